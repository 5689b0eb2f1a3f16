"""The remoting requests that store messages: ``SEND_MESSAGE_V2`` for one message (a
delayed one carries the absolute ``TIMER_DELIVER_MS``) and ``SEND_BATCH_MESSAGE`` for
immediate messages of one queue. The message id is RocketMQ's ``UNIQ_KEY``, so ids mean
the same on both engines.

``single_request_exact`` builds a request field by field (``message.send_header``,
``message.encode_properties``) and ``remoting.encode`` lays out its header: the one home
of the format. ``single_request`` gives the same bytes for less CPU: a ``SendTemplate``
per (topic, broker, sysFlag) holds that header pre-encoded, cut from ``encode``'s own
output for sentinel values, and splices in what varies per message (queue, born time,
properties; the connection splices the opaque). The properties of a message with no
key, tags or user properties and a plain id (ASCII letters and digits, as ours are) are
spliced the same way from the encoded properties of a sentinel message.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...protocol.wire import FLAG_COMPRESSED, WireMessage
from . import message as msg
from .codes import RequestCode
from .remoting import RemotingCommand, SplicedCommand, _json_encode, encode, request

__all__ = [
    "PRODUCER_GROUP",
    "SendTemplate",
    "batch_request",
    "send_template",
    "single_request",
    "single_request_exact",
]

#: the producer group our requests name (RocketMQ's default group of a client)
PRODUCER_GROUP = "QCLIENT_PRODUCER_GROUP"

_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
#: sentinel values the templates are cut at; a cut needs each to occur once in the
#: encoded header (a topic or broker name holding one gets no template)
_OPAQUE, _FLAG, _QUEUE, _BORN, _DELIVER = 1987654321, 1987654322, 1987654323, 1987654324, 1987654325
_PROPS = "\x00P\x00"  # JSON: "\u0000P\u0000"
_ID = "\x00U\x00"
#: how many templates are kept (topics x brokers x compressed or not)
MAX_TEMPLATES = 4096


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


def _sys_flag(w: WireMessage) -> int:
    return msg.SysFlag.COMPRESSED_ZLIB if w.flag & FLAG_COMPRESSED else 0


def _header(w: WireMessage, broker: str, born_ms: int, properties: str) -> dict[str, str]:
    return msg.send_header(
        group=PRODUCER_GROUP,
        topic=w.topic,
        queue_id=w.queue_id,
        sys_flag=_sys_flag(w),
        born_ms=born_ms,
        flag=0,
        properties=properties,
        broker_name=broker,
    )


def single_request_exact(
    w: WireMessage, broker: str, deliver_ms: int | None, now: int
) -> RemotingCommand:
    """SEND_MESSAGE_V2 of ``w`` to its queue on ``broker``, due at ``deliver_ms`` (None:
    at once); ``now``: the born time. Field by field: what the templates are cut from."""
    properties = msg.encode_properties(_properties(w, deliver_ms))
    return request(RequestCode.SEND_MESSAGE_V2, _header(w, broker, now, properties), w.body)


def _cut(data: bytes, marks: list[bytes]) -> list[bytes] | None:
    """``data`` split at each of ``marks`` (in this order, each occurring once), or None."""
    parts: list[bytes] = []
    pos = 0
    for mark in marks:
        at = data.find(mark, pos)
        if at < 0 or data.count(mark) != 1:
            return None
        parts.append(data[pos:at])
        pos = at + len(mark)
    parts.append(data[pos:])
    return parts


def _props_cut(delayed: bool) -> tuple[bytes, ...] | None:
    """The encoded properties (a JSON string) of a message with only an id (and, when
    ``delayed``, a deliver time), cut where the id and the deliver time go."""
    deliver = _DELIVER if delayed else None
    text = _json_encode(msg.encode_properties(_properties(WireMessage("t", 0, _ID, b""), deliver)))
    marks = [_json_encode(_ID)[1:-1]] + ([b"%d" % _DELIVER] if delayed else [])
    parts = _cut(text, marks)
    return None if parts is None else tuple(parts)


_DELAYED_PROPS = _props_cut(True)
_NOW_PROPS = _props_cut(False)


@dataclass(frozen=True, slots=True)
class SendTemplate:
    """The SEND_MESSAGE_V2 header of one (topic, broker, sysFlag), pre-encoded: ``head``
    (to the opaque), ``mid`` (between the opaque and the flag), then ``parts`` around the
    queue id, the born time and the properties."""

    head: bytes
    mid: bytes
    parts: tuple[bytes, bytes, bytes, bytes]

    def request(
        self, queue_id: int, born_ms: int, props_json: bytes, body: bytes
    ) -> SplicedCommand:
        """The request of one message: ``props_json`` is its properties as a JSON string."""
        p = self.parts
        tail = b"%b%d%b%d%b%b%b" % (p[0], queue_id, p[1], born_ms, p[2], props_json, p[3])
        return SplicedCommand(code=_SEND_V2, head=self.head, mid=self.mid, tail=tail, body=body)


def send_template(topic: str, broker: str, sys_flag: int) -> SendTemplate | None:
    """The template of ``topic`` on ``broker`` cut from ``encode``'s output for a request
    of sentinel values, or None when a sentinel does not occur exactly once in it."""
    w = WireMessage(topic, _QUEUE, "", b"", flag=FLAG_COMPRESSED if sys_flag else 0)
    cmd = request(_SEND_V2, _header(w, broker, _BORN, _PROPS))
    cmd.opaque, cmd.flag = _OPAQUE, _FLAG
    header = encode(cmd)[8:]
    marks = [b"%d" % _OPAQUE, b"%d" % _FLAG, b"%d" % _QUEUE, b"%d" % _BORN, _json_encode(_PROPS)]
    parts = _cut(header, marks)
    if parts is None:
        return None
    return SendTemplate(parts[0], parts[1], (parts[2], parts[3], parts[4], parts[5]))


_templates: dict[tuple[str, str, int], SendTemplate | None] = {}
_MISSING = object()
_ZLIB = msg.SysFlag.COMPRESSED_ZLIB


def _props_json(w: WireMessage, deliver_ms: int | None) -> bytes:
    """``w``'s properties as the JSON string the header carries."""
    if not (w.properties or w.key or w.tags):
        mid = w.msg_id.encode()
        # ASCII letters and digits (bytes.isalnum) are their own JSON and no separator
        if len(mid) <= msg.MAX_UNIQUE_KEY_CHARS and mid.isalnum():
            if deliver_ms is None:
                if _NOW_PROPS is not None:
                    return b"%b%b%b" % (_NOW_PROPS[0], mid, _NOW_PROPS[1])
            elif _DELAYED_PROPS is not None:
                a, b, c = _DELAYED_PROPS
                return b"%b%b%b%d%b" % (a, mid, b, deliver_ms, c)
    return _json_encode(msg.encode_properties(_properties(w, deliver_ms)))


