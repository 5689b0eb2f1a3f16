"""Binary record codec shared by the message log and the consume logs.

Layout (little endian)::

    magic u32 | length u32 (whole record) | crc32 u32 (of every byte after it)
    kind u8 | flag i32 | queue_id i32 | received_ms i64 | deliver_at_ms i64
    fired_at_ms i64 | qoffset i64 | ref i64
    len(msg_id) u16 | len(topic) u16 | len(key) u16 | len(tags) u16 | len(props) u32 | len(body) u32
    msg_id | topic | key | tags | props (msgpack map) | body

``None`` strings/properties have length 0xFFFF / 0xFFFFFFFF. ``ref`` is the message-log
position a record refers to (the cancelled message for a tombstone, the source message for a
consume-log record, the replaced record for a reschedule); ``qoffset`` is the consume-queue
offset of a fired record.

A reschedule (``KIND_RESCHEDULE``) is a whole copy of the message with its new deliver time,
``ref`` the replaced record and ``qoffset`` the replaced record's deliver time (it names the
time bucket the old entry is cancelled in): one record, so a crash leaves either the old
schedule or the new one, never both and never neither.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any, NamedTuple, Protocol

import msgspec

MAGIC = 0x31514451  # b"QDQ1"
KIND_MESSAGE = 1
KIND_CANCEL = 2
KIND_FIRED = 3
KIND_RESCHEDULE = 4
_KINDS = (KIND_MESSAGE, KIND_CANCEL, KIND_FIRED, KIND_RESCHEDULE)
#: kinds of message-log records that schedule a message (what firing and lookups accept)
SCHEDULING_KINDS = (KIND_MESSAGE, KIND_RESCHEDULE)

PRE = struct.Struct("<III")
REST = struct.Struct("<BiiqqqqqHHHHII")
HEADER_SIZE = PRE.size + REST.size
_NONE16 = 0xFFFF
_NONE32 = 0xFFFFFFFF
MAX_STR = 0xFFFE

_enc_props = msgspec.msgpack.Encoder()
_dec_props = msgspec.msgpack.Decoder(dict[str, str])


class Record(NamedTuple):
    """A decoded record."""

    kind: int
    flag: int
    queue_id: int
    received_ms: int
    deliver_at_ms: int
    fired_at_ms: int
    qoffset: int
    ref: int
    msg_id: str
    topic: str
    key: str | None
    tags: str | None
    properties: dict[str, str] | None
    body: bytes


class CorruptRecord(Exception):
    """Bad magic, impossible length or CRC mismatch."""


def encode(
    kind: int,
    msg_id: str,
    topic: str,
    body: bytes,
    *,
    flag: int = 0,
    queue_id: int = 0,
    received_ms: int = 0,
    deliver_at_ms: int = 0,
    fired_at_ms: int = 0,
    qoffset: int = 0,
    ref: int = 0,
    key: str | None = None,
    tags: str | None = None,
    properties: dict[str, str] | None = None,
) -> bytes:
    """Encode one record; raises ValueError on out-of-range fields."""
    mid = msg_id.encode()
    top = topic.encode()
    if key is None:
        kb, kl = b"", _NONE16
    else:
        kb = key.encode()
        kl = len(kb)
    if tags is None:
        tb, tl = b"", _NONE16
    else:
        tb = tags.encode()
        tl = len(tb)
    if properties is None:
        pb, pl = b"", _NONE32
    else:
        pb = _enc_props.encode(properties)
        pl = len(pb)
    lm = len(mid)
    lt = len(top)
    if lm > MAX_STR or lt > MAX_STR or len(kb) > MAX_STR or len(tb) > MAX_STR:
        raise ValueError("string field longer than 65534 bytes")
    try:
        head = REST.pack(
            kind,
            flag,
            queue_id,
            received_ms,
            deliver_at_ms,
            fired_at_ms,
            qoffset,
            ref,
            lm,
            lt,
            kl,
            tl,
            pl,
            len(body),
        )
    except struct.error as exc:
        raise ValueError(f"record field out of range: {exc}") from None
    rest = b"".join((head, mid, top, kb, tb, pb, body))
    return PRE.pack(MAGIC, PRE.size + len(rest), zlib.crc32(rest)) + rest


class WireFields(Protocol):
    """What :func:`encode_messages` reads from each message given with its deliver time
    (the broker's wire message)."""

    topic: str
    msg_id: str
    body: bytes
    flag: int
    queue_id: int
    key: str | None
    tags: str | None
    properties: dict[str, str] | None


class PlainMessage(WireFields, Protocol):
    """What :func:`encode_messages` reads from each message (the store's NewMessage)."""

    received_ms: int
    deliver_at_ms: int


def encode_messages(
    msgs: Sequence[PlainMessage] | Sequence[WireFields],
    topics: dict[str, bytes],
    received_ms: int,
    deliver_ats: Sequence[int] | None = None,
) -> list[bytes] | None:
    """``encode(KIND_MESSAGE, ...)`` of each message (``received_ms`` where a message has
    0), for the send path's hot loop: the same bytes, one loop, topics encoded once
    (``topics``: name -> its UTF-8). ``deliver_ats``: the messages' deliver times, when
    they are not on the messages (then every one was received at ``received_ms``). None
    when a message has a key, tags, properties or a body that is not ``bytes`` (use
    :func:`encode` for those). Raises ValueError (or struct.error) on out-of-range fields
    like :func:`encode`."""
    out: list[bytes] = []
    append = out.append
    pack = REST.pack
    pre = PRE.pack
    crc32 = zlib.crc32
    join = b"".join
    head = PRE.size
    if deliver_ats is None:
        rows: Iterable[tuple[Any, int, int]] = (
            (m, m.deliver_at_ms, m.received_ms or received_ms)  # type: ignore[attr-defined]
            for m in msgs
        )
    else:
        if len(deliver_ats) != len(msgs):
            raise ValueError("one deliver time per message")
        rows = zip(msgs, deliver_ats, repeat(received_ms), strict=False)
    for m, deliver_at, received in rows:
        body = m.body
        if m.key is not None or m.tags is not None or m.properties is not None:
            return None
        if type(body) is not bytes:
            return None
        mid = m.msg_id.encode()
        top = topics[m.topic]
        lm = len(mid)
        lt = len(top)
        if lm > MAX_STR or lt > MAX_STR:
            raise ValueError("string field longer than 65534 bytes")
        rest = join(
            (
                pack(
                    KIND_MESSAGE,
                    m.flag,
                    m.queue_id,
                    received,
                    deliver_at,
                    0,
                    0,
                    0,
                    lm,
                    lt,
                    _NONE16,
                    _NONE16,
                    _NONE32,
                    len(body),
                ),
                mid,
                top,
                body,
            )
        )
        append(pre(MAGIC, head + len(rest), crc32(rest)) + rest)
    return out


def peek_length(buf: bytes | memoryview, off: int = 0) -> int:
    """Length of the record starting at ``off`` (validates magic and bounds only)."""
    if len(buf) - off < PRE.size:
        raise CorruptRecord("short header")
    magic, length, _ = PRE.unpack_from(buf, off)
    if magic != MAGIC or length < HEADER_SIZE:
        raise CorruptRecord("bad magic or length")
    return int(length)


def decode(buf: bytes | memoryview, off: int = 0) -> tuple[Record, int]:
    """Decode the record at ``off``; returns it and its length. Raises CorruptRecord."""
    avail = len(buf) - off
    if avail < HEADER_SIZE:
        raise CorruptRecord("short header")
    magic, length, crc = PRE.unpack_from(buf, off)
    if magic != MAGIC or length < HEADER_SIZE:
        raise CorruptRecord("bad magic or length")
    if length > avail:
        raise CorruptRecord("truncated record")
    mv = memoryview(buf)[off + PRE.size : off + length]
    if zlib.crc32(mv) != crc:
        raise CorruptRecord("crc mismatch")
    (kind, flag, qid, rec_ms, dl_ms, fired, qoff, ref, lm, lt, lk, lg, lp, lb) = REST.unpack_from(
        mv
    )
    if kind not in _KINDS:
        raise CorruptRecord("unknown kind")
    p = REST.size
    try:
        msg_id = bytes(mv[p : p + lm]).decode()
        p += lm
        topic = bytes(mv[p : p + lt]).decode()
        p += lt
        key = None
        if lk != _NONE16:
            key = bytes(mv[p : p + lk]).decode()
            p += lk
        tags = None
        if lg != _NONE16:
            tags = bytes(mv[p : p + lg]).decode()
            p += lg
        props = None
        if lp != _NONE32:
            props = _dec_props.decode(mv[p : p + lp])
            p += lp
        body = bytes(mv[p : p + lb])
        p += lb
    except (UnicodeDecodeError, msgspec.DecodeError) as exc:
        raise CorruptRecord(f"bad field: {exc}") from None
    if p != len(mv) or len(body) != lb:
        raise CorruptRecord("field lengths do not add up")
    rec = Record(
        kind, flag, qid, rec_ms, dl_ms, fired, qoff, ref, msg_id, topic, key, tags, props, body
    )
    return rec, int(length)


def trusted_fields(
    data: bytes,
) -> tuple[str, str | None, str | None, dict[str, str] | None, bytes, int, int, int]:
    """``(msg_id, key, tags, properties, body, deliver_at_ms, fired_at_ms, flag)`` of a
    record this process built from one whose CRC it checked (a pull of what was just
    fired): :func:`decode` without the CRC and consistency checks, its largest cost.
    Raises CorruptRecord if the bytes do not parse."""
    try:
        (_k, flag, _q, _r, deliver, fired, _o, _ref, lm, lt, lk, lg, lp, lb) = REST.unpack_from(
            data, PRE.size
        )
        p = HEADER_SIZE
        msg_id = data[p : p + lm].decode()
        p += lm + lt
        key = tags = props = None
        if lk != _NONE16:
            key = data[p : p + lk].decode()
            p += lk
        if lg != _NONE16:
            tags = data[p : p + lg].decode()
            p += lg
        if lp != _NONE32:
            props = _dec_props.decode(data[p : p + lp])
            p += lp
    except (struct.error, UnicodeDecodeError, msgspec.DecodeError) as exc:
        raise CorruptRecord(f"bad field: {exc}") from None
    return msg_id, key, tags, props, data[p : p + lb], deliver, fired, flag


# byte offsets inside a record (PRE is 12 bytes, then REST)
_OFF_KIND = 12
_OFF_FIRED = 37  # fired_at_ms, qoffset, ref: three i64
_ROUTE = struct.Struct("<BiiqqqqqHH")  # up to len(topic)
_FIRED_FIELDS = struct.Struct("<qqq")


_KIND_FIRED_BYTE = bytes([KIND_FIRED])
_AFTER_FIRED = _OFF_FIRED + _FIRED_FIELDS.size


def verify_route(data: bytes) -> tuple[int, int, int, bytes]:
    """Check magic, length and CRC of the whole record in ``data``; return the few fields
    the firing path needs, without decoding the rest: ``(kind, queue_id, deliver_at_ms,
    topic as bytes)`` (a plain tuple and the topic undecoded: firing calls this once per
    message, and caches the topic's decoding)."""
    if len(data) < HEADER_SIZE:
        raise CorruptRecord("short header")
    magic, length, crc = PRE.unpack_from(data)
    if magic != MAGIC or length != len(data):
        raise CorruptRecord("bad magic or length")
    if zlib.crc32(data[PRE.size :]) != crc:  # a bytes slice: cheaper than a memoryview's
        raise CorruptRecord("crc mismatch")
    kind, _f, qid, _r, deliver, _fi, _qo, _ref, lm, lt = _ROUTE.unpack_from(data, PRE.size)
    start = HEADER_SIZE + lm
    return kind, qid, deliver, data[start : start + lt]


def to_fired(data: bytes, fired_at_ms: int, qoffset: int, ref: int) -> bytes:
    """The consume-log copy of a message record: same fields, kind FIRED, new CRC (the
    record is joined from its unchanged slices: no mutable copy, one CRC pass)."""
    rest = b"".join(
        (
            _KIND_FIRED_BYTE,
            data[_OFF_KIND + 1 : _OFF_FIRED],
            _FIRED_FIELDS.pack(fired_at_ms, qoffset, ref),
            data[_AFTER_FIRED:],
        )
    )
    return PRE.pack(MAGIC, len(data), zlib.crc32(rest)) + rest
