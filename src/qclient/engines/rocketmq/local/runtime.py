"""What a local Apache RocketMQ JVM needs: java, the jars, its command line, its files.

No process is started here (see ``cluster.py``); these are pure helpers plus the few
look-ups of the environment (``java``, the lib directory, free loopback ports).

Every key written below was checked against the 5.5.0 jars: ``BrokerStartup -p`` prints
``BrokerConfig`` and the Netty configs, ``javap -p`` lists the fields of
``MessageStoreConfig`` and ``BrokerIdentity`` (brokerClusterName, brokerName, brokerId);
RocketMQ ignores an unknown key silently, so a typo would pass unnoticed. A broker echoes
every key it applied to its log at boot, which the tests compare against.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import qclient

from ....errors import ClusterError
from ... import ROCKETMQ_TIMER_MAX_DELAY_SEC

__all__ = [
    "BROKER_MAIN",
    "HA_JAR",
    "HA_PLUGIN",
    "LIB_ENV",
    "LOOPBACK",
    "NAMESRV_MAIN",
    "SETUP_HINT",
    "TIMER_MAX_DELAY_SEC",
    "TIMER_PRECISION_MS",
    "JvmSpec",
    "broker_config",
    "broker_ports",
    "controller_broker_options",
    "controller_namesrv_options",
    "die_with_parent",
    "find_ha_jar",
    "find_java",
    "find_lib",
    "free_port",
    "jvm_argv",
    "namesrv_config",
    "port_free",
    "write_logback",
    "write_properties",
]

NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
#: where the jars are when set; else ``<repo>/tools/rocketmq/lib`` next to the package
LIB_ENV = "QCLIENT_ROCKETMQ_LIB"
SETUP_HINT = "run `make setup` (needs java 17+ and mvn)"
#: RocketMQ 5.5.0 brokers bind their HA acceptor to the wildcard address, whatever the config
#: says; this jar (tools/rocketmq/ha-loopback, `make rocketmq-ha-loopback`) on a broker's
#: classpath binds it to brokerIP2: by itself for a lone master (its HAService is loaded from
#: META-INF/service), with HA_PLUGIN as messageStorePlugIn in controller mode
HA_JAR = "qclient-rocketmq-ha-loopback.jar"
HA_PLUGIN = "io.qclient.rocketmq.ha.BrokerIp2HAPlugin"
#: every RocketMQ process binds and advertises this address only
LOOPBACK = "127.0.0.1"
#: the longest timer delay the brokers accept (``timerMaxDelaySec``): the SDK's default
#: bound on this engine, so what it checks before sending and what the brokers enforce agree
TIMER_MAX_DELAY_SEC = ROCKETMQ_TIMER_MAX_DELAY_SEC
#: the timer wheel's slot (``timerPrecisionMs``: the broker accepts 100, 200, 500, 1000)
TIMER_PRECISION_MS = 100
_MIN_JAVA = 17
_MiB = 1024 * 1024


# --- java and the jars ----------------------------------------------------------------


@functools.cache
def _java_major(java: str) -> int | None:
    """The major version ``java -version`` reports, or None when it cannot say."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def find_java() -> str:
    """The ``java`` to run (``$JAVA_HOME/bin/java``, else the one on PATH), Java 17 or newer;
    ClusterError naming the fix otherwise."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else None
    if java is None or not os.access(java, os.X_OK):
        java = shutil.which("java")
    if java is None:
        raise ClusterError(f"java not found: {SETUP_HINT}")
    major = _java_major(java)
    if major is None or major < _MIN_JAVA:
        found = "unknown version" if major is None else f"Java {major}"
        raise ClusterError(f"{java} is {found}, RocketMQ 5 needs {_MIN_JAVA}+: {SETUP_HINT}")
    return java


def find_lib() -> Path:
    """The directory of the Apache RocketMQ jars (``$QCLIENT_ROCKETMQ_LIB``, else
    ``tools/rocketmq/lib`` of the checkout qclient is installed from); ClusterError naming
    the fix when the NameServer or broker jar is not there."""
    env = os.environ.get(LIB_ENV)
    if env:
        lib = Path(env)
    else:  # an editable install: <repo>/src/qclient/__init__.py
        lib = Path(qclient.__file__).resolve().parents[2] / "tools" / "rocketmq" / "lib"
    if not all(any(lib.glob(f"rocketmq-{m}-*.jar")) for m in ("namesrv", "broker")):
        raise ClusterError(f"no Apache RocketMQ jars in {lib}: {SETUP_HINT}")
    return lib


def missing() -> str | None:
    """Why RocketMQ processes cannot start here (no Java 17+, no jars: the one-line error
    naming the fix), or None when they can."""
    try:
        find_java()
        find_lib()
    except ClusterError as exc:
        return str(exc)
    return None


def find_ha_jar() -> Path | None:
    """The HA jar (``HA_JAR``) built in the checkout qclient is installed from, or None."""
    root = Path(qclient.__file__).resolve().parents[2]  # an editable install
    jar = root / "tools" / "rocketmq" / "ha-loopback" / "target" / HA_JAR
    return jar if jar.is_file() else None


# --- ports ----------------------------------------------------------------------------


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """True when ``host:port`` can be bound now (a hint: another process may take it)."""
    if not 0 < port < 65536:
        return False
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = LOOPBACK) -> int:
    """A port the kernel calls free now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def broker_ports(host: str = LOOPBACK, attempts: int = 100) -> tuple[int, int]:
    """``(listenPort, haListenPort)`` for a broker: the broker also opens its "fast"
    (VIP) remoting server on listenPort - 2, always (5.5.0 has no switch for it)."""
    for _ in range(attempts):
        port = free_port(host)
        if port > 1026 and port_free(port - 2, host):
            ha = free_port(host)
            if ha not in (port, port - 2):
                return port, ha
    raise ClusterError(f"no free pair of ports p, p-2 on {host} after {attempts} tries")


