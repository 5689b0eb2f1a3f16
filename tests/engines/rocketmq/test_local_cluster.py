"""RocketMQCluster: real Apache RocketMQ 5.5.0 JVMs on 127.0.0.1, started, routed, signalled
and stopped as the tests and benchmarks need them.

One two-broker cluster serves the module; the tests that need a cluster of their own (to
leave it, or to kill its parent) start a smaller one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import pytest
from tests._budget import OneAtATime

from qclient.cluster import ClusterError
from qclient.engines.rocketmq.codes import RequestCode
from qclient.engines.rocketmq.local import DEFAULT_TOPIC, SETUP_HINT, RocketMQCluster
from qclient.engines.rocketmq.local import cluster as cluster_module
from qclient.engines.rocketmq.local.node import JvmNode, call
from qclient.engines.rocketmq.local.runtime import (
    HA_PLUGIN,
    LIB_ENV,
    broker_ports,
    die_with_parent,
    find_ha_jar,
    find_lib,
)
from qclient.engines.rocketmq.remoting import request

from ._needs import needs_rocketmq

pytestmark = [
    pytest.mark.slow,
    pytest.mark.jvm,
    needs_rocketmq,
]


@pytest.fixture(scope="module")
def _shared() -> Iterator[OneAtATime[RocketMQCluster]]:
    """The module's two-broker cluster, stopped before a test that starts JVMs of its own."""
    shared = OneAtATime(lambda: RocketMQCluster(brokers=2).start(), RocketMQCluster.stop)
    try:
        yield shared
    finally:
        shared.release()


@pytest.fixture
def cluster(_shared: OneAtATime[RocketMQCluster]) -> RocketMQCluster:
    return _shared.get()


@pytest.fixture(autouse=True)
def _one_cluster_at_a_time(
    request: pytest.FixtureRequest, _shared: OneAtATime[RocketMQCluster]
) -> None:
    if "cluster" not in request.fixturenames:
        _shared.release()


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def _listening(pid: int) -> list[tuple[str, int]]:
    return [
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]


def _conf(node: JvmNode) -> dict[str, str]:
    lines = node.conf_path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _listening_by_node(c: RocketMQCluster) -> dict[str, list[tuple[str, int]]]:
    """Node name -> the sockets its JVM listens on, for every running JVM of ``c``."""
    return {n.name: sorted(_listening(n.pid)) for n in c.nodes if n.running and n.pid}


def _loopback_only(c: RocketMQCluster) -> dict[str, list[tuple[str, int]]]:
    """What ``_listening_by_node`` must be: the NameServer on its port (and the controller's),
    each broker on its port, its fast port (port - 2) and its HA port; 127.0.0.1 all."""
    want = {}
    for n in c.nodes:
        if not (n.running and n.pid):
            continue
        if n.role == "namesrv":
            ports = [n.port]
            if c.controller_addr is not None:
                ports.append(int(c.controller_addr.rsplit(":", 1)[1]))
        else:
            ports = [n.port - 2, n.port, int(_conf(n)["haListenPort"])]
        want[n.name] = sorted(("127.0.0.1", p) for p in ports)
    return want


def _unapplied(node: JvmNode) -> list[str]:
    """The keys of the node's properties its log does not echo: RocketMQ ignores an unknown
    key silently; a broker echoes every key it applied at boot (BrokerIdentity's
    brokerClusterName/brokerName/brokerId excepted: the boot line shows those)."""
    log = node.log_path.read_text(errors="replace")
    identity = {"brokerClusterName", "brokerName", "brokerId"}
    return [
        f"{k}={v}"
        for k, v in _conf(node).items()
        if k not in identity and f" - {k}={v}\n" not in log
    ]


