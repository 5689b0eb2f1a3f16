"""``RocketMQConsumer``'s failure handling against a real Apache RocketMQ 5.5.0 cluster on
127.0.0.1 (one NameServer, broker-a and broker-b, timer precision 100 ms): ``retry_later``
through ``%RETRY%<group>`` (never before its delay, attempts counted, the message looking
like the original), dead-lettering through the broker to ``%DLQ%<group>`` (its properties,
readable by any group), a member killed right after ``retry_later`` losing nothing, a
failed ``retry_later`` keeping the message uncommitted, RocketMQ's own send-back read as a
retry, and tag filters applied by the brokers. The sans-I/O parts: test_retry_codec.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from benchmarks._rocketmq_java import java_peer_available, run_consume

from qclient import Message, Producer, ReceivedMessage
from qclient.consumer._failures import (
    PROP_ATTEMPTS,
    PROP_ORIGIN_MSG_ID,
    PROP_ORIGIN_TOPIC,
    PROP_REASON,
    dlq_topic,
    retry_topic,
)
from qclient.engines.rocketmq import message as msg
from qclient.engines.rocketmq.codes import RequestCode
from qclient.engines.rocketmq.connection import Connection
from qclient.engines.rocketmq.consumer import RocketMQConsumer
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.engines.rocketmq.local.runtime import TIMER_MAX_DELAY_SEC
from qclient.engines.rocketmq.remoting import request
from qclient.errors import InvalidMessageError

from ._consumer_helpers import name, wait_for
from ._needs import needs_rocketmq

pytestmark = [pytest.mark.slow, pytest.mark.jvm, needs_rocketmq]

QUEUES = 2  # per broker: 4 in all
_MEMBER = Path(__file__).with_name("_consumer_member.py")
_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster(rocketmq_cluster: RocketMQCluster) -> RocketMQCluster:
    """tests/conftest.py's RocketMQ cluster (module scope): brokers are never stopped here."""
    return rocketmq_cluster


def _topic(cluster: RocketMQCluster) -> str:
    topic = name("tr")
    cluster.create_topic(topic, QUEUES)
    return topic


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _consumer(cluster: RocketMQCluster, topic: str, group: str, **kw: Any) -> RocketMQConsumer:
    return RocketMQConsumer((cluster.namesrv_addr,), topic, group, **kw)


def _poll_until(
    c: RocketMQConsumer, done: Callable[[list[ReceivedMessage]], bool], timeout: float
) -> list[tuple[ReceivedMessage, int]]:
    """Poll until ``done(all received)``; (message, local ms when poll returned) pairs."""
    out: list[tuple[ReceivedMessage, int]] = []
    deadline = time.monotonic() + timeout
    while not done([m for m, _ in out]):
        assert time.monotonic() < deadline, f"not within {timeout} s: got {len(out)}"
        out += [(m, _now_ms()) for m in c.poll(32, 0.2)]
    return out


def _quiet(c: RocketMQConsumer, seconds: float) -> list[ReceivedMessage]:
    """What ``c`` returns within ``seconds`` (expected: nothing more)."""
    out: list[ReceivedMessage] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out += c.poll(32, 0.2)
    return out


def _send_one(cluster: RocketMQCluster, topic: str, **kw: Any) -> str:
    with Producer(cluster.namesrv, send_timeout=10) as p:
        return p.send(
            topic, "payload", key="k1", tags="TagA", properties={"color": "red"}, **kw
        ).msg_id


def _max_offset(cluster: RocketMQCluster, topic: str, broker: str, qid: int) -> int:
    with Connection(cluster.broker(broker).addr) as conn:
        fields = {"topic": topic, "queueId": str(qid), "bname": broker}
        answer = conn.call(request(RequestCode.GET_MAX_OFFSET, fields), 10)
    assert answer.code == 0, answer.remark
    return int(answer.ext_fields["offset"])


def _looks_like_the_original(m: ReceivedMessage, topic: str, msg_id: str) -> None:
    assert (m.topic, m.msg_id, m.body, m.key, m.tags) == (topic, msg_id, b"payload", "k1", "TagA")
    assert m.properties == {"color": "red"}, "no internal property leaks"


