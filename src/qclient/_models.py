"""Public value types: Message, MessageBatch, SendResult, SendStatus, ReceivedMessage."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

__all__ = [
    "DELAY_LEVELS",
    "Message",
    "MessageBatch",
    "MessageInfo",
    "MessageState",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "delay_level",
]


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


class SendResult(msgspec.Struct, frozen=True, gc=False):
    """An acknowledged message: where it is stored and when it will be delivered.

    Immutable and hashable. A ``msgspec.Struct`` rather than a dataclass: one is made per
    acknowledged message, and building a frozen dataclass cost ~1 us more each (2 % of
    a core at 20k msgs/s). Not tracked by the cyclic garbage collector (``gc=False``):
    its fields are strings, integers and an enum member, so it can never be part of a
    cycle, and a program holding many results pays nothing for them at each collection.
    """

    msg_id: str
    status: SendStatus
    broker_name: str
    queue_id: int
    deliver_at_ms: int
    topic: str = ""

    @property
    def deliver_at(self) -> datetime:
        return datetime.fromtimestamp(self.deliver_at_ms / 1000, tz=UTC)


class MessageBatch:
    """Many messages as columns: one topic (or one per message) and a list per field.

    The cheap way to hand thousands of similar messages to ``send_batch``: no ``Message``
    object per row, and the columns are checked as columns (the same limits and errors
    as for ``Message``). Times are integers in milliseconds here: ``delay_ms`` relative,
    ``deliver_at_ms`` epoch; a row gives at most one of them (``None`` = unset, neither =
    deliver now). An optional column is ``None`` or has one entry per message.
    Slicing (``batch[lo:hi]``) gives a batch of those rows.
    """

    __slots__ = (
        "bodies",
        "delay_ms",
        "deliver_at_ms",
        "keys",
        "msg_ids",
        "properties",
        "tags",
        "topic",
    )

    def __init__(
        self,
        topic: str | Sequence[str],
        bodies: Sequence[bytes | str],
        *,
        msg_ids: Sequence[str | None] | None = None,
        delay_ms: Sequence[int | None] | None = None,
        deliver_at_ms: Sequence[int | None] | None = None,
        keys: Sequence[str | None] | None = None,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[dict[str, str] | None] | None = None,
    ) -> None:
        n = len(bodies)
        for name, col in (
            ("topic", None if isinstance(topic, str) else topic),
            ("msg_ids", msg_ids),
            ("delay_ms", delay_ms),
            ("deliver_at_ms", deliver_at_ms),
            ("keys", keys),
            ("tags", tags),
            ("properties", properties),
        ):
            if col is not None and len(col) != n:
                from .errors import InvalidMessageError

                raise InvalidMessageError(
                    f"MessageBatch: {name} has {len(col)} entries for {n} bodies"
                )
        self.topic = topic
        self.bodies = bodies
        self.msg_ids = msg_ids
        self.delay_ms = delay_ms
        self.deliver_at_ms = deliver_at_ms
        self.keys = keys
        self.tags = tags
        self.properties = properties

    def __len__(self) -> int:
        return len(self.bodies)

    def __getitem__(self, rows: slice) -> MessageBatch:
        if not isinstance(rows, slice):
            raise TypeError("MessageBatch rows are taken by slice: batch[lo:hi]")
        return self._rows(lambda col: col[rows])

    def take(self, rows: Sequence[int]) -> MessageBatch:
        """A batch of the given rows, in that order."""
        return self._rows(lambda col: [col[i] for i in rows])

    def _rows(self, cut: Callable[[Sequence[Any]], Any]) -> MessageBatch:
        """A batch of ``cut(column)`` for every column (an absent one stays absent)."""

        def opt(col: Sequence[Any] | None) -> Any:
            return None if col is None else cut(col)

        return MessageBatch(
            self.topic if isinstance(self.topic, str) else cut(self.topic),
            cut(self.bodies),
            msg_ids=opt(self.msg_ids),
            delay_ms=opt(self.delay_ms),
            deliver_at_ms=opt(self.deliver_at_ms),
            keys=opt(self.keys),
            tags=opt(self.tags),
            properties=opt(self.properties),
        )

    def msg_id(self, row: int) -> str | None:
        """The id given for ``row`` (``None``: the producer makes one)."""
        return None if self.msg_ids is None else self.msg_ids[row]

    def __iter__(self) -> Iterator[Message]:
        """The rows as ``Message`` objects (times in seconds, as ``Message`` takes them)."""
        for i in range(len(self.bodies)):
            d = None if self.delay_ms is None else self.delay_ms[i]
            at = None if self.deliver_at_ms is None else self.deliver_at_ms[i]
            yield Message(
                self.topic if isinstance(self.topic, str) else self.topic[i],
                self.bodies[i],
                key=None if self.keys is None else self.keys[i],
                tags=None if self.tags is None else self.tags[i],
                properties=None if self.properties is None else self.properties[i],
                delay=None if d is None else timedelta(milliseconds=d),
                deliver_at=None if at is None else at / 1000,
                msg_id=self.msg_id(i),
            )

    def __repr__(self) -> str:
        topic = self.topic if isinstance(self.topic, str) else "<per message>"
        return f"MessageBatch(topic={topic!r}, {len(self.bodies)} messages)"


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A delivered message, as a consumer sees it (times in epoch ms).

    ``deliver_at_ms`` is the time it was scheduled for: the consumer returns it at that
    time, never before. ``fired_at_ms`` is when the broker fired it into its consume log:
    a qclient broker fires up to ``fire_ahead_ms`` (40 ms) *earlier* and the consumer
    holds the message until ``deliver_at_ms`` by the broker's clock. So ``fired_at_ms <
    deliver_at_ms`` is normal and does not mean it was delivered early; how late the
    application got it is its receipt time minus ``deliver_at_ms``.
    """

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
    #: 1 on the first delivery to this group, one more per ``Consumer.retry_later``
    attempt: int = 1
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def lateness_ms(self) -> int:
        """How late the broker fired it, ``fired_at_ms - deliver_at_ms``; 0 if it fired
        ahead (brokers do, by ``fire_ahead_ms``, and the consumer holds the message until
        its time), as the broker's fire-lateness histogram counts it."""
        return max(0, self.fired_at_ms - self.deliver_at_ms)


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


class MessageState(enum.StrEnum):
    """Where a stored message is in its life."""

    SCHEDULED = "scheduled"
    FIRED = "fired"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """What a lookup found: the message's state, broker and times (epoch ms).

    ``fired_at_ms`` is None unless the message fired. A qclient broker fires a message
    up to ``fire_ahead_ms`` (40 ms) before ``deliver_at_ms`` and consumers hold it until
    then, so the state can be FIRED, with ``fired_at_ms`` before ``deliver_at_ms``, while
    no consumer has returned it yet; a cancel or reschedule must arrive before the firing.
    ``copies`` counts the brokers that hold the id (more than one only after a retry whose
    first attempt was stored too).
    """

    msg_id: str
    topic: str
    broker_name: str
    state: MessageState
    deliver_at_ms: int
    fired_at_ms: int | None = None
    queue_id: int = 0
    copies: int = 1

    @property
    def deliver_at(self) -> datetime:
        return datetime.fromtimestamp(self.deliver_at_ms / 1000, tz=UTC)

    @property
    def fired_at(self) -> datetime | None:
        if self.fired_at_ms is None:
            return None
        return datetime.fromtimestamp(self.fired_at_ms / 1000, tz=UTC)
