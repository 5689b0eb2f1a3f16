"""The chaos bench on a replicated Apache RocketMQ 5 cluster (2 broker groups, each a
master and a slave in controller mode, the controller inside the NameServer): a monitor of
who is master and who is in sync, and the nemesis that kills, pauses and cleanly stops
masters and slaves and restarts the NameServer.

The nemesis' rules: at most ``MAX_NODES_DOWN`` broker JVMs under a fault at once (so both
replicas of both groups are never down together) and at most one fault open on a group's
master (a second master fault while the first group is without a master would leave no
group to write to whenever a slave is out of sync, which RocketMQ never elects); a
restarted or resumed JVM counts as under its fault until it is in its SyncStateSet again
(within ``IN_SYNC_WAIT_S``); one NameServer fault at a time, and the next only once every
group is routed again. Each
fault runs on its own thread: a clean stop and a restart take seconds (RocketMQ's
shutdown hooks, a broker's registration), and the schedule goes on meanwhile.
"""

from __future__ import annotations

import bisect
import contextlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks._chaos import TOPIC, Band, Clock, Members
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.engines.rocketmq.local.node import JvmNode

#: broker JVMs under a fault at once, at most (of 4)
MAX_NODES_DOWN = 2
#: the nemesis' actions and their weights, as on qclient's engine
ACTIONS = {
    "kill": 3,
    "pause": 3,
    "stop": 2,
    "namesrv": 1,
    "member_join": 1,
    "member_die": 1,
}
#: how long each fault lasts before its undo (s, uniform)
HOLD_S = {"kill": (1.0, 4.0), "pause": (1.0, 6.0), "stop": (1.0, 3.0), "namesrv": (2.0, 5.0)}
#: the first actions, so even a short run hits every role with every fault kind
OPENING = [
    "kill:master",
    "pause:slave",
    "kill:slave",
    "namesrv",
    "pause:master",
    "stop:slave",
    "stop:master",
]
#: a restarted JVM's deadline to serve (a broker: routed by the NameServer; one started
#: while the NameServer is down waits for it, then registers within 10 s)
START_TIMEOUT_S = 150.0
#: how long a restarted or resumed broker JVM may take to be in its SyncStateSet again
#: before the nemesis counts it as healthy anyway
IN_SYNC_WAIT_S = 60.0
#: how long a NameServer fault stays open after the restart, waiting for every group's
#: route (RocketMQCluster's brokers register every 10 s)
ROUTES_BACK_S = 60.0


@dataclass(slots=True, frozen=True)
class Sample:
    """The cluster as the NameServer and the controller had it at bench time ``t``:
    group -> address routed as id 0 (None: none, or no answer), and group -> (the
    controller's master, the SyncStateSet)."""

    t: float
    routed: dict[str, str | None]
    synced: dict[str, tuple[str | None, frozenset[str]]]


class Monitor(threading.Thread):
    """Samples the route of the chaos topic and the controller's sync state every
    ``interval`` s until ``stop()``; ``at(t)`` is the last sample at or before ``t``."""

    def __init__(self, cluster: RocketMQCluster, clock: Clock, interval: float = 0.25) -> None:
        super().__init__(name="rmq-monitor", daemon=True)
        self.cluster = cluster
        self.clock = clock
        self.interval = interval
        self.samples: list[Sample] = []
        self._times: list[float] = []
        self._quit = threading.Event()
        self.names = {n.addr: n.name for g in cluster.replicas.values() for n in g}

    def stop(self) -> None:
        self._quit.set()

    def run(self) -> None:
        while not self._quit.is_set():
            self.sample()
            self._quit.wait(self.interval)

    def sample(self) -> Sample:
        t = self.clock()
        # a busy NameServer may take a second or more to answer: {} means no answer
        route = self.cluster.route(TOPIC, timeout=3.0)
        state = self.cluster.sync_state()
        groups = list(self.cluster.replicas)
        s = Sample(
            t,
            {g: route.get(g, {}).get(0) for g in groups},
            {g: (m, frozenset(ss)) for g, (m, ss) in state.items()},
        )
        self.samples.append(s)
        self._times.append(t)
        return s

    def at(self, t: float) -> Sample | None:
        i = bisect.bisect_right(self._times, t)
        return self.samples[i - 1] if i else None

    def after(self, t: float, cond: Callable[[Sample], bool]) -> float | None:
        """Seconds from ``t`` to the first sample at or after it where ``cond`` holds."""
        i = bisect.bisect_left(self._times, t)
        for s in self.samples[i:]:
            if cond(s):
                return round(s.t - t, 2)
        return None

    def master(self, group: str) -> str | None:
        """The group's master now: the controller's, else the routed one."""
        s = self.samples[-1] if self.samples else self.sample()
        return s.synced.get(group, (None, frozenset()))[0] or s.routed.get(group)

    def describe(self, s: Sample | None, group: str) -> dict[str, Any]:
        """A group's state in a sample, by node name."""
        if s is None:
            return {}
        master, in_sync = s.synced.get(group, (None, frozenset()))
        return {
            "routed_master": self.names.get(s.routed.get(group) or "", s.routed.get(group)),
            "controller_master": self.names.get(master or "", master),
            "in_sync": sorted(self.names.get(a, a) for a in in_sync),
        }

    def changes(self) -> list[tuple[float, str]]:
        """An event for each change of a group's routed master or SyncStateSet."""
        out: list[tuple[float, str]] = []
        prev: dict[str, Any] = {}
        for s in self.samples:
            for g in self.cluster.replicas:
                d = self.describe(s, g)
                if prev.get(g) != d:
                    out.append((round(s.t, 2), f"{g}: {d}"))
                    prev[g] = d
        return out