# --- retries -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["delay", "backoff"])
def test_fails_twice_then_succeeds(cluster: RocketMQCluster, how: str) -> None:
    """Attempts 1, 2, 3 of one message, each retry no earlier than its delay: given per
    call (1.3 s, then 0.7 s) or from the group's ``retry_delays`` (0.8 s, 1.6 s)."""
    topic, group = _topic(cluster), name("g")
    delays = [1.3, 0.7] if how == "delay" else [0.8, 1.6]
    kw = {"retry_delays": delays} if how == "backoff" else {}
    mid = _send_one(cluster, topic)
    with _consumer(cluster, topic, group, **kw) as c:
        seen: list[tuple[ReceivedMessage, int]] = []
        retried_at: list[int] = []
        while len(seen) < 3:
            got = _poll_until(c, lambda ms: len(ms) >= 1, 30)
            assert len(got) == 1, [m for m, _ in got]
            seen += got
            m = got[0][0]
            if m.attempt < 3:  # the handler fails twice
                retried_at.append(_now_ms())
                c.retry_later(m, delays[m.attempt - 1] if how == "delay" else None)
        assert _quiet(c, 2.0) == [], "the third attempt succeeded: nothing more"
        stats = c.stats()
    assert [m.attempt for m, _ in seen] == [1, 2, 3]
    for m, _ in seen:
        _looks_like_the_original(m, topic, mid)
    late = [
        at - call - d * 1000 for (_, at), call, d in zip(seen[1:], retried_at, delays, strict=True)
    ]
    print(f"\n{how}: retries returned {late} ms after their delay")
    assert all(x >= 0 for x in late), "never before its delay"
    assert all(x < 5000 for x in late)
    assert stats["retried"] == 2 and stats["retries_fetched"] == 2


def test_retry_only_to_its_group_and_the_original_is_committed(cluster: RocketMQCluster) -> None:
    """Another group sees the message once; after retry_later returns and the next poll,
    the group's offset is past the original."""
    topic, group = _topic(cluster), name("g")
    mid = _send_one(cluster, topic)
    with _consumer(cluster, topic, group) as c, _consumer(cluster, topic, name("o")) as other:
        [(m, _)] = _poll_until(c, lambda ms: len(ms) >= 1, 30)
        c.retry_later(m, 0.5)
        c.poll(1, 0)  # acknowledges what the previous poll returned
        key = (m.broker_name, m.queue_id)
        wait_for(lambda: c.committed().get(key) == m.offset + 1, 10, "original committed")
        [(again, _)] = _poll_until(c, lambda ms: len(ms) >= 1, 30)
        assert (again.msg_id, again.attempt) == (mid, 2)
        theirs = _poll_until(other, lambda ms: len(ms) >= 1, 30)
        assert [(x.msg_id, x.attempt) for x, _ in theirs] + [
            (x.msg_id, x.attempt) for x in _quiet(other, 1.5)
        ] == [(mid, 1)]


def test_max_attempts_dead_letters_with_properties(cluster: RocketMQCluster) -> None:
    """``max_attempts=2``: the second ``retry_later`` puts the message on ``%DLQ%<group>``
    once, with its body, key, tags and the dead-letter properties; the group does not get
    it again; a group of the topic saw it once; any group reads the DLQ."""
    topic, group = _topic(cluster), name("g")
    mid = _send_one(cluster, topic)
    with (
        _consumer(cluster, topic, group, max_attempts=2, retry_delays=[0.3]) as c,
        _consumer(cluster, topic, name("o")) as other,
    ):
        for attempt in (1, 2):
            [(m, _)] = _poll_until(c, lambda ms: len(ms) >= 1, 30)
            assert (m.msg_id, m.attempt) == (mid, attempt)
            c.retry_later(m)
        assert _quiet(c, 1.5) == []
        assert c.stats()["retried"] == 1 and c.stats()["dead_lettered"] == 1
        assert [x.msg_id for x, _ in _poll_until(other, lambda ms: len(ms) >= 1, 30)] == [mid]
        assert _quiet(other, 0.5) == []
    with _consumer(cluster, dlq_topic(group), name("dlq")) as d:
        got = _poll_until(d, lambda ms: len(ms) >= 1, 30)
        got += [(x, 0) for x in _quiet(d, 1.0)]
    [(dead, _)] = got
    assert (dead.topic, dead.msg_id, dead.body, dead.key, dead.tags) == (
        dlq_topic(group),
        mid,
        b"payload",
        "k1",
        "TagA",
    )
    props = dead.properties
    assert props["color"] == "red"
    assert (props[PROP_ORIGIN_TOPIC], props[PROP_ORIGIN_MSG_ID]) == (topic, mid)
    assert props[PROP_ATTEMPTS] == "2" and "max_attempts" in props[PROP_REASON]
    assert dead.attempt == 1, "the first delivery to the reading group"


