"""qclient and Apache RocketMQ's own Java client on one real RocketMQ 5 cluster (NameServer and
two brokers as JVMs on 127.0.0.1): proof that qclient speaks RocketMQ's remoting protocol and
message format, not a private dialect.

- What qclient sends (send, send_delayed, send_batch, send_async; binary, UTF-8 and
  zlib-compressed bodies) the Java consumer reads whole: body, KEYS, TAGS, user properties,
  UNIQ_KEY = qclient's msg_id, TIMER_DELIVER_MS = the SendResult's deliver time, and nothing
  before that time.
- What the Java producer sends (tags, keys, properties, timer messages, compressed bodies)
  qclient's Consumer reads whole, with msg_id = Java's unique key and no message before its
  deliver time.
- Many timer messages in one send_batch are never delivered early: RocketMQ's batch path
  skips the timer hook, so the SDK must send each timer message on its own.

Every Java run is a child process bounded in time (benchmarks/_rocketmq_java.py); the cluster
is stopped after the module, also when a test fails.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import re
import struct
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from benchmarks._rocketmq_java import java_peer_available, run_consume, run_produce

from qclient import Consumer, Message, Producer, SendResult
from qclient.engines.rocketmq import message as msg
from qclient.engines.rocketmq.codes import RequestCode, ResponseCode
from qclient.engines.rocketmq.connection import Connection
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.engines.rocketmq.remoting import request

_WHY = java_peer_available()
# CI builds the peer in `make setup`: there a missing peer is a failure, not a skip.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.jvm,
    pytest.mark.skipif(_WHY is not None and not os.environ.get("CI"), reason=str(_WHY)),
]

#: the user properties every message carries (a space in a value, as RocketMQ allows)
PROPS = {"a": "1", "b": "x y"}
#: the delay of part 1's timed messages (seconds)
DELAY_S = 1.5
#: qclient's default compress_threshold: a body over it travels zlib-compressed
COMPRESS_OVER = 4096


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(scope="module")
def cluster(rocketmq_cluster: RocketMQCluster) -> RocketMQCluster:
    """tests/conftest.py's RocketMQ cluster: broker-a and broker-b."""
    assert isinstance(rocketmq_cluster, RocketMQCluster)
    return rocketmq_cluster


def _topic(cluster: RocketMQCluster, prefix: str) -> str:
    """A fresh topic with 4 queues on each broker, routed before it is returned."""
    topic = _name(prefix)
    cluster.create_topic(topic, 4)
    return topic


@contextlib.contextmanager
def _java_consuming(
    cluster: RocketMQCluster, topic: str, count: int, timeout_s: float
) -> Iterator[Future[list[dict[str, Any]]]]:
    """RocketMQ's Java consumer (a fresh group, from the first offset) reading ``topic`` on a
    thread while the block runs; leaving the block waits for it (it stops at ``count``
    messages or ``timeout_s``, and its wrapper kills it past that), so it never outlives the
    test, even one that fails."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(
            run_consume, cluster.namesrv_addr, topic, _name("java-g"), count, timeout_s
        )


def _stored(offset_msg_id: str, topic: str) -> tuple[int, bytes]:
    """(sysFlag, body bytes as stored) of the message at an offset message id, read raw from
    its broker with VIEW_MESSAGE_BY_ID -- the broker's own copy, before any client decodes it."""
    host, port, offset = msg.decode_offset_msg_id(offset_msg_id)
    assert host == "127.0.0.1", offset_msg_id
    cmd = request(RequestCode.VIEW_MESSAGE_BY_ID, {"topic": topic, "offset": str(offset)})
    with Connection(f"{host}:{port}") as conn:
        answer = conn.call(cmd, 10.0)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    data = answer.body
    # MessageDecoder layout: sysFlag at 36; with IPv4 hosts the body length is at 84
    (sys_flag,) = struct.unpack_from(">i", data, 36)
    assert not sys_flag & (msg.SysFlag.BORNHOST_V6 | msg.SysFlag.STOREHOST_V6), hex(sys_flag)
    (length,) = struct.unpack_from(">i", data, 84)
    return sys_flag, data[88 : 88 + length]