class _ShutsDownWhenFreed:
    """Shuts its socket down (SHUT_RDWR) when freed, as py4j's finalizer of a connection to
    the Spark JVM does."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def __del__(self) -> None:
        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def _thread_local_canary() -> Iterator[Callable[[], bool]]:
    """A thread that keeps a ``_ShutsDownWhenFreed`` of one end of a socket pair in a
    thread-local while the block runs; yields a check that the pair still carries a byte
    both ways. A forked child of this process that runs Python code clears the other
    threads' states there, so the object is freed in the child, and the shutdown of the
    socket the child shares with this process ends the pair here too."""
    a, b = socket.socketpair()
    a.settimeout(5.0)
    b.settimeout(5.0)
    local = threading.local()
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        local.conn = _ShutsDownWhenFreed(a)
        holding.set()
        done.wait(300)

    def carries() -> bool:
        try:
            a.sendall(b"x")
            b.sendall(b"y")
            return b.recv(1) == b"x" and a.recv(1) == b"y"
        except OSError:
            return False

    thread = threading.Thread(target=hold, name="canary", daemon=True)
    thread.start()
    try:
        assert holding.wait(10)
        assert carries()
        yield carries
    finally:
        done.set()
        thread.join(10)
        a.close()
        b.close()


# --- the shared cluster ---------------------------------------------------------------


def test_namesrv_routes_tbw102_to_both_brokers_on_loopback(cluster: RocketMQCluster) -> None:
    assert cluster.namesrv == f"rocketmq://{cluster.namesrv_addr}"
    assert cluster.namesrv_addr.startswith("127.0.0.1:")
    assert [b.name for b in cluster.brokers] == ["broker-a", "broker-b"]
    assert {name: [n.name for n in group] for name, group in cluster.replicas.items()} == {
        "broker-a": ["broker-a"],
        "broker-b": ["broker-b"],
    }
    route = cluster.route(DEFAULT_TOPIC)
    assert route == {b.name: {0: b.addr} for b in cluster.brokers}
    for b in cluster.brokers:
        assert b.addr.startswith("127.0.0.1:")
        assert cluster.broker(b.name) is b


def test_every_broker_applied_every_key_it_was_given(cluster: RocketMQCluster) -> None:
    for b in cluster.brokers:
        assert not _unapplied(b), f"{b.name} did not apply them"
        log = b.log_path.read_text(errors="replace")
        assert f"The broker[{b.name}, {b.addr}] boot success" in log


def test_every_jvm_listens_on_loopback_only(cluster: RocketMQCluster) -> None:
    """Every listening socket is on 127.0.0.1, the HA acceptor's too: RocketMQ 5.5.0 binds that
    one to every interface, the HA jar on each broker's classpath binds it to brokerIP2."""
    jar = find_ha_jar()
    assert jar is not None, "the HA jar is not built: make rocketmq-ha-loopback"
    assert _listening_by_node(cluster) == _loopback_only(cluster)
    for b in cluster.brokers:
        classpath = b.argv[b.argv.index("-cp") + 1]
        assert classpath.endswith(f"{os.pathsep}{jar}")
        assert "messageStorePlugIn" not in _conf(b)  # a lone master needs no plugin
    namesrv_argv = cluster.namesrv_node.argv
    assert str(jar) not in namesrv_argv[namesrv_argv.index("-cp") + 1]


def test_create_topic_then_routed_to_every_master(cluster: RocketMQCluster) -> None:
    cluster.create_topic("local-cluster-t1", queues=3)
    assert cluster.route("local-cluster-t1") == {b.name: {0: b.addr} for b in cluster.brokers}
    assert cluster.route("local-cluster-unknown") == {}


def test_pause_hangs_a_broker_and_resume_brings_it_back(cluster: RocketMQCluster) -> None:
    b = cluster.broker("broker-b")
    assert b.pid is not None
    assert call(b.addr, request(RequestCode.GET_BROKER_RUNTIME_INFO), 10.0).code == 0
    b.pause()
    try:
        _until(lambda: psutil.Process(b.pid).status() == psutil.STATUS_STOPPED, 10, "SIGSTOP")
        with pytest.raises(TimeoutError):  # the kernel still accepts; nothing answers
            call(b.addr, request(RequestCode.GET_BROKER_RUNTIME_INFO), 1.0)
    finally:
        b.resume()
    assert call(b.addr, request(RequestCode.GET_BROKER_RUNTIME_INFO), 10.0).code == 0
    assert b.running


def test_kill_then_start_brings_a_broker_back_to_the_route(cluster: RocketMQCluster) -> None:
    cluster.create_topic("local-cluster-t2")
    b = cluster.broker("broker-a")
    old_pid, old_addr = b.pid, b.addr
    b.kill()
    assert not b.running
    # the NameServer drops a broker when its connection closes
    _until(lambda: "broker-a" not in cluster.route(DEFAULT_TOPIC), 30, "broker-a to leave")
    b.start(timeout=120)
    assert (b.addr, b.running) == (old_addr, True)
    assert b.pid != old_pid
    assert cluster.route(DEFAULT_TOPIC)["broker-a"] == {0: old_addr}
    cluster.wait_routed("local-cluster-t2", timeout=30)  # its topics came back with it


