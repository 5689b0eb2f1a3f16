"""Scheduled messages counted by deliver second, for the broker's "due within" gauge.

Counts change with the events that change what is scheduled -- a schedule entry replayed
(a new message, +1 at its deliver time; a cancel, -1; a reschedule, both) and a message
fired (-1) -- so a scrape never scans the messages: it sums per-minute totals and, for
the minute a bound falls in, that minute's per-second counts -- only for the minutes up
to the last bound (the minutes are kept sorted; all further ones are in one total). At
open the store counts
what recovery left scheduled once (:func:`count_at_open`) and the events follow from
there. Resolution is one second: a message due in second ``S`` is "due within ``x``
seconds" when ``S <= now's second + x``; overdue messages count in every bound.

Memory: one 60-slot array per minute that has scheduled messages (~600 bytes), so at
most ~35 MB for messages spread over every minute of the 40-day maximum delay.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Sequence

from qclient.server.store import record as rec
from qclient.server.store.files import StoreFiles
from qclient.server.store.schedule_log import ENTRY
from qclient.server.store.wheel import Wheel

__all__ = ["DUE_BOUNDS_S", "DueCounts", "count_at_open"]

#: the gauge's bounds, seconds from now (``+Inf``, every scheduled message, comes last)
DUE_BOUNDS_S = (5, 60, 300, 900, 3600, 14400, 28800, 86400)

_ZERO_MINUTE = bytes(60 * 8)


class DueCounts:
    """Scheduled messages per deliver second (thread-safe; one lock per call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[int, array[int]] = {}  # minute -> its 60 seconds' counts
        self._totals: dict[int, int] = {}  # minute -> the sum of its seconds
        self._minutes: list[int] = []  # the minutes with counts, sorted
        self._all = 0  # every count

    def add(self, deliver_ats: Sequence[int], sign: int = 1) -> None:
        """``sign`` (+1 or -1) for each deliver time (epoch ms) of ``deliver_ats``."""
        if not deliver_ats:
            return
        lo, hi = min(deliver_ats) // 1000, max(deliver_ats) // 1000
        with self._lock:
            if lo == hi:  # a batch sent with one delay: one second
                self._bump(lo, sign * len(deliver_ats))
            else:
                for second, n in Counter(d // 1000 for d in deliver_ats).items():
                    self._bump(second, sign * n)

    def add_seconds(self, counts: Iterable[tuple[int, int]]) -> None:
        """Add ``(second, count)`` pairs."""
        with self._lock:
            for second, n in counts:
                self._bump(second, n)

    def _bump(self, second: int, n: int) -> None:
        minute, i = divmod(second, 60)
        arr = self._seconds.get(minute)
        if arr is None:
            arr = self._seconds[minute] = array("q", _ZERO_MINUTE)
            insort(self._minutes, minute)
        arr[i] += n
        self._all += n
        total = self._totals.get(minute, 0) + n
        if total == 0 and not any(arr):
            del self._seconds[minute]
            self._totals.pop(minute, None)
            del self._minutes[bisect_left(self._minutes, minute)]
        else:
            self._totals[minute] = total

    def within(self, now_ms: int, bounds_s: Sequence[int] = DUE_BOUNDS_S) -> list[int]:
        """Messages due within each of ``bounds_s`` (ascending) seconds from ``now_ms``,
        then all of them: cumulative counts, ``len(bounds_s) + 1`` of them."""
        now_s = now_ms // 1000
        limits = [now_s + b for b in bounds_s]  # the last second each bound takes in
        n = len(limits)
        inc = [0] * (n + 1)  # whole minutes, by the first bound that takes them in
        partial = [0] * n  # minutes a bound cuts: their seconds up to it, for that bound
        with self._lock:
            minutes = self._minutes
            # minutes past the last bound count only in the total: not looked at
            stop = bisect_left(minutes, limits[-1] // 60 + 1) if limits else 0
            totals = self._totals
            everything = self._all
            for idx in range(stop):
                minute = minutes[idx]
                total = totals[minute]
                first = minute * 60
                j = bisect_left(limits, first + 59)  # the first bound past the minute
                inc[j] += total
                k = j - 1
                while k >= 0 and limits[k] >= first:
                    partial[k] += sum(self._seconds[minute][: limits[k] - first + 1])
                    k -= 1
        out = []
        running = 0
        for j in range(n):
            running += inc[j]
            out.append(max(0, running + partial[j]))
        out.append(max(0, everything))
        return out


def count_at_open(due: DueCounts, wheel: Wheel, files: StoreFiles) -> None:
    """Count what recovery left scheduled into ``due``: the wheel's entries (the loaded
    buckets) and the schedule entries of the buckets not loaded yet, each position once,
    less the cancelled (and fired) ones. Call before the store's threads start."""
    counts: Counter[int] = Counter()
    bucket_ms = wheel.bucket_ms
    for key in wheel.heap:
        d = key >> 64
        pos = (key >> 24) & ((1 << 40) - 1)
        if not wheel.is_cancelled(d // bucket_ms, pos):
            counts[d // 1000] += 1
    for b in sorted(wheel.unloaded):
        seen: set[int] = set()
        cancelled = set(wheel.cancelled.get(b, ()))
        cancelled.update(files.dlog.positions(b))  # (fired: none, as the bucket is ahead)
        entries = list(ENTRY.iter_unpack(files.slog.read(b)))
        cancelled.update(pos for _d, pos, _s, kind in entries if kind == rec.KIND_CANCEL)
        for d, pos, _size, kind in entries:
            if kind == rec.KIND_MESSAGE and pos not in cancelled and pos not in seen:
                seen.add(pos)
                counts[d // 1000] += 1
    due.add_seconds(counts.items())
