"""The send deadline: the wall-clock time after which a sender no longer waits for an
attempt's answer, and the broker's rule for refusing a request that arrives (or is still
queued) after it (no I/O here).

A sender that gave up on an attempt retries elsewhere; a broker that stored the stale
request anyway (it was paused, or the request sat in its socket buffer) would hold a
second copy. So the sender puts ``deadline_ms`` on every send request and the broker
stores nothing of a request once :func:`expired` says so.

Wall clocks of the sender and the broker are assumed NTP-synchronised within
:data:`DEADLINE_SKEW_MS` (the broker already relies on its wall clock for due times).
"""

from __future__ import annotations

import time

__all__ = ["DEADLINE_SKEW_MS", "attempt_deadline_ms", "expired", "refuse_after_ms"]

#: a broker refuses a request only this long after its deadline. It covers the clock
#: skew between sender and broker: a broker whose clock runs ahead must not refuse
#: requests its sender still waits for. NTP keeps hosts within tens of ms of each other
#: (single ms on a LAN); 500 ms is ten times that, and still half of the shortest usual
#: attempt timeout (1 s), so most of a stale request's life past its deadline is refused.
DEADLINE_SKEW_MS = 500


def attempt_deadline_ms(timeout_s: float, now_s: float | None = None) -> int:
    """The ``deadline_ms`` of an attempt starting now (wall clock, Unix ms) that waits up
    to ``timeout_s`` for its answer."""
    start = time.time() if now_s is None else now_s
    return int((start + timeout_s) * 1000.0) + 1  # rounded up: never before the real end


def refuse_after_ms(deadline_ms: int) -> int:
    """The broker's wall-clock time (Unix ms) after which it stores nothing of a request
    with ``deadline_ms``."""
    return deadline_ms + DEADLINE_SKEW_MS


def expired(deadline_ms: int | None, now_ms: int) -> bool:
    """Whether a broker must refuse a request with ``deadline_ms`` at ``now_ms`` (its own
    wall clock); None: no deadline, never expired."""
    return deadline_ms is not None and now_ms > refuse_after_ms(deadline_ms)