# --- clusters of their own ------------------------------------------------------------


def test_leaving_the_block_after_an_exception_leaves_no_jvm() -> None:
    procs: list[psutil.Process] = []
    with pytest.raises(RuntimeError, match="boom"), RocketMQCluster(brokers=1) as c:
        procs = [psutil.Process(n.pid) for n in c.nodes if n.pid is not None]
        data_dir = c.data_dir
        raise RuntimeError("boom")
    assert len(procs) == 2
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive
    assert not data_dir.exists()


def test_jvms_die_with_their_python_parent_even_by_sigkill(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from qclient.engines.rocketmq.local import RocketMQCluster
        c = RocketMQCluster(brokers=0, data_dir={str(tmp_path)!r}).start()
        print(c.namesrv_node.pid, flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the child printed {line!r}"
        jvm = psutil.Process(int(line))
        assert jvm.is_running()
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        _, alive = psutil.wait_procs([jvm], timeout=10)
        assert not alive
    finally:
        parent.kill()
        parent.wait(10)


def test_starting_a_cluster_runs_no_python_in_a_forked_child() -> None:
    """A forked child that runs Python (a preexec_fn) frees the other threads' thread-locals
    and their finalizers shut down sockets it shares with this process: a Spark driver lost
    its py4j connection so. The JVMs are spawned through an exec'd wrapper instead."""

    def preexec_fn_elsewhere() -> None:  # the control: the canary sees such a child
        subprocess.run(["true"], preexec_fn=lambda: None, check=True, timeout=30)

    with _thread_local_canary() as carries:
        runner = threading.Thread(target=preexec_fn_elsewhere)
        runner.start()
        runner.join(30)
        assert not carries(), "a preexec_fn child left the canary's socket working"

    with _thread_local_canary() as carries, RocketMQCluster(brokers=0) as c:
        assert carries(), "starting the cluster shut down a socket of this process"
        for node in c.nodes:  # the pid is the JVM's: the wrapper exec'd it
            assert node.pid is not None
            jvm = psutil.Process(node.pid)
            assert (jvm.cmdline(), jvm.ppid()) == (node.argv, os.getpid())


def test_die_with_parent_wraps_a_command_in_the_same_process() -> None:
    """The wrapped command keeps the wrapper's pid, ignores no signal (CPython ignores
    SIGPIPE and SIGXFSZ, which exec would pass on), and does not start when its parent is
    not the one named."""
    show = "echo $$; grep '^SigIgn:' /proc/self/status"
    proc = subprocess.Popen(
        die_with_parent(["/bin/sh", "-c", show]), stdout=subprocess.PIPE, text=True
    )
    out = proc.communicate(timeout=30)[0]
    pid, ignored = out.splitlines()[:2]
    assert (int(pid), proc.returncode) == (proc.pid, 0)
    ignored_by_python = 1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)
    assert int(ignored.split()[1], 16) & ignored_by_python == 0
    orphan = subprocess.run(die_with_parent(["/bin/true"], parent=1), timeout=30, check=False)
    assert orphan.returncode == 126


def test_a_broker_that_lost_its_port_gets_new_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker whose port another process took before it bound retries on new ports: its
    BindException is hundreds of lines before its log ends (the shutdown hooks')."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        picks: list[tuple[int, int]] = []

        def first_taken() -> tuple[int, int]:
            pair = broker_ports()
            picks.append((port, pair[1]) if not picks else pair)
            return picks[-1]

        monkeypatch.setattr(cluster_module, "broker_ports", first_taken)
        with RocketMQCluster(brokers=1, startup_timeout=240) as c:
            b = c.broker("broker-a")
            assert len(picks) == 2
            assert b.port == picks[1][0] != port
            assert c.route(DEFAULT_TOPIC) == {"broker-a": {0: b.addr}}
            log = b.log_path.read_text(errors="replace")
            assert log.count("java.net.BindException: Address already in use") == 1


def test_a_broker_that_exits_at_boot_is_named_with_its_log() -> None:
    c = RocketMQCluster(brokers=1, broker_options={"brokerRole": "SLAVE"})  # slaves need id > 0
    try:
        with pytest.raises(ClusterError, match=r"^broker broker-a exited with code") as err:
            c.start()
        assert "brokerId must be > 0" in str(err.value)
        assert not c.namesrv_node.running
        # a failed start keeps the temporary data dir for the log its error names
        assert f"log {c.data_dir / 'broker-a.log'}: " in str(err.value)
        assert (c.data_dir / "broker-a.log").exists()
    finally:
        shutil.rmtree(c.data_dir, ignore_errors=True)


def test_a_broker_never_routed_times_out_naming_it_and_its_log(tmp_path: Path) -> None:
    # it boots, but registers with a NameServer that is not there
    c = RocketMQCluster(
        brokers=1,
        data_dir=tmp_path,
        broker_options={"namesrvAddr": "127.0.0.1:1"},
        startup_timeout=8,
    )
    with pytest.raises(ClusterError, match=r"^broker broker-a not ready after 8 s") as err:
        c.start()
    assert f"log {tmp_path / 'broker-a.log'}: " in str(err.value)
    assert not any(n.running for n in c.nodes)


def test_missing_jars_is_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LIB_ENV, str(tmp_path))
    c = RocketMQCluster(brokers=1)
    with pytest.raises(ClusterError) as err:
        c.start()
    assert str(err.value) == f"no Apache RocketMQ jars in {tmp_path}: {SETUP_HINT}"
    assert c.namesrv_node.pid is None
    assert not c.data_dir.exists()


def test_missing_java_is_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ClusterError, match=r"^java not found: run `make setup`") as err:
        RocketMQCluster(brokers=1).start()
    assert "\n" not in str(err.value)


