"""Recall and lookup by unique key (``engines/rocketmq/recall.py``) against a real Apache
RocketMQ 5.5.0 cluster on 127.0.0.1 (one NameServer, broker-a and broker-b, timer precision
100 ms, ``recallMessageEnable=true``).

- The ``recallHandle`` a broker answers a timer send with is what ``recall_handle``
  computes from the topic, the broker, the slot (``timer_slot`` of the deliver time and the
  broker's ``timerPrecisionMs``) and the UNIQ_KEY; qclient's ``SendResult`` holds all of it.
- A message recalled before its time is never delivered; its siblings on the same broker
  are; a recall naming another slot is answered SUCCESS and changes nothing.
- What the broker answers a recall after the message fired, twice, with a wrong handle,
  for an unknown id (codes and remarks asserted as observed).
- What QUERY_MESSAGE by unique key returns for scheduled, recalled, fired and unknown ids,
  on the real topic and on the timer topic.

Every wait is on a condition with a deadline; the cluster (tests/conftest.py) is stopped
after the module, also when a test fails.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator

import pytest

from qclient import Consumer, Producer, ReceivedMessage, SendResult
from qclient.engines.rocketmq import message as msg
from qclient.engines.rocketmq.codes import RequestCode, ResponseCode
from qclient.engines.rocketmq.connection import Connection
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.engines.rocketmq.local.runtime import TIMER_PRECISION_MS
from qclient.engines.rocketmq.message import StoredMessage
from qclient.engines.rocketmq.recall import (
    RECALL_TAG,
    TIMER_TOPIC,
    KeyLookup,
    KeyState,
    RecallOutcome,
    RecallRefusal,
    RecallResult,
    classify,
    lookup_requests,
    parse_recall_handle,
    precision_from_config,
    read_query,
    read_recall,
    recall_handle,
    recall_request,
    timer_slot,
)
from qclient.engines.rocketmq.remoting import RemotingCommand, request

from ._consumer_helpers import name, wait_for
from ._needs import needs_rocketmq

pytestmark = [
    pytest.mark.slow,
    # the jvm group: one worker runs the JVM tests one after another, one cluster at a time
    pytest.mark.jvm,
    needs_rocketmq,
]

GROUP = "qclient-recall-test"
P = TIMER_PRECISION_MS
#: Long.MAX_VALUE: no upper bound on the store time
FOREVER = 2**63 - 1
TIMEOUT = 10.0
#: how far ahead a test's messages are due: its sends, recalls and lookups must all come
#: before then, and on a loaded 2-core host they took over the 3.5 s a test once allowed
LEAD_MS = 8_000
#: the remark of a recall's SUCCESS: RemotingCommand.createResponseCommand's default,
#: which RecallMessageProcessor leaves in place when it sets the code
OK_REMARK = "not set any response code"


def _now() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(scope="module")
def cluster(rocketmq_cluster: RocketMQCluster) -> RocketMQCluster:
    """tests/conftest.py's RocketMQ cluster (module-scoped): brokers are never stopped."""
    return rocketmq_cluster


@pytest.fixture(scope="module")
def conns(cluster: RocketMQCluster) -> Iterator[dict[str, Connection]]:
    """One connection per broker name, to its master."""
    out = {b.group: Connection(b.addr) for b in cluster.brokers}
    try:
        yield out
    finally:
        for c in out.values():
            c.close()


@pytest.fixture
def topic(cluster: RocketMQCluster) -> str:
    t = name("recall")
    cluster.create_topic(t, 2)
    return t


def _recall(conn: Connection, topic: str, handle: str) -> tuple[RemotingCommand, RecallResult]:
    answer = conn.call(recall_request(topic, handle, GROUP), TIMEOUT)
    return answer, read_recall(answer)


def _recall_result(conn: Connection, r: SendResult, slot: int | None = None) -> RecallResult:
    """Recall what ``r`` names, with the handle computed from it (or for another slot)."""
    slot = timer_slot(r.deliver_at_ms, P) if slot is None else slot
    handle = recall_handle(r.topic, r.broker_name, slot, r.msg_id)
    return _recall(conn, r.topic, handle)[1]


def _query(
    conn: Connection, topic: str, key: str, since: int
) -> tuple[list[StoredMessage], list[StoredMessage]]:
    """(real-topic copies, timer-topic copies) of ``key`` on the broker of ``conn``."""
    real, timer = conn.call_many(list(lookup_requests(topic, key, since - 60_000, FOREVER)), 10)
    assert isinstance(real, RemotingCommand) and isinstance(timer, RemotingCommand)
    return read_query(real, key), read_query(timer, key)


