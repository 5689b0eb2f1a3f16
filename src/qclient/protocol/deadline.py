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

#: a broker refuses a request only this long after its deadline: the clock skew between
#: sender and broker it tolerates. NTP keeps hosts within a few ms of each other on a LAN
#: and tens of ms over the internet; 100 ms is more than that, and more than the 50 ms by
#: which the async driver's cap may outlast an attempt's timeout. A broker further ahead
#: refuses only requests that reach it in the last (skew - 100 ms) of their attempt: a
#: definite refusal, retried elsewhere, never a loss. A larger margin would let a paused
#: broker store more requests nobody waits for any longer (extra copies): in the chaos
#: soak, 2.3 such copies per pause at 500 ms against 0.9 at 100 ms
#: (docs/decisions/0014-send-deadline.md).
DEADLINE_SKEW_MS = 100


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