def test_a_second_start_maps_the_class_data_archive_the_first_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NameServer alone: a broker takes the same path, and its clean stop (the writer's)
    takes ~20 s."""
    lib = tmp_path / "lib"  # the jars, with no archive beside them yet
    lib.mkdir()
    for jar in find_lib().glob("*.jar"):
        (lib / jar.name).symlink_to(jar)
    monkeypatch.setenv(LIB_ENV, str(lib))
    with RocketMQCluster(brokers=0) as c:
        assert c.namesrv_node.writes_archive
    # the teardown stopped the writer cleanly (not the kill a temporary store gets)
    assert [p.name.split("-")[0] for p in (lib / ".cds").iterdir()] == ["NamesrvStartup"]
    with RocketMQCluster(brokers=0) as c:
        node = c.namesrv_node
        assert not node.writes_archive
        assert f"-XX:SharedArchiveFile={lib / '.cds'}" in " ".join(node.argv)
        maps = Path(f"/proc/{node.pid}/maps").read_text()
        assert str(lib / ".cds") in maps, "the NameServer did not map its archive"


def test_replicas_elect_a_new_master_when_the_master_is_killed() -> None:
    with RocketMQCluster(brokers=1, replicas=2) as c:
        group = c.replicas["broker-a"]
        assert [n.name for n in group] == ["broker-a-0", "broker-a-1"]
        master = c.broker("broker-a")
        (slave,) = [n for n in group if n is not master]
        route = c.route(DEFAULT_TOPIC)["broker-a"]
        assert route[0] == master.addr
        assert slave.addr in [addr for i, addr in route.items() if i != 0]
        assert c.sync_state()["broker-a"] == (master.addr, {master.addr, slave.addr})
        for node in group:
            assert not _unapplied(node), f"{node.name} did not apply them"
            assert _conf(node)["messageStorePlugIn"] == HA_PLUGIN  # binds the HA port
        # the controller and every replica's HA acceptor too: the slave replicates through
        # the master's, on 127.0.0.1
        assert _listening_by_node(c) == _loopback_only(c)

        master.kill()
        _until(
            lambda: c.route(DEFAULT_TOPIC).get("broker-a", {}).get(0) == slave.addr,
            30,
            "the controller to elect the slave",
        )
        assert c.brokers == [slave]
        c.create_topic("replicas-t1")  # on the new master
        master.start(timeout=120)  # it comes back as a slave
        c.wait_in_sync(60)
        route = c.route(DEFAULT_TOPIC)["broker-a"]
        assert route[0] == slave.addr
        assert master.addr in route.values()
        assert _listening_by_node(c) == _loopback_only(c)


def test_replicas_outside_1_to_9_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"replicas must be 1\.\.9, got 0"):
        RocketMQCluster(brokers=1, replicas=0)
