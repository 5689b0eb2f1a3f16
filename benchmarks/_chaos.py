"""Parts of the chaos bench: the ledger of what callers saw, the consumer-group members
(child processes), and the nemesis that injects faults on a seeded schedule."""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from qclient import LocalCluster, SendResult
from qclient.cluster import NodeHandle

TOPIC = "chaos"
GROUP = "chaos-members"


class Clock:
    """Seconds since the run began (monotonic)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.wall0 = time.time()

    def __call__(self) -> float:
        return time.monotonic() - self.t0

    def wall_ms(self, t: float) -> float:
        """Epoch ms of bench time ``t``."""
        return (self.wall0 + t) * 1000


@dataclass
class Ledger:
    """Every acknowledgement, every error that reached a caller, every send's latency."""

    clock: Clock
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: dict[str, tuple[int, str, float]] = field(default_factory=dict)  # deliver, broker, t
    #: every acknowledgement of each id (a re-sent id has several): broker, bench time
    acks: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    sends: list[tuple[float, float, str]] = field(default_factory=list)  # t, latency ms, kind
    errors: list[tuple[float, str, str]] = field(default_factory=list)  # t, kind, error type
    error_texts: list[str] = field(default_factory=list)  # the first lines, same order
    failed_messages: int = 0
    resent: set[str] = field(default_factory=set)
    recent: list[tuple[str, int]] = field(default_factory=list)  # ids to re-send on purpose

    def ok(self, kind: str, start: float, results: list[SendResult]) -> None:
        end = self.clock()
        with self.lock:
            self.sends.append((start, (end - start) * 1000, kind))
            for r in results:
                self.acked.setdefault(r.msg_id, (r.deliver_at_ms, r.broker_name, end))
                self.acks.setdefault(r.msg_id, []).append((r.broker_name, end))
                if len(self.recent) < 500:
                    self.recent.append((r.msg_id, r.deliver_at_ms))
                else:
                    self.recent[hash(r.msg_id) % 500] = (r.msg_id, r.deliver_at_ms)

    def fail(self, kind: str, start: float, exc: BaseException, n: int = 1) -> None:
        end = self.clock()
        with self.lock:
            self.sends.append((start, (end - start) * 1000, kind))
            self.errors.append((end, kind, type(exc).__name__))
            self.error_texts.append(str(exc).splitlines()[0][:200] if str(exc) else "")
            self.failed_messages += n

    def pick_resend(self, rng: random.Random, min_deliver_ms: int) -> tuple[str, int] | None:
        """An acknowledged id still due later than ``min_deliver_ms``, to send again."""
        with self.lock:
            if not self.recent:
                return None
            mid, deliver = self.recent[rng.randrange(len(self.recent))]
            if deliver < min_deliver_ms:
                return None
            self.resent.add(mid)
            return mid, deliver


@dataclass
class Receipt:
    msg_id: str
    broker: str
    queue: int
    offset: int
    deliver_at_ms: int
    fired_at_ms: int
    received_ms: int
    body_ok: bool
    t: float  # bench clock when read


class Members:
    """Consumer-group members as child processes; ``join()`` starts one, ``die()``
    SIGKILLs one (at least one stays), ``close()`` stops all."""

    def __init__(self, namesrv: str, clock: Clock, session_s: float) -> None:
        self.namesrv = namesrv
        self.clock = clock
        self.session_s = session_s
        self.receipts: list[Receipt] = []
        self.errors = 0
        self._procs: list[subprocess.Popen[str]] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def alive(self) -> list[subprocess.Popen[str]]:
        return [p for p in self._procs if p.poll() is None]

    def join(self) -> None:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks._chaos_member",
                self.namesrv,
                TOPIC,
                GROUP,
                str(self.session_s),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._procs.append(proc)
        t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        t.start()
        self._threads.append(t)

    def die(self, rng: random.Random) -> bool:
        alive = self.alive()
        if len(alive) < 2:
            return False
        victim = alive[rng.randrange(len(alive))]
        victim.kill()
        victim.wait(10)
        return True

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if parts and parts[0] == "R" and len(parts) == 9:
                r = Receipt(
                    parts[1],
                    parts[2],
                    int(parts[3]),
                    int(parts[4]),
                    int(parts[5]),
                    int(parts[6]),
                    int(parts[7]),
                    parts[8] == "1",
                    self.clock(),
                )
                with self._lock:
                    self.receipts.append(r)
            elif parts and parts[0] == "E":
                self.errors += 1

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for t in self._threads:
            t.join(5)


@dataclass
class Band:
    """One fault, from its start to its end (bench clock), and how long recovery took."""

    kind: str
    target: str
    t0: float
    t1: float = -1.0
    recovery_s: float | None = None  # time the restart took (until it served again)
    #: what the engine's state was as it began (RocketMQ: the group's master, in-sync set)
    info: dict[str, Any] = field(default_factory=dict)


#: the nemesis' actions and their weights: broker faults dominate, as in production
ACTIONS = {
    "kill": 3,
    "pause": 3,
    "stop": 2,
    "namesrv": 1,
    "member_join": 1,
    "member_die": 1,
}


