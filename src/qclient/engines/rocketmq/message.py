"""RocketMQ message encodings, sans-I/O: properties, the SEND_MESSAGE_V2 header, batch
bodies, stored messages (pull / query / view bodies) and offset message ids.

References (apache/rocketmq): ``MessageDecoder.java`` (properties, ``encodeMessages``,
``decode``), ``MessageConst.java`` (property names), ``MessageSysFlag.java``,
``SendMessageRequestHeaderV2.java``, ``SendMessageResponseHeader.java``.
"""

from __future__ import annotations

import importlib
import ipaddress
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .remoting import RemotingCommand

__all__ = [
    "CONSUME_START_TIME",
    "DEFAULT_TOPIC",
    "DEFAULT_TOPIC_QUEUE_NUMS",
    "DELAY",
    "KEYS",
    "MAX_PROPERTIES_BYTES",
    "MAX_RECONSUME_TIMES",
    "MAX_UNIQUE_KEY_CHARS",
    "ORIGIN_MESSAGE_ID",
    "REAL_QID",
    "REAL_TOPIC",
    "RECONSUME_TIME",
    "RETRY_TOPIC",
    "TAGS",
    "TIMER_DELAY_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS",
    "TIMER_DEL_UNIQKEY",
    "TIMER_DEQUEUE_MS",
    "TIMER_ENQUEUE_MS",
    "TIMER_OUT_MS",
    "TIMER_ROLL_TIMES",
    "UNIQ_KEY",
    "WAIT",
    "MessageDecodeError",
    "OutMessage",
    "SendResponse",
    "StoredMessage",
    "SysFlag",
    "decode_messages",
    "decode_offset_msg_id",
    "decode_properties",
    "encode_batch",
    "encode_properties",
    "offset_msg_id",
    "parse_send_response",
    "send_header",
    "validate_unique_key",
]

#: The properties string is stored with a signed 16-bit length (``MessageDecoder``); the
#: broker refuses longer ones (PROPERTIES_SIZE_EXCEEDED -> MESSAGE_ILLEGAL).
MAX_PROPERTIES_BYTES = 32767
#: Our bound on a UNIQ_KEY: RocketMQ takes any string, but it is echoed in every index.
MAX_UNIQUE_KEY_CHARS = 128
#: The Java producer's ``createTopicKey`` and ``defaultTopicQueueNums`` (header c and d).
DEFAULT_TOPIC = "TBW102"
DEFAULT_TOPIC_QUEUE_NUMS = 4
_DEFAULT_QUEUE_NUMS = str(DEFAULT_TOPIC_QUEUE_NUMS)

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

MAGIC_V1 = -626843481  # topic length in 1 byte
MAGIC_V2 = -626843477  # topic length in 2 bytes


# Message property names (MessageConst.PROPERTY_*).
KEYS = "KEYS"  # space-separated index keys
TAGS = "TAGS"
WAIT = "WAIT"  # "true": answer after the store (and flush/replication) completes
DELAY = "DELAY"  # delay level 1..18 (the old ScheduleMessageService); wins over TIMER_*
UNIQ_KEY = "UNIQ_KEY"  # the client's message id
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # absolute epoch ms
TIMER_DELAY_MS = "TIMER_DELAY_MS"  # relative to the broker's receive time
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_OUT_MS = "TIMER_OUT_MS"  # the wheel slot the broker chose
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"  # when the wheel released it
TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
RECONSUME_TIME = "RECONSUME_TIME"
CONSUME_START_TIME = "CONSUME_START_TIME"


class SysFlag:
    """``MessageSysFlag`` bits."""

    COMPRESSED = 0x1
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    COMPRESSION_MASK = 0x700  # codec in bits 8-10: 1 LZ4, 2 ZSTD, 3 (or 0) ZLIB
    COMPRESSION_ZLIB = 0x300
    COMPRESSED_ZLIB = 0x301  # COMPRESSED | COMPRESSION_ZLIB: what the Java producer sends


class MessageDecodeError(ValueError):
    """A stored-message body that does not follow ``MessageDecoder``'s layout."""


# --- properties -------------------------------------------------------------------------


def _check_text(kind: str, text: Any) -> str:
    if not isinstance(text, str):
        raise ValueError(f"property {kind} must be a string, got {type(text).__name__}")
    if not text:
        # MessageDecoder.string2messageProperties drops empty names and values
        raise ValueError(f"property {kind} must not be empty")
    if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        raise ValueError(f"property {kind} {text[:40]!r} holds a \\x01 or \\x02 separator")
    return text