class RmqNemesis(threading.Thread):
    """Faults on a seeded schedule (``OPENING`` first, then random), each on its own
    thread, within the module's rules; ``heal()`` ends them all."""

    def __init__(
        self,
        cluster: RocketMQCluster,
        members: Members,
        monitor: Monitor,
        clock: Clock,
        *,
        seed: int,
        until: float,
        gap_s: tuple[float, float],
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.cluster = cluster
        self.members = members
        self.monitor = monitor
        self.clock = clock
        self.rng = random.Random(seed)
        self.until = until
        self.gap_s = gap_s
        self.bands: list[Band] = []
        self.events: list[tuple[float, str]] = []
        self.failures: list[str] = []
        self.skipped = 0  # actions the rules refused when their turn came
        self._lock = threading.Lock()
        self._faulty: dict[str, str] = {}  # node name (or "namesrv") -> role under a fault
        self._workers: list[threading.Thread] = []
        self._halt = threading.Event()

    def halt(self) -> None:
        """No new faults; those on end now (their holds are cut short)."""
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
        plan = list(OPENING)
        next_at = self.clock() + rng.uniform(*self.gap_s)
        while not self._halt.is_set() and self.clock() < self.until:
            if self.clock() >= next_at:
                if plan:
                    if self._act(plan[0]):
                        plan.pop(0)
                else:
                    kind = rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
                    role = rng.choice(["master", "slave"])
                    whole = kind in ("namesrv", "member_join", "member_die")
                    self._act(kind if whole else f"{kind}:{role}")
                next_at = self.clock() + rng.uniform(*self.gap_s)
            self._halt.wait(0.05)

    def _act(self, action: str) -> bool:
        """Start ``action`` (``kind:role``, ``namesrv``, ``member_*``) if the rules allow;
        False when they do not now."""
        now = self.clock()
        if action == "member_join":
            self.members.join()
            self.events.append((now, "member joins"))
            return True
        if action == "member_die":
            if self.members.die(self.rng):
                self.events.append((now, "member killed"))
            return True
        if action == "namesrv":
            return self._namesrv()
        kind, role = action.split(":")
        with self._lock:
            victim = self._pick(role)
            if victim is None:
                self.skipped += 1
                return False
            self._faulty[victim.name] = role
        self._spawn(self._broker_fault, kind, role, victim)
        return True

    def _pick(self, role: str) -> JvmNode | None:
        """A broker JVM of ``role`` the rules allow a fault on now (under ``_lock``)."""
        brokers = [n for n in self._faulty if n != "namesrv"]
        if len(brokers) >= MAX_NODES_DOWN:
            return None
        if role == "master" and "master" in (self._faulty[n] for n in brokers):
            return None
        candidates = []
        for group, nodes in self.cluster.replicas.items():
            master = self.monitor.master(group)
            if master is None:
                continue  # who is master is not known now (the NameServer is down)
            for node in nodes:
                is_master = node.addr == master
                if node.name in self._faulty or not node.running or is_master != (role == "master"):
                    continue
                candidates.append(node)
        return candidates[self.rng.randrange(len(candidates))] if candidates else None

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=self._guard, args=(fn, *args), daemon=True)
        self._workers.append(t)
        t.start()

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self.failures.append(f"{fn.__name__}{args[:2]}: {type(exc).__name__}: {exc}")

    def _begin(self, kind: str, target: str, group: str | None) -> Band:
        t0 = self.clock()
        info: dict[str, Any] = {}
        if group is not None:
            info = self.monitor.describe(self.monitor.at(t0), group)
        band = Band(kind, target, t0, info=info)
        with self._lock:
            self.bands.append(band)
            self.events.append((t0, f"{kind} {target}"))
        return band

    def _end(self, band: Band, undo: Callable[[], None]) -> None:
        t = time.monotonic()
        try:
            undo()
        except Exception as exc:
            self.failures.append(f"{band.kind} {band.target}: {type(exc).__name__}: {exc}")
        band.recovery_s = round(time.monotonic() - t, 3)
        band.t1 = self.clock()
        with self._lock:
            self.events.append((band.t1, f"{band.target} back"))

    def _broker_fault(self, kind: str, role: str, node: JvmNode) -> None:
        band = self._begin(f"{kind}_{role}", node.name, node.group)
        action: Callable[[], None] = {"kill": node.kill, "pause": node.pause, "stop": node.stop}[
            kind
        ]
        action()  # a clean stop takes a while: the fault began with it
        self._halt.wait(self.rng.uniform(*HOLD_S[kind]))
        if kind == "pause":
            self._end(band, node.resume)
        else:
            self._end(band, lambda: node.start(timeout=START_TIMEOUT_S))
        # the node counts as under a fault until it is in its SyncStateSet again (bounded):
        # a fault on its group's other replica meanwhile would find no electable slave
        deadline = time.monotonic() + IN_SYNC_WAIT_S
        while time.monotonic() < deadline and not self._halt.is_set():
            _, in_sync = self.cluster.sync_state().get(node.group, (None, set()))
            if node.addr in in_sync:
                band.info["in_sync_after_s"] = round(self.clock() - band.t1, 2)
                break
            time.sleep(0.2)
        with self._lock:
            self._faulty.pop(node.name, None)

    def _namesrv(self) -> bool:
        with self._lock:
            if "namesrv" in self._faulty:
                return False
            self._faulty["namesrv"] = "namesrv"
        s = self.monitor.samples[-1] if self.monitor.samples else None
        if s is None or any(v is None for v in s.routed.values()):
            # the next outage only once every group is routed again
            with self._lock:
                self._faulty.pop("namesrv", None)
            self.skipped += 1
            return False
        self._spawn(self._namesrv_fault, self.rng.choice(["kill", "stop"]))
        return True

    def _namesrv_fault(self, how: str) -> None:
        ns = self.cluster.namesrv_node
        band = self._begin("namesrv", "namesrv", None)
        band.info = {"how": how}
        if how == "kill":
            ns.kill()
        else:
            ns.stop()
        self._halt.wait(self.rng.uniform(*HOLD_S["namesrv"]))
        self._end(band, lambda: ns.start(timeout=START_TIMEOUT_S))
        # open until the brokers registered again (bounded): the next outage waits for it
        deadline = time.monotonic() + ROUTES_BACK_S
        while time.monotonic() < deadline and not self._halt.is_set():
            route = self.cluster.route(TOPIC, timeout=3.0)
            if all(0 in route.get(g, {}) for g in self.cluster.replicas):
                break
            time.sleep(0.2)
        with self._lock:
            self._faulty.pop("namesrv", None)

    def heal(self) -> None:
        """End every fault (also on failure): wait for the fault threads (bounded), then
        resume and start whatever is still paused or down, and wait until every group
        has a routed master and every replica is in sync."""
        self._halt.set()
        deadline = time.monotonic() + START_TIMEOUT_S + 60
        for t in list(self._workers):
            t.join(max(0.1, deadline - time.monotonic()))
            if t.is_alive():
                self.failures.append(f"heal: fault thread {t.name} still running")
        for node in self.cluster.nodes:
            with contextlib.suppress(Exception):
                node.resume()
            if not node.running:
                try:
                    node.start(timeout=START_TIMEOUT_S)
                except Exception as exc:
                    self.failures.append(f"heal {node.name}: {type(exc).__name__}: {exc}")
        try:
            self.cluster.wait_in_sync(120)
            self.cluster.wait_routed(TOPIC, 120)
        except Exception as exc:
            self.failures.append(f"heal: {type(exc).__name__}: {exc}")
