"""RocketMQ remoting frames and commands, sans-I/O.

A frame is, big-endian: ``int32 length`` (of everything after it), ``int32 header mark``
(``serialize type << 24 | header length``), the header, the body. The header is JSON
(serialize type 0, what we send) or RocketMQ's binary layout (type 1, which a server
configured with ``rocketmq.serialize.type=ROCKETMQ`` answers in, whatever the request used).
Reference: ``RemotingCommand.java`` and ``RocketMQSerializable.java`` in apache/rocketmq.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

import msgspec

__all__ = [
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "MAX_FRAME",
    "VERSION",
    "FrameDecoder",
    "RemotingCommand",
    "RemotingProtocolError",
    "SplicedCommand",
    "decode_frame",
    "encode",
    "request",
    "response_to",
]

#: ``MQVersion.Version.V5_5_0.ordinal()``, the version the 5.5.0 Java client sends. Any value
#: >= 401 (V4_9_4) makes the NameServer answer routes in standard JSON (quoted map keys).
VERSION = 513

#: Largest frame, its 4-byte length prefix included: Netty's ``LengthFieldBasedFrameDecoder``
#: in ``NettyDecoder`` (``com.rocketmq.remoting.frameMaxLength``, default 16 MiB) counts it.
MAX_FRAME = 16 * 1024 * 1024

FLAG_RESPONSE = 1  # bit 0: a response (RemotingCommand.RPC_TYPE)
FLAG_ONEWAY = 2  # bit 1: no response expected (RemotingCommand.RPC_ONEWAY)

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1

#: ``LanguageCode`` ordinals, for the binary header (which carries the byte, not the name).
LANGUAGES = (
    "JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY",
    "OTHER", "HTTP", "GO", "PHP", "OMS", "RUST", "NODE_JS",
)  # fmt: skip

_PREFIX = struct.Struct(">II")  # total length, header mark
_BIN_FIXED = struct.Struct(">hbhiii")  # code, language, version, opaque, flag, remark length
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")

# one process-wide sequence: itertools.count's next() is atomic under the GIL
_opaques = itertools.count(1)


class RemotingProtocolError(Exception):
    """A frame or header that does not follow the remoting protocol."""


class RemotingCommand(msgspec.Struct, gc=False):
    """One remoting request or response. ``ext_fields`` values are strings on the wire.

    Not tracked by the cyclic collector (``gc=False``: its fields are numbers, strings,
    bytes and a dict of strings, so it is never part of a cycle): a pipelined connection
    keeps hundreds in flight, and tracked ones would set off collections.
    """

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = msgspec.field(default_factory=dict)
    body: bytes = b""
    language: str = "PYTHON"
    version: int = VERSION

    @property
    def is_response(self) -> bool:
        """True for a response (flag bit 0)."""
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """True for a oneway request, which gets no response (flag bit 1)."""
        return bool(self.flag & FLAG_ONEWAY)


class SplicedCommand(RemotingCommand, kw_only=True):
    """A request whose JSON header was encoded ahead but for its ``opaque`` and ``flag``,
    which ``encode`` splices in: ``head`` + opaque + ``mid`` + flag + ``tail``.

    The parts are cut from ``encode``'s own output for a command with sentinel values
    (``sending.SendTemplate``), so ``encode`` stays the one home of the header's layout.
    ``code``, ``language``, ``version``, ``remark`` and the extFields are fixed in the
    parts: ``ext_fields`` is empty here and ``fields()`` decodes them.
    """

    head: bytes
    mid: bytes
    tail: bytes

    def fields(self) -> dict[str, str]:
        """The extFields the header carries (decoded from the encoded frame)."""
        return decode_frame(encode(self)[4:]).ext_fields

    def __eq__(self, other: object) -> bool:
        if type(other) is not SplicedCommand:
            return NotImplemented
        return (self.opaque, self.flag, self.head, self.mid, self.tail, self.body) == (
            other.opaque,
            other.flag,
            other.head,
            other.mid,
            other.tail,
            other.body,
        )

    def __repr__(self) -> str:
        return f"SplicedCommand(code={self.code}, opaque={self.opaque}, header={self.tail!r})"


_json_encode = msgspec.json.Encoder().encode


def encode(cmd: RemotingCommand) -> bytes:
    """The whole frame of ``cmd`` (length prefix included) with a JSON header.

    Raises RemotingProtocolError when the frame would exceed ``MAX_FRAME``: the server
    would close the connection on it.
    """
    if type(cmd) is SplicedCommand:
        header = b"%b%d%b%d%b" % (cmd.head, cmd.opaque, cmd.mid, cmd.flag, cmd.tail)
    else:
        hdr: dict[str, Any] = {
            "code": cmd.code,
            "language": cmd.language,
            "version": cmd.version,
            "opaque": cmd.opaque,
            "flag": cmd.flag,
            "extFields": cmd.ext_fields,
            "serializeTypeCurrentRPC": "JSON",
        }
        if cmd.remark is not None:
            hdr["remark"] = cmd.remark
        header = _json_encode(hdr)
    hlen = len(header)
    body = cmd.body
    length = 4 + hlen + len(body)
    if length + 4 > MAX_FRAME:
        raise RemotingProtocolError(
            f"frame of {length + 4} bytes exceeds the {MAX_FRAME}-byte limit (code {cmd.code})"
        )
    if hlen > 0xFFFFFF:
        raise RemotingProtocolError(f"header of {hlen} bytes exceeds the 24-bit length")
    if body:
        return b"".join((_PREFIX.pack(length, hlen), header, body))
    return _PREFIX.pack(length, hlen) + header


def request(
    code: int,
    ext_fields: dict[str, str] | None = None,
    body: bytes = b"",
    *,
    oneway: bool = False,
) -> RemotingCommand:
    """A request with a fresh opaque (process-wide sequence, wrapping at 2**31; a driver
    may replace it with its own)."""
    return RemotingCommand(
        code,
        next(_opaques) & 0x7FFFFFFF,
        FLAG_ONEWAY if oneway else 0,
        None,
        {} if ext_fields is None else ext_fields,
        body,
    )


def response_to(req: RemotingCommand, code: int, remark: str | None = None) -> RemotingCommand:
    """The response to ``req`` (a request the server sent us): same opaque, response flag."""
    return RemotingCommand(code, req.opaque, FLAG_RESPONSE, remark)


# --- decoding -------------------------------------------------------------------------


class _JsonHeader(msgspec.Struct):
    code: int = 0
    language: str | None = None
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    extFields: dict[str, str] | None = None  # the wire name


class _LooseJsonHeader(msgspec.Struct):
    """The fallback when a peer sends non-string extFields values or a non-string remark."""

    code: int = 0
    language: Any = None
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: Any = None
    extFields: dict[str, Any] | None = None  # the wire name


_strict_json = msgspec.json.Decoder(_JsonHeader).decode
_loose_json = msgspec.json.Decoder(_LooseJsonHeader).decode


def _java_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def _decode_json_header(data: bytes | memoryview, body: bytes) -> RemotingCommand:
    try:
        h = _strict_json(data)
        ext = h.extFields if h.extFields is not None else {}
        remark = h.remark
        language = h.language
    except msgspec.ValidationError:
        try:
            lh = _loose_json(data)
        except msgspec.MsgspecError as exc:
            raise RemotingProtocolError(f"bad JSON header: {exc}") from None
        ext = {k: _java_str(v) for k, v in (lh.extFields or {}).items() if v is not None}
        remark = None if lh.remark is None else _java_str(lh.remark)
        language = None if lh.language is None else _java_str(lh.language)
        h = lh  # type: ignore[assignment]
    except msgspec.DecodeError as exc:
        raise RemotingProtocolError(f"bad JSON header: {exc}") from None
    return RemotingCommand(
        h.code, h.opaque, h.flag, remark, ext, body, language or "OTHER", h.version
    )


def _decode_binary_header(data: bytes, body: bytes) -> RemotingCommand:
    """``RocketMQSerializable.rocketMQProtocolDecode``: a zero length string is null."""
    n = len(data)
    try:
        code, lang, version, opaque, flag, rlen = _BIN_FIXED.unpack_from(data, 0)
        pos = _BIN_FIXED.size
        if rlen < 0 or pos + rlen > n:
            raise RemotingProtocolError(f"binary header: remark length {rlen} of {n}")
        remark = data[pos : pos + rlen].decode() if rlen else None
        pos += rlen
        (elen,) = _I32.unpack_from(data, pos)
        pos += 4
        if elen < 0 or pos + elen > n:
            raise RemotingProtocolError(f"binary header: extFields length {elen} of {n}")
        end = pos + elen
        ext: dict[str, str] = {}
        while pos < end:
            (klen,) = _I16.unpack_from(data, pos)
            pos += 2
            key = data[pos : pos + klen].decode()
            pos += klen
            (vlen,) = _I32.unpack_from(data, pos)
            pos += 4
            if klen < 0 or vlen < 0 or pos + vlen > end:
                raise RemotingProtocolError("binary header: extFields entry overruns its map")
            ext[key] = data[pos : pos + vlen].decode()
            pos += vlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise RemotingProtocolError(f"bad binary header: {exc}") from None
    language = LANGUAGES[lang] if 0 <= lang < len(LANGUAGES) else "OTHER"
    return RemotingCommand(code, opaque, flag, remark, ext, body, language, version)


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """One command from a frame without its 4-byte length prefix."""
    n = len(frame)
    if n < 4:
        raise RemotingProtocolError(f"frame of {n} bytes has no header mark")
    (mark,) = _I32.unpack_from(frame, 0)
    stype = (mark >> 24) & 0xFF
    hlen = mark & 0xFFFFFF
    if hlen > n - 4:
        raise RemotingProtocolError(f"header length {hlen} exceeds the frame ({n - 4} bytes)")
    header = bytes(frame[4 : 4 + hlen])
    body = bytes(frame[4 + hlen :])
    if stype == SERIALIZE_JSON:
        return _decode_json_header(header, body)
    if stype == SERIALIZE_ROCKETMQ:
        return _decode_binary_header(header, body)
    raise RemotingProtocolError(f"unknown serialize type {stype}")


class FrameDecoder:
    """Incremental decoder for one connection's byte stream.

    ``feed`` returns the commands completed so far. After a protocol error the stream
    cannot be resynchronised: every later ``feed`` raises again (close the connection).
    """

    __slots__ = ("_buf", "_error", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._error: RemotingProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a whole frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """Add received bytes; return the commands they complete, in stream order."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        buf += data
        out: list[RemotingCommand] = []
        pos = 0
        avail = len(buf)
        view = memoryview(buf)
        try:
            while avail - pos >= 4:
                (length,) = _I32.unpack_from(buf, pos)
                if length < 4 or length + 4 > self.max_frame:
                    raise RemotingProtocolError(
                        f"frame length {length} outside 4..{self.max_frame - 4}"
                    )
                end = pos + 4 + length
                if end > avail:
                    break
                (mark,) = _I32.unpack_from(buf, pos + 4)
                start = pos + 8 + (mark & 0xFFFFFF)
                if mark >> 24 == SERIALIZE_JSON and start <= end:
                    # decode_frame's JSON case, without its copies and call
                    body = bytes(view[start:end]) if start < end else b""
                    out.append(_decode_json_header(view[pos + 8 : start], body))
                else:
                    out.append(decode_frame(view[pos + 4 : end]))
                pos = end
        except RemotingProtocolError as exc:
            # a traceback may still hold a slice of the view, which pins the bytearray's
            # size: drop it rather than clear it
            self._error = exc
            self._buf = bytearray()
            raise
        finally:
            view.release()
        if pos:
            del buf[:pos]
        return out