def _lookup(conn: Connection, topic: str, key: str, since: int) -> KeyLookup:
    return classify(topic, key, *_query(conn, topic, key, since))


def _by_broker(results: list[SendResult]) -> dict[str, list[SendResult]]:
    out: dict[str, list[SendResult]] = {}
    for r in results:
        out.setdefault(r.broker_name, []).append(r)
    return out


def _send_delayed(cluster: RocketMQCluster, topic: str, n: int, at_ms: int) -> list[SendResult]:
    """``n`` messages due at ``at_ms`` through qclient's Producer."""
    with Producer(cluster.namesrv, send_timeout=15) as p:
        return [p.send_delayed(topic, f"m-{i}", deliver_at=at_ms / 1000) for i in range(n)]


# --- (a) the handle ----------------------------------------------------------------------


def test_broker_precision_is_read_from_its_config(conns: dict[str, Connection]) -> None:
    for conn in conns.values():
        answer = conn.call(request(RequestCode.GET_BROKER_CONFIG), TIMEOUT)
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        assert precision_from_config(answer.body) == P == 100


def test_send_answer_handle_is_the_computed_one(
    cluster: RocketMQCluster, conns: dict[str, Connection], topic: str
) -> None:
    """A raw SEND_MESSAGE_V2 per broker and per rounding case (a deliver time on a slot
    boundary, one inside a slot): the answer's recallHandle is ``recall_handle``'s."""
    base = (_now() + 5_000) // P * P  # a multiple of the precision
    seen = 0
    for broker, conn in conns.items():
        for deliver in (base, base + 37, base + P - 1):
            key = uuid.uuid4().hex
            props = {msg.UNIQ_KEY: key, msg.TIMER_DELIVER_MS: str(deliver), msg.WAIT: "true"}
            header = msg.send_header(
                group=GROUP,
                topic=topic,
                queue_id=0,
                sys_flag=0,
                born_ms=_now(),
                flag=0,
                properties=props,
                broker_name=broker,
            )
            answer = conn.call(request(RequestCode.SEND_MESSAGE_V2, header, b"x"), TIMEOUT)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            got = msg.parse_send_response(answer).recall_handle
            slot = timer_slot(deliver, P)
            assert slot == (deliver - P if deliver % P == 0 else deliver // P * P)
            assert got == recall_handle(topic, broker, slot, key)
            assert parse_recall_handle(got) == (topic, broker, slot, key)
            assert base64.urlsafe_b64decode(got).decode() == f"v1 {topic} {broker} {slot + 1} {key}"
            seen += 1
    assert seen == 6


def test_sdk_send_result_gives_the_slot(
    cluster: RocketMQCluster, conns: dict[str, Connection], topic: str
) -> None:
    """What qclient's SendResult holds is the broker's slot: the timer topic's copy has
    TIMER_OUT_MS = timer_slot(deliver_at_ms) and TIMER_DELIVER_MS = deliver_at_ms."""
    t0 = _now()
    results = _send_delayed(cluster, topic, 4, t0 + 5_000 + 37)
    for r in results:
        conn = conns[r.broker_name]

        def indexed(r: SendResult = r, conn: Connection = conn) -> bool:
            return bool(_query(conn, topic, r.msg_id, t0)[1])

        wait_for(indexed, TIMEOUT, f"{r.msg_id} indexed on the timer topic")
        (copy,) = _query(conn, topic, r.msg_id, t0)[1]
        assert copy.topic == TIMER_TOPIC and copy.queue_id == 0
        assert copy.properties[msg.REAL_TOPIC] == topic
        assert copy.properties[msg.REAL_QID] == str(r.queue_id)
        assert copy.properties[msg.TIMER_DELIVER_MS] == str(r.deliver_at_ms)
        assert copy.properties[msg.TIMER_OUT_MS] == str(timer_slot(r.deliver_at_ms, P))


# --- (b) recalled: never delivered -------------------------------------------------------


def test_recalled_message_is_never_delivered(
    cluster: RocketMQCluster, conns: dict[str, Connection], topic: str
) -> None:
    """Of 8 messages due together, half of each broker's are recalled: none of those is
    delivered, every other one is; one more recalled with the next slot's handle is
    answered SUCCESS and delivered all the same."""
    at = _now() + LEAD_MS
    results = _send_delayed(cluster, topic, 9, at)
    *eight, wrong_slot = results
    recalled: set[str] = set()
    for group in _by_broker(eight).values():
        for r in group[: len(group) // 2]:
            res = _recall_result(conns[r.broker_name], r)
            assert res == RecallResult(RecallOutcome.RECALLED, 0, OK_REMARK, None, r.msg_id)
            recalled.add(r.msg_id)
    assert recalled, "no broker got two of the eight messages"
    r = wrong_slot
    other = _recall_result(conns[r.broker_name], r, timer_slot(r.deliver_at_ms, P) + P)
    assert other.outcome == RecallOutcome.RECALLED
    kept = {r.msg_id for r in results} - recalled

    # before their time: recalled ones show their tombstone, the others are scheduled
    for r in results:
        look = _lookup(conns[r.broker_name], topic, r.msg_id, at - 10_000)
        want = KeyState.RECALLED if r.msg_id in recalled else KeyState.SCHEDULED
        assert look.state == want, (r, look)

    seen: list[str] = []
    with Consumer(cluster.namesrv, topic=topic, group=name("g")) as c:
        # every kept one (on both brokers), and a second past the last one's time
        deadline = time.monotonic() + 30
        while not kept <= set(seen) or _now() < at + 1_000:
            assert time.monotonic() < deadline, f"not delivered: {kept - set(seen)}"
            seen += [m.msg_id for m in c.poll(64, 0.2)]
    assert not recalled & set(seen), f"recalled yet delivered: {recalled & set(seen)}"
    assert sorted(seen) == sorted(kept)  # each once

    for r in results:
        look = _lookup(conns[r.broker_name], topic, r.msg_id, at - 10_000)
        want = KeyState.RECALLED if r.msg_id in recalled else KeyState.FIRED
        assert look.state == want, (r, look)
        assert not look.fired if r.msg_id in recalled else len(look.fired) == 1
    wrong = _lookup(conns[wrong_slot.broker_name], topic, wrong_slot.msg_id, at - 10_000)
    assert len(wrong.tombstones) == 1  # stored, in another slot: not applied
    wrong_out = timer_slot(wrong_slot.deliver_at_ms, P)
    assert wrong.timer_out_ms == wrong_out
    assert wrong.tombstones[0].properties[msg.TIMER_OUT_MS] == str(wrong_out + P)


def test_reschedule_is_a_new_send_then_a_recall(
    cluster: RocketMQCluster, conns: dict[str, Connection], topic: str
) -> None:
    """The same id sent again for a later time, then the first slot recalled: the
    tombstone only touches its own slot, so the message comes once, at the new time."""
    t0 = _now()
    with Producer(cluster.namesrv, send_timeout=15) as p:
        old = p.send_delayed(topic, "v1", deliver_at=(t0 + LEAD_MS) / 1000)
        new = p.send_delayed(
            topic, "v2", deliver_at=(t0 + LEAD_MS + 2_000) / 1000, msg_id=old.msg_id
        )
    assert new.msg_id == old.msg_id
    assert _recall_result(conns[old.broker_name], old).outcome == RecallOutcome.RECALLED

    def looks() -> list[KeyLookup]:
        return [_lookup(c, topic, old.msg_id, t0) for c in conns.values()]

    # before the first time: scheduled, at the new slot (both copies and the tombstone in)
    wait_for(
        lambda: sum(len(x.scheduled) + len(x.tombstones) for x in looks()) == 3,
        TIMEOUT,
        "both copies and the tombstone indexed",
    )
    live = [x for x in looks() if x.state == KeyState.SCHEDULED]
    assert [(x.deliver_ms, x.timer_out_ms) for x in live] == [
        (new.deliver_at_ms, timer_slot(new.deliver_at_ms, P))
    ]

    got: list[ReceivedMessage] = []
    with Consumer(cluster.namesrv, topic=topic, group=name("g")) as c:
        deadline = time.monotonic() + 30
        while not got or _now() < new.deliver_at_ms + 1_000:
            assert time.monotonic() < deadline, "the rescheduled message did not come"
            got += c.poll(64, 0.2)
        assert c.stats()["duplicates_dropped"] == 0
    assert [(m.body, m.deliver_at_ms) for m in got] == [(b"v2", new.deliver_at_ms)]
    fired = [m for x in looks() for m in x.fired]
    assert [m.properties[msg.TIMER_DELIVER_MS] for m in fired] == [str(new.deliver_at_ms)]


# --- (c) what the broker answers ---------------------------------------------------------


def test_recall_answers(cluster: RocketMQCluster, conns: dict[str, Connection], topic: str) -> None:
    t0 = _now()
    fired, twice = _send_delayed(cluster, topic, 2, t0 + 2_000)
    conn = conns[twice.broker_name]

    # twice: SUCCESS both times (a second tombstone; the broker looks nothing up)
    first = _recall_result(conn, twice)
    again = _recall_result(conn, twice)
    assert first == again == RecallResult(RecallOutcome.RECALLED, 0, OK_REMARK, None, twice.msg_id)

    # an id no broker ever stored: SUCCESS as well
    ghost = uuid.uuid4().hex
    handle = recall_handle(topic, twice.broker_name, timer_slot(t0 + 60_000, P), ghost)
    answer, res = _recall(conn, topic, handle)
    assert (answer.code, answer.remark, res.outcome, res.msg_id) == (
        0, OK_REMARK, RecallOutcome.RECALLED, ghost
    )  # fmt: skip
    wait_for(lambda: bool(_lookup(conn, topic, ghost, t0).tombstones), TIMEOUT, "tombstone indexed")
    assert _lookup(conn, topic, ghost, t0).state == KeyState.UNKNOWN  # a tombstone alone

    # wrong handles: ILLEGAL_OPERATION (604), or TOPIC_NOT_EXIST (17), remarks as observed
    future = timer_slot(t0 + 60_000, P)
    broker = twice.broker_name
    other_broker = next(b for b in conns if b != broker)
    raw = base64.urlsafe_b64encode
    cases: list[tuple[str, str, int, str, RecallOutcome, RecallRefusal | None]] = [
        (topic, "not a handle!", 604, "recall handle is invalid",
         RecallOutcome.REFUSED, RecallRefusal.INVALID_HANDLE),
        (topic, raw(f"v2 {topic} {broker} {future + 1} {ghost}".encode()).decode(), 604,
         "recall handle is invalid", RecallOutcome.REFUSED, RecallRefusal.INVALID_HANDLE),
        (topic, raw(f"v1 {topic} {broker} {future + 1}".encode()).decode(), 604,
         "recall handle is invalid", RecallOutcome.REFUSED, RecallRefusal.INVALID_HANDLE),
        (topic, recall_handle(name("other"), broker, future, ghost), 604,
         "recall failed, topic not match", RecallOutcome.REFUSED, RecallRefusal.TOPIC_MISMATCH),
        (topic, recall_handle(topic, other_broker, future, ghost), 604,
         "recall failed, broker service not available",
         RecallOutcome.REFUSED, RecallRefusal.WRONG_BROKER),
        (topic, recall_handle(topic, broker, timer_slot(t0 - 1_000, P), ghost), 604,
         "recall failed, timestamp invalid", RecallOutcome.TOO_LATE, None),
        (topic, recall_handle(topic, broker, t0 + 4 * 86_400_000, ghost), 604,
         "recall failed, timestamp invalid", RecallOutcome.TOO_LATE, None),
        (topic, raw(f"v1 {topic} {broker} soon {ghost}".encode()).decode(), 604,
         "recall failed, timestamp invalid", RecallOutcome.TOO_LATE, None),
    ]  # fmt: skip
    missing = name("missing")
    cases.append(
        (missing, recall_handle(missing, broker, future, ghost), 17,
         f"recall failed, the topic[{missing}] not exist",
         RecallOutcome.REFUSED, RecallRefusal.TOPIC_NOT_EXIST)
    )  # fmt: skip
    for t, h, code, remark, outcome, reason in cases:
        answer, res = _recall(conn, t, h)
        assert (answer.code, answer.remark) == (code, remark), h
        assert (res.outcome, res.reason, res.code, res.remark) == (outcome, reason, code, remark)

    # after it fired: the slot has passed, "timestamp invalid"
    fconn = conns[fired.broker_name]
    wait_for(
        lambda: _lookup(fconn, topic, fired.msg_id, t0).state == KeyState.FIRED,
        TIMEOUT + 2,
        "the un-recalled message fired",
    )
    late = _recall_result(fconn, fired)
    assert (late.outcome, late.code, late.remark) == (
        RecallOutcome.TOO_LATE, 604, "recall failed, timestamp invalid"
    )  # fmt: skip

    # the twice-recalled one: two tombstones, never fired (its slot is the fired one's
    # when both are on one broker; else wait until its own slot is a second past)
    if fired.broker_name != twice.broker_name:
        wait_for(lambda: _now() > twice.deliver_at_ms + 1_000, 10, "its slot passed")
    look = _lookup(conn, topic, twice.msg_id, t0)
    assert look.state == KeyState.RECALLED and len(look.tombstones) == 2 and not look.fired


# --- (d) query by unique key -------------------------------------------------------------


def test_query_by_unique_key(
    cluster: RocketMQCluster, conns: dict[str, Connection], topic: str
) -> None:
    """What one broker's two queries return for a scheduled, a recalled, a fired and an
    unknown id, field by field."""
    t0 = _now()
    deliver = t0 + 2_500
    results = _send_delayed(cluster, topic, 4, deliver)
    broker, (s, rc, *_) = next((b, g) for b, g in _by_broker(results).items() if len(g) >= 2)
    conn = conns[broker]
    slot = timer_slot(deliver, P)
    assert _recall_result(conn, rc).outcome == RecallOutcome.RECALLED

    # an unknown id: QUERY_NOT_FOUND on both topics
    ghost = uuid.uuid4().hex
    for cmd in lookup_requests(topic, ghost, t0 - 60_000, FOREVER):
        answer = conn.call(cmd, TIMEOUT)
        assert (answer.code, answer.remark) == (
            ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct"
        )  # fmt: skip
    assert _lookup(conn, topic, ghost, t0) == KeyLookup(KeyState.UNKNOWN, ghost, topic)
    # on the broker that does not hold it: unknown too
    other = next(c for b, c in conns.items() if b != broker)
    assert _lookup(other, topic, s.msg_id, t0).state == KeyState.UNKNOWN

    # scheduled: nothing on the real topic, one copy on the timer topic
    wait_for(lambda: bool(_query(conn, topic, s.msg_id, t0)[1]), TIMEOUT, "s indexed")
    real, timer = _query(conn, topic, s.msg_id, t0)
    assert real == [] and len(timer) == 1
    look = classify(topic, s.msg_id, real, timer)
    assert (look.state, look.deliver_ms, look.timer_out_ms, look.queue_id, look.fired_ms) == (
        KeyState.SCHEDULED, deliver, slot, s.queue_id, None
    )  # fmt: skip
    assert look.live_slots == (slot,)
    # a producer's own recall whose tombstone the index does not show yet (the broker
    # indexes asynchronously): the same answer with that slot known recalled
    mine = classify(topic, s.msg_id, real, timer, recalled={slot})
    assert (mine.state, mine.live_slots, mine.deliver_ms) == (KeyState.RECALLED, (), deliver)
    assert classify(topic, s.msg_id, real, timer, recalled={slot + P}).live_slots == (slot,)

    # recalled: the copy and a tombstone on the timer topic, under the same UNIQ_KEY
    def both_indexed() -> bool:
        return len(_query(conn, topic, rc.msg_id, t0)[1]) == 2

    wait_for(both_indexed, TIMEOUT, "the recalled copy and its tombstone indexed")
    real, timer = _query(conn, topic, rc.msg_id, t0)
    (tomb,) = [m for m in timer if msg.TIMER_DEL_UNIQKEY in m.properties]
    assert real == [] and tomb.topic == TIMER_TOPIC and tomb.body == b"0"
    p = tomb.properties
    assert (p[msg.TIMER_DEL_UNIQKEY], p[msg.UNIQ_KEY], p[msg.REAL_TOPIC], p[msg.TAGS]) == (
        rc.msg_id, rc.msg_id, topic, RECALL_TAG
    )  # fmt: skip
    assert (p[msg.TIMER_DELIVER_MS], p[msg.TIMER_OUT_MS]) == (str(slot + 1), str(slot))
    assert classify(topic, rc.msg_id, real, timer).state == KeyState.RECALLED

    # fired: a copy on the real topic with the timer's marks; the timer topic's copy stays
    wait_for(lambda: bool(_query(conn, topic, s.msg_id, t0)[0]), TIMEOUT + 3, "s fired and indexed")
    real, timer = _query(conn, topic, s.msg_id, t0)
    (f,) = real
    assert (f.topic, f.queue_id, f.body) == (topic, s.queue_id, f"m-{results.index(s)}".encode())
    # convertMessage clears REAL_* from the map after it wrote the properties string:
    # the stored copy keeps them
    assert f.properties[msg.REAL_TOPIC] == topic
    assert f.properties[msg.REAL_QID] == str(s.queue_id)
    assert f.properties[msg.TIMER_OUT_MS] == str(slot)
    assert f.properties[msg.TIMER_DELIVER_MS] == str(deliver)
    dequeued = int(f.properties[msg.TIMER_DEQUEUE_MS])
    assert int(f.properties[msg.TIMER_ENQUEUE_MS]) <= dequeued
    assert dequeued >= slot + P and dequeued >= deliver
    assert len(timer) == 1
    look = classify(topic, s.msg_id, real, timer)
    assert (look.state, look.fired_ms, look.queue_id) == (KeyState.FIRED, dequeued, s.queue_id)

    # the recalled one, its slot fired (same broker, same slot): still nothing real
    real, timer = _query(conn, topic, rc.msg_id, t0)
    assert real == [] and len(timer) == 2
    assert classify(topic, rc.msg_id, real, timer).state == KeyState.RECALLED
