"""LocalCluster: a name server and brokers as child processes on free loopback ports.

Every test, example and benchmark runs against real processes started here. The
children are ``python -m qclient namesrv|broker``; they die with the process that
started them (even if it is killed), and leaving the ``with`` block stops them all.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from ._config import DEFAULT_HOST
from ._extras import missing_server_extra
from .errors import ClusterError, UnsupportedByEngineError
from .protocol import wire

__all__ = ["ClusterError", "LocalCluster", "NodeHandle"]

log = logging.getLogger(__name__)


def _wait(cond: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")


class NodeHandle:
    """One name server or broker process: ``.name``, ``.addr``, ``.pid`` and signals."""

    def __init__(
        self,
        name: str,
        role: str,
        args: list[str],
        workdir: Path,
        host: str = DEFAULT_HOST,
        port: int = 0,
        scheme: str = "http",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.role = role
        self.host = host
        self.port = port
        self.scheme = scheme
        self._args = args
        self._env = dict(env) if env else None
        self.log_path = workdir / f"{name}.log"
        self._ready_file = workdir / f"{name}.ready"
        self.process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<NodeHandle {self.role} {self.name} {self.addr} pid={self.pid}>"

    @property
    def addr(self) -> str:
        hostport = f"{self.host}:{self.port}"
        return hostport if self.scheme == "http" else f"{self.scheme}://{hostport}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self) -> None:
        """Start the process without waiting; ``wait_ready()`` waits."""
        if self.running:
            raise ClusterError(f"{self.name} is already running")
        self._ready_file.unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "qclient",
            self.role,
            *self._args,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--ready-file",
            str(self._ready_file),
            "--exit-with-parent",
            str(os.getpid()),
        ]
        logfile = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.process = subprocess.Popen(
                argv,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env,
            )
        finally:
            logfile.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise ClusterError(
                    f"{self.role} {self.name} exited with code "
                    f"{self.process.returncode}; log: {self._log_tail()}"
                )
            return self._ready_file.exists()

        _wait(ready, timeout, f"{self.role} {self.name} to listen")
        addr = self._ready_file.read_text().strip()
        self.port = int(addr.rsplit(":", 1)[1])  # port 0 became a real port; keep it

    def start(self, timeout: float = 30.0) -> None:
        """Start (again) with the same name, port and data dir; wait until it serves."""
        self.spawn()
        self.wait_ready(timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM and wait (SIGKILL after ``timeout``)."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGCONT)  # a paused process cannot handle SIGTERM
            proc.terminate()
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s %s did not stop in %.0f s; killing it", self.role, self.name, timeout)
            proc.kill()
            proc.wait(10)
        except ProcessLookupError:
            pass

    def pause(self) -> None:
        """SIGSTOP: the process hangs, its sockets stay open."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"


