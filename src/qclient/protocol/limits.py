"""The limits of one message and the one row checker, shared by the SDK, the broker and
the store (no I/O here).

:func:`check_row` is the rule: it takes one message in wire form and names the first
limit it breaks. Each layer turns that name into its own error (the SDK's
``InvalidMessageError``, the broker's HTTP 400/413, the store's ``InvalidRecordError``).
A layer's bulk fast path must accept exactly the rows this accepts (property-tested).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "KNOWN_FLAGS",
    "MAX_DELAY_MS",
    "MAX_KEY_CHARS",
    "MAX_MESSAGE_SIZE",
    "MAX_MSG_ID_CHARS",
    "MAX_PROPERTIES",
    "MAX_PROPERTY_KEY_CHARS",
    "MAX_PROPERTY_VALUE_CHARS",
    "MAX_QUEUES",
    "MAX_TAGS_CHARS",
    "MSG_ID_RE",
    "TOPIC_PATTERN",
    "TOPIC_RE",
    "Rule",
    "check_row",
    "valid_msg_id",
]

#: topic and group names, as documented (the whole name must match)
TOPIC_PATTERN = "^[A-Za-z0-9_%|-]{1,127}$"
# \Z, not $: "$" also matches before a trailing newline, and "orders\n" is no topic
TOPIC_RE = re.compile(r"^[A-Za-z0-9_%|-]{1,127}\Z")
#: message ids: 1 to MAX_MSG_ID_CHARS printable ASCII characters, no space
MAX_MSG_ID_CHARS = 128
MSG_ID_RE = re.compile(rf"^[\x21-\x7e]{{1,{MAX_MSG_ID_CHARS}}}\Z")
MAX_KEY_CHARS = 1024
MAX_TAGS_CHARS = 256
MAX_PROPERTIES = 64
MAX_PROPERTY_KEY_CHARS = 256
MAX_PROPERTY_VALUE_CHARS = 4096
#: queue ids are 0..MAX_QUEUES-1
MAX_QUEUES = 256
#: message flag bits
FLAG_COMPRESSED = 1  # body is zlib-compressed; consumers inflate it
KNOWN_FLAGS = FLAG_COMPRESSED
#: the longest delay (and furthest deliver time ahead) a broker accepts by default
MAX_DELAY_MS = 40 * 86_400_000
#: the largest message body a broker accepts by default (bytes, as sent)
MAX_MESSAGE_SIZE = 4 * 1024 * 1024


class Rule:
    """The names :func:`check_row` gives to the limit a message breaks."""

    TOPIC = "topic"
    MSG_ID = "msg_id"
    BODY_SIZE = "body_size"
    QUEUE_ID = "queue_id"
    KEY = "key"
    TAGS = "tags"
    PROPERTY_COUNT = "property_count"
    PROPERTY_LENGTH = "property_length"
    FLAG = "flag"
    BOTH_DELAYS = "both_delays"
    DELAY = "delay"
    DELIVER_AT = "deliver_at"


_match_topic = TOPIC_RE.match
#: topics that passed the check (a set hit is ~10x cheaper than the regex); bounded
_good_topics: set[str] = set()
_MAX_GOOD_TOPICS = 4096


def valid_msg_id(msg_id: str) -> bool:
    """``MSG_ID_RE``, with str methods (C loops, faster than the regex on short ids)."""
    return (
        0 < len(msg_id) <= MAX_MSG_ID_CHARS
        and msg_id.isascii()
        and msg_id.isprintable()
        and " " not in msg_id
    )


def check_row(
    topic: str,
    msg_id: str,
    body_size: int,
    queue_id: int,
    key: str | None,
    tags: str | None,
    properties: Mapping[str, str] | None,
    flag: int,
    delay_ms: int | None,
    deliver_at_ms: int | None,
    now_ms: int,
    *,
    max_delay_ms: int = MAX_DELAY_MS,
    max_size: int = MAX_MESSAGE_SIZE,
) -> str | None:
    """The first :class:`Rule` one message (wire types: str, int, bytes length) breaks,
    in this order, or None if it keeps every limit."""
    if topic not in _good_topics:
        if _match_topic(topic) is None:
            return Rule.TOPIC
        if len(_good_topics) < _MAX_GOOD_TOPICS:
            _good_topics.add(topic)
    # valid_msg_id, inlined: this runs once per message
    if not (
        0 < len(msg_id) <= MAX_MSG_ID_CHARS
        and msg_id.isascii()
        and msg_id.isprintable()
        and " " not in msg_id
    ):
        return Rule.MSG_ID
    if body_size > max_size:
        return Rule.BODY_SIZE
    if not 0 <= queue_id < MAX_QUEUES:
        return Rule.QUEUE_ID
    if key is not None and len(key) > MAX_KEY_CHARS:
        return Rule.KEY
    if tags is not None and len(tags) > MAX_TAGS_CHARS:
        return Rule.TAGS
    if properties is not None:
        if len(properties) > MAX_PROPERTIES:
            return Rule.PROPERTY_COUNT
        for k, v in properties.items():
            if len(k) > MAX_PROPERTY_KEY_CHARS or len(v) > MAX_PROPERTY_VALUE_CHARS:
                return Rule.PROPERTY_LENGTH
    if flag & ~KNOWN_FLAGS:
        return Rule.FLAG
    if delay_ms is not None:
        if deliver_at_ms is not None:
            return Rule.BOTH_DELAYS
        if not 0 <= delay_ms <= max_delay_ms:
            return Rule.DELAY
    elif deliver_at_ms is not None and (deliver_at_ms < 0 or deliver_at_ms - now_ms > max_delay_ms):
        return Rule.DELIVER_AT
    return None
