"""Steal (``/proc/stat``) over a window: time this VM's vCPUs were ready to run and the
hypervisor did not run them.

It is not only other guests' load. On the 2-vCPU VM these benchmarks run on, a workload
that sleeps and wakes often collects it by itself: on an otherwise idle VM, a TCP
ping-pong between two threads showed 34-39 % steal and an fdatasync loop 10-23 %, where
two spinning processes showed 0.2-1.2 %; and one workload's steal varies from minute to
minute with the host. So a lateness round reports it as a condition of that round (of
the host, and of how the measured system sleeps), beside its figures.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["StealMeter"]

_STAT = Path("/proc/stat")
_STEAL = 7  # the 8th number of the "cpu" line: steal, in clock ticks


def _ticks() -> list[int] | None:
    try:
        line = _STAT.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = line.split()
    if fields[0] != "cpu" or len(fields) <= _STEAL + 1:
        return None
    return [int(x) for x in fields[1:]]


class StealMeter:
    """``with StealMeter() as m: ...`` then ``m.pct``: steal as % of all CPU time in the
    window (every CPU), or None where the kernel does not report it."""

    def __init__(self) -> None:
        self._start: list[int] | None = None
        self.pct: float | None = None

    def __enter__(self) -> StealMeter:
        self._start = _ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        end = _ticks()
        if self._start is None or end is None:
            return
        delta = [b - a for a, b in zip(self._start, end, strict=False)]
        total = sum(delta)
        if total > 0:
            self.pct = round(100 * delta[_STEAL] / total, 1)
