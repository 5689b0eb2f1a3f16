"""The sans-I/O RocketMQ message codec: properties, send header, batch bodies, stored
messages, offset message ids."""

from __future__ import annotations

import importlib.util
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qclient.engines.rocketmq import message as m
from qclient.engines.rocketmq.remoting import RemotingCommand

# --- messages ---------------------------------------------------------------------------

_prop_text = st.text(
    st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), min_size=1
)


@settings(max_examples=200)
@given(st.dictionaries(_prop_text, _prop_text, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert m.decode_properties(m.encode_properties(props)) == props


@pytest.mark.parametrize(
    "props", [{"a\x01": "v"}, {"a": "v\x02"}, {"a": ""}, {"": "v"}, {"a": 1}, {"k": "é" * 16384}]
)
def test_bad_properties(props: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        m.encode_properties(props)


def test_properties_limit_and_java_parsing() -> None:
    m.encode_properties({"k": "v" * (m.MAX_PROPERTIES_BYTES - 3)})
    with pytest.raises(ValueError):
        m.encode_properties({"k": "v" * (m.MAX_PROPERTIES_BYTES - 2)})
    # string2messageProperties skips entries with no name or value; the value keeps \x01
    assert m.decode_properties("a\x01\x02\x01b\x02c\x01d\x01e\x02f") == {"c": "d\x01e"}
    assert m.validate_unique_key("0" * 36)
    for bad in ("", "x" * 129, "a\x02"):
        with pytest.raises(ValueError):
            m.validate_unique_key(bad)


def test_send_header() -> None:
    h = m.send_header(
        group="g",
        topic="T",
        queue_id=3,
        sys_flag=0,
        born_ms=17,
        flag=0,
        properties={m.UNIQ_KEY: "u"},
        broker_name="broker-a",
    )
    assert h == {
        "a": "g",
        "b": "T",
        "c": "TBW102",
        "d": "4",
        "e": "3",
        "f": "0",
        "g": "17",
        "h": "0",
        "i": "UNIQ_KEY\x01u\x02",
        "j": "0",
        "k": "false",
        "m": "false",
        "n": "broker-a",
        "bname": "broker-a",
    }
    h = m.send_header(
        group="g",
        topic="%RETRY%g",
        queue_id=0,
        sys_flag=0,
        born_ms=1,
        flag=0,
        properties="",
        reconsume_times=2,
        max_reconsume_times=16,
        batch=True,
        broker_name="b",
    )
    assert (h["j"], h["l"], h["m"]) == ("2", "16", "true")


def test_encode_batch_layout() -> None:
    body = m.encode_batch([(b"one", 0, {m.UNIQ_KEY: "1"}), m.OutMessage(b"", 7, "K\x01v\x02")])
    pos, seen = 0, []
    while pos < len(body):
        size, magic, crc, flag, blen = struct.unpack_from(">iiiii", body, pos)
        payload = body[pos + 20 : pos + 20 + blen]
        (plen,) = struct.unpack_from(">h", body, pos + 20 + blen)
        props = body[pos + 22 + blen : pos + 22 + blen + plen].decode()
        assert (magic, crc, size) == (0, 0, 22 + blen + plen)
        seen.append((payload, flag, m.decode_properties(props)))
        pos += size
    assert seen == [(b"one", 0, {"UNIQ_KEY": "1"}), (b"", 7, {"K": "v"})]
    with pytest.raises(ValueError, match="immediate"):
        m.encode_batch([(b"x", 0, {m.TIMER_DELIVER_MS: "1"})])
    with pytest.raises(ValueError, match="compressed"):
        m.encode_batch([(b"x", 0, "", True), (b"y", 0, "", False)])


def test_parse_send_response() -> None:
    resp = RemotingCommand(
        0, 1, 1, None, {"msgId": "AB", "queueId": "2", "queueOffset": "9", "recallHandle": "djE="}
    )
    r = m.parse_send_response(resp)
    assert (r.msg_id, r.queue_id, r.queue_offset, r.recall_handle, r.transaction_id) == (
        "AB",
        2,
        9,
        "djE=",
        None,
    )


def _stored(
    *,
    v2: bool,
    ipv6: bool,
    body: bytes,
    sys_flag: int = 0,
    props: str = "",
    topic: str = "T",
    commit: int = 4096,
) -> bytes:
    """One stored message laid out as ``MessageDecoder.decode`` reads it."""
    if ipv6:
        sys_flag |= m.SysFlag.BORNHOST_V6 | m.SysFlag.STOREHOST_V6
    born = bytes(15) + b"\x01" if ipv6 else bytes([10, 0, 0, 7])
    store = bytes(15) + b"\x01" if ipv6 else bytes([127, 0, 0, 1])
    t, p = topic.encode(), props.encode()
    rest = (
        struct.pack(">iiiqqiq", 5, 3, 0, 11, commit, sys_flag, 1000)
        + born
        + struct.pack(">iq", 555, 2000)
        + store
        + struct.pack(">iiqi", 10911, 1, 0, len(body))
        + body
        + (struct.pack(">h", len(t)) if v2 else bytes([len(t)]))
        + t
        + struct.pack(">h", len(p))
        + p
    )
    magic = m.MAGIC_V2 if v2 else m.MAGIC_V1
    return struct.pack(">ii", 8 + len(rest), magic) + rest


def test_decode_v1_and_v2_messages() -> None:
    props = "UNIQ_KEY\x01abc\x02TAGS\x01t1\x02KEYS\x01k1 k2\x02"
    data = _stored(v2=False, ipv6=False, body=b"hello", props=props) + _stored(
        v2=True,
        ipv6=True,
        body=zlib.compress(b"zipped" * 10),
        topic="T2",
        commit=8192,
        sys_flag=m.SysFlag.COMPRESSED_ZLIB,
    )
    a, b = m.decode_messages(data, check_crc=False)
    assert (a.topic, a.queue_id, a.flag, a.queue_offset, a.commit_log_offset) == (
        "T",
        3,
        0,
        11,
        4096,
    )
    assert (a.born_ms, a.store_ms, a.reconsume_times, a.body) == (1000, 2000, 1, b"hello")
    assert (a.born_host, a.store_host) == ("10.0.0.7:555", "127.0.0.1:10911")
    assert (a.unique_key, a.tags, a.keys) == ("abc", "t1", ["k1", "k2"])
    assert (
        a.msg_id == m.offset_msg_id("127.0.0.1", 10911, 4096) == "7F00000100002A9F0000000000001000"
    )
    assert (b.topic, b.body, b.properties, b.unique_key, b.keys) == (
        "T2",
        b"zipped" * 10,
        {},
        None,
        [],
    )
    assert b.store_host == "[::1]:10911" and not b.sys_flag & m.SysFlag.COMPRESSED
    assert m.decode_offset_msg_id(b.msg_id) == ("::1", 10911, 8192)
    with pytest.raises(m.MessageDecodeError):
        m.decode_messages(data[:-3])
    with pytest.raises(m.MessageDecodeError, match="CRC"):
        m.decode_messages(_stored(v2=True, ipv6=False, body=b"x"), check_crc=True)


def test_decode_other_codecs() -> None:
    lz4 = _stored(v2=True, ipv6=False, body=b"\x04\x22\x4d\x18", sys_flag=0x101)
    if importlib.util.find_spec("lz4") is None:
        with pytest.raises(m.MessageDecodeError, match=r"LZ4.*install the lz4 package"):
            m.decode_messages(lz4)
    if importlib.util.find_spec("zstandard") is not None:
        import zstandard

        zb = zstandard.ZstdCompressor().compress(b"z" * 100)
        (msg,) = m.decode_messages(_stored(v2=True, ipv6=False, body=zb, sys_flag=0x201))
        assert msg.body == b"z" * 100
    with pytest.raises(m.MessageDecodeError, match="ZLIB"):
        m.decode_messages(_stored(v2=True, ipv6=False, body=b"not zlib", sys_flag=0x301))


def test_offset_msg_id_round_trip() -> None:
    for host, port, off in (("192.168.1.2", 10911, 0), ("::1", 1, 2**40), ("10.0.0.1", 65535, 7)):
        mid = m.offset_msg_id(host, port, off)
        assert len(mid) in (32, 56) and m.decode_offset_msg_id(mid) == (host, port, off)
        assert m.decode_offset_msg_id(mid.lower()) == (host, port, off)
    with pytest.raises(ValueError):
        m.decode_offset_msg_id("XYZ")