class LocalCluster:
    """A name server and ``brokers`` brokers as child processes (a context manager).

    ``engine="rocketmq"`` makes it an Apache RocketMQ 5 cluster instead (NameServer and
    brokers as JVMs: ``qclient.engines.rocketmq.local.RocketMQCluster``, the same handles
    and waits); ``replicas`` is that engine's.
    """

    #: the engine its processes are
    engine = "qclient"

    def __new__(cls, *args: Any, engine: str = "qclient", replicas: int = 1, **kwargs: Any) -> Any:
        if engine == "rocketmq":
            from .engines.rocketmq.local import RocketMQCluster

            brokers = args[0] if args else kwargs.pop("brokers", 2)
            data_dir = args[1] if len(args) > 1 else kwargs.pop("data_dir", None)
            auth_file = args[2] if len(args) > 2 else kwargs.pop("auth_file", None)
            if auth_file is not None:
                raise UnsupportedByEngineError("rocketmq", "LocalCluster(auth_file=...)")
            return RocketMQCluster(brokers, data_dir, replicas=replicas, **kwargs)
        if engine != "qclient":
            raise ValueError(f"unknown engine {engine!r}: 'qclient' or 'rocketmq'")
        if replicas != 1:
            raise UnsupportedByEngineError(
                "qclient", "replicas", "its brokers keep one copy; use engine='rocketmq'"
            )
        return super().__new__(cls)

    def __init__(
        self,
        brokers: int = 2,
        data_dir: str | None = None,
        auth_file: str | None = None,
        *,
        namesrv_count: int = 1,
        namesrv_port: int = 0,
        host: str = DEFAULT_HOST,
        heartbeat_interval: float = 1.0,
        broker_expire: float | None = None,
        read_only: Sequence[str] = (),
        auto_create_topics: bool = True,
        store_options: Mapping[str, Any] | None = None,
        broker_args: Sequence[str] = (),
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
        startup_timeout: float = 60.0,
        engine: str = "qclient",
        replicas: int = 1,
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="qclient-cluster-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.startup_timeout = startup_timeout
        scheme = "https" if tls_cert else "http"
        tls: list[str] = ["--tls-cert", tls_cert, "--tls-key", tls_key or ""] if tls_cert else []
        expire = broker_expire if broker_expire is not None else max(3.0, 4 * heartbeat_interval)
        self.namesrv_nodes = [
            NodeHandle(
                f"namesrv-{i}",
                "namesrv",
                [
                    "--broker-expire",
                    str(expire),
                    *tls,
                    *(["--auth-file", auth_file] if auth_file else []),
                ],
                self.data_dir,
                host,
                namesrv_port if i == 0 else 0,
                scheme,
            )
            for i in range(namesrv_count)
        ]
        self._broker_specs: list[tuple[str, list[str]]] = []
        for i in range(brokers):
            name = f"broker-{chr(ord('a') + i)}" if i < 26 else f"broker-{i}"
            args = [
                "--name",
                name,
                "--data-dir",
                str(self.data_dir / name),
                "--heartbeat-interval",
                str(heartbeat_interval),
                *broker_args,
                *tls,
            ]
            if tls_cert:  # brokers verify the name server (self-signed: its cert)
                args += ["--tls-ca", tls_ca or tls_cert]
            if name in read_only:
                args.append("--read-only")
            if auth_file:
                args += ["--auth-file", auth_file]
            if not auto_create_topics:
                args.append("--no-auto-create-topics")
            for key, value in (store_options or {}).items():
                args += ["--store-option", f"{key}={value}"]
            self._broker_specs.append((name, args))
        self.brokers: list[NodeHandle] = []
        self._http = httpx.Client(timeout=2.0, verify=not tls_cert)

    def __repr__(self) -> str:
        return f"<LocalCluster namesrv={self.namesrv!r} brokers={[b.name for b in self.brokers]}>"

    # --- addresses ------------------------------------------------------------------

    @property
    def namesrv(self) -> str:
        """The name server address(es), ``host:port[,host:port]``."""
        return ",".join(n.addr for n in self.namesrv_nodes)

    @property
    def namesrv_node(self) -> NodeHandle:
        return self.namesrv_nodes[0]

    def broker(self, name: str) -> NodeHandle:
        for b in self.brokers:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def replicas(self) -> dict[str, list[NodeHandle]]:
        """Every process of each broker: one here (our brokers keep one copy)."""
        return {b.name: [b] for b in self.brokers}

    def create_topic(self, topic: str, queues: int = 4, timeout: float = 30.0) -> None:
        """Create ``topic`` with ``queues`` queues on every broker, and wait until the name
        servers route it to all of them."""
        body = wire.encode(wire.CreateTopicRequest(topic, queues))
        for b in self.brokers:
            resp = self._http.post(
                wire.base_url(b.addr) + wire.BROKER_TOPICS,
                content=body,
                headers={"content-type": wire.JSON},
            )
            if resp.status_code != 200:
                raise ClusterError(f"{b.name}: create topic {topic}: HTTP {resp.status_code}")
        want = {b.name for b in self.brokers}

        def routed() -> bool:
            resp = self._http.get(
                wire.base_url(self.namesrv_node.addr) + wire.NAMESRV_ROUTE.format(topic=topic)
            )
            if resp.status_code != 200:
                return False
            route = wire.decode(resp.content, wire.TopicRoute, resp.headers.get("content-type", ""))
            return want <= {q.broker_name for q in route.queue_datas}

        _wait(routed, timeout, f"topic {topic} to route to {sorted(want)}")

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> LocalCluster:
        try:
            missing = missing_server_extra("LocalCluster")
            if missing:
                raise ClusterError(missing)
            for node in self.namesrv_nodes:
                node.spawn()
            for node in self.namesrv_nodes:
                node.wait_ready(self.startup_timeout)
            namesrv = self.namesrv
            for name, args in self._broker_specs:
                self.brokers.append(
                    NodeHandle(
                        name,
                        "broker",
                        [*args, "--namesrv", namesrv],
                        self.data_dir,
                        self.namesrv_node.host,
                        0,
                        self.namesrv_node.scheme,
                    )
                )
            for b in self.brokers:
                b.spawn()
            with ThreadPoolExecutor(max(1, len(self.brokers))) as pool:
                list(pool.map(lambda b: b.wait_ready(self.startup_timeout), self.brokers))
            self.wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process (brokers first); remove the data dir if it was a temp one."""
        for b in self.brokers:
            b.stop()
        for n in self.namesrv_nodes:
            n.stop()
        self._http.close()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    close = stop

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- waiting on the name server -------------------------------------------------

    def registered(self, node: NodeHandle | None = None) -> set[str]:
        """Names of the brokers a name server lists now."""
        ns = node or self.namesrv_node
        try:
            resp = self._http.get(wire.base_url(ns.addr) + wire.NAMESRV_BROKERS)
            resp.raise_for_status()
        except httpx.HTTPError:
            return set()
        return {b.broker_name for b in wire.decode(resp.content, wire.BrokerList).brokers}

    def wait_registered(
        self, names: Sequence[str] | None = None, timeout: float | None = None
    ) -> None:
        """Wait until every name server lists the brokers (all by default)."""
        want = set(names) if names is not None else {b.name for b in self.brokers}
        for ns in self.namesrv_nodes:
            _wait(
                functools.partial(lambda n: want <= self.registered(n), ns),
                timeout or self.startup_timeout,
                f"brokers {sorted(want)} to register with {ns.addr}",
            )

    def wait_unregistered(self, name: str, timeout: float = 30.0) -> None:
        """Wait until no name server lists the broker (stopped, or heartbeats expired)."""
        for ns in self.namesrv_nodes:
            _wait(
                functools.partial(lambda n: name not in self.registered(n), ns),
                timeout,
                f"broker {name} to leave {ns.addr}",
            )
