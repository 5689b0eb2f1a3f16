"""``FaultItem`` and ``LatencyFaultTolerance``: the per-broker fault table (RocketMQ's
LatencyFaultToleranceImpl)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FaultItem", "FaultItemSnapshot", "LatencyFaultTolerance"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FaultItem:
    """What the producer knows of one broker's health. Times are ``time.monotonic()``."""

    name: str
    current_latency: float = 0.0  # ms of the last attempt
    start_timestamp: float = 0.0  # isolated until then
    check_stamp: float = 0.0  # next probe by the detector
    reachable: bool = True

    def is_available(self, now: float) -> bool:
        return now >= self.start_timestamp

    def update_not_available_duration(self, duration_ms: float, now: float) -> None:
        """Extend the isolation to ``now + duration`` if that is later (never shortens)."""
        until = now + duration_ms / 1000.0
        if duration_ms > 0 and until > self.start_timestamp:
            self.start_timestamp = until
            log.info("broker %s isolated for %.0f ms", self.name, duration_ms)


@dataclass(frozen=True, slots=True)
class FaultItemSnapshot:
    """A copy of a ``FaultItem`` for ``Producer.fault_items()``.

    ``isolated_until`` is wall-clock epoch seconds, or ``None`` when not isolated.
    """

    name: str
    current_latency_ms: float
    available: bool
    reachable: bool
    isolated_until: float | None


class LatencyFaultTolerance:
    """The fault table. Updates replace a few fields of one item; the lock only guards
    creation and removal of items, so readers on the hot path never wait."""

    def __init__(self, timer: Callable[[], float] = time.monotonic) -> None:
        self._items: dict[str, FaultItem] = {}
        self._lock = threading.Lock()
        self.timer = timer
        # cheap "everything healthy" test for the hot path: no item isolated past this
        # time, and no item unreachable (kept conservative: a stale True costs only the
        # slow path once)
        self._isolated_until = 0.0
        self._any_unreachable = False

    def after_fork_in_child(self) -> None:
        """A fresh lock in a forked child (the parent's threads may have held it)."""
        self._lock = threading.Lock()

    def _note(self, item: FaultItem) -> None:
        if item.start_timestamp > self._isolated_until:
            self._isolated_until = item.start_timestamp
        if not item.reachable:
            self._any_unreachable = True
        elif self._any_unreachable:
            self._any_unreachable = any(not i.reachable for i in list(self._items.values()))

    def all_healthy(self) -> bool:
        """True when no broker is isolated or unreachable (no allocation, no lock)."""
        return not self._any_unreachable and self.timer() >= self._isolated_until

    def update_fault_item(
        self, name: str, current_latency: float, not_available_duration: float, reachable: bool
    ) -> None:
        now = self.timer()
        item = self._items.get(name)
        if item is None:
            with self._lock:
                item = self._items.setdefault(name, FaultItem(name))
        item.current_latency = current_latency
        if not_available_duration > 0:
            item.update_not_available_duration(not_available_duration, now)
        elif reachable and not item.is_available(now):
            # Better than RocketMQ: a fast answer ends the isolation at once.
            item.start_timestamp = now
            log.info("broker %s answered in %.0f ms; isolation ended", name, current_latency)
        if item.reachable != reachable:
            item.reachable = reachable
            if not reachable:
                log.info("broker %s is unreachable; not used until it is reachable", name)
        self._note(item)

    def is_available(self, name: str) -> bool:
        item = self._items.get(name)
        return item is None or item.is_available(self.timer())

    def unhealthy(self) -> tuple[set[str], set[str]]:
        """``(not available, not reachable)`` broker names, right now."""
        now = self.timer()
        unavailable: set[str] = set()
        unreachable: set[str] = set()
        for item in list(self._items.values()):
            if now < item.start_timestamp:
                unavailable.add(item.name)
            if not item.reachable:
                unreachable.add(item.name)
        return unavailable, unreachable

    def items(self) -> list[FaultItem]:
        return list(self._items.values())

    def get(self, name: str) -> FaultItem | None:
        return self._items.get(name)

    def remove(self, name: str) -> None:
        with self._lock:
            if self._items.pop(name, None) is not None:
                log.info("broker %s left the route; fault item dropped", name)
            self._any_unreachable = any(not i.reachable for i in self._items.values())

    def snapshot(self) -> list[FaultItemSnapshot]:
        now = self.timer()
        wall = time.time()
        out = []
        for item in sorted(self._items.values(), key=lambda i: i.name):
            available = item.is_available(now)
            out.append(
                FaultItemSnapshot(
                    name=item.name,
                    current_latency_ms=item.current_latency,
                    available=available,
                    reachable=item.reachable,
                    isolated_until=None if available else wall + (item.start_timestamp - now),
                )
            )
        return out

    def detect_round(
        self,
        resolve: Callable[[str], str | None],
        probe: Callable[[str, float], bool],
        *,
        interval: float,
        timeout: float,
    ) -> int:
        """One detector pass: probe each isolated or unreachable broker that is due.

        A broker that answers is reachable again and its isolation ends; one that does
        not is marked unreachable (RocketMQ only ever sets the flag, PR #11146) and kept
        isolated until the next probe can decide. Items of brokers that left every route
        are dropped. Returns the number of probes made.
        """
        probes = 0
        for item in self.items():
            addr = resolve(item.name)
            if addr is None:
                self.remove(item.name)
                continue
            now = self.timer()
            if item.is_available(now) and item.reachable:
                continue
            if now < item.check_stamp:
                continue
            item.check_stamp = now + interval
            probes += 1
            ok = probe(addr, timeout)
            now = self.timer()
            if ok:
                if not item.reachable or not item.is_available(now):
                    log.info("broker %s answers its health probe; back in use", item.name)
                item.reachable = True
                item.start_timestamp = min(item.start_timestamp, now)
                self._note(item)
            else:
                if item.reachable:
                    log.info("broker %s fails its health probe; unreachable", item.name)
                item.reachable = False
                # stay isolated at least until the next probe has had its chance
                item.start_timestamp = max(item.start_timestamp, now + interval + timeout)
                self._note(item)
        return probes
