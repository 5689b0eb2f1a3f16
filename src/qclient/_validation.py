"""Message -> ``WireMessage``: every check that can fail before the network does here."""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from ._config import ProducerConfig
from ._ids import msg_ids, new_msg_id
from ._models import Message
from .errors import InvalidMessageError, MessageTooLargeError
from .protocol import wire as proto
from .protocol.wire import FLAG_COMPRESSED, TOPIC_RE, WireMessage

__all__ = ["WireBuilder", "delay_to_ms", "deliver_at_to_ms", "message_to_wire", "to_wire"]

_match_topic = TOPIC_RE.match
_match_msg_id = proto.MSG_ID_RE.match


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
    ms = round(seconds * 1000)
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
        ms = round(deliver_at.timestamp() * 1000)
    elif isinstance(deliver_at, int | float) and not isinstance(deliver_at, bool):
        if math.isnan(deliver_at) or math.isinf(deliver_at):
            raise InvalidMessageError(f"deliver_at must be finite, got {deliver_at!r}")
        ms = round(deliver_at * 1000)
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
    """Validate one message and build its wire form (``queue_id`` is set at send time)."""
    if not isinstance(topic, str) or _match_topic(topic) is None:
        raise InvalidMessageError(f"invalid topic {topic!r}: must match {TOPIC_RE.pattern}")
    if isinstance(body, str):
        data = body.encode()
    elif isinstance(body, bytes):
        data = body
    elif isinstance(body, bytearray | memoryview):
        data = bytes(body)
    else:
        raise InvalidMessageError(f"body must be bytes or str, got {type(body).__name__}")
    size = len(data)
    if size > cfg.max_message_size:
        raise MessageTooLargeError(
            f"body of {size} bytes exceeds max_message_size={cfg.max_message_size}"
        )
    delay_ms = deliver_at_ms = None
    if delay is not None:
        if deliver_at is not None:
            raise InvalidMessageError("give at most one of delay and deliver_at")
        delay_ms = delay_to_ms(delay, cfg.max_delay_ms)
    elif deliver_at is not None:
        deliver_at_ms = deliver_at_to_ms(deliver_at, cfg.max_delay_ms)
    if key is not None and not isinstance(key, str):
        raise InvalidMessageError(f"key must be a str, got {type(key).__name__}")
    if key is not None and len(key) > proto.MAX_KEY_CHARS:
        raise InvalidMessageError(f"key is longer than {proto.MAX_KEY_CHARS} characters")
    if tags is not None and not isinstance(tags, str):
        raise InvalidMessageError(f"tags must be a str, got {type(tags).__name__}")
    if tags is not None and len(tags) > proto.MAX_TAGS_CHARS:
        raise InvalidMessageError(f"tags is longer than {proto.MAX_TAGS_CHARS} characters")
    if properties is not None:
        if not isinstance(properties, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
        ):
            raise InvalidMessageError("properties must be a dict of str to str")
        if len(properties) > proto.MAX_PROPERTIES:
            raise InvalidMessageError(f"more than {proto.MAX_PROPERTIES} properties")
        if any(
            len(k) > proto.MAX_PROPERTY_KEY_CHARS or len(v) > proto.MAX_PROPERTY_VALUE_CHARS
            for k, v in properties.items()
        ):
            raise InvalidMessageError(
                f"a property key is over {proto.MAX_PROPERTY_KEY_CHARS} or a value over "
                f"{proto.MAX_PROPERTY_VALUE_CHARS} characters"
            )
        properties = dict(properties) or None
    if msg_id is None:
        msg_id = new_msg_id()
    elif not isinstance(msg_id, str) or not _match_msg_id(msg_id):
        raise InvalidMessageError(
            f"msg_id must be 1-128 printable ASCII characters without spaces: {msg_id!r}"
        )
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
                    delay_ms = round(delay * 1000) if t is float else delay * 1000
                    ok = delay_ms <= self.max_delay_ms
                else:
                    ok = False
            elif deliver_at is not None:
                t = type(deliver_at)
                if (t is int or t is float) and 0 <= deliver_at < _DELIVER_AT_SANE:
                    deliver_at_ms = round(deliver_at * 1000)
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
        if len(_good_topics) < _MAX_GOOD_TOPICS and type(message.topic) is str:
            _good_topics.add(message.topic)  # it passed to_wire's check
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