def encode_properties(props: Mapping[str, str]) -> str:
    """``k\\x01v\\x02`` for each property (``messageProperties2String``).

    Raises ValueError for an empty name or value, a name or value holding a separator,
    or a result over ``MAX_PROPERTIES_BYTES`` UTF-8 bytes.
    """
    text = "".join([f"{k}\x01{v}\x02" for k, v in props.items()])
    n = len(props)
    # each entry adds one of each separator: more means a name or value holds one
    if (
        text.count("\x01") != n
        or text.count("\x02") != n
        or "\x01\x02" in text
        or "\x02\x01" in text
        or text.startswith("\x01")
        or not all(type(k) is str and type(v) is str for k, v in props.items())
    ):
        for k, v in props.items():
            _check_text("name", k)
            _check_text("value", v)
    # 4 bytes is the longest UTF-8 encoding of a code point: skip the encode when it fits
    if len(text) * 4 > MAX_PROPERTIES_BYTES and len(text.encode()) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties take over RocketMQ's {MAX_PROPERTIES_BYTES} bytes")
    return text


def decode_properties(text: str) -> dict[str, str]:
    """The properties of ``text``, parsed as ``string2messageProperties`` does: an entry
    without a name or a value is skipped; the value runs to the next ``\\x02``."""
    out: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        k, sep, v = item.partition(NAME_VALUE_SEPARATOR)
        if sep and k and v:
            out[k] = v
    return out


def validate_unique_key(key: str) -> str:
    """``key`` if it can be a UNIQ_KEY (our ids are 36 hex chars; RocketMQ takes any
    string), else ValueError."""
    if not isinstance(key, str) or not key or len(key) > MAX_UNIQUE_KEY_CHARS:
        raise ValueError(f"unique key must be 1..{MAX_UNIQUE_KEY_CHARS} characters")
    if NAME_VALUE_SEPARATOR in key or PROPERTY_SEPARATOR in key:
        raise ValueError(f"unique key {key[:40]!r} holds a \\x01 or \\x02 separator")
    return key


# --- send -------------------------------------------------------------------------------


def send_header(
    *,
    group: str,
    topic: str,
    queue_id: int,
    sys_flag: int,
    born_ms: int,
    flag: int,
    properties: str | Mapping[str, str],
    reconsume_times: int = 0,
    max_reconsume_times: int | None = None,
    batch: bool = False,
    broker_name: str,
) -> dict[str, str]:
    """The ``SendMessageRequestHeaderV2`` extFields (short names a..n, plus ``bname``, the
    inherited ``RpcRequestHeader`` broker name) for SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE."""
    if not isinstance(properties, str):
        properties = encode_properties(properties)
    header = {
        "a": group,
        "b": topic,
        "c": DEFAULT_TOPIC,
        "d": _DEFAULT_QUEUE_NUMS,
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(born_ms),
        "h": str(flag),
        "i": properties,
        "j": str(reconsume_times),
        "k": "false",  # unitMode
        "m": "true" if batch else "false",
        "n": broker_name,
        "bname": broker_name,
    }
    if max_reconsume_times is not None:
        header["l"] = str(max_reconsume_times)
    return header


class OutMessage(NamedTuple):
    """One message of a batch body. ``compressed``: the body is zlib data (the batch's
    header sys_flag says so for every message, see ``encode_batch``)."""

    body: bytes
    flag: int = 0
    properties: str | Mapping[str, str] = ""  # encoded (``encode_properties``) or a mapping
    compressed: bool = False


_DELAYING = (DELAY, TIMER_DELIVER_MS, TIMER_DELAY_MS, TIMER_DELAY_SEC)
_BATCH_HEAD = struct.Struct(">iiiii")  # total size, magic 0, body CRC 0, flag, body length
_H = struct.Struct(">h")