def test_dead_letter_at_once(cluster: RocketMQCluster) -> None:
    topic, group = _topic(cluster), name("g")
    mid = _send_one(cluster, topic)
    with _consumer(cluster, topic, group) as c:
        [(m, _)] = _poll_until(c, lambda ms: len(ms) >= 1, 30)
        start = _now_ms()
        c.dead_letter(m, "poison: bad schema")
        took = _now_ms() - start
        assert _quiet(c, 1.0) == []
    with _consumer(cluster, dlq_topic(group), name("dlq")) as d:
        [(dead, _)] = _poll_until(d, lambda ms: len(ms) >= 1, 30)
    props = dead.properties
    assert (props[PROP_ORIGIN_TOPIC], props[PROP_ORIGIN_MSG_ID], props[PROP_ATTEMPTS]) == (
        topic,
        mid,
        "1",
    )
    assert props[PROP_REASON] == "poison: bad schema"
    print(f"\ndead_letter returned in {took} ms")


def test_failed_retry_later_keeps_the_message_uncommitted(cluster: RocketMQCluster) -> None:
    """A retry the broker refuses (a delay past its timerMaxDelaySec) raises, and the
    message's offset is not committed; a dead_letter of it then lets the commit pass."""
    topic, group = _topic(cluster), name("g")
    _send_one(cluster, topic)
    with _consumer(cluster, topic, group) as c:
        [(m, _)] = _poll_until(c, lambda ms: len(ms) >= 1, 30)
        key = (m.broker_name, m.queue_id)
        with pytest.raises(InvalidMessageError):
            c.retry_later(m, TIMER_MAX_DELAY_SEC + 3600)
        c.poll(1, 0.3)
        c.commit()
        assert c.committed().get(key, 0) <= m.offset, "not committed past it"
        c.dead_letter(m, "gave up")
        c.poll(1, 0)
        wait_for(lambda: c.committed().get(key) == m.offset + 1, 10, "committed once handled")


def test_member_killed_right_after_retry_later_loses_nothing(
    cluster: RocketMQCluster, tmp_path: Path
) -> None:
    """A member process that hands every message back (0.5 s) is SIGKILLed as soon as its
    first ``retry_later`` returned: another member of the group gets every message, the
    retried one as the original (uncommitted) and/or its retry: at most a duplicate."""
    topic, group = _topic(cluster), name("g")
    with Producer(cluster.namesrv, send_timeout=10) as p:
        ids = {r.msg_id for r in p.send_batch([Message(topic, f"m{i}") for i in range(20)])}
    with open(tmp_path / "member.log", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(_MEMBER), cluster.namesrv_addr, topic, group, "0.5"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=_ROOT,
            text=True,
        )
        try:
            retried = _first_retried(proc, 60)
            proc.kill()  # SIGKILL, right after the call returned
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    with _consumer(cluster, topic, group) as c:
        got = _poll_until(c, lambda ms: ids <= {m.msg_id for m in ms}, 60)
        got += [(x, 0) for x in _quiet(c, 2.0)]
    count = Counter(m.msg_id for m, _ in got)
    assert set(count) == ids
    attempts = sorted(m.attempt for m, _ in got if m.msg_id == retried)
    print(f"\nretried message after the kill: attempts {attempts}")
    assert attempts in ([1], [2], [1, 2])


def _first_retried(proc: subprocess.Popen[str], timeout: float) -> str:
    """The id of the member's first ``retried`` line (read on a thread, bounded)."""
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            ev = json.loads(line)
            if "retried" in ev:
                found.append(ev["retried"][0])
                ready.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert ready.wait(timeout), "the member retried nothing"
    return found[0]


# --- RocketMQ's own mechanism ------------------------------------------------------------


def test_rocketmq_send_back_is_read_as_a_retry(cluster: RocketMQCluster) -> None:
    """What a Java consumer of the group does (CONSUMER_SEND_MSG_BACK, delay level 1 =
    1 s): ours reads it from the retry topic as attempt 2 of the original. The heartbeat
    made each broker create the group's retry topic, which this member reads."""
    topic, group = _topic(cluster), name("g")
    mid = _send_one(cluster, topic)
    with _consumer(cluster, topic, group) as c:
        [(m, _)] = _poll_until(c, lambda ms: len(ms) >= 1, 30)
        wait_for(lambda: len(cluster.route(retry_topic(group))) == 2, 20, "retry topic routed")
        wait_for(lambda: len(c.retry_assignment()) == 2, 20, "the member reads it")
        fields = {
            "offset": str(msg.decode_offset_msg_id(m.extra["offset_msg_id"])[2]),
            "group": group,
            "delayLevel": "1",
            "originMsgId": m.extra["offset_msg_id"],
            "originTopic": topic,
            "maxReconsumeTimes": "16",
            "bname": m.broker_name,
        }
        with Connection(cluster.broker(m.broker_name).addr) as conn:
            answer = conn.call(request(RequestCode.CONSUMER_SEND_MSG_BACK, fields), 10)
        assert answer.code == 0, answer.remark
        [(again, _)] = _poll_until(c, lambda ms: len(ms) >= 1, 30)
    assert again.attempt == 2 and again.extra["store_topic"] == retry_topic(group)
    _looks_like_the_original(again, topic, mid)


