"""The sans-I/O RocketMQ codec: frames, codes, messages, routes; and one real NameServer."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qclient.engines.rocketmq.codes import (
    RequestCode,
    ResponseCode,
    error_for,
    is_ambiguous_code,
    send_outcome,
)
from qclient.engines.rocketmq.local.runtime import JVM_OPTS_ENV
from qclient.engines.rocketmq.remoting import (
    MAX_FRAME,
    VERSION,
    FrameDecoder,
    RemotingCommand,
    RemotingProtocolError,
    encode,
    request,
    response_to,
)
from qclient.engines.rocketmq.route import parse_cluster_info, parse_route, quote_bare_keys
from qclient.errors import (
    AuthError,
    BrokerResponseError,
    BrokerUnavailableError,
    InvalidMessageError,
    MessageTooLargeError,
    RouteNotFoundError,
)
from qclient.protocol.wire import BrokerData, QueueData
from qclient.transport.errors import Outcome

# --- frames -----------------------------------------------------------------------------


def _feed_all(data: bytes, cuts: list[int]) -> list[RemotingCommand]:
    dec = FrameDecoder()
    out: list[RemotingCommand] = []
    last = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        out += dec.feed(data[last:cut])
        last = cut
    assert dec.buffered == 0
    return out


def test_header_mark_matches_the_java_vector() -> None:
    """``markProtocolType(261, JSON)`` is 00 00 01 05: a 261-byte JSON header."""
    cmd = RemotingCommand(105, opaque=1, remark="")
    pad = 261 - (len(encode(cmd)) - 8)
    cmd.remark = "x" * pad
    frame = encode(cmd)
    assert frame[4:8] == bytes.fromhex("00000105")
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4


def test_json_header_fields() -> None:
    cmd = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    header = json.loads(encode(cmd)[8:])
    assert header == {
        "code": 105,
        "language": "PYTHON",
        "version": VERSION,
        "opaque": cmd.opaque,
        "flag": 0,
        "extFields": {"topic": "T"},
        "serializeTypeCurrentRPC": "JSON",
    }
    assert VERSION == 513  # MQVersion.Version.V5_5_0.ordinal()
    assert request(1).opaque != request(1).opaque
    one = request(34, oneway=True)
    assert one.is_oneway and not one.is_response
    resp = response_to(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "no")
    assert (resp.opaque, resp.is_response, resp.code, resp.remark) == (cmd.opaque, True, 3, "no")


_text = st.text(max_size=40)
_commands = st.builds(
    RemotingCommand,
    code=st.integers(-(2**31), 2**31 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    remark=st.none() | _text,
    ext_fields=st.dictionaries(_text, _text, max_size=6),
    body=st.binary(max_size=300),
)


@settings(max_examples=150, deadline=None)
@given(cmds=st.lists(_commands, min_size=1, max_size=4), data=st.data())
def test_round_trip_in_any_split(cmds: list[RemotingCommand], data: st.DataObject) -> None:
    stream = b"".join(encode(c) for c in cmds)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    assert _feed_all(stream, cuts) == cmds


def test_byte_by_byte() -> None:
    cmds = [request(310, {"a": "g", "i": "UNIQ_KEY\x01x\x02"}, b"\x00\xff" * 50), request(105)]
    stream = b"".join(encode(c) for c in cmds)
    assert _feed_all(stream, list(range(len(stream)))) == cmds


def _binary_frame(
    code: int,
    lang: int,
    version: int,
    opaque: int,
    flag: int,
    remark: bytes,
    ext: list[tuple[bytes, bytes]],
    body: bytes,
) -> bytes:
    """A frame with a RocketMQ binary header, laid out as ``RocketMQSerializable``."""
    ext_bytes = b"".join(
        struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in ext
    )
    header = (
        struct.pack(">hbhii", code, lang, version, opaque, flag)
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(ext_bytes))
        + ext_bytes
    )
    mark = (1 << 24) | len(header)
    return struct.pack(">ii", 4 + len(header) + len(body), mark) + header + body


def test_binary_header_decode() -> None:
    frame = _binary_frame(
        17,
        0,
        513,
        42,
        1,
        "topic ∅".encode(),
        [(b"msgId", b"7F00"), (b"empty", b""), (b"k\xc3\xa9", b"v")],
        b"xyz",
    )
    assert frame[4] == 1
    (cmd,) = FrameDecoder().feed(frame)
    assert cmd == RemotingCommand(
        17, 42, 1, "topic ∅", {"msgId": "7F00", "empty": "", "ké": "v"}, b"xyz", "JAVA", 513
    )
    (cmd,) = FrameDecoder().feed(_binary_frame(0, 9, 1, 1, 1, b"", [], b""))
    assert (cmd.remark, cmd.ext_fields, cmd.language, cmd.body) == (None, {}, "GO", b"")


def test_loose_json_header_values_become_strings() -> None:
    header = b'{"code":0,"flag":1,"opaque":3,"remark":5,"extFields":{"n":7,"b":true,"z":null}}'
    (cmd,) = FrameDecoder().feed(struct.pack(">ii", 4 + len(header), len(header)) + header)
    assert (cmd.remark, cmd.ext_fields, cmd.language) == ("5", {"n": "7", "b": "true"}, "OTHER")


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", MAX_FRAME),  # over the limit once the prefix counts
        struct.pack(">i", 2),  # shorter than the header mark
        struct.pack(">ii", 8, (2 << 24) | 4) + b"{}{}",  # serialize type 2
        struct.pack(">ii", 8, 10) + b"{}{}",  # header longer than the frame
        struct.pack(">ii", 8, 4) + b"{]{}",  # not JSON
        struct.pack(">ii", 13, (1 << 24) | 9) + b"\x00" * 9,  # binary header cut short
    ],
)
def test_bad_frames_raise_and_poison(frame: bytes) -> None:
    dec = FrameDecoder()
    with pytest.raises(RemotingProtocolError):
        dec.feed(frame)
    with pytest.raises(RemotingProtocolError):
        dec.feed(encode(request(105)))


def test_encode_refuses_frames_over_16_mib() -> None:
    assert len(encode(RemotingCommand(310, body=b"x" * (MAX_FRAME - 200)))) <= MAX_FRAME
    with pytest.raises(RemotingProtocolError, match="exceeds"):
        encode(RemotingCommand(310, body=b"x" * MAX_FRAME))


# --- codes ------------------------------------------------------------------------------


def test_send_outcomes() -> None:
    assert send_outcome(0) == (Outcome.OK, False)
    for code in (1, 2, 14, 16, 17, 1500):
        assert send_outcome(code) == (Outcome.BROKER, True), code
    for code in (13, 29, 3, 15, 999):
        assert send_outcome(code) == (Outcome.FINAL, False), code
    for code in (10, 11, 12):
        assert send_outcome(code) == (Outcome.BROKER, True) and is_ambiguous_code(code)
    assert not is_ambiguous_code(0) and not is_ambiguous_code(1)
    assert send_outcome(16, "check signature failed.") == (Outcome.FINAL, False)


def test_error_for() -> None:
    big = (
        "the message is illegal, maybe msg body or properties length not matched. "
        "msg body length limit 4194304B, msg properties length limit 32KB."
    )
    err = error_for(13, big, broker="broker-a", topic="T")
    assert type(err) is MessageTooLargeError
    assert str(err).startswith("broker broker-a: MESSAGE_ILLEGAL(13): the message is illegal")
    assert type(error_for(13, "message topic length too long 300", broker="b")) is (
        InvalidMessageError
    )
    nf = error_for(17, "topic[T] not exist, apply first please!", broker="b", topic="T")
    assert isinstance(nf, RouteNotFoundError) and nf.topic == "T"
    auth = error_for(16, "User:bob is not found.", broker="b")
    assert isinstance(auth, AuthError) and auth.code == "UNAUTHORIZED"
    acl = error_for(16, "User:bob has no permission to access Topic:T from 127.0.0.1", broker="b")
    assert isinstance(acl, AuthError) and acl.code == "FORBIDDEN"
    slave = error_for(16, "the broker[127.0.0.1] sending message is forbidden", broker="b")
    assert isinstance(slave, BrokerUnavailableError) and slave.broker_name == "b"
    assert isinstance(error_for(12, None, broker="b"), BrokerUnavailableError)
    other = error_for(18, "exists\nline two", broker="b")
    assert isinstance(other, BrokerResponseError) and other.code == "TOPIC_EXIST_ALREADY"
    assert "\n" not in str(other)
    assert error_for(4242, "?", broker=None).code == "CODE_4242"  # type: ignore[attr-defined]


# --- routes -----------------------------------------------------------------------------

_ROUTE_STD = (
    b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10921"},'
    b'"brokerName":"broker-a","cluster":"C","enableActingMaster":false}],'
    b'"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,'
    b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}],"new":[1]}'
)
_ROUTE_FASTJSON = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},'
    b'"brokerName":"broker-a","cluster":"C","zoneName":"{0:\\"z\\"}, 1:"}],'
    b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,'
    b'"topicSysFlag":0,"writeQueueNums":4}]}'
)


def test_route_parse_both_styles() -> None:
    want_q = [QueueData(broker_name="broker-a", read_queue_nums=4, write_queue_nums=4, perm=6)]
    want_b = [
        BrokerData(
            broker_name="broker-a", cluster="C", addrs={0: "127.0.0.1:10911", 1: "127.0.0.1:10921"}
        )
    ]
    for body in (_ROUTE_STD, _ROUTE_FASTJSON):
        route = parse_route("T", body)
        assert (route.topic, route.queue_datas, route.broker_datas) == ("T", want_q, want_b)
    # keys inside strings stay as they are
    assert quote_bare_keys(b'{"a":"{0:1}", -1 :{2:3}}') == b'{"a":"{0:1}", "-1" :{"2":3}}'
    with pytest.raises(ValueError):
        parse_route("T", b"not json")


def test_cluster_info() -> None:
    body = (
        b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911"},'
        b'"brokerName":"broker-a","cluster":"C"},"broker-b":{"brokerAddrs":{1:"h:2"},'
        b'"brokerName":"broker-b","cluster":"C"}},"clusterAddrTable":{"C":["broker-b","broker-a"]}}'
    )
    info = parse_cluster_info(body)
    assert info.clusters == {"C": ["broker-a", "broker-b"]}
    assert info.brokers["broker-b"].addrs == {1: "h:2"}
    assert info.masters("C") == {"broker-a": "127.0.0.1:10911"} == info.masters()


# --- a real NameServer ------------------------------------------------------------------

_LIB = Path(__file__).resolve().parents[3] / "tools" / "rocketmq" / "lib"
_LOGBACK = """<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender"><file>{log}</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5p %logger{{24}} - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="F"/></root>
</configuration>
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A NameServer JVM on 127.0.0.1:<free port>, killed at the end."""
    if not list(_LIB.glob("rocketmq-namesrv-*.jar")):
        pytest.skip(f"no RocketMQ jars in {_LIB} (mvn -f tools/rocketmq/pom.xml)")
    tmp = tmp_path_factory.mktemp("namesrv")
    port = _free_port()
    (tmp / "namesrv.conf").write_text(f"listenPort={port}\nbindAddress=127.0.0.1\n")
    (tmp / "logback.xml").write_text(_LOGBACK.format(log=tmp / "namesrv.log"))
    cmd = [
        "java",
        "-Xms128m",
        "-Xmx128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",  # C1 only: it lives seconds (as in test_connection)
        *os.environ.get(JVM_OPTS_ENV, "").split(),
        f"-Duser.home={tmp}",
        f"-Drocketmq.home.dir={tmp}",
        f"-Drmq.logback.configurationFile={tmp / 'logback.xml'}",
        "-cp",
        f"{_LIB}{os.sep}*",
        "org.apache.rocketmq.namesrv.NamesrvStartup",
        "-c",
        str(tmp / "namesrv.conf"),
    ]
    out = tmp / "namesrv.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"NameServer did not listen on {port}: {out.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        yield "127.0.0.1", port
    finally:
        proc.kill()
        proc.wait(30)


def _call(sock: socket.socket, dec: FrameDecoder, cmd: RemotingCommand) -> RemotingCommand:
    """Send ``cmd`` and read until its response (10 s deadline)."""
    sock.sendall(encode(cmd))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = sock.recv(65536)
        assert data, "the NameServer closed the connection"
        for got in dec.feed(data):
            if got.is_response and got.opaque == cmd.opaque:
                return got
    raise TimeoutError(f"no response to code {cmd.code}")


@pytest.mark.jvm("rocketmq")  # a real NameServer JVM
def test_real_namesrv_unknown_topic(namesrv: tuple[str, int]) -> None:
    with socket.create_connection(namesrv, timeout=10) as sock:
        req = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "codec-no-such-topic"})
        resp = _call(sock, FrameDecoder(), req)
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    assert resp.opaque == req.opaque and resp.is_response and resp.flag & 1
    assert "codec-no-such-topic" in (resp.remark or "")


@pytest.mark.jvm("rocketmq")  # a real NameServer JVM
def test_real_namesrv_route_both_styles(namesrv: tuple[str, int]) -> None:
    """A broker entry registered on this connection (REGISTER_BROKER, as a broker does; the
    NameServer drops it when the connection closes); its route fetched as standard JSON
    (our version) and as fastjson (an old client's version) parses to the same route."""
    addr = f"127.0.0.1:{_free_port()}"
    # two topics: a registration with exactly one is taken as a topic-only update
    topics = {
        t: {"topicName": t, "readQueueNums": 2, "writeQueueNums": 3, "perm": 6}
        for t in ("codec-t", "codec-u")
    }
    body = msgspec.json.encode(
        {
            "topicConfigSerializeWrapper": {
                "topicConfigTable": topics,
                "dataVersion": {"timestamp": 1, "counter": 1, "stateVersion": 0},
            },
            "filterServerList": [],
        }
    )
    with socket.create_connection(namesrv, timeout=10) as sock:
        dec = FrameDecoder()
        reg = request(
            RequestCode.REGISTER_BROKER,
            {
                "brokerName": "codec-b",
                "brokerAddr": addr,
                "clusterName": "CodecCluster",
                "haServerAddr": addr,
                "brokerId": "0",
                "compressed": "false",
                "bodyCrc32": "0",
            },
            body,
        )
        assert _call(sock, dec, reg).code == ResponseCode.SUCCESS
        std = _call(sock, dec, request(105, {"topic": "codec-t"}))
        old = request(105, {"topic": "codec-t"})
        old.version = 317  # the Go client's: below V4_9_4, so fastjson's bare keys
        fast = _call(sock, dec, old)
        cluster = _call(sock, dec, request(RequestCode.GET_BROKER_CLUSTER_INFO))
    assert std.code == fast.code == cluster.code == ResponseCode.SUCCESS
    assert b'{0:"' in fast.body and b'{"0":"' in std.body
    want = parse_route("codec-t", std.body)
    assert want == parse_route("codec-t", fast.body)
    assert want.queue_datas == [
        QueueData(broker_name="codec-b", read_queue_nums=2, write_queue_nums=3, perm=6)
    ]
    assert want.broker_datas == [
        BrokerData(broker_name="codec-b", addrs={0: addr}, cluster="CodecCluster")
    ]
    info = parse_cluster_info(cluster.body)
    assert info.masters("CodecCluster") == {"codec-b": addr}