def encode_batch(messages: Iterable[OutMessage | tuple[Any, ...]]) -> bytes:
    """A SEND_BATCH_MESSAGE body (``MessageDecoder.encodeMessages``); items are
    ``OutMessage`` or tuples in its field order ``(body, flag, properties, compressed)``.

    Raises ValueError for a message with a DELAY or TIMER_* property (the broker's batch
    path never schedules: it would be delivered at once; send timed messages singly) and
    for a batch mixing compressed and plain bodies: the broker stores the header's sysFlag
    on every message of a batch (``MessageExtEncoder.encodeBatch``), so a compressed batch
    needs ``SysFlag.COMPRESSED_ZLIB`` in its header and nothing else. Each message should
    carry its own UNIQ_KEY.
    """
    parts: list[bytes] = []
    compressed: bool | None = None
    for item in messages:
        msg = item if isinstance(item, OutMessage) else OutMessage(*item)
        if compressed is None:
            compressed = bool(msg.compressed)
        elif compressed != bool(msg.compressed):
            raise ValueError("a batch holds compressed or plain bodies, not both")
        props = msg.properties
        if isinstance(props, str):
            text = props
            has_delay = any(f"{name}\x01" in text for name in _DELAYING)
        else:
            text = encode_properties(props)
            has_delay = any(name in props for name in _DELAYING)
        if has_delay:
            raise ValueError("a batch holds immediate messages only: send timed messages singly")
        pbytes = text.encode()
        if len(pbytes) > MAX_PROPERTIES_BYTES:
            raise ValueError(f"properties take {len(pbytes)} bytes, over {MAX_PROPERTIES_BYTES}")
        body = bytes(msg.body)
        size = 20 + len(body) + 2 + len(pbytes)
        parts += (
            _BATCH_HEAD.pack(size, 0, 0, msg.flag, len(body)),
            body,
            _H.pack(len(pbytes)),
            pbytes,
        )
    return b"".join(parts)


@dataclass(slots=True)
class SendResponse:
    """The ``SendMessageResponseHeader`` of a send. ``msg_id`` is the offset message id
    (for a batch, one per message joined by commas); ``recall_handle`` is set for timed
    messages when the broker has recall enabled."""

    msg_id: str
    queue_id: int
    queue_offset: int
    recall_handle: str | None = None
    transaction_id: str | None = None
    batch_uniq_id: str | None = None


def parse_send_response(cmd: RemotingCommand) -> SendResponse:
    """The send result fields of a SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE response."""
    ext = cmd.ext_fields
    try:
        return SendResponse(
            ext.get("msgId", ""),
            int(ext.get("queueId", "-1")),
            int(ext.get("queueOffset", "-1")),
            ext.get("recallHandle") or None,
            ext.get("transactionId") or None,
            ext.get("batchUniqId") or None,
        )
    except ValueError as exc:
        raise MessageDecodeError(f"bad send response header {ext!r}: {exc}") from None


# --- stored messages --------------------------------------------------------------------


@dataclass(slots=True)
class StoredMessage:
    """A message as the store holds it (``MessageExt``), from a pull / query / view body.

    ``body`` is decompressed and COMPRESSED is then cleared from ``sys_flag``. ``msg_id``
    is the offset message id (store host + commit log offset).
    """

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_ms: int
    store_ms: int
    reconsume_times: int
    body: bytes
    properties: dict[str, str]
    msg_id: str
    flag: int = 0
    born_host: str = ""
    store_host: str = ""
    prepared_tx_offset: int = 0
    body_crc: int = 0

    @property
    def unique_key(self) -> str | None:
        """The producer's message id (UNIQ_KEY), if it set one."""
        return self.properties.get(UNIQ_KEY)

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> list[str]:
        """The index keys (KEYS, space separated)."""
        return self.properties.get(KEYS, "").split()


_STORED_HEAD = struct.Struct(">iiiiiqqiq")  # size..born timestamp: 52 bytes
_I = struct.Struct(">i")
_Q = struct.Struct(">q")
_QI = struct.Struct(">iq")  # reconsume times, prepared transaction offset
_CODECS = {0: "ZLIB", 1: "LZ4", 2: "ZSTD", 3: "ZLIB"}


def _host(raw: bytes, port: int) -> str:
    if len(raw) == 4:
        return f"{raw[0]}.{raw[1]}.{raw[2]}.{raw[3]}:{port}"
    return f"[{ipaddress.IPv6Address(raw)}]:{port}"


def _decompress(body: bytes, sys_flag: int) -> bytes:
    codec = _CODECS.get((sys_flag & SysFlag.COMPRESSION_MASK) >> 8)
    if codec is None:
        raise MessageDecodeError(f"unknown compression type in sysFlag {sys_flag:#x}")
    if codec == "ZLIB":
        decompress: Any = zlib.decompress
    else:
        package = "zstandard" if codec == "ZSTD" else "lz4.frame"
        try:
            mod: Any = importlib.import_module(package)
        except ImportError:
            raise MessageDecodeError(
                f"message body is {codec}-compressed: install the {package.split('.')[0]} "
                "package to read it"
            ) from None
        # Java writes a whole zstd frame (ZstdOutputStream) / LZ4 frame (LZ4FrameOutputStream)
        zstd = codec == "ZSTD"
        decompress = mod.ZstdDecompressor().decompressobj().decompress if zstd else mod.decompress
    try:
        return bytes(decompress(body))
    except Exception as exc:  # each codec has its own error type
        raise MessageDecodeError(f"{codec} body does not decompress: {exc}") from None


