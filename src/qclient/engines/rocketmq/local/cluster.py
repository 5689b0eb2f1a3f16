"""RocketMQCluster: a real Apache RocketMQ 5 NameServer and brokers as local JVMs.

The counterpart of :class:`qclient.cluster.LocalCluster` for the RocketMQ engine, for tests
and benchmarks: every JVM binds and advertises 127.0.0.1 on free ports, keeps its home,
store, config and log under the cluster's data dir, dies with the Python process that
started it (even by SIGKILL), and leaving the ``with`` block stops them all.

Readiness is what a client needs, not a sleep: a NameServer is ready when it has logged
its boot line and accepts connections; a broker when it has logged its boot line, accepts
connections, and the NameServer routes ``TBW102`` (the default topic every master
registers) to it under broker id 0 at the address it was given.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from ....errors import ClusterError
from ..codes import RequestCode, ResponseCode
from ..remoting import request
from ..route import RouteParseError, parse_route
from .node import JvmNode, call
from .runtime import (
    BROKER_MAIN,
    NAMESRV_MAIN,
    JvmSpec,
    broker_config,
    broker_ports,
    find_java,
    find_lib,
    free_port,
    namesrv_config,
)

__all__ = ["DEFAULT_TOPIC", "RocketMQCluster"]

log = logging.getLogger(__name__)

#: the topic every master registers at boot, whose route auto-created topics copy
DEFAULT_TOPIC = "TBW102"
_NAMESRV_JVM = JvmSpec(heap_mb=128, direct_mb=64)
_BROKER_JVM = JvmSpec(heap_mb=256, direct_mb=256)
_PORT_TAKEN = "Address already in use"
_PORT_ATTEMPTS = 3


# --- the cluster ----------------------------------------------------------------------


class RocketMQCluster:
    """A NameServer and ``brokers`` lone masters (broker-a, broker-b, ...) as JVMs; a
    context manager that stops them all, also after an exception.

    ``broker_options`` / ``namesrv_options`` add or override properties of every broker /
    the NameServer (see ``runtime.broker_config`` for the defaults). ``replicas`` > 1
    (controller-mode groups, RIP-44) is not supported yet.
    """

    #: the engine its processes are (``LocalCluster.engine``)
    engine = "rocketmq"

    def __init__(
        self,
        brokers: int = 2,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        replicas: int = 1,
        broker_options: Mapping[str, Any] | None = None,
        namesrv_options: Mapping[str, Any] | None = None,
        cluster_name: str = "DefaultCluster",
        startup_timeout: float = 90.0,
        namesrv_port: int = 0,
    ) -> None:
        if replicas != 1:
            raise ClusterError(
                f"replicas={replicas}: only replicas=1 (lone masters) is supported; "
                "controller-mode groups (RIP-44) are not implemented yet"
            )
        if brokers < 0 or brokers > 26:
            raise ValueError(f"brokers must be 0..26, got {brokers}")
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="qclient-rocketmq-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.cluster_name = cluster_name
        #: the NameServer's port (0: a free one)
        self._namesrv_port = namesrv_port
        self.startup_timeout = startup_timeout
        self._broker_options = dict(broker_options or {})
        self._namesrv_options = dict(namesrv_options or {})
        self._java = ""
        self._lib = Path()
        self.namesrv_node = JvmNode(
            "namesrv", "namesrv", NAMESRV_MAIN, self.data_dir / "namesrv", _NAMESRV_JVM
        )
        self.brokers: list[JvmNode] = []
        for i in range(brokers):
            name = f"broker-{chr(ord('a') + i)}"
            node = JvmNode(name, "broker", BROKER_MAIN, self.data_dir / name, _BROKER_JVM)
            node.ready_check = self._routed_check(node)
            self.brokers.append(node)
        #: broker name -> its replicas, master first (one each with replicas=1)
        self.replicas: dict[str, list[JvmNode]] = {b.name: [b] for b in self.brokers}

    def __repr__(self) -> str:
        return (
            f"<RocketMQCluster namesrv={self.namesrv!r} brokers={[b.name for b in self.brokers]}>"
        )

    # --- addresses ------------------------------------------------------------------

    @property
    def namesrv_addr(self) -> str:
        """``127.0.0.1:PORT``, the NameServer (what RocketMQ's ``namesrvAddr`` takes)."""
        return self.namesrv_node.addr

    @property
    def namesrv(self) -> str:
        """``rocketmq://127.0.0.1:PORT``, the address qclient takes."""
        return f"rocketmq://{self.namesrv_addr}"

    def broker(self, name: str) -> JvmNode:
        """The master named ``name`` (KeyError if none)."""
        for b in self.brokers:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def nodes(self) -> list[JvmNode]:
        """Every JVM of the cluster, NameServer first."""
        return [self.namesrv_node, *(n for group in self.replicas.values() for n in group)]

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> RocketMQCluster:
        """Start the NameServer, then every broker; wait until each is routed.

        On failure every JVM is killed; a temporary data dir is kept when a JVM failed
        (the ClusterError names its log there), removed otherwise.
        """
        try:
            self._java, self._lib = find_java(), find_lib()
            self._start_nodes([self.namesrv_node])
            self._start_nodes(self.brokers)
        except BaseException as exc:
            spawned = any(n.process is not None for n in self.nodes)
            keep = isinstance(exc, ClusterError) and spawned and self._own_dir
            self._stop(graceful=False, remove_dir=not keep)
            if keep:
                log.warning("RocketMQ cluster failed to start; its logs are in %s", self.data_dir)
            raise
        return self

    def _configure(self, node: JvmNode) -> None:
        """Pick free ports for ``node`` and write its files."""
        if node is self.namesrv_node:
            props = namesrv_config(self._namesrv_port or free_port(), self._namesrv_options)
        else:
            port, ha_port = broker_ports()
            props = broker_config(
                name=node.name,
                cluster=self.cluster_name,
                namesrv_addr=self.namesrv_addr,
                port=port,
                ha_port=ha_port,
                store_dir=node.home / "store",
                overrides=self._broker_options,
            )
        node.configure(self._java, self._lib, props)

    def _start_nodes(self, nodes: Sequence[JvmNode]) -> None:
        """Spawn ``nodes`` together and wait for each; a node that lost a port race (its
        port taken by another process between our check and its bind) gets new ports."""
        for node in nodes:
            self._configure(node)
            node.spawn()
        deadline = time.monotonic() + self.startup_timeout
        for node in nodes:
            for attempt in range(_PORT_ATTEMPTS):
                try:
                    node.wait_ready(max(1.0, deadline - time.monotonic()))
                    break
                except ClusterError:
                    lost_port = not node.running and _PORT_TAKEN in node.log_tail(40)
                    if not lost_port or attempt == _PORT_ATTEMPTS - 1:
                        raise
                    log.info("%s %s lost its port; retrying on new ones", node.role, node.name)
                    self._configure(node)
                    node.spawn()

    def stop(self, graceful: bool | None = None) -> None:
        """Stop every JVM, brokers first; remove the data dir if it was a temporary one.

        ``graceful`` (default: only when the data dir is the caller's) sends SIGTERM to the
        brokers in parallel and waits for RocketMQ's shutdown hooks, which take 10-20 s a
        broker on two busy cores (each service thread is joined in turn, several after a
        poll of 1-3 s); otherwise every JVM is killed at once: a temporary store is deleted
        next, so a clean shutdown of it would buy nothing.
        """
        self._stop(graceful, remove_dir=self._own_dir)

    def _stop(self, graceful: bool | None, remove_dir: bool) -> None:
        if graceful is None:
            graceful = not self._own_dir
        brokers = [n for group in self.replicas.values() for n in group]
        if graceful and brokers:
            with ThreadPoolExecutor(len(brokers)) as pool:
                list(pool.map(lambda n: n.stop(), brokers))
        for node in [*brokers, self.namesrv_node]:
            if graceful:
                node.stop()
            else:
                node.kill()
        if remove_dir and self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    close = stop

    def __enter__(self) -> RocketMQCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- routes and topics ----------------------------------------------------------

    def route(self, topic: str, timeout: float = 5.0) -> dict[str, dict[int, str]]:
        """Broker name -> {broker id: address} the NameServer routes ``topic`` to now, for
        brokers that hold queues of it ({} when the topic is unknown or on an error)."""
        try:
            reply = call(
                self.namesrv_addr,
                request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
                timeout,
            )
        except OSError:
            return {}
        if reply.code != ResponseCode.SUCCESS:
            return {}
        try:
            route = parse_route(topic, reply.body)
        except RouteParseError:
            return {}
        with_queues = {q.broker_name for q in route.queue_datas}
        return {
            b.broker_name: dict(b.addrs) for b in route.broker_datas if b.broker_name in with_queues
        }

    def _routed_check(self, node: JvmNode) -> Callable[[], str | None]:
        def check() -> str | None:
            route = self.route(DEFAULT_TOPIC)
            if route.get(node.name, {}).get(0) == node.addr:
                return None
            return f"{DEFAULT_TOPIC} routed to {node.addr} as id 0 (the NameServer: {route})"

        return check

    def wait_routed(
        self,
        topic: str,
        timeout: float = 30.0,
        brokers: Sequence[str] | None = None,
    ) -> None:
        """Wait until the NameServer routes ``topic`` to each master (``brokers``, default
        every running one) under id 0 at its address; ClusterError on timeout."""
        if brokers is None:
            want = {b.name: b.addr for b in self.brokers if b.running}
        else:
            want = {name: self.broker(name).addr for name in brokers}
        deadline = time.monotonic() + timeout
        while True:
            routed = self.route(topic)
            missing = sorted(n for n, a in want.items() if routed.get(n, {}).get(0) != a)
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"topic {topic!r} not routed to {missing} after {timeout:.0f} s "
                    f"(the NameServer {self.namesrv_addr} routes it to {routed})"
                )
            time.sleep(0.05)

    def create_topic(self, topic: str, queues: int = 4, timeout: float = 30.0) -> None:
        """Create (or update) ``topic`` with ``queues`` read and write queues on every
        master (UPDATE_AND_CREATE_TOPIC), then wait until the NameServer routes it."""
        fields = {
            "topic": topic,
            "defaultTopic": DEFAULT_TOPIC,
            "readQueueNums": str(queues),
            "writeQueueNums": str(queues),
            "perm": "6",  # PermName.PERM_READ | PERM_WRITE
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
        }
        for b in self.brokers:
            try:
                reply = call(b.addr, request(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(fields)))
            except OSError as exc:
                raise ClusterError(
                    f"create topic {topic!r} on {b.name} ({b.addr}): {exc}"
                ) from None
            if reply.code != ResponseCode.SUCCESS:
                raise ClusterError(
                    f"create topic {topic!r} on {b.name} ({b.addr}): code {reply.code} "
                    f"{reply.remark or ''}".rstrip()
                )
        self.wait_routed(topic, timeout, [b.name for b in self.brokers])