def _assert_stored_zlib(offset_msg_id: str, topic: str, body: bytes) -> None:
    """The broker stores ``body`` zlib-compressed, flagged as RocketMQ's Java client flags it."""
    sys_flag, stored = _stored(offset_msg_id, topic)
    assert sys_flag & msg.SysFlag.COMPRESSED, hex(sys_flag)
    # compression type in bits 8-10: 3, or 0 from clients older than 5.x, means zlib
    assert (sys_flag & msg.SysFlag.COMPRESSION_MASK) >> 8 in (0, 3), hex(sys_flag)
    assert len(stored) < len(body) and zlib.decompress(stored) == body


# --- 1. qclient sends, the Java consumer reads --------------------------------------------


@dataclass(slots=True)
class _Sent:
    """One message qclient sent and what the Java side must find in it."""

    result: SendResult
    body: bytes
    key: str
    tags: str
    delayed: bool


def _bodies(tag: str) -> dict[str, bytes | str]:
    """A binary body (every byte value, RocketMQ's property separators included), a UTF-8
    text and a compressible text over 4 KiB (zlib-compressed by qclient)."""
    return {
        "bin": tag.encode() + bytes(range(256)),
        "utf8": f"{tag} héllo wörld ✓ 日本語 🚀",
        "big": f"{tag} " + "compressible 0123456789 " * 300,
    }


def _as_bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else body


def _send_every_way(producer: Producer, topic: str) -> list[_Sent]:
    """Each body kind through send, send_delayed, send_async (immediate and delayed) and
    send_batch (immediate; with 9 of each kind, so some queue of the 8 gets 2+ compressed
    bodies and 2+ plain bodies in one batch request)."""
    sent: list[_Sent] = []

    def note(r: SendResult, body: bytes | str, key: str, tags: str, delayed: bool) -> None:
        sent.append(_Sent(r, _as_bytes(body), key, tags, delayed))

    for kind, body in _bodies("send").items():
        key = f"send-{kind}"
        r = producer.send(topic, body, key=key, tags="TagS", properties=dict(PROPS))
        note(r, body, key, "TagS", False)
    for kind, body in _bodies("delayed").items():
        key = f"delayed-{kind}"
        r = producer.send_delayed(
            topic, body, delay=DELAY_S, key=key, tags="TagD", properties=dict(PROPS)
        )
        note(r, body, key, "TagD", True)
    futures: list[tuple[Future[SendResult], bytes | str, str, str, bool]] = []
    for delayed in (False, True):
        tags = "TagAD" if delayed else "TagA"
        for kind, body in _bodies(f"async-{delayed}").items():
            key = f"async-{int(delayed)}-{kind}"
            m = Message(
                topic,
                body,
                key=key,
                tags=tags,
                properties=dict(PROPS),
                delay=DELAY_S if delayed else None,
            )
            futures.append((producer.send_async(m), body, key, tags, delayed))
    batch: list[tuple[Message, str]] = []
    for i in range(9):
        for kind, body in _bodies(f"batch-{i}").items():
            key = f"batch-{i}-{kind}"
            batch.append((Message(topic, body, key=key, tags="TagB", properties=dict(PROPS)), key))
    results = producer.send_batch([m for m, _ in batch])
    for r, (m, key) in zip(results, batch, strict=True):
        note(r, m.body, key, "TagB", False)
    for fut, body, key, tags, delayed in futures:
        note(fut.result(timeout=30), body, key, tags, delayed)
    return sent


