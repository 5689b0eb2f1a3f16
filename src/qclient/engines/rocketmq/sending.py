"""The remoting requests that store messages: ``SEND_MESSAGE_V2`` for one message (a
delayed one carries the absolute ``TIMER_DELIVER_MS``) and ``SEND_BATCH_MESSAGE`` for
immediate messages of one queue. The message id is RocketMQ's ``UNIQ_KEY``, so ids mean
the same on both engines."""

from __future__ import annotations

from ...protocol.wire import FLAG_COMPRESSED, WireMessage
from . import message as msg
from .codes import RequestCode
from .remoting import RemotingCommand, request

__all__ = ["PRODUCER_GROUP", "batch_request", "single_request"]

#: the producer group our requests name (RocketMQ's default group of a client)
PRODUCER_GROUP = "QCLIENT_PRODUCER_GROUP"


def _properties(w: WireMessage, deliver_ms: int | None) -> dict[str, str]:
    props = dict(w.properties) if w.properties else {}
    props[msg.UNIQ_KEY] = w.msg_id
    props[msg.WAIT] = "true"
    if w.key:
        props[msg.KEYS] = w.key
    if w.tags:
        props[msg.TAGS] = w.tags
    if deliver_ms is not None:
        props[msg.TIMER_DELIVER_MS] = str(deliver_ms)
    return props


def single_request(
    w: WireMessage, broker: str, deliver_ms: int | None, now: int
) -> RemotingCommand:
    """SEND_MESSAGE_V2 of ``w`` to its queue on ``broker``, due at ``deliver_ms`` (None:
    at once); ``now``: the born time."""
    header = msg.send_header(
        group=PRODUCER_GROUP,
        topic=w.topic,
        queue_id=w.queue_id,
        sys_flag=msg.SysFlag.COMPRESSED_ZLIB if w.flag & FLAG_COMPRESSED else 0,
        born_ms=now,
        flag=0,
        properties=msg.encode_properties(_properties(w, deliver_ms)),
        broker_name=broker,
    )
    return request(RequestCode.SEND_MESSAGE_V2, header, w.body)


def batch_request(wires: list[WireMessage], broker: str, now: int) -> RemotingCommand:
    """SEND_BATCH_MESSAGE of immediate ``wires`` (one queue, all compressed or none)."""
    w0 = wires[0]
    header = msg.send_header(
        group=PRODUCER_GROUP,
        topic=w0.topic,
        queue_id=w0.queue_id,
        sys_flag=msg.SysFlag.COMPRESSED_ZLIB if w0.flag & FLAG_COMPRESSED else 0,
        born_ms=now,
        flag=0,
        properties="",
        batch=True,
        broker_name=broker,
    )
    body = msg.encode_batch(
        [
            (w.body, 0, msg.encode_properties(_properties(w, None)), bool(w.flag & FLAG_COMPRESSED))
            for w in wires
        ]
    )
    return request(RequestCode.SEND_BATCH_MESSAGE, header, body)
