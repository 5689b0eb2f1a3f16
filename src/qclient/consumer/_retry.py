"""A qclient group's retries and dead letters on the wire, sans-I/O: the copy of a message
``retry_later`` sends to ``%RETRY%<group>``, the one ``dead_letter`` sends to
``%DLQ%<group>``, and the message the application sees again when a retry comes back.

A retry copy carries the message as delivered (body, key, tags, user properties) and
one bookkeeping property, :data:`PROP_RETRY` = ``"<attempt> <topic> <msg id>"``: the
attempt it will be delivered as, and the original's topic and id, which the consumer
puts back (and drops the property) so the retry looks like the original. Its own id is
derived from the group, the original id and the attempt: brokers deduplicate by id, so
the original and its retries must differ, while a retry sent twice for the same attempt
(a member that died before committing, another that got the message again) is stored
once on a broker. A dead-lettered copy likewise has one id per group and message.
"""

from __future__ import annotations

import hashlib
import math
import zlib

from .._models import ReceivedMessage
from ..protocol import wire
from ._failures import dlq_properties, dlq_topic, retry_topic
from ._received import build, from_pulled

__all__ = [
    "PROP_RETRY",
    "dlq_copy",
    "dlq_msg_id",
    "from_retry",
    "queue_for",
    "retry_copy",
    "retry_msg_id",
]

#: the bookkeeping property of a copy in a retry topic (never shown to the application)
PROP_RETRY = "QCLIENT_RETRY"

#: bodies longer than this travel zlib-compressed, as the producer sends them
_COMPRESS_OVER = 4096
_COMPRESS_LEVEL = 5


def _derived_id(kind: str, *parts: str) -> str:
    digest = hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()
    return f"{kind}-{digest}"


def retry_msg_id(group: str, msg_id: str, attempt: int) -> str:
    """The id of the retry copy that delivers ``msg_id`` to ``group`` as ``attempt``."""
    return _derived_id("RETRY", group, msg_id, str(attempt))


def dlq_msg_id(group: str, msg_id: str) -> str:
    """The id of ``msg_id``'s dead-lettered copy in ``group``'s DLQ."""
    return _derived_id("DLQ", group, msg_id)


def queue_for(msg_id: str, queues: int) -> int:
    """The queue of a copy: spread by id over ``queues`` (0 when not known)."""
    return zlib.crc32(msg_id.encode()) % queues if queues > 0 else 0


def _body(body: bytes) -> tuple[bytes, int]:
    if len(body) > _COMPRESS_OVER:
        packed = zlib.compress(body, _COMPRESS_LEVEL)
        if len(packed) < len(body):
            return packed, wire.FLAG_COMPRESSED
    return body, 0


def retry_copy(m: ReceivedMessage, group: str, delay_s: float, queues: int = 0) -> wire.WireMessage:
    """The copy of ``m`` that delivers it to ``group`` again, as attempt ``m.attempt +
    1``, ``delay_s`` seconds after the broker stores it (rounded up to the ms: never
    earlier); ``queues``: the retry topic's queues on the target broker, if known."""
    attempt = m.attempt + 1
    msg_id = retry_msg_id(group, m.msg_id, attempt)
    props = dict(m.properties)
    props[PROP_RETRY] = f"{attempt} {m.topic} {m.msg_id}"
    body, flag = _body(m.body)
    return wire.WireMessage(
        topic=retry_topic(group),
        queue_id=queue_for(msg_id, queues),
        msg_id=msg_id,
        body=body,
        key=m.key,
        tags=m.tags,
        properties=props,
        delay_ms=math.ceil(delay_s * 1000),
        flag=flag,
    )


def dlq_copy(m: ReceivedMessage, group: str, reason: str) -> wire.WireMessage:
    """The copy of ``m`` that dead-letters it in ``group``'s DLQ (delivered at once)."""
    props = dlq_properties(m.properties, m.topic, m.msg_id, m.attempt, reason)
    body, flag = _body(m.body)
    return wire.WireMessage(
        topic=dlq_topic(group),
        queue_id=0,
        msg_id=dlq_msg_id(group, m.msg_id),
        body=body,
        key=m.key,
        tags=m.tags,
        properties=props,
        flag=flag,
    )


def from_retry(m: wire.PulledMessage, broker: str) -> ReceivedMessage:
    """A message of a retry topic as the application sees it: the original's id and
    topic, the attempt it is delivered as, the bookkeeping property dropped. A message
    without it (sent there by something else) is shown as it is."""
    mark = m.properties.get(PROP_RETRY) if m.properties else None
    parts = mark.split(" ", 2) if mark else []
    if len(parts) != 3 or not parts[0].isdigit():
        return from_pulled(m, broker)
    attempt, topic, msg_id = int(parts[0]), parts[1], parts[2]
    props = dict(m.properties or {})
    del props[PROP_RETRY]
    body = zlib.decompress(m.body) if m.flag & wire.FLAG_COMPRESSED else m.body
    out = build(
        msg_id,
        topic,
        body,
        m.key,
        m.tags,
        props,
        m.deliver_at_ms,
        m.fired_at_ms,
        broker,
        m.queue_id,
        m.offset,
    )
    object.__setattr__(out, "attempt", attempt)
    return out
