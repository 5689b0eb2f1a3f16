"""Delays and deliver times as whole milliseconds, checked, always rounded up.

A message must never be due before the time asked, and brokers count time in whole
milliseconds, so every conversion into ms rounds up
(docs/decisions/0018-rounding-to-milliseconds.md).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from .errors import InvalidMessageError

__all__ = ["delay_to_ms", "deliver_at_to_ms", "seconds_to_ms"]


#: a float's own error in ``seconds * 1000`` is far below this: not rounded up (1.1 s is
#: 1100 ms, not 1101)
_FLOAT_SLACK_MS = 0.001
_MICROSECOND = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def seconds_to_ms(seconds: float) -> int:
    """Seconds as whole milliseconds, rounded up: a message is never due before the time
    asked (rounding to the nearest could make it due up to half a millisecond early)."""
    return math.ceil(seconds * 1000 - _FLOAT_SLACK_MS)


def _timedelta_to_ms(td: timedelta) -> int:
    """``seconds_to_ms`` of a timedelta, exactly: from its whole microseconds."""
    return -(-(td // _MICROSECOND) // 1000)


def delay_to_ms(delay: Any, max_delay_ms: int) -> int:
    """A relative delay (seconds as a number, or a timedelta) in ms, checked."""
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise InvalidMessageError(
            f"delay must be seconds (float) or a timedelta, got {type(delay).__name__}"
        )
    if math.isnan(seconds) or seconds < 0:
        raise InvalidMessageError(f"delay must be >= 0, got {delay!r}")
    ms = _timedelta_to_ms(delay) if isinstance(delay, timedelta) else seconds_to_ms(seconds)
    if ms > max_delay_ms:
        raise InvalidMessageError(
            f"delay {seconds:.0f}s is beyond the maximum delay of {max_delay_ms // 1000}s"
        )
    return ms


def deliver_at_to_ms(deliver_at: Any, max_delay_ms: int, now_ms: int | None = None) -> int:
    """An absolute deliver time (aware datetime, or epoch seconds) in epoch ms, checked."""
    if isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
            raise InvalidMessageError(
                "deliver_at must be a timezone-aware datetime (naive times are ambiguous)"
            )
        ms = _timedelta_to_ms(deliver_at - _EPOCH)
    elif isinstance(deliver_at, int | float) and not isinstance(deliver_at, bool):
        if math.isnan(deliver_at) or math.isinf(deliver_at):
            raise InvalidMessageError(f"deliver_at must be finite, got {deliver_at!r}")
        ms = seconds_to_ms(deliver_at)
    else:
        raise InvalidMessageError(
            "deliver_at must be an aware datetime or epoch seconds, "
            f"got {type(deliver_at).__name__}"
        )
    if ms < 0:
        raise InvalidMessageError(f"deliver_at must not be before the epoch, got {deliver_at!r}")
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if ms - now > max_delay_ms:
        raise InvalidMessageError(
            f"deliver_at is {(ms - now) // 1000}s ahead, beyond the maximum delay of "
            f"{max_delay_ms // 1000}s"
        )
    return ms