class Nemesis(threading.Thread):
    """Faults on a seeded schedule, overlapping, never every broker at once -- except one
    planned all-down of ``all_down_s`` at ``all_down_at`` s."""

    def __init__(
        self,
        cluster: LocalCluster,
        members: Members,
        clock: Clock,
        *,
        seed: int,
        until: float,
        gap_s: tuple[float, float],
        all_down_at: float,
        all_down_s: float,
        min_faults: int = 0,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.cluster = cluster
        self.members = members
        self.clock = clock
        self.rng = random.Random(seed)
        self.until = until
        self.gap_s = gap_s
        self.all_down_at = all_down_at
        self.all_down_s = all_down_s
        #: faults to make before stopping, past ``until`` if need be (until halted)
        self.min_faults = min_faults
        self.bands: list[Band] = []
        self.events: list[tuple[float, str]] = []
        self.failures: list[str] = []  # a restart that did not come back
        self._pending: list[tuple[float, Band, Callable[[], None]]] = []
        self._faulty: set[str] = set()  # brokers (and "namesrv") under a fault now
        self._halt = threading.Event()

    def halt(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # reported, and the run's checks still run
            self.failures.append(f"nemesis: {type(exc).__name__}: {exc}")
        finally:
            self.heal()

    def _loop(self) -> None:
        rng = self.rng
        next_at = self.clock() + rng.uniform(*self.gap_s)
        all_down_done = self.all_down_s <= 0
        while not self._halt.is_set():
            now = self.clock()
            self._run_due(now)
            if not all_down_done and now >= self.all_down_at:
                self._all_down()
                all_down_done = True
                next_at = self.clock() + rng.uniform(*self.gap_s)
            elif now >= next_at and (now < self.until or len(self.bands) < self.min_faults):
                self._act()
                next_at = self.clock() + rng.uniform(*self.gap_s)
            elif now >= self.until and not self._pending and len(self.bands) >= self.min_faults:
                return
            self._halt.wait(0.05)

    def _run_due(self, now: float) -> None:
        due = [p for p in self._pending if p[0] <= now]
        self._pending = [p for p in self._pending if p[0] > now]
        for _, band, undo in due:
            self._end(band, undo)

    def _end(self, band: Band, undo: Callable[[], None]) -> None:
        t = time.monotonic()
        try:
            undo()
        except Exception as exc:
            self.failures.append(f"{band.kind} {band.target}: {type(exc).__name__}: {exc}")
        band.recovery_s = round(time.monotonic() - t, 3)
        band.t1 = self.clock()
        self._faulty.discard(band.target)
        self.events.append((band.t1, f"{band.target} back"))

    def _start(self, kind: str, target: str, action: Callable[[], None]) -> Band:
        t0 = self.clock()  # a clean stop takes a while: the fault begins with it
        action()
        band = Band(kind, target, t0)
        self.bands.append(band)
        self.events.append((band.t0, f"{kind} {target}"))
        self._faulty.add(target)
        return band

    def _act(self) -> None:
        rng = self.rng
        kind = rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        now = self.clock()
        if kind == "member_join":
            self.members.join()
            self.events.append((now, "member joins"))
            return
        if kind == "member_die":
            if self.members.die(rng):
                self.events.append((now, "member killed"))
            return
        if kind == "namesrv":
            if "namesrv" in self._faulty:
                return
            ns = self.cluster.namesrv_node
            # a crash or a clean stop
            band = self._start("namesrv", "namesrv", rng.choice([ns.kill, ns.stop]))
            self._pending.append((now + rng.uniform(2.0, 5.0), band, ns.start))
            return
        up = [b for b in self.cluster.brokers if b.name not in self._faulty]
        if len(up) < 2:
            return  # never every broker at once
        victim = up[rng.randrange(len(up))]
        if kind == "kill":
            band = self._start("kill", victim.name, victim.kill)
            self._pending.append((now + rng.uniform(1.0, 4.0), band, victim.start))
        elif kind == "pause":
            band = self._start("pause", victim.name, victim.pause)
            self._pending.append((now + rng.uniform(1.0, 5.0), band, victim.resume))
        else:
            band = self._start("stop", victim.name, victim.stop)
            self._pending.append((now + rng.uniform(1.0, 3.0), band, victim.start))

    def _all_down(self) -> None:
        for _, band, undo in self._pending:
            if band.target != "namesrv":
                self._end(band, undo)
        self._pending = [p for p in self._pending if p[1].target == "namesrv"]
        brokers = self.cluster.brokers
        bands = [self._start("all_down", b.name, b.kill) for b in brokers]
        self._halt.wait(self.all_down_s)
        t = time.monotonic()
        with ThreadPoolExecutor(len(brokers)) as pool:
            for b, exc in zip(brokers, pool.map(_try_start, brokers), strict=True):
                if exc:
                    self.failures.append(f"all_down restart {b.name}: {exc}")
        took = round(time.monotonic() - t, 3)
        for band in bands:
            band.t1, band.recovery_s = self.clock(), took
            self._faulty.discard(band.target)
        self.events.append((self.clock(), "all brokers back"))

    def heal(self) -> None:
        """End every fault still on (also on failure): nothing stays paused or down."""
        pending, self._pending = self._pending, []
        for _, band, undo in pending:
            self._end(band, undo)
        nodes: list[NodeHandle] = [*self.cluster.brokers, self.cluster.namesrv_node]
        for node in nodes:
            with contextlib.suppress(Exception):
                node.resume()
            if not node.running:
                err = _try_start(node)
                if err:
                    self.failures.append(f"heal {node.name}: {err}")


#: a restarted broker's deadline to serve: a bound against a hang. Three brokers replaying
#: their stores at once after the all-down took over 30 s (the default) at load 35
START_TIMEOUT_S = 120.0


def _try_start(node: NodeHandle) -> str | None:
    try:
        node.start(timeout=START_TIMEOUT_S)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def faults_at(bands: list[Band], t: float, end: float, before: float = 0.0) -> set[str]:
    """Kinds of the faults on at any time in ``[t - before, t]`` (open bands end at ``end``)."""
    return {b.kind for b in bands if b.t0 <= t and (b.t1 if b.t1 >= 0 else end) >= t - before}


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p * len(s)))], 1)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": pct(values, 0.5),
        "p99_ms": pct(values, 0.99),
        "max_ms": round(max(values), 1) if values else 0.0,
    }