def _decode_one(data: bytes, pos: int, check_crc: bool) -> tuple[StoredMessage, int]:
    (size, magic, body_crc, queue_id, flag, queue_offset, phys_offset, sys_flag, born_ms) = (
        _STORED_HEAD.unpack_from(data, pos)
    )
    end = pos + size
    if size < _STORED_HEAD.size or end > len(data):
        raise MessageDecodeError(f"message at {pos}: size {size} overruns the {len(data)} bytes")
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise MessageDecodeError(f"message at {pos}: unknown magic code {magic}")
    p = pos + _STORED_HEAD.size
    n = 16 if sys_flag & SysFlag.BORNHOST_V6 else 4
    born_host = _host(data[p : p + n], _I.unpack_from(data, p + n)[0])
    p += n + 4
    (store_ms,) = _Q.unpack_from(data, p)
    p += 8
    n = 16 if sys_flag & SysFlag.STOREHOST_V6 else 4
    store_ip = data[p : p + n]
    (store_port,) = _I.unpack_from(data, p + n)
    p += n + 4
    reconsume, prepared = _QI.unpack_from(data, p)
    p += 12
    (body_len,) = _I.unpack_from(data, p)
    p += 4
    if body_len < 0 or p + body_len > end:
        raise MessageDecodeError(f"message at {pos}: body length {body_len} overruns it")
    body = data[p : p + body_len]
    p += body_len
    if check_crc and body_len and zlib.crc32(body) & 0x7FFFFFFF != body_crc:
        raise MessageDecodeError(f"message at {pos}: body CRC mismatch")
    if body_len and sys_flag & SysFlag.COMPRESSED:
        body = _decompress(body, sys_flag)
        sys_flag &= ~SysFlag.COMPRESSED
    if magic == MAGIC_V1:
        topic_len = data[p]
        p += 1
    else:
        (topic_len,) = _H.unpack_from(data, p)
        p += 2
    topic = data[p : p + topic_len].decode("utf-8", "replace")  # as Java's new String
    p += topic_len
    (prop_len,) = _H.unpack_from(data, p)
    p += 2
    if p + max(prop_len, 0) > end:
        raise MessageDecodeError(f"message at {pos}: properties overrun it")
    props = {}
    if prop_len > 0:
        props = decode_properties(data[p : p + prop_len].decode("utf-8", "replace"))
    msg = StoredMessage(
        topic,
        queue_id,
        queue_offset,
        phys_offset,
        sys_flag,
        born_ms,
        store_ms,
        reconsume,
        body,
        props,
        (store_ip + store_port.to_bytes(4, "big") + phys_offset.to_bytes(8, "big", signed=True))
        .hex()
        .upper(),
        flag,
        born_host,
        _host(store_ip, store_port),
        prepared,
        body_crc,
    )
    return msg, end


def decode_messages(body: bytes, *, check_crc: bool = False) -> list[StoredMessage]:
    """Every message of a PULL / QUERY / VIEW body (``MessageDecoder.decodes``), both
    magic versions, IPv4 and IPv6 hosts, bodies decompressed.

    Raises MessageDecodeError for a malformed body or a codec that is not installed.
    """
    data = bytes(body)
    out: list[StoredMessage] = []
    pos = 0
    total = len(data)
    try:
        while pos < total:
            msg, pos = _decode_one(data, pos, check_crc)
            out.append(msg)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise MessageDecodeError(f"message at {pos} is truncated or malformed: {exc}") from None
    return out


# --- offset message ids -----------------------------------------------------------------


def offset_msg_id(host: str, port: int, offset: int) -> str:
    """The offset message id (``MessageDecoder.createMessageId``): upper-case hex of the
    store host's IP (4 or 16 bytes), port (int32) and commit log offset (int64)."""
    ip = ipaddress.ip_address(host.strip("[]"))
    return (ip.packed + _I.pack(port) + _Q.pack(offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """``(host, port, commit_log_offset)`` of an offset message id (32 or 56 hex chars)."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"offset message id must be 32 or 56 hex chars, got {len(msg_id)}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ValueError(f"offset message id {msg_id!r} is not hex") from None
    n = 4 if len(raw) == 16 else 16
    host = str(ipaddress.ip_address(raw[:n]))
    (port,) = _I.unpack_from(raw, n)
    (offset,) = _Q.unpack_from(raw, n + 4)
    return host, port, offset
