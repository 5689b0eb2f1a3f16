"""CPU time the hypervisor took from this VM (``steal`` in ``/proc/stat``) over a window.

On a shared VM, neighbours' load shows up here, not in our processes' CPU time: a
latency figure measured while 20 % of the machine was stolen is a figure of the host,
so each lateness round reports the share stolen during it.
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
