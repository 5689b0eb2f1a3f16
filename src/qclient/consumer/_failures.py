"""What a consumer group does with a message its handler could not process: the rules
both engines share (retry topic and dead-letter topic names, the backoff schedule, the
properties a dead-lettered copy carries, tag expressions).

A retry travels through the group's retry topic ``%RETRY%<group>`` and a message that has
used up its attempts goes to ``%DLQ%<group>``: RocketMQ's names, so a Java consumer of the
same group on RocketMQ sees the same topics. The default backoff is RocketMQ's own
schedule for a consumer's reconsume (delay levels 3 to 18: 10 s ... 2 h) and the default
limit its ``maxReconsumeTimes`` (16).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = [
    "DLQ_PREFIX",
    "MAX_ATTEMPTS",
    "PROP_ATTEMPTS",
    "PROP_ORIGIN_MSG_ID",
    "PROP_ORIGIN_TOPIC",
    "PROP_REASON",
    "RETRY_DELAYS",
    "RETRY_PREFIX",
    "FailurePolicy",
    "dlq_properties",
    "dlq_topic",
    "failure_policy",
    "parse_tags",
    "retry_topic",
    "tag_matches",
]

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

#: seconds before retry n (n = the attempt that failed): RocketMQ's reconsume schedule
RETRY_DELAYS: tuple[float, ...] = (
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)  # fmt: skip
#: deliveries to one group before ``retry_later`` dead-letters instead (``maxReconsumeTimes``)
MAX_ATTEMPTS = 16

#: properties of a dead-lettered copy (``ReceivedMessage.properties`` of a DLQ read); the
#: first two are the names RocketMQ 5's broker gives them, so Java tools read them too
PROP_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROP_ORIGIN_MSG_ID = "DLQ_ORIGIN_MESSAGE_ID"
PROP_ATTEMPTS = "QCLIENT_DLQ_ATTEMPTS"
PROP_REASON = "QCLIENT_DLQ_REASON"

_MAX_REASON = 1024  # characters of a reason kept (a property, not a log)


def retry_topic(group: str) -> str:
    """The group's retry topic."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """The group's dead-letter topic."""
    return DLQ_PREFIX + group


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(f"{what} must be seconds or a timedelta, got {type(value).__name__}")
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """A group's retry rules: the backoff per failed attempt, the attempt limit, and the
    tags it receives (None: all)."""

    retry_delays: tuple[float, ...] = RETRY_DELAYS
    max_attempts: int = MAX_ATTEMPTS
    tags: frozenset[str] | None = None
    #: the expression as given (RocketMQ's subscription carries it), "*" for all
    tag_expression: str = "*"

    def delay_after(self, attempt: int, delay: float | timedelta | None = None) -> float:
        """Seconds until the retry of a message whose delivery ``attempt`` failed:
        ``delay`` when given, else the schedule's entry (its last one past the end)."""
        if delay is not None:
            return _seconds(delay, "delay")
        return self.retry_delays[min(max(attempt, 1), len(self.retry_delays)) - 1]

    def dead_letters(self, attempt: int) -> bool:
        """Whether ``retry_later`` of a message at ``attempt`` dead-letters it instead."""
        return attempt >= self.max_attempts

    def accepts(self, tags: str | None) -> bool:
        """Whether a message with ``tags`` is delivered to the group."""
        return tag_matches(tags, self.tags)


def dlq_properties(
    properties: dict[str, str], origin_topic: str, origin_msg_id: str, attempts: int, reason: str
) -> dict[str, str]:
    """The properties of a dead-lettered copy: the message's own plus where it came from,
    how many deliveries it had and why it was given up (cut to 1,024 characters)."""
    out = dict(properties)
    out[PROP_ORIGIN_TOPIC] = origin_topic
    out[PROP_ORIGIN_MSG_ID] = origin_msg_id
    out[PROP_ATTEMPTS] = str(attempts)
    out[PROP_REASON] = reason[:_MAX_REASON]
    return out


def failure_policy(
    tags: str | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    retry_delays: Sequence[float | timedelta] | None = None,
) -> FailurePolicy:
    """The checked policy of ``Consumer(..., tags=, max_attempts=, retry_delays=)``;
    ``ValueError`` with a one-line message for a bad value."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
    if retry_delays is None:
        delays = RETRY_DELAYS
    else:
        if isinstance(retry_delays, str | bytes) or not isinstance(retry_delays, Sequence):
            raise ValueError("retry_delays must be a sequence of seconds")
        delays = tuple(_seconds(d, "retry_delays entry") for d in retry_delays)
        if not delays:
            raise ValueError("retry_delays must not be empty")
    accepted = parse_tags(tags)
    expression = "*" if accepted is None else " || ".join(sorted(accepted))
    return FailurePolicy(delays, max_attempts, accepted, expression)


def parse_tags(expression: str | None) -> frozenset[str] | None:
    """The tags of a RocketMQ tag expression (``"TagA || TagB"``); None for all (``None``,
    ``""`` or ``"*"``). ``ValueError`` for an expression with an empty tag."""
    if expression is None:
        return None
    if not isinstance(expression, str):
        raise ValueError(f"tags must be a string such as 'TagA || TagB', got {expression!r}")
    text = expression.strip()
    if text in ("", "*"):
        return None
    parts = [p.strip() for p in text.split("||")]
    if any(not p for p in parts) or any(p == "*" for p in parts):
        raise ValueError(f"tags {expression!r}: expected 'TagA || TagB' (no empty tag, no '*')")
    return frozenset(parts)


def tag_matches(tags: str | None, accepted: frozenset[str] | None) -> bool:
    """Whether a message's ``tags`` is in ``accepted`` (None accepts every message)."""
    return accepted is None or (tags is not None and tags in accepted)
