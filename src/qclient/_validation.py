"""Message -> ``WireMessage``: every check that can fail before the network does here.

Delays and deliver times become milliseconds in :mod:`qclient._delays` (re-exported here).
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

from ._config import ProducerConfig
from ._delays import delay_to_ms, deliver_at_to_ms, seconds_to_ms
from ._ids import msg_ids, new_msg_id
from ._models import Message, MessageBatch
from .errors import InvalidMessageError, MessageTooLargeError
from .protocol import wire as proto
from .protocol.limits import MAX_MSG_ID_CHARS, Rule, check_row
from .protocol.wire import FLAG_COMPRESSED, TOPIC_RE, WireMessage

__all__ = [
    "WireBuilder",
    "delay_to_ms",
    "deliver_at_to_ms",
    "message_to_wire",
    "seconds_to_ms",
    "to_wire",
]

_match_topic = TOPIC_RE.match
_match_msg_id = proto.MSG_ID_RE.match
#: many msg_ids at once: joined with "\n" (not an id character), checked in one C call
_IDS_JOINED = re.compile(rf"(?:[\x21-\x7e]{{1,{MAX_MSG_ID_CHARS}}}\n)*")
_NONE = type(None)

#: the SDK's wording of each rule of the row checker
_ERRORS = {
    Rule.TOPIC: "invalid topic {topic!r}: must match "
    + proto.TOPIC_PATTERN.replace("{", "{{").replace("}", "}}"),
    Rule.MSG_ID: (
        f"msg_id must be 1-{MAX_MSG_ID_CHARS} printable ASCII characters without spaces: "
        "{msg_id!r}"
    ),
    Rule.BODY_SIZE: "body of {size} bytes exceeds max_message_size={cfg.max_message_size}",
    Rule.QUEUE_ID: "queue id out of range",
    Rule.KEY: f"key is longer than {proto.MAX_KEY_CHARS} characters",
    Rule.TAGS: f"tags is longer than {proto.MAX_TAGS_CHARS} characters",
    Rule.PROPERTY_COUNT: f"more than {proto.MAX_PROPERTIES} properties",
    Rule.PROPERTY_LENGTH: (
        f"a property key is over {proto.MAX_PROPERTY_KEY_CHARS} or a value over "
        f"{proto.MAX_PROPERTY_VALUE_CHARS} characters"
    ),
    Rule.FLAG: "unknown flag bits",
    Rule.BOTH_DELAYS: "give at most one of delay and deliver_at",
    Rule.DELAY: "delay is beyond the maximum delay of {cfg.max_delay_ms}ms",
    Rule.DELIVER_AT: "deliver_at is beyond the maximum delay of {cfg.max_delay_ms}ms",
}


def to_wire(
    cfg: ProducerConfig,
    topic: str,
    body: Any,
    key: str | None = None,
    tags: str | None = None,
    properties: dict[str, str] | None = None,
    delay: Any = None,
    deliver_at: Any = None,
    msg_id: str | None = None,
) -> WireMessage:
    """Validate one message and build its wire form (``queue_id`` is set at send time).

    The Python types are checked and converted here; the limits are the protocol's row
    checker's (:func:`~qclient.protocol.limits.check_row`), so the broker accepts what
    passes."""
    if not isinstance(topic, str):
        raise InvalidMessageError(f"invalid topic {topic!r}: must match {proto.TOPIC_PATTERN}")
    if isinstance(body, str):
        data = body.encode()
    elif isinstance(body, bytes):
        data = body
    elif isinstance(body, bytearray | memoryview):
        data = bytes(body)
    else:
        raise InvalidMessageError(f"body must be bytes or str, got {type(body).__name__}")
    size = len(data)
    delay_ms = deliver_at_ms = None
    now_ms = time.time_ns() // 1_000_000
    if delay is not None:
        if deliver_at is not None:
            raise InvalidMessageError("give at most one of delay and deliver_at")
        delay_ms = delay_to_ms(delay, cfg.max_delay_ms)
    elif deliver_at is not None:
        deliver_at_ms = deliver_at_to_ms(deliver_at, cfg.max_delay_ms, now_ms)
    if key is not None and not isinstance(key, str):
        raise InvalidMessageError(f"key must be a str, got {type(key).__name__}")
    if tags is not None and not isinstance(tags, str):
        raise InvalidMessageError(f"tags must be a str, got {type(tags).__name__}")
    if properties is not None:
        if not isinstance(properties, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
        ):
            raise InvalidMessageError("properties must be a dict of str to str")
        properties = dict(properties) or None
    if msg_id is None:
        msg_id = new_msg_id()
    elif not isinstance(msg_id, str):
        raise InvalidMessageError(_ERRORS[Rule.MSG_ID].format(msg_id=msg_id))
    rule = check_row(
        topic,
        msg_id,
        size,
        0,
        key,
        tags,
        properties,
        0,
        delay_ms,
        deliver_at_ms,
        now_ms,
        max_delay_ms=cfg.max_delay_ms,
        max_size=cfg.max_message_size,
    )
    if rule is not None:
        error = MessageTooLargeError if rule == Rule.BODY_SIZE else InvalidMessageError
        raise error(_ERRORS[rule].format(topic=topic, msg_id=msg_id, size=size, cfg=cfg))
    flag = 0
    if cfg.compress_threshold and size > cfg.compress_threshold:
        packed = zlib.compress(data, cfg.compress_level)
        if len(packed) < size:  # incompressible bodies travel as they are
            data = packed
            flag = FLAG_COMPRESSED
    return WireMessage(
        topic=topic,
        queue_id=0,
        msg_id=msg_id,
        body=data,
        key=key,
        tags=tags,
        properties=properties,
        delay_ms=delay_ms,
        deliver_at_ms=deliver_at_ms,
        flag=flag,
    )


def message_to_wire(cfg: ProducerConfig, message: Message) -> WireMessage:
    """``to_wire`` for a ``Message`` object."""
    if not isinstance(message, Message):
        raise InvalidMessageError(f"expected a Message, got {type(message).__name__}")
    return to_wire(
        cfg,
        message.topic,
        message.body,
        message.key,
        message.tags,
        message.properties,
        message.delay,
        message.deliver_at,
        message.msg_id,
    )


#: topics that passed the check (a dict hit is ~10x cheaper than the regex); bounded
_good_topics: set[str] = set()
_MAX_GOOD_TOPICS = 4096
#: a deliver_at beyond this (epoch seconds, year ~33658) takes the checked slow path
_DELIVER_AT_SANE = 1e12


class WireBuilder:
    """``to_wire`` with one config's limits hoisted, and a fast path for the common
    message (str topic, bytes body, no properties, numeric or no delay): anything else
    goes through ``to_wire`` itself, so the checks and their errors are the same."""

    __slots__ = ("cfg", "compress_threshold", "max_delay_ms", "max_size")

    def __init__(self, cfg: ProducerConfig) -> None:
        self.cfg = cfg
        self.max_size = cfg.max_message_size
        self.max_delay_ms = cfg.max_delay_ms
        # a body above this needs compressing: not the fast path
        self.compress_threshold = cfg.compress_threshold or cfg.max_message_size

    def message(
        self, message: Message, now_ms: int | None = None, ids: Iterator[str] | None = None
    ) -> WireMessage:
        """One ``Message``; ``now_ms`` (epoch ms) and ``ids`` (``msg_ids()``) to skip
        reading the clock."""
        if type(message) is not Message:
            return message_to_wire(self.cfg, message)
        # Any: the fields are checked here, not trusted to their annotations
        topic: Any = message.topic
        body: Any = message.body
        delay: Any = message.delay
        deliver_at: Any = message.deliver_at
        key, tags, msg_id = message.key, message.tags, message.msg_id
        known_topic = type(topic) is str and topic in _good_topics
        tb = type(body)
        if tb is str and known_topic:  # (to_wire checks the topic before encoding)
            body = body.encode()  # UTF-8 as to_wire (an unpaired surrogate raises alike)
            tb = bytes
        size = len(body) if tb is bytes else -1
        if (
            known_topic
            and 0 <= size <= self.compress_threshold
            and size <= self.max_size
            and message.properties is None
            and (key is None or (type(key) is str and len(key) <= proto.MAX_KEY_CHARS))
            and (tags is None or (type(tags) is str and len(tags) <= proto.MAX_TAGS_CHARS))
            and (msg_id is None or (type(msg_id) is str and _match_msg_id(msg_id) is not None))
        ):
            delay_ms = deliver_at_ms = None
            ok = True
            if delay is not None:
                t = type(delay)
                if deliver_at is not None or (t is not int and t is not float):
                    ok = False
                elif delay >= 0:  # NaN fails this too
                    delay_ms = seconds_to_ms(delay) if t is float else delay * 1000
                    ok = delay_ms <= self.max_delay_ms
                else:
                    ok = False
            elif deliver_at is not None:
                t = type(deliver_at)
                if (t is int or t is float) and 0 <= deliver_at < _DELIVER_AT_SANE:
                    deliver_at_ms = seconds_to_ms(deliver_at)
                    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
                    ok = deliver_at_ms - now <= self.max_delay_ms
                else:
                    ok = False
            if ok:
                if msg_id is None:
                    msg_id = new_msg_id() if ids is None else next(ids)
                return WireMessage(
                    topic, 0, msg_id, body, key, tags, None, delay_ms, deliver_at_ms, 0
                )
        wire = message_to_wire(self.cfg, message)
        if type(message.topic) is str:
            _remember(message.topic)  # it passed to_wire's check
        return wire

    def messages(self, messages: Sequence[Message]) -> list[WireMessage]:
        """A batch; the first bad message fails it (``message #i: ...``)."""
        now_ms = time.time_ns() // 1_000_000
        ids = msg_ids()
        one = self.message
        out = []
        try:
            for m in messages:
                out.append(one(m, now_ms, ids))
        except InvalidMessageError as exc:
            raise type(exc)(f"message #{len(out)}: {exc}") from None
        return out

    # --- columns (MessageBatch) --------------------------------------------------------

    def columns(self, batch: MessageBatch) -> list[WireMessage]:
        """A ``MessageBatch``, checked column by column (a few C-level passes), then one
        ``WireMessage`` per row. A batch the column checks cannot vouch for (a body to
        compress, properties, a bad value...) is built row by row with ``to_wire``'s
        checks, and the first bad row fails it (``message #i: ...``)."""
        n = len(batch)
        if not n:
            return []
        now_ms = time.time_ns() // 1_000_000
        fast = self._fast_columns(batch, n, now_ms)
        if fast is not None:
            return fast
        out = []
        try:
            for i in range(n):
                out.append(self._row(batch, i, now_ms))
        except InvalidMessageError as exc:
            raise type(exc)(f"message #{len(out)}: {exc}") from None
        return out

    def _fast_columns(self, batch: MessageBatch, n: int, now_ms: int) -> list[WireMessage] | None:
        """The common batch in bulk, or ``None`` for the row-by-row path."""
        topic = batch.topic
        topics: Iterable[str]
        if isinstance(topic, str):
            if not _known_topic(topic):
                return None
            topics = repeat(topic, n)
        else:
            if not all(type(t) is str and _known_topic(t) for t in set(topic)):
                return None
            topics = topic
        bodies: Sequence[Any] = batch.bodies
        kinds = set(map(type, bodies))
        if kinds != {bytes}:
            if not kinds <= {bytes, str}:
                return None
            try:
                bodies = [b.encode() if type(b) is str else b for b in bodies]
            except UnicodeEncodeError:
                return None
        if max(map(len, bodies)) > min(self.compress_threshold, self.max_size):
            return None
        if batch.properties is not None and any(p is not None for p in batch.properties):
            return None
        ids: Iterable[Any]
        if batch.msg_ids is None:
            ids = msg_ids()
        else:
            given: Sequence[Any] = batch.msg_ids
            if set(map(type, given)) != {str}:
                return None
            joined = "\n".join(given) + "\n"
            # (the count: an id with a "\n" of its own would pass as two)
            if joined.count("\n") != n or not _IDS_JOINED.fullmatch(joined):
                return None
            ids = given
        try:
            delays = _ms_column(batch.delay_ms, 0, self.max_delay_ms)
            deliver = _ms_column(batch.deliver_at_ms, 0, now_ms + self.max_delay_ms)
            keys = _str_column(batch.keys, proto.MAX_KEY_CHARS)
            tags = _str_column(batch.tags, proto.MAX_TAGS_CHARS)
        except _RowByRow:
            return None
        if (
            delays is not None
            and deliver is not None
            and any(d is not None and a is not None for d, a in zip(delays, deliver, strict=True))
        ):
            return None

        def absent() -> Iterator[None]:
            return repeat(None, n)  # one per column: map() advances each argument

        return list(
            map(
                WireMessage,
                topics,
                repeat(0, n),
                ids,  # (msg_ids() is endless: the other columns end the map)
                bodies,
                absent() if keys is None else keys,
                absent() if tags is None else tags,
                absent(),
                absent() if delays is None else delays,
                absent() if deliver is None else deliver,
                repeat(0, n),
            )
        )

    def _row(self, batch: MessageBatch, i: int, now_ms: int) -> WireMessage:
        """One row of a batch, with every check of ``to_wire`` and the ms columns'."""
        delay = _ms_value("delay_ms", batch.delay_ms, i)
        deliver_at = _ms_value("deliver_at_ms", batch.deliver_at_ms, i)
        if delay is not None:
            if deliver_at is not None:
                raise InvalidMessageError("give at most one of delay_ms and deliver_at_ms")
            if not 0 <= delay <= self.max_delay_ms:
                raise InvalidMessageError(
                    f"delay_ms must be 0..{self.max_delay_ms} (the maximum delay), got {delay}"
                )
        if deliver_at is not None and not 0 <= deliver_at <= now_ms + self.max_delay_ms:
            raise InvalidMessageError(
                f"deliver_at_ms {deliver_at} is negative or beyond the maximum delay of "
                f"{self.max_delay_ms // 1000}s"
            )
        topic = batch.topic if isinstance(batch.topic, str) else batch.topic[i]
        wire = to_wire(
            self.cfg,
            topic,
            batch.bodies[i],
            None if batch.keys is None else batch.keys[i],
            None if batch.tags is None else batch.tags[i],
            None if batch.properties is None else batch.properties[i],
            None,
            None,
            batch.msg_id(i),
        )
        _remember(topic)  # it passed to_wire's check
        wire.delay_ms, wire.deliver_at_ms = delay, deliver_at
        return wire


def _known_topic(topic: str) -> bool:
    """A valid topic (remembered once seen: a set hit is ~10x cheaper than the regex)."""
    if topic in _good_topics:
        return True
    if _match_topic(topic) is None:
        return False
    _remember(topic)
    return True


def _remember(topic: str) -> None:
    """Add a topic that passed the check to ``_good_topics`` (while it has room)."""
    if len(_good_topics) < _MAX_GOOD_TOPICS:
        _good_topics.add(topic)


class _RowByRow(Exception):
    """A column the bulk checks cannot vouch for: build the batch row by row."""


def _ms_column(col: Sequence[Any] | None, lo: int, hi: int) -> Sequence[Any] | None:
    """``col`` if every entry is an int in lo..hi or None (None: no value in any row)."""
    if col is None:
        return None
    kinds = set(map(type, col))
    if kinds == {int}:
        values: Sequence[int] = col
    elif kinds == {int, _NONE}:
        values = [v for v in col if v is not None]
    elif kinds == {_NONE}:
        return None
    else:
        raise _RowByRow
    if not lo <= min(values) or max(values) > hi:
        raise _RowByRow
    return col


def _str_column(col: Sequence[Any] | None, max_chars: int) -> Sequence[Any] | None:
    """``col`` if every entry is a str of at most ``max_chars`` or None."""
    if col is None:
        return None
    kinds = set(map(type, col))
    if kinds == {_NONE}:
        return None
    if not kinds <= {str, _NONE} or max(len(v) for v in col if v is not None) > max_chars:
        raise _RowByRow
    return col


def _ms_value(name: str, col: Sequence[Any] | None, i: int) -> int | None:
    """Row ``i`` of a milliseconds column: an int (any integral type) or None."""
    if col is None:
        return None
    v = col[i]
    if v is None:
        return None
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise InvalidMessageError(f"{name} must be an int (milliseconds), got {type(v).__name__}")
    return int(v.__index__())
