"""Cumulative histograms the store fills on its hot paths (fire lateness, fsync time).

Observations are counted per batch under one lock hold; ``/metrics`` reads a snapshot
at scrape time. The bucket bounds live here, in each histogram's own unit.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

__all__ = ["FSYNC_BOUNDS_S", "LATENESS_BOUNDS_MS", "Histogram"]

#: fired_at - deliver_at, milliseconds: the firing goal is tens of ms, alerts at seconds
LATENESS_BOUNDS_MS: tuple[float, ...] = (
    1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
)  # fmt: skip
#: one fsync/fdatasync, seconds: SSDs take well under a ms, slow disks tens of ms
FSYNC_BOUNDS_S: tuple[float, ...] = (
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


class Histogram:
    """Counts per bucket (``value <= bound``, plus +Inf), their sum and count."""

    __slots__ = ("_counts", "_lock", "_sum", "bounds")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def observe_many(self, values: Sequence[float]) -> None:
        """One lock hold for a batch of observations."""
        bounds = self.bounds
        where = [bisect.bisect_left(bounds, v) for v in values]
        total = sum(values)
        with self._lock:
            counts = self._counts
            for i in where:
                counts[i] += 1
            self._sum += total

    def snapshot(self) -> tuple[list[int], float]:
        """Cumulative counts per bound (the last is +Inf, the total count), and the sum."""
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        cumulative = []
        running = 0
        for c in counts:
            running += c
            cumulative.append(running)
        return cumulative, total
