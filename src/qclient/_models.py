"""Public value types: Message, SendResult, SendStatus, ReceivedMessage."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["DELAY_LEVELS", "Message", "ReceivedMessage", "SendResult", "SendStatus", "delay_level"]


class SendStatus(enum.StrEnum):
    """Outcome of an acknowledged send. ``SEND_OK`` means durable on the broker."""

    SEND_OK = "SEND_OK"


Delay = float | int | timedelta
DeliverAt = datetime | float | int


@dataclass(slots=True)
class Message:
    """One message to send. At most one of ``delay`` and ``deliver_at`` is set."""

    topic: str
    body: bytes | str
    key: str | None = None
    tags: str | None = None
    properties: dict[str, str] | None = None
    delay: Delay | None = None
    deliver_at: DeliverAt | None = None
    msg_id: str | None = None

    def __init__(
        self,
        topic: str,
        body: bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        delay: Delay | None = None,
        deliver_at: DeliverAt | None = None,
        msg_id: str | None = None,
    ) -> None:
        self.topic = topic
        self.body = body
        self.key = key
        self.tags = tags
        self.properties = properties
        self.delay = delay
        self.deliver_at = deliver_at
        self.msg_id = msg_id

    def __repr__(self) -> str:
        size = len(self.body)
        return (
            f"Message(topic={self.topic!r}, body=<{size} bytes>, key={self.key!r}, "
            f"delay={self.delay!r}, deliver_at={self.deliver_at!r}, msg_id={self.msg_id!r})"
        )


@dataclass(frozen=True, slots=True)
class SendResult:
    """An acknowledged message: where it is stored and when it will be delivered."""

    msg_id: str
    status: SendStatus
    broker_name: str
    queue_id: int
    deliver_at_ms: int
    topic: str = ""

    @property
    def deliver_at(self) -> datetime:
        return datetime.fromtimestamp(self.deliver_at_ms / 1000, tz=UTC)


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A delivered (fired) message, as a consumer sees it."""

    msg_id: str
    topic: str
    body: bytes
    key: str | None
    tags: str | None
    properties: dict[str, str]
    deliver_at_ms: int
    fired_at_ms: int
    broker_name: str
    queue_id: int
    offset: int
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def lateness_ms(self) -> int:
        return self.fired_at_ms - self.deliver_at_ms


#: RocketMQ 4's 18 fixed delay levels, in seconds (level 1 = 1 s ... level 18 = 2 h).
DELAY_LEVELS: tuple[int, ...] = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)


def delay_level(level: int) -> timedelta:
    """The delay of a RocketMQ 4 delay level (1..18), for users coming from RocketMQ 4."""
    if not 1 <= level <= len(DELAY_LEVELS):
        from .errors import InvalidMessageError

        raise InvalidMessageError(f"delay level must be 1..{len(DELAY_LEVELS)}, got {level}")
    return timedelta(seconds=DELAY_LEVELS[level - 1])