@pytest.mark.skipif(java_peer_available() is not None, reason=str(java_peer_available()))
def test_java_consumer_reads_our_retry_and_dead_letter(cluster: RocketMQCluster) -> None:
    """RocketMQ's Java client (DefaultLitePullConsumer, another group) reads our retry on
    ``%RETRY%<group>`` as RocketMQ's own (reconsume times 1, ``RETRY_TOPIC``) and our dead
    letter on ``%DLQ%<group>`` with its properties."""
    topic, group = _topic(cluster), name("g")
    with Producer(cluster.namesrv, send_timeout=10) as p:
        ids = [p.send(topic, f"m{i}", tags="TagA").msg_id for i in range(2)]
    with _consumer(cluster, topic, group) as c:
        got = {m.msg_id: m for m, _ in _poll_until(c, lambda ms: len(ms) >= 2, 30)}
        c.retry_later(got[ids[0]], 0.2)
        c.dead_letter(got[ids[1]], "bad")
    [retry] = run_consume(cluster.namesrv_addr, retry_topic(group), name("jr"), 1, timeout_s=60)
    [dead] = run_consume(cluster.namesrv_addr, dlq_topic(group), name("jd"), 1, timeout_s=60)
    assert (retry["uniqKey"], retry["reconsumeTimes"], retry["tags"]) == (ids[0], 1, "TagA")
    assert retry["properties"]["RETRY_TOPIC"] == topic
    assert (dead["uniqKey"], dead["topic"]) == (ids[1], dlq_topic(group))
    props = dead["properties"]
    assert (props[PROP_ORIGIN_TOPIC], props[PROP_ORIGIN_MSG_ID], props[PROP_REASON]) == (
        topic,
        ids[1],
        "bad",
    )


# --- tags ----------------------------------------------------------------------------------


def test_tags_filtered_on_the_broker(cluster: RocketMQCluster) -> None:
    """``tags="TagA || TagB"`` gets only those, an unfiltered group all; the brokers never
    hand the others to the filtered member (it fetched only what it returned), and its
    offsets pass them."""
    topic = _topic(cluster)
    tags = ["TagA", "TagB", "TagC", None]
    with Producer(cluster.namesrv, send_timeout=10) as p:
        sent = {
            r.msg_id: tags[i % 4]
            for i, r in enumerate(
                p.send_batch([Message(topic, f"m{i}", tags=tags[i % 4]) for i in range(40)])
            )
        }
    want = {i for i, t in sent.items() if t in ("TagA", "TagB")}
    with (
        _consumer(cluster, topic, name("f"), tags="TagA || TagB") as f,
        _consumer(cluster, topic, name("all")) as a,
    ):
        got_f = _poll_until(f, lambda ms: want <= {m.msg_id for m in ms}, 30)
        got_f += [(x, 0) for x in _quiet(f, 1.0)]
        got_a = _poll_until(a, lambda ms: set(sent) <= {m.msg_id for m in ms}, 30)
        f.poll(1, 0)
        queues = {(f"broker-{b}", q) for b in "ab" for q in range(QUEUES)}
        ends = {k: _max_offset(cluster, topic, *k) for k in queues}
        ends = {k: e for k, e in ends.items() if e > 0}
        committed = f.committed
        wait_for(
            lambda: {k: committed().get(k) for k in ends} == ends, 10, "skipped ones committed"
        )
        stats = f.stats()
    assert sorted(m.msg_id for m, _ in got_f) == sorted(want)
    assert {m.msg_id for m, _ in got_a} == set(sent)
    assert stats["fetched"] == len(want) and stats["filtered"] == 0, stats


def test_tag_hash_collision_checked_by_the_client(cluster: RocketMQCluster) -> None:
    """``"Aa"`` and ``"BB"`` share a Java hash code (2112): the broker hands both to a group
    of ``tags="Aa"``, the member returns only ``Aa`` and commits past ``BB``."""
    topic = _topic(cluster)
    with Producer(cluster.namesrv, send_timeout=10) as p:
        sent = [p.send(topic, t, tags=t) for t in ("Aa", "BB", "Aa", "BB")]
    with _consumer(cluster, topic, name("f"), tags="Aa") as f:
        got = _poll_until(f, lambda ms: len(ms) >= 2, 30)
        got += [(x, 0) for x in _quiet(f, 1.0)]
        stats = f.stats()
    assert sorted(m.msg_id for m, _ in got) == sorted(r.msg_id for r in sent[::2])
    assert stats["filtered"] == 2 and stats["fetched"] == 2