def test_java_consumer_reads_what_qclient_sent(cluster: RocketMQCluster) -> None:
    """Every way qclient sends, every body kind: RocketMQ's Java consumer reads each message
    once and whole, with qclient's id, deliver time and compression, none before its time."""
    topic = _topic(cluster, "interop-q2j")
    expected = 3 + 3 + 6 + 27
    # The Java consumer starts while qclient sends. Its JVM may come up only after the
    # timers fired, so the proof of "not early" is storeTimestamp: when the timer put the
    # message into its queue, the earliest any consumer could read it.
    with (
        # it stops at ``expected``; 90 s is for a loaded host, where 40 s ran out
        _java_consuming(cluster, topic, expected, timeout_s=90) as java,
        # round robin over both brokers' queues whatever their latency: with the fault table
        # on, one slow answer on a loaded host isolates a broker and every send goes to the
        # other, by design, and this test reads from both brokers
        Producer(cluster.namesrv, linger_ms=2, send_latency_fault_enable=False) as producer,
    ):
        sent = _send_every_way(producer, topic)
    got = java.result()

    assert len(sent) == expected
    assert {s.result.broker_name for s in sent} == {"broker-a", "broker-b"}
    by_id = {s.result.msg_id: s for s in sent}
    counts = Counter(m["uniqKey"] for m in got)
    assert set(counts) == set(by_id), (set(by_id) - set(counts), set(counts) - set(by_id))
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1]
    for m in got:
        s = by_id[m["uniqKey"]]
        props = m["properties"]
        where = (s.key, m)
        assert base64.b64decode(m["body_b64"]) == s.body, where
        assert (m["topic"], m["keys"], m["tags"]) == (topic, s.key, s.tags), where
        assert props["UNIQ_KEY"] == s.result.msg_id, where
        assert (props["a"], props["b"]) == ("1", "x y"), where
        # one clock (one machine): stored into its queue, and read, not before its time
        assert m["receivedMs"] >= s.result.deliver_at_ms, where
        assert m["storeTimestamp"] >= s.result.deliver_at_ms, where
        if s.delayed:
            assert props["TIMER_DELIVER_MS"] == str(s.result.deliver_at_ms), where
            # the delay counts from the attempt (the header's born time)
            born = m["bornTimestamp"]
            assert born < s.result.deliver_at_ms <= born + DELAY_S * 1000, where
        else:
            assert "TIMER_DELIVER_MS" not in props, where
        if len(s.body) > COMPRESS_OVER:
            _assert_stored_zlib(m["msgId"], topic, s.body)
    # A send call's messages share one born time, and the engine puts a call's immediates
    # of one queue, all compressed or all plain, into one SEND_BATCH_MESSAGE: two such
    # messages of send_batch in one queue with one born time came in one batch request.
    for kind in ("big", "(bin|utf8)"):
        together = Counter(
            (m["brokerName"], m["queueId"], m["bornTimestamp"])
            for m in got
            if re.fullmatch(rf"batch-\d+-{kind}", by_id[m["uniqKey"]].key)
        )
        assert max(together.values()) >= 2, (kind, together)


# --- 2. Java sends, qclient's Consumer reads ----------------------------------------------


