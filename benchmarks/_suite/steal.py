"""Steal over a window: time this VM's vCPUs were ready to run and the hypervisor did not
run them (``psutil.cpu_times().steal``, from ``/proc/stat``).

It is not only other guests' load. On the 2-vCPU VM these benchmarks run on, a workload
that sleeps and wakes often collects it by itself: on an otherwise idle VM, a TCP
ping-pong between two threads showed 34-39 % steal and an fdatasync loop 10-23 %, where
two spinning processes showed 0.2-1.2 %; and one workload's steal varies from minute to
minute with the host. So a lateness round reports it as a condition of that round (of
the host, and of how the measured system sleeps), beside its figures.
"""

from __future__ import annotations

from typing import Any

import psutil

__all__ = ["StealMeter"]


class StealMeter:
    """``with StealMeter() as m: ...`` then ``m.pct``: steal as % of all CPU time in the
    window (every CPU), or None where the kernel does not report it."""

    def __init__(self) -> None:
        self._start: Any = None
        self.pct: float | None = None

    def __enter__(self) -> StealMeter:
        self._start = psutil.cpu_times()
        return self

    def __exit__(self, *exc: object) -> None:
        end = psutil.cpu_times()
        if not hasattr(end, "steal"):  # not Linux
            return
        total = sum(end) - sum(self._start)
        if total > 0:
            self.pct = round(100 * (end.steal - self._start.steal) / total, 1)