def _template(key: tuple[str, str, int]) -> SendTemplate | None:
    """The template of ``key`` (topic, broker, sysFlag), made on first use."""
    if len(_templates) >= MAX_TEMPLATES:
        _templates.clear()
    t = _templates[key] = send_template(*key)
    return t


def single_request(
    w: WireMessage, broker: str, deliver_ms: int | None, now: int
) -> RemotingCommand:
    """SEND_MESSAGE_V2 of ``w`` to its queue on ``broker``, due at ``deliver_ms`` (None:
    at once); ``now``: the born time. The bytes of ``single_request_exact``'s."""
    key = (w.topic, broker, _ZLIB if w.flag & FLAG_COMPRESSED else 0)
    t = _templates.get(key, _MISSING)
    if t is _MISSING:
        t = _template(key)
    if t is None:
        return single_request_exact(w, broker, deliver_ms, now)
    assert isinstance(t, SendTemplate)
    if (
        deliver_ms is not None
        and _DELAYED_PROPS is not None
        and not (w.properties or w.key or w.tags)
    ):
        # the common delayed message, header and properties in one splice (_props_json's)
        mid = w.msg_id.encode()
        if len(mid) <= msg.MAX_UNIQUE_KEY_CHARS and mid.isalnum():
            p0, p1, p2, p3 = t.parts
            a, b, c = _DELAYED_PROPS
            tail = b"%b%d%b%d%b%b%b%b%d%b%b" % (
                p0, w.queue_id, p1, now, p2, a, mid, b, deliver_ms, c, p3
            )  # fmt: skip
            return SplicedCommand(code=_SEND_V2, head=t.head, mid=t.mid, tail=tail, body=w.body)
    return t.request(w.queue_id, now, _props_json(w, deliver_ms), w.body)


def batch_request(wires: list[WireMessage], broker: str, now: int) -> RemotingCommand:
    """SEND_BATCH_MESSAGE of immediate ``wires`` (one queue, all compressed or none)."""
    w0 = wires[0]
    header = msg.send_header(
        group=PRODUCER_GROUP,
        topic=w0.topic,
        queue_id=w0.queue_id,
        sys_flag=_sys_flag(w0),
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