def test_qclient_reads_what_java_sent(cluster: RocketMQCluster) -> None:
    """RocketMQ's Java producer (tags, keys, properties, timer messages, a compressed body):
    qclient's Consumer reads each once and whole, with Java's ids, none before its time."""
    topic = _topic(cluster, "interop-j2q")
    addr = cluster.namesrv_addr
    big_text = "java-big-{i} " + "z0123456789 " * 500
    runs: dict[str, dict[str, Any]] = {
        "plain": dict(count=6, tags="TagJ", keys="jk-{i}", body="java-plain-{i}"),
        "delayed": dict(count=6, delay_ms=1500, tags="TagJD", keys="jd-{i}", body="late-{i}"),
        "big": dict(count=2, tags="TagJB", keys="jb-{i}", body=big_text),
    }
    got: list[tuple[Any, int]] = []
    with Consumer(cluster.namesrv, topic, _name("qclient-g")) as consumer:
        # the producers run while the consumer polls, so it reads the timed ones as they
        # fire; one JVM at a time (three starting at once took the host to load 23)
        with ThreadPoolExecutor(1) as pool:
            futures = {
                name: pool.submit(run_produce, addr, topic, props=PROPS, timeout_s=60, **kw)
                for name, kw in runs.items()
            }
            deadline = time.monotonic() + 90
            while not all(f.done() for f in futures.values()):
                assert time.monotonic() < deadline, "the Java producers did not finish"
                got += [(m, _now_ms()) for m in consumer.poll(64, 0.2)]
            sent = {name: f.result() for name, f in futures.items()}
        want = {s["uniqKey"] for lines in sent.values() for s in lines}
        deadline = time.monotonic() + 30
        while not want <= {m.msg_id for m, _ in got}:
            missing = want - {m.msg_id for m, _ in got}
            assert time.monotonic() < deadline, f"{len(missing)} of {len(want)} not read"
            got += [(m, _now_ms()) for m in consumer.poll(64, 0.5)]

    for name, lines in sent.items():
        assert [s["status"] for s in lines] == ["SEND_OK"] * runs[name]["count"], lines
    counts = Counter(m.msg_id for m, _ in got)
    assert set(counts) == want and max(counts.values()) == 1, counts
    by_id = {m.msg_id: (m, at) for m, at in got}
    for name, lines in sent.items():
        run = runs[name]
        for i, s in enumerate(lines):
            m, returned_ms = by_id[s["uniqKey"]]
            where = (name, i, m)
            assert m.topic == topic, where
            assert m.body == run["body"].replace("{i}", str(i)).encode(), where
            assert (m.key, m.tags) == (run["keys"].replace("{i}", str(i)), run["tags"]), where
            assert m.properties == PROPS, where
            # a timer message's send result names its copy in the timer topic's queue
            assert m.broker_name == s["brokerName"], where
            if name == "delayed":
                assert m.deliver_at_ms == s["deliverAtMs"], where
                assert returned_ms >= s["deliverAtMs"], where
                assert m.fired_at_ms >= s["deliverAtMs"], where
            else:
                assert (m.queue_id, m.offset) == (s["queueId"], s["queueOffset"]), where
                assert m.deliver_at_ms == m.extra["store_ms"], where
            if name == "big":
                _assert_stored_zlib(s["msgId"], topic, m.body)


# --- 3. many timer messages in one send_batch ---------------------------------------------


def test_batched_timer_messages_never_reach_java_early(cluster: RocketMQCluster) -> None:
    """500 timer messages (1-2 s) and 50 immediates in one send_batch: not one reaches its
    queue, or the Java consumer, before its deliver time."""
    topic = _topic(cluster, "interop-burst")
    rng = random.Random(11)
    n_delayed, n_now = 500, 50
    batch = [
        Message(topic, f"late-{i}", key=f"d{i}", tags="TagD", delay=1.0 + rng.random())
        for i in range(n_delayed)
    ]
    # immediates among them: the same send_batch carries both kinds of request
    for i in range(n_now):
        batch.insert(i * 11, Message(topic, f"now-{i}", key=f"n{i}", tags="TagN"))
    with (
        _java_consuming(cluster, topic, len(batch), timeout_s=45) as java,
        Producer(cluster.namesrv) as producer,
    ):
        results = producer.send_batch(batch)
    got = java.result()

    sent = {r.msg_id: (r, m) for r, m in zip(results, batch, strict=True)}
    counts = Counter(m["uniqKey"] for m in got)
    assert set(counts) == set(sent), f"{len(set(sent) - set(counts))} not read"
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1]
    early: list[tuple[int, str]] = []
    for m in got:
        r, src = sent[m["uniqKey"]]
        assert base64.b64decode(m["body_b64"]) == _as_bytes(src.body)
        assert (m["keys"], m["tags"]) == (src.key, src.tags)
        if src.delay is not None:
            assert m["properties"]["TIMER_DELIVER_MS"] == str(r.deliver_at_ms), m
        else:
            assert "TIMER_DELIVER_MS" not in m["properties"], m
        if min(m["receivedMs"], m["storeTimestamp"]) < r.deliver_at_ms:
            early.append((r.deliver_at_ms - min(m["receivedMs"], m["storeTimestamp"]), m["keys"]))
    assert not early, f"{len(early)} delivered early, by up to {max(early)} ms (ms, key)"
