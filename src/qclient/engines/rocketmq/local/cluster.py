"""RocketMQCluster: a real Apache RocketMQ 5 NameServer and brokers as local JVMs.

The counterpart of :class:`qclient.cluster.LocalCluster` for the RocketMQ engine, for tests
and benchmarks: every JVM binds and advertises 127.0.0.1 on free ports, keeps its home,
store, config and log under the cluster's data dir, dies with the Python process that
started it (even by SIGKILL), and leaving the ``with`` block stops them all.

Readiness is what a client needs, not a sleep: a NameServer is ready when it has logged
its boot line and accepts connections; a broker when it has logged its boot line, accepts
connections, and the NameServer routes ``TBW102`` (the default topic every master
registers) to it under broker id 0 at the address it was given.

With ``replicas`` > 1 each broker name is a group of replicas in controller mode (RIP-44):
the controller runs inside the NameServer, picks each group's master (routed as id 0; the
others as slaves under their own ids) and elects another when it dies. The cluster is
ready when every group has a routed master and every replica is in its SyncStateSet (an
election only picks from that set).
"""

from __future__ import annotations

import json
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
from ..admin import topic_fields
from ..codes import RequestCode, ResponseCode
from ..remoting import request
from ..route import RouteParseError, parse_route
from .node import JvmNode, call
from .runtime import (
    BROKER_MAIN,
    HA_PLUGIN,
    NAMESRV_MAIN,
    JvmSpec,
    broker_config,
    broker_ports,
    controller_broker_options,
    controller_namesrv_options,
    find_ha_jar,
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

#: A broker's heap: it starts at 256 MB and may grow to 1 GB. RocketMQ's timer holds every
#: message of a slot being fired (the decoded message, ~1-2 KB each) until the whole slot
#: is stored: 100,000 due at one instant on a broker filled a 256 MB heap, and the
#: OutOfMemoryErrors lost 124,437 of 200,000 acknowledged messages (decision 0039)
BROKER_HEAP_MB = 1024
BROKER_INITIAL_HEAP_MB = 256
_PORT_TAKEN = "Address already in use"
_PORT_ATTEMPTS = 3
#: RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: body a JSON list of broker names
_GET_SYNC_STATE_DATA = 1006


# --- the cluster ----------------------------------------------------------------------


class RocketMQCluster:
    """A NameServer and ``brokers`` brokers (broker-a, broker-b, ...) as JVMs; a context
    manager that stops them all, also after an exception.

    ``replicas`` is the number of JVMs per broker name: 1, lone masters (node names
    broker-a, ...); more, controller-mode groups (nodes broker-a-0, broker-a-1, ...).
    ``broker_options`` / ``namesrv_options`` add or override properties of every broker /
    the NameServer (see ``runtime.broker_config`` for the defaults). ``broker_heap_mb`` is
    the most heap a broker may grow to (from 256 MB; ``BROKER_HEAP_MB``): a spike due at
    one instant needs room for every message of the slot being fired.
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
        broker_heap_mb: int = BROKER_HEAP_MB,
    ) -> None:
        if not 1 <= replicas <= 9:
            raise ValueError(f"replicas must be 1..9, got {replicas}")
        if brokers < 0 or brokers > 26:
            raise ValueError(f"brokers must be 0..26, got {brokers}")
        if broker_heap_mb < BROKER_INITIAL_HEAP_MB:
            raise ValueError(
                f"broker_heap_mb must be at least {BROKER_INITIAL_HEAP_MB}, got {broker_heap_mb}"
            )
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
        self._replicas = replicas
        #: the brokers' JVMs, this cluster's own: start() adds the HA jar to its classpath
        self._broker_jvm = JvmSpec(
            heap_mb=broker_heap_mb, direct_mb=256, initial_heap_mb=BROKER_INITIAL_HEAP_MB
        )
        #: the controller (``127.0.0.1:PORT``) with replicas > 1, set by start()
        self.controller_addr: str | None = None
        self.namesrv_node = JvmNode(
            "namesrv", "namesrv", NAMESRV_MAIN, self.data_dir / "namesrv", _NAMESRV_JVM
        )
        #: broker name -> its JVMs (one each with replicas=1)
        self.replicas: dict[str, list[JvmNode]] = {}
        for i in range(brokers):
            group = f"broker-{chr(ord('a') + i)}"
            names = [group] if replicas == 1 else [f"{group}-{r}" for r in range(replicas)]
            nodes = [
                JvmNode(n, "broker", BROKER_MAIN, self.data_dir / n, self._broker_jvm, group)
                for n in names
            ]
            for node in nodes:
                node.ready_check = self._routed_check(node)
            self.replicas[group] = nodes

    def __repr__(self) -> str:
        return f"<RocketMQCluster namesrv={self.namesrv!r} brokers={list(self.replicas)}>"

    # --- addresses ------------------------------------------------------------------

    @property
    def namesrv_addr(self) -> str:
        """``127.0.0.1:PORT``, the NameServer (what RocketMQ's ``namesrvAddr`` takes)."""
        return self.namesrv_node.addr

    @property
    def namesrv(self) -> str:
        """``rocketmq://127.0.0.1:PORT``, the address qclient takes."""
        return f"rocketmq://{self.namesrv_addr}"

    @property
    def brokers(self) -> list[JvmNode]:
        """The masters, one per broker name. With replicas > 1 each is the replica the
        NameServer routes as id 0 now (asked on every call), or the group's first when it
        routes none."""
        if self._replicas == 1:
            return [group[0] for group in self.replicas.values()]
        route = self.route(DEFAULT_TOPIC) if self.namesrv_node.running else {}
        masters = []
        for name, group in self.replicas.items():
            addr = route.get(name, {}).get(0)
            masters.append(next((n for n in group if n.addr == addr), group[0]))
        return masters

    def broker(self, name: str) -> JvmNode:
        """The master of broker ``name``, or the replica whose node name is ``name``
        (KeyError if none)."""
        if name in self.replicas:
            return next(b for b in self.brokers if b.group == name)
        for group in self.replicas.values():
            for node in group:
                if node.name == name:
                    return node
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
            self._broker_jvm.classpath = self._ha_classpath()
            self._start_nodes([self.namesrv_node])
            self._start_nodes([n for group in self.replicas.values() for n in group])
            if self._replicas > 1:
                self.wait_in_sync(self.startup_timeout)
        except BaseException as exc:
            spawned = any(n.process is not None for n in self.nodes)
            keep = isinstance(exc, ClusterError) and spawned and self._own_dir
            self._stop(graceful=False, remove_dir=not keep)
            if keep:
                log.warning("RocketMQ cluster failed to start; its logs are in %s", self.data_dir)
            raise
        return self

    def _ha_classpath(self) -> tuple[Path, ...]:
        """The HA jar, which binds each broker's HA acceptor to brokerIP2, 127.0.0.1 (5.5.0
        binds it to every interface); without it () and one warning: the brokers still work."""
        jar = find_ha_jar()
        if jar is None and self.replicas:
            log.warning(
                "RocketMQ HA jar not built (make rocketmq-ha-loopback): the brokers' HA port "
                "listens on every interface, not 127.0.0.1 only"
            )
        return (jar,) if jar is not None and self.replicas else ()

    def _configure(self, node: JvmNode) -> None:
        """Pick free ports for ``node`` and write its files."""
        if node is self.namesrv_node:
            options = dict(self._namesrv_options)
            if self._replicas > 1:
                ctl_port = free_port()
                ctl = controller_namesrv_options(ctl_port, node.home / "controller")
                options = ctl | options
                self.controller_addr = f"{node.host}:{ctl_port}"
            props = namesrv_config(self._namesrv_port or free_port(), options)
        else:
            options = dict(self._broker_options)
            if self.controller_addr is not None:
                options = controller_broker_options(self.controller_addr) | options
                if self._broker_jvm.classpath:  # the HA jar: controller mode needs its plugin
                    options = {"messageStorePlugIn": HA_PLUGIN} | options
            port, ha_port = broker_ports()
            props = broker_config(
                name=node.group,
                cluster=self.cluster_name,
                namesrv_addr=self.namesrv_addr,
                port=port,
                ha_port=ha_port,
                store_dir=node.home / "store",
                overrides=options,
            )
        node.configure(self._java, self._lib, props)

    def _start_nodes(self, nodes: Sequence[JvmNode]) -> None:
        """Spawn ``nodes`` together and wait for each; a node that lost a port race (its
        port taken by another process between our check and its bind) gets new ports. The
        BindException is looked for in all the node logged since its spawn: a broker's
        shutdown hooks log a hundred lines and more after it."""
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
                    lost_port = not node.running and node.logged_since_spawn(_PORT_TAKEN)
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
            # the JVM that writes its main class's class data archive (once per class
            # path) writes it on a clean exit only: a kill would waste it (see ``cds``)
            if graceful or node.writes_archive:
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
        """A lone master is ready when routed as id 0, a replica when routed (its id is the
        controller's choice)."""

        def check() -> str | None:
            addrs = self.route(DEFAULT_TOPIC).get(node.group, {})
            if self._replicas == 1:
                if addrs.get(0) == node.addr:
                    return None
                return f"{DEFAULT_TOPIC} routed to {node.addr} as id 0 (the NameServer: {addrs})"
            if node.addr in addrs.values():
                return None
            return f"{DEFAULT_TOPIC} routed to {node.addr} (the NameServer: {addrs})"

        return check

    def sync_state(self) -> dict[str, tuple[str | None, set[str]]]:
        """Broker name -> (master address, addresses in its SyncStateSet), as the
        controller has them now ({} without a controller or on an error)."""
        if self.controller_addr is None:
            return {}
        body = json.dumps(sorted(self.replicas)).encode()
        try:
            reply = call(self.controller_addr, request(_GET_SYNC_STATE_DATA, body=body))
            table = json.loads(reply.body)["replicasInfoTable"] if reply.code == 0 else {}
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        return {
            name: (
                info.get("masterAddress"),
                {r["brokerAddress"] for r in info.get("inSyncReplicas") or ()},
            )
            for name, info in table.items()
        }

    def wait_in_sync(self, timeout: float = 60.0) -> None:
        """Wait until every broker name has a master routed as id 0 and every running
        replica is in its SyncStateSet (so a master's death elects another); a no-op with
        replicas=1."""
        if self._replicas == 1:
            return
        deadline = time.monotonic() + timeout
        while True:
            state, route = self.sync_state(), self.route(DEFAULT_TOPIC)
            lagging = {}
            for name, group in self.replicas.items():
                master, in_sync = state.get(name, (None, set()))
                want = {n.addr for n in group if n.running}
                if master is None or route.get(name, {}).get(0) != master or want - in_sync:
                    lagging[name] = (master, sorted(in_sync), route.get(name, {}))
            if not lagging:
                return
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"replicas not in sync after {timeout:.0f} s: broker -> (master, "
                    f"SyncStateSet, route) {lagging}"
                )
            time.sleep(0.1)

    def wait_routed(
        self,
        topic: str,
        timeout: float = 30.0,
        brokers: Sequence[str] | None = None,
    ) -> None:
        """Wait until the NameServer routes ``topic`` under id 0 to a running JVM of each
        broker name (``brokers``, default every one with a running JVM); ClusterError on
        timeout."""
        names = list(brokers) if brokers is not None else list(self.replicas)
        want = {n: {r.addr for r in self.replicas[n] if r.running} for n in names}
        if brokers is None:
            want = {n: addrs for n, addrs in want.items() if addrs}
        deadline = time.monotonic() + timeout
        while True:
            routed = self.route(topic)
            missing = sorted(n for n, a in want.items() if routed.get(n, {}).get(0) not in a)
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
        master (UPDATE_AND_CREATE_TOPIC), then wait until the NameServer routes it.

        With replicas > 1 the running slaves get it too: a slave copies its master's topics
        only every 10 s (controller mode's SlaveSynchronize), and one elected before that
        answers every pull of the topic with TOPIC_NOT_EXIST (a send creates it there only
        while ``autoCreateTopicEnable`` is on). The NameServer routes a slave's topics only
        while its group has no master, as the master's would be."""
        fields = topic_fields(topic, queues)
        masters = self.brokers
        slaves = [
            n
            for b in masters
            for n in self.replicas[b.group]
            if n is not b and n.running and self._replicas > 1
        ]
        # the whole budget for the requests too: a JVM's first admin request can take
        # seconds on a loaded host (one slave took over 5 s right after start-up)
        deadline = time.monotonic() + timeout
        for b in [*masters, *slaves]:
            left = max(1.0, deadline - time.monotonic())
            try:
                reply = call(
                    b.addr, request(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(fields)), left
                )
            except OSError as exc:
                raise ClusterError(
                    f"create topic {topic!r} on {b.name} ({b.addr}): {exc}"
                ) from None
            if reply.code != ResponseCode.SUCCESS:
                raise ClusterError(
                    f"create topic {topic!r} on {b.name} ({b.addr}): code {reply.code} "
                    f"{reply.remark or ''}".rstrip()
                )
        self.wait_routed(topic, timeout, [b.group for b in masters])