# --- config files ---------------------------------------------------------------------


def _prop(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def write_properties(path: Path, props: Mapping[str, Any]) -> None:
    """A Java properties file, one ``key=value`` a line (values need no escaping here:
    paths, numbers, names; a backslash or newline is refused)."""
    lines = []
    for key, value in props.items():
        text = _prop(value)
        if "\\" in text or "\n" in text or "\\" in key:
            raise ValueError(f"{key}={text!r}: backslashes and newlines are not supported")
        lines.append(f"{key}={text}\n")
    path.write_text("".join(lines), encoding="utf-8")


def namesrv_config(port: int, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A NameServer's properties: loopback only, on ``port``."""
    props: dict[str, Any] = {
        "listenPort": port,
        "bindAddress": LOOPBACK,
        # the NameServer's own client is pointed at <first non-loopback address>:port; its
        # scan thread would dial it every few seconds (and fail: we listen on loopback)
        "scanAvailableNameSrv": False,
    }
    props.update(overrides or {})
    return props


def broker_config(
    *,
    name: str,
    cluster: str,
    namesrv_addr: str,
    port: int,
    ha_port: int,
    store_dir: Path,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A lone master's properties (classic mode, brokerId 0): loopback only, a small
    store, the timer wheel at 100 ms, recall on, every ack on disk.

    A replica of a controller-mode group (RIP-44) starts from the same keys with
    ``controller_broker_options`` over them.
    """
    props: dict[str, Any] = {
        "brokerClusterName": cluster,
        "brokerName": name,
        "brokerId": 0,
        "namesrvAddr": namesrv_addr,
        "listenPort": port,
        "haListenPort": ha_port,
        "bindAddress": LOOPBACK,
        "brokerIP1": LOOPBACK,
        "brokerIP2": LOOPBACK,
        "storePathRootDir": str(store_dir),
        "storePathCommitLog": str(store_dir / "commitlog"),
        # small mapped files (defaults: 1 GiB commit log, 6 MB per consume queue, 100 MB
        # timer log, a 420 MB index): sparse, but a start maps and may pre-allocate them
        "mappedFileSizeCommitLog": 64 * _MiB,
        "mappedFileSizeConsumeQueue": 100_000 * 20,  # entries of 20 bytes
        "mappedFileSizeTimerLog": 16 * _MiB,
        "maxIndexNum": 200_000,
        "maxHashSlotNum": 50_000,
        "timerWheelEnable": True,
        "timerPrecisionMs": TIMER_PRECISION_MS,
        "timerMaxDelaySec": TIMER_MAX_DELAY_SEC,
        "recallMessageEnable": True,
        "autoCreateTopicEnable": True,
        "autoCreateSubscriptionGroup": True,
        # a lone master: an ack means the message is flushed to disk
        "flushDiskType": "SYNC_FLUSH",
        "brokerRole": "ASYNC_MASTER",
        # the default 200 ms sheds sends queued that long ([TIMEOUT_CLEAN_QUEUE]) on a
        # busy 2-core machine
        "waitTimeMillsInSendQueue": 1000,
        # a broker registers with the NameServers every 10 s (the least RocketMQ allows;
        # default 30 s): a restarted NameServer routes every broker again within 10 s
        "registerNameServerPeriod": 10_000,
        # the broker caps these at 90 / 85 %: above them it refuses writes, or (forcibly)
        # deletes commit log files; a test broker refuses rather than drop unread messages
        "diskSpaceWarningLevelRatio": 90,
        "diskMaxUsedSpaceRatio": 85,
        "diskSpaceCleanForciblyRatio": 85,
        "cleanFileForciblyEnable": False,
        # RocketMQ 5.5.0's transaction-metrics thread spins, never sleeping, until its first
        # flush is due (apache/rocketmq#10515, fixed upstream by #10517): a whole core for the
        # default 10 s after every broker start. At 1 s it spins 1 s and then writes one small
        # file a second
        "transactionMetricFlushInterval": 1000,
        # a fired timer message whose put into its topic fails is retried until stored;
        # by default (apache/rocketmq#8979) it is tried 3 times 50 ms apart and dropped,
        # and an acknowledged message is lost (a fenced replica, a busy page cache)
        "timerEnableRetryUntilSuccess": True,
    }
    props.update(overrides or {})
    return props


def controller_namesrv_options(port: int, store_dir: Path) -> dict[str, Any]:
    """NameServer keys that embed a controller (RIP-44): one DLedger peer listening on
    ``127.0.0.1:port``, the address brokers in controller mode take as ``controllerAddr``
    (the controller answers there, not on the NameServer's port)."""
    return {
        "enableControllerInNamesrv": True,
        "controllerDLegerGroup": "qclient",
        "controllerDLegerPeers": f"n0-{LOOPBACK}:{port}",
        "controllerDLegerSelfId": "n0",
        "controllerStorePath": str(store_dir),
        "mappedFileSize": 1 * _MiB,  # the controller's log files (default 1 GiB)
    }


def controller_broker_options(controller_addr: str) -> dict[str, Any]:
    """Broker keys of a replica in controller mode (RIP-44): the controller picks the
    master and assigns ids (brokerId and brokerRole here are placeholders it overrides);
    a write is acknowledged once every replica in the SyncStateSet has it."""
    return {
        "enableControllerMode": True,
        "controllerAddr": controller_addr,
        "brokerId": -1,
        "brokerRole": "SLAVE",
        "allAckInSyncStateSet": True,
        # a slave reports its offset every second and drops out of the SyncStateSet after
        # 5 s behind (defaults 5 s and 15 s: a 15 s window of acks waiting on a dead slave;
        # a heartbeat interval above the drop time would make the set flap)
        "haSendHeartbeatInterval": 1000,
        "haMaxTimeSlaveNotCatchup": 5000,
        # how often the master checks and the brokers sync it (defaults 5 s)
        "checkSyncStateSetPeriod": 1000,
        "syncBrokerMetadataPeriod": 1000,
        # a replica silent this long (5 heartbeats) is disconnected, which drops a hung
        # slave from the SyncStateSet; the catch-up check above does not while the master
        # has sent all it has (its writers all wait for that slave): with the default 20 s
        # every ack of the group waited 20 s for a SIGSTOPped slave
        "haHousekeepingInterval": 5000,
        # (timerEnableRetryUntilSuccess, in broker_config, matters most here: a restarted
        # replica is fenced, its store refusing writes, until its start-up with the
        # controller is done, 0.1-1 s after it turns master, 5 s more when the controller
        # elected it before its own election request did; its timer fires meanwhile)
    }


_LOGBACK = """<?xml version="1.0" encoding="UTF-8"?>
<!-- One log per node, appended to; the JVM's stdout/stderr go to the same file. -->
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <append>true</append>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5p [%t] %logger{{0}} - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


def write_logback(path: Path, log_file: Path) -> None:
    """A logback file (RocketMQ's shaded logback reads ``-Drmq.logback.configurationFile``)
    that writes everything to ``log_file``; without one the JVM would pick whichever
    ``rmq.*.logback.xml`` comes first on the classpath and log under ``~/logs``."""
    text = str(log_file)
    if any(c in text for c in "<>&\"'{}"):
        raise ValueError(f"log path {text!r} has characters logback files cannot hold")
    path.write_text(_LOGBACK.format(log=text), encoding="utf-8")


# --- the command line -----------------------------------------------------------------


class JvmSpec:
    """Heap sizes, extra flags and extra classpath entries (after the RocketMQ jars) of one
    kind of node. ``heap_mb`` is the most heap the JVM may take, ``initial_heap_mb`` what
    it starts with (default: all of it); the serial collector grows the heap as needed."""

    __slots__ = ("classpath", "direct_mb", "extra", "heap_mb", "initial_heap_mb")

    def __init__(
        self,
        heap_mb: int,
        direct_mb: int,
        extra: Sequence[str] = (),
        classpath: Sequence[Path] = (),
        initial_heap_mb: int | None = None,
    ) -> None:
        self.heap_mb = heap_mb
        self.initial_heap_mb = heap_mb if initial_heap_mb is None else initial_heap_mb
        self.direct_mb = direct_mb
        self.extra = tuple(extra)
        self.classpath = tuple(classpath)


#: extra JVM flags for every node, space-separated (e.g. a cheaper JIT for test suites)
JVM_OPTS_ENV = "QCLIENT_ROCKETMQ_JVM_OPTS"

#: The flags every node runs with. SerialGC: on this 2-core machine it started the
#: NameServer and brokers as fast as G1 or faster and keeps GC threads off the other
#: JVMs' cores. preferIPv4Stack: loopback sockets show as 127.0.0.1, not ::ffff:127.0.0.1.
#: tls.server.mode=disabled: the default "permissive" mode generates a self-signed
#: certificate at start (seconds of RSA key generation) for a TLS nobody uses here.
#: The add-opens: RocketMQ's reflection into the JDK (buffers, hessian in the controller).
_COMMON_FLAGS = (
    "-XX:+UseSerialGC",
    "-Djava.net.preferIPv4Stack=true",
    "-Dtls.server.mode=disabled",
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/sun.nio.ch=ALL-UNNAMED",
)


def jvm_argv(
    java: str,
    lib: Path,
    main: str,
    *,
    conf: Path,
    home: Path,
    logback: Path,
    spec: JvmSpec,
) -> list[str]:
    """The command line of one node: ``home`` is its user.home and rocketmq.home.dir
    (RocketMQ keeps ``~/store``, ``~/namesrv`` and ``~/logs`` defaults under them).
    ``$QCLIENT_ROCKETMQ_JVM_OPTS`` adds flags (the test suite's: a cheaper JIT)."""
    return [
        java,
        "-server",
        f"-Xms{min(spec.initial_heap_mb, spec.heap_mb)}m",
        f"-Xmx{spec.heap_mb}m",
        f"-XX:MaxDirectMemorySize={spec.direct_mb}m",
        *_COMMON_FLAGS,
        f"-Duser.home={home}",
        f"-Drocketmq.home.dir={home}",
        f"-Drmq.logback.configurationFile={logback}",
        *spec.extra,
        *os.environ.get(JVM_OPTS_ENV, "").split(),
        "-cp",
        os.pathsep.join([f"{lib}{os.sep}*", *map(str, spec.classpath)]),
        main,
        "-c",
        str(conf),
    ]


# --- dying with the parent ------------------------------------------------------------

#: The program ``die_with_parent`` puts before a command line, run by a fresh interpreter
#: (``python -I -S -c``): ``sys.argv[1]`` is the pid the child must not outlive, the rest
#: the command it becomes. It arms PR_SET_PDEATHSIG (option 1), which survives execv, checks
#: the parent did not die before that, and puts back the two signals CPython ignores at
#: startup (an ignored signal stays ignored across execv), as subprocess's
#: ``restore_signals`` does for a direct child.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
parent, argv = int(sys.argv[1]), sys.argv[2:]
if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
    print("prctl(PR_SET_PDEATHSIG):", os.strerror(ctypes.get_errno()), file=sys.stderr)
    os._exit(126)
if os.getppid() != parent:
    os._exit(126)
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
os.execv(argv[0], argv)
"""


def die_with_parent(argv: Sequence[str], parent: int | None = None) -> list[str]:
    """``argv`` run so that the kernel SIGKILLs it when its parent dies, even by SIGKILL:
    a wrapper that sets ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` then execs ``argv`` (the same
    process: its pid is the command's). ``parent`` is the pid of the process that starts it
    (default: this one); the wrapper exits with 126 when that one is already gone. Linux
    only: ``argv`` unchanged elsewhere, or without ``sys.executable``.

    The wrapper is a separate program, not a ``preexec_fn``: a preexec_fn runs Python in
    the forked child, which first clears the other threads' states there, so their
    thread-locals' finalizers run in the child; py4j's shut down (SHUT_RDWR) the sockets
    to the Spark JVM that the child shares with this process, and the Spark session of a
    driver loses its connection.

    The signal fires when the *thread* that forked the child ends, so the command must be
    started from a thread that lives as long as the process (``node.py`` starts every JVM
    on one such thread).
    """
    if not sys.platform.startswith("linux") or not sys.executable:
        return list(argv)
    pid = os.getpid() if parent is None else parent
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(pid), *argv]
