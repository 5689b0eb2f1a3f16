"""The suite's resource budget: what may run at once on a 2-core host, and its report.

The rule (docs/TESTING.md): at most one RocketMQ cluster and one Spark driver alive at any
moment. Every test that starts a JVM is marked ``jvm`` and runs in one of two
pytest-xdist groups, so one worker runs each group's tests one after another while the
other workers run the Python-only tests:

- ``rocketmq``: every test that starts RocketMQ JVMs (a NameServer and brokers, RocketMQ's
  Java client beside them), Spark on RocketMQ included: one cluster at a time;
- ``spark``: the Spark tests on our engine (a local session, a Connect server, a
  standalone master and worker).

The two groups' workers share the Spark driver through ``spark_slot`` (a lock file on the
host), taken by whatever starts Spark, so a Spark test on RocketMQ waits for the other
worker's module to end rather than run a second driver beside it.

A test states its group with ``pytest.mark.jvm("rocketmq" | "spark")`` (a module's
``pytestmark``, or one parameter's marks); a test under ``tests/spark/`` is in ``spark``,
and a ``[rocketmq]`` parameter of a two-engine test in ``rocketmq``, unmarked.

The controller process samples the host's JVMs every second for the whole run and prints
the peak of each kind at the end; more than one RocketMQ NameServer (each cluster has
exactly one) or Spark driver at once, or a JVM that appears while no JVM test runs, fails
the run, naming the tests that were running then, so a change that breaks the budget
cannot land unseen.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import pytest

#: the xdist groups of the tests that start JVMs
JVM_GROUPS = ("rocketmq", "spark")

#: the folder whose every test starts Spark (or shares a module's session)
_SPARK_DIR = "tests/spark/"

#: the limits: each RocketMQ cluster has one NameServer; each Spark deployment one driver
LIMITS = {"rocketmq-namesrv": 1, "spark-driver": 1}

#: the host-wide lock that the one Spark driver holds (both JVM workers start Spark)
SPARK_LOCK = Path(tempfile.gettempdir()) / "qclient-tests-spark.lock"

#: a sample reads /proc for every process (15-20 ms of CPU with the suite's ~300): at 0.2 s
#: that was ~100 of a run's ~2,000 CPU seconds; every JVM of the budget lives for seconds
_SAMPLE_S = 1.0


def jvm_group(item: pytest.Item) -> str | None:
    """The JVM group of ``item`` (see the module's docstring), or None: no JVM."""
    nodeid = item.nodeid.split("@", 1)[0]
    if "[rocketmq" in nodeid:
        return "rocketmq"
    mark = item.get_closest_marker("jvm")
    if mark is not None:
        group = mark.args[0] if mark.args else "rocketmq"
        if group not in JVM_GROUPS:
            raise pytest.UsageError(f"{nodeid}: pytest.mark.jvm({group!r}): not in {JVM_GROUPS}")
        return str(group)
    return "spark" if nodeid.startswith(_SPARK_DIR) else None


_T = TypeVar("_T")


class OneAtATime(Generic[_T]):
    """A JVM resource (a cluster, a NameServer) shared by the tests that may share it:
    started by ``start`` on first use, stopped by ``stop`` on ``release`` -- which a test
    that starts JVMs of its own calls first, so two are never alive at once."""

    def __init__(self, start: Callable[[], _T], stop: Callable[[_T], object]) -> None:
        self._start, self._stop = start, stop
        self._value: _T | None = None

    def get(self) -> _T:
        if self._value is None:
            self._value = self._start()
        return self._value

    def release(self) -> None:
        value, self._value = self._value, None
        if value is not None:
            self._stop(value)


@contextlib.contextmanager
def spark_slot() -> Iterator[None]:
    """Hold the host's one Spark driver while the block runs (waits for the holder). A
    wait of the run is noted (``WAITS_ENV``): a JVM group's worker waiting here is idle on
    the run's longest chain."""
    with SPARK_LOCK.open("a") as f:
        started = time.monotonic()
        fcntl.flock(f, fcntl.LOCK_EX)
        _note_wait(time.monotonic() - started)
        try:
            yield
        finally:
            _wait_for_drivers_gone(DRIVER_EXIT_S)
            fcntl.flock(f, fcntl.LOCK_UN)


#: how long the slot's holder waits, on release, for the drivers it started to exit: a
#: bound against a hang, not a speed goal
DRIVER_EXIT_S = 120.0


def _wait_for_drivers_gone(timeout: float) -> None:
    """Wait until no Spark driver JVM is alive on the host (the slot's holder started any
    there is). A driver whose Python parent exits without waiting for it (a script's
    session: PySpark's gateway JVM ends on its own once its stdin closes) was seen still
    alive, on a host with a busy core, when the next holder's Connect server started."""
    deadline = time.monotonic() + timeout
    while "spark-driver" in _jvms().values() and time.monotonic() < deadline:
        time.sleep(0.2)


#: the file where a run's workers note their waits for the Spark slot (set by the controller)
WAITS_ENV = "QCLIENT_TEST_SPARK_WAITS"


def _note_wait(seconds: float) -> None:
    path = os.environ.get(WAITS_ENV)
    if path and seconds >= 0.5:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ", 1)[0]
        with open(path, "a") as f:
            f.write(f"{seconds:.1f} {test}\n")


def _waits_report(path: Path) -> list[str]:
    """One line on the run's waits for the Spark slot (the longest named)."""
    try:
        rows = [line.split(" ", 1) for line in path.read_text().splitlines() if line]
    except FileNotFoundError:
        rows = []  # no worker waited half a second
    except OSError:
        return []
    if not rows:
        return ["Spark slot: no test waited for it"]
    waits = sorted(((float(s), t) for s, t in rows), reverse=True)
    total = sum(s for s, _ in waits)
    longest = ", ".join(f"{t} {s:.0f} s" for s, t in waits[:3])
    return [f"Spark slot: {len(waits)} waits, {total:.0f} s in all; longest: {longest}"]


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        sampler = JvmSampler(grouped=config.getoption("dist", "no") == "loadgroup")
        config.stash[_SAMPLER] = sampler
        global _ledger
        _ledger = config.stash[_LEDGER] = CpuLedger()
        sampler.start()
        # the workers it starts inherit the variable; a run of its own file
        waits = Path(tempfile.gettempdir()) / f"qclient-tests-spark-waits-{os.getpid()}"
        waits.unlink(missing_ok=True)
        os.environ[WAITS_ENV] = str(waits)
        config.stash[_WAITS] = waits


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put every JVM test in its group, ahead of any group a module names (the closest
    ``xdist_group`` mark is the one pytest-xdist reads); mark it ``jvm``, so that
    ``-m "not jvm"`` leaves it out. Then order the run (``run_order``)."""
    for item in items:
        group = jvm_group(item)
        if group is not None:
            if item.get_closest_marker("jvm") is None:
                item.add_marker(pytest.mark.jvm(group))
            item.add_marker(pytest.mark.xdist_group(group), append=False)
    sharing = config.stash[_SHARING] = _sharing_modules(items)
    run_order(items, sharing)


#: the marker of a module that shares the RocketMQ cluster only for some tests (conftest)
SHARES_MARK = "shares_rocketmq_cluster"
#: the node ids of the modules that share it, found once at collection
_SHARING = pytest.StashKey[set[str]]()
#: the controller's file of Spark slot waits (``spark_slot``)
_WAITS = pytest.StashKey[Path]()


def _sharing_modules(items: list[pytest.Item]) -> set[str]:
    """The modules (node ids) one of whose tests asks for ``rocketmq_cluster``, or that
    are marked ``SHARES_MARK``."""
    out: set[str] = set()
    for item in items:
        module = item.getparent(pytest.Module)
        if module is not None and (
            "rocketmq_cluster" in getattr(item, "fixturenames", ())
            or module.get_closest_marker(SHARES_MARK) is not None
        ):
            out.add(module.nodeid)
    return out


def shares_rocketmq_cluster(module: pytest.Item | pytest.Collector) -> bool:
    """Whether the tests of ``module`` use the shared RocketMQ cluster."""
    return module.nodeid in module.config.stash.get(_SHARING, set())


def run_order(items: list[pytest.Item], sharing: set[str]) -> None:
    """Reorder ``items``: the JVM groups first, ``rocketmq`` then ``spark``, then every
    other test. A group runs on one worker, one test after another: the longest chain of
    the run, so it must start at once. Inside ``rocketmq`` the modules that share its
    cluster (``sharing``) run one after another, before the modules that start clusters
    of their own: the shared cluster then starts once, instead of again after each module
    that stopped it (a start costs 5-10 s). The order of the tests of one module is kept."""

    def key(pair: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        index, item = pair
        group = jvm_group(item)
        if group is None:
            return (len(JVM_GROUPS), 0, index)
        module = item.getparent(pytest.Module)
        own = group == "rocketmq" and (module is None or module.nodeid not in sharing)
        return (JVM_GROUPS.index(group), int(own), index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


_CPU_START = pytest.StashKey[float]()
#: the user property that carries a test's CPU seconds to the controller (and the JUnit report)
CPU_PROPERTY = "cpu_s"


def _cpu_now() -> float:
    """CPU seconds of this process and of every child it has reaped (a child's own reaped
    children included: a Spark driver's Python workers, a cluster's JVMs once stopped)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Record the CPU a test cost, set-up and teardown included (a module fixture's cluster
    is paid by its first test's set-up and its last test's teardown)."""
    item.stash[_CPU_START] = _cpu_now()
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if call.when != "teardown":
        return
    start = item.stash.get(_CPU_START, None)
    if start is not None:  # the default makereport, after this one, copies the properties
        item.user_properties.append((CPU_PROPERTY, round(_cpu_now() - start, 2)))


@dataclass
class CpuLedger:
    """The controller's sum of the CPU seconds its tests reported, by group and module."""

    by_group: Counter[str] = field(default_factory=Counter)
    by_module: Counter[str] = field(default_factory=Counter)
    #: the host's busy and total CPU seconds at the start (``/proc/stat``), if readable
    host_start: tuple[float, float] | None = field(default_factory=lambda: _host_cpu())

    def add(self, nodeid: str, cpu_s: float) -> None:
        test, _, group = nodeid.partition("@")
        self.by_group[group if group in JVM_GROUPS else "python"] += cpu_s
        self.by_module[test.split("::", 1)[0]] += cpu_s

    def report(self, wall_s: float) -> list[str]:
        total = sum(self.by_group.values())
        if not total:
            return []
        groups = ", ".join(f"{g} {s:,.0f}" for g, s in self.by_group.most_common())
        heavy = ", ".join(f"{m} {s:,.0f}" for m, s in self.by_module.most_common(8))
        lines = [
            f"CPU: {total:,.0f} s in tests ({groups}), {wall_s:,.0f} s wall on "
            f"{os.cpu_count()} cores; heaviest modules: {heavy}"
        ]
        now = _host_cpu()
        if self.host_start is not None and now is not None:
            busy, all_ = now[0] - self.host_start[0], now[1] - self.host_start[1]
            lines.append(
                f"  the host's CPU over the run: {busy:,.0f} s busy of {all_:,.0f} "
                f"({busy / max(all_, 1e-9):.0%}; everything on the host, processes no test "
                "waited for included, which the sums above miss)"
            )
        return lines


def _host_cpu() -> tuple[float, float] | None:
    """The host's busy and total CPU seconds since boot (``/proc/stat``'s cpu line)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    total = sum(fields[:8])  # guest time is counted in user already
    return (total - idle) / tick, total / tick


_LEDGER = pytest.StashKey[CpuLedger]()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    ledger = _ledger
    if ledger is None or report.when != "teardown":
        return
    for key, value in report.user_properties:
        if key == CPU_PROPERTY:
            ledger.add(report.nodeid, float(value))


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    sampler = _current
    if sampler is not None:
        with sampler.lock:
            sampler.running.add(nodeid)


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    sampler = _current
    if sampler is not None:
        with sampler.lock:
            sampler.running.discard(nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    sampler = session.config.stash.get(_SAMPLER, None)
    if sampler is None:
        return
    sampler.stop()
    if sampler.over_budget() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    sampler = terminalreporter.config.stash.get(_SAMPLER, None)
    if sampler is None:
        return
    for line in sampler.report():
        terminalreporter.write_line(line)
    ledger = terminalreporter.config.stash.get(_LEDGER, None)
    if ledger is not None:
        for line in ledger.report(time.monotonic() - sampler.started):
            terminalreporter.write_line(line)
    waits = terminalreporter.config.stash.get(_WAITS, None)
    if waits is not None:
        for line in _waits_report(waits):
            terminalreporter.write_line(line)
        waits.unlink(missing_ok=True)


def _kind(cmdline: str) -> str:
    """What a JVM is, from its command line."""
    if "NamesrvStartup" in cmdline:
        return "rocketmq-namesrv"
    if "BrokerStartup" in cmdline:
        return "rocketmq-broker"
    if "ControllerStartup" in cmdline:
        return "rocketmq-controller"
    if "org.apache.spark.launcher.Main" in cmdline:
        # spark-submit's launcher: it prints the driver's command line and exits, and on a
        # loaded host its JVM may still be exiting when the driver it launched starts
        return "spark-launcher"
    if "org.apache.spark.deploy.SparkSubmit" in cmdline:
        # a local session's or an application's driver, or a Connect server (its own driver)
        return "spark-driver"
    if "org.apache.spark" in cmdline:
        return "spark-other"  # standalone master and worker, executors
    if "qclient-java-peer" in cmdline:
        return "java-peer"
    return "other"


def _jvms() -> dict[int, str]:
    """The JVMs alive on the host now: pid -> kind (read from /proc)."""
    kinds: dict[int, str] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "java":
                continue
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        kinds[int(pid)] = _kind(raw.replace(b"\0", b" ").decode(errors="replace"))
    return kinds


@dataclass
class JvmSampler:
    """Samples the host's JVMs and load in a daemon thread; keeps the peaks."""

    peak: Counter[str] = field(default_factory=Counter)
    peak_total: int = 0
    peak_load: float = 0.0
    #: the tests running when the 1-min load reached its peak
    peak_load_tests: list[str] = field(default_factory=list)
    #: kind -> (count, the tests running when it was first seen over its limit)
    over: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    #: whether tests carry xdist's ``@group`` suffix (``--dist loadgroup``)
    grouped: bool = False
    #: JVMs that appeared while no test of the jvm group was running: kind -> tests
    strays: dict[str, list[str]] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)
    #: when the run started (monotonic seconds)
    started: float = field(default_factory=time.monotonic)

    def start(self) -> None:
        global _current
        _current = self
        if not os.path.isdir("/proc"):
            return
        self._thread = threading.Thread(target=self._run, name="jvm-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        jvms = _jvms()
        kinds = Counter(jvms.values())
        self.peak_total = max(self.peak_total, len(jvms))
        with self.lock:
            running = sorted(self.running)
        for pid in jvms.keys() - self._seen:
            if jvms[pid] == "other":  # `java -version` probes, Maven: not a test's JVM
                continue
            if self.grouped and not any(t.rsplit("@", 1)[-1] in JVM_GROUPS for t in running):
                self.strays.setdefault(jvms[pid], running)
        self._seen = set(jvms)
        for kind, n in kinds.items():
            self.peak[kind] = max(self.peak[kind], n)
            limit = LIMITS.get(kind)
            if limit is not None and n > limit and kind not in self.over:
                self.over[kind] = (n, running)
        load = os.getloadavg()[0]
        if load > self.peak_load:
            self.peak_load, self.peak_load_tests = load, running

    def over_budget(self) -> bool:
        return bool(self.over or self.strays)

    def report(self) -> list[str]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.peak.items())) or "none"
        lines = [
            f"JVM budget: peak {self.peak_total} JVMs at once ({kinds}); "
            f"peak 1-min load {self.peak_load:.1f} on {os.cpu_count()} cores",
        ]
        if self.peak_load_tests:
            lines.append(f"  running at the peak load: {', '.join(self.peak_load_tests)}")
        for kind, (n, tests) in sorted(self.over.items()):
            lines.append(
                f"JVM budget exceeded: {n} {kind} at once (limit {LIMITS[kind]}) "
                f"while running: {', '.join(tests) or 'no test (a fixture)'}"
            )
        for kind, tests in sorted(self.strays.items()):
            lines.append(
                f"JVM budget: a {kind} started while no JVM test ran; running: "
                f"{', '.join(tests) or 'no test (a fixture)'}; mark the test jvm"
            )
        return lines


_SAMPLER = pytest.StashKey[JvmSampler]()
#: the controller's sampler, for the log hooks (they get no config)
_current: JvmSampler | None = None
#: the controller's CPU ledger, for the report hook (it gets no config)
_ledger: CpuLedger | None = None
