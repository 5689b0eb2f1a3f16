"""The RocketMQ consumer's failure handling, sans-I/O: Java tag hash codes and tag
subscriptions, the send-back requests (retry and dead letter) and where they go, a retry
read back as the original, and what ``ConsumeState`` does with tags, retries of one id, a
failed ``retry_later`` and two topics at once."""

from __future__ import annotations

import zlib

import msgspec

from qclient import ReceivedMessage
from qclient.consumer._failures import (
    PROP_ATTEMPTS,
    PROP_ORIGIN_MSG_ID,
    PROP_ORIGIN_TOPIC,
    PROP_REASON,
)
from qclient.engines.rocketmq import message as msg
from qclient.engines.rocketmq.codes import RequestCode
from qclient.engines.rocketmq.message import StoredMessage
from qclient.engines.rocketmq.pull import to_received
from qclient.engines.rocketmq.rebalance import heartbeat_request
from qclient.engines.rocketmq.retry import (
    SendTarget,
    dead_letter_request,
    java_string_hash,
    origin_msg_id,
    retry_request,
    send_targets,
    subscription_data,
)
from qclient.engines.rocketmq.state import ConsumeState, release_merged
from qclient.protocol.wire import BrokerData, QueueData, TopicRoute

A0 = ("broker-a", 0)


def _stored(offset: int, topic: str = "T", reconsume: int = 0, **props: str) -> StoredMessage:
    p = {"UNIQ_KEY": props.pop("uid", f"id-{offset}"), **props}
    return StoredMessage(topic, 0, offset, 1000 + offset, 0, 1, 5, reconsume, b"b", p, f"O{offset}")


def _received(attempt: int = 1, body: bytes = b"payload") -> ReceivedMessage:
    return ReceivedMessage(
        "U1", "T", body, "k1", "TagA", {"color": "red"}, 5, 5, "broker-a", 0, 7, attempt,
        extra={"offset_msg_id": "OFF7", "origin_msg_id": None},
    )  # fmt: skip


def test_java_string_hash() -> None:
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("中文") == 646394 and java_string_hash("😀") == 1772899
    assert java_string_hash("polygenelubricants") == -(2**31)  # int32 overflow, as Java


def test_subscription_data() -> None:
    everything = subscription_data("%RETRY%g", "*", 7)
    assert (everything["subString"], everything["tagsSet"], everything["codeSet"]) == ("*", [], [])
    tagged = subscription_data("T", "TagB || TagA", 7)
    assert tagged["subString"] == "TagB || TagA" and tagged["tagsSet"] == ["TagA", "TagB"]
    assert tagged["codeSet"] == [2598919, 2598920] and tagged["expressionType"] == "TAG"
    body = msgspec.json.decode(heartbeat_request("c", "g", {"T": "TagA", "%RETRY%g": "*"}, 1).body)
    subs = body["consumerDataSet"][0]["subscriptionDataSet"]
    assert [s["topic"] for s in subs] == ["T", "%RETRY%g"]


def test_retry_and_dead_letter_requests() -> None:
    m = _received(attempt=2)
    cmd = retry_request(
        m, group="g", broker="broker-b", queue_id=0, deliver_ms=5000, max_attempts=16, now_ms=1000
    )
    h = cmd.ext_fields
    assert (cmd.code, h["a"], h["b"], h["j"], h["l"], h["d"], h["bname"]) == (
        RequestCode.SEND_MESSAGE_V2, "g", "%RETRY%g", "2", "15", "1", "broker-b",
    )  # fmt: skip
    props = msg.decode_properties(h["i"])
    assert props == {
        "color": "red", "UNIQ_KEY": "U1", "WAIT": "true", "KEYS": "k1", "TAGS": "TagA",
        "RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": "OFF7", "TIMER_DELIVER_MS": "5000",
    }  # fmt: skip
    assert cmd.body == b"payload" and h["f"] == "0"
    now = retry_request(
        m, group="g", broker="b", queue_id=0, deliver_ms=1000, max_attempts=16, now_ms=1000
    )
    assert "TIMER_DELIVER_MS" not in msg.decode_properties(now.ext_fields["i"])
    big = retry_request(
        _received(body=b"x" * 5000), group="g", broker="b", queue_id=0, deliver_ms=0,
        max_attempts=16, now_ms=1,
    )  # fmt: skip
    assert big.ext_fields["f"] == str(msg.SysFlag.COMPRESSED_ZLIB)
    assert zlib.decompress(big.body) == b"x" * 5000
    dead = dead_letter_request(m, group="g", broker="b", queue_id=0, reason="bad", now_ms=1)
    h = dead.ext_fields
    assert (h["b"], h["j"], h["l"]) == ("%RETRY%g", "2", "1"), "reconsume > max: the DLQ"
    props = msg.decode_properties(h["i"])
    assert (props[PROP_ORIGIN_TOPIC], props[PROP_ORIGIN_MSG_ID], props[PROP_ATTEMPTS]) == (
        "T", "U1", "2",
    )  # fmt: skip
    assert props[PROP_REASON] == "bad" and "TIMER_DELIVER_MS" not in props


def test_send_targets_message_broker_first() -> None:
    route = TopicRoute(
        "%RETRY%g",
        [QueueData("broker-a", 1, 1, 6), QueueData("broker-b", 1, 2, 6), QueueData("c", 1, 1, 4)],
        [BrokerData(b, {0: f"h:{i + 1}"}) for i, b in enumerate(["broker-a", "broker-b", "c"])],
    )  # fmt: skip
    got = send_targets(route, "broker-b", {}, spread=3)
    assert got == [SendTarget("broker-b", "h:2", 1), SendTarget("broker-a", "h:1", 0)]
    assert send_targets(None, "broker-a", {"broker-a": "h:1"}) == [SendTarget("broker-a", "h:1", 0)]
    assert send_targets(None, "x", {}) == []


def test_a_retry_looks_like_the_original() -> None:
    stored = _stored(
        3, "%RETRY%g", 2, uid="U1", RETRY_TOPIC="T", ORIGIN_MESSAGE_ID="OFF1",
        REAL_TOPIC="%RETRY%g", TIMER_OUT_MS="1", TIMER_DELIVER_MS="900", TIMER_DEQUEUE_MS="950",
        color="red",
    )  # fmt: skip
    r = to_received(stored, "broker-a")
    assert (r.topic, r.msg_id, r.attempt, r.properties) == ("T", "U1", 3, {"color": "red"})
    assert (r.deliver_at_ms, r.extra["store_topic"], r.extra["origin_msg_id"]) == (
        900, "%RETRY%g", "OFF1",
    )  # fmt: skip
    assert origin_msg_id(r) == "OFF1"
    dlq = to_received(_stored(0, "%DLQ%g", 2, RETRY_TOPIC="T"), "broker-a")
    assert (dlq.topic, dlq.attempt) == ("%DLQ%g", 1), "a DLQ read is a first delivery"


def test_state_filters_tags_and_commits_past_them() -> None:
    s = ConsumeState(accepts=lambda t: t == "A")
    gen = s.take(A0, 0)
    batch = [_stored(0, TAGS="A"), _stored(1, TAGS="B"), _stored(2), _stored(3, TAGS="A")]
    assert s.accept(A0, gen, batch, 4, 0)
    assert [r.offset for r in s.release(10, 1)] == [0, 3]
    assert s.ack() and s.pending_commits() == {A0: 4}
    assert s.stats.filtered == 2 and s.stats.fetched == 2
    gen = s.take(A0, 4)  # a batch all filtered still moves the commit
    assert s.accept(A0, gen, [_stored(4, TAGS="B")], 5, 0)
    assert s.ack() and s.pending_commits() == {A0: 5}


def test_state_retries_of_one_id_are_not_duplicates() -> None:
    s = ConsumeState()
    gen = s.take(A0, 0)
    same = [_stored(0, "%RETRY%g", 1, uid="U"), _stored(1, "%RETRY%g", 2, uid="U")]
    assert s.accept(A0, gen, [*same, _stored(2, "%RETRY%g", 2, uid="U")], 3, 0)
    assert [r.attempt for r in s.release(10, 1)] == [2, 3]
    assert s.stats.duplicates_dropped == 1


def test_state_reopen_holds_the_commit_back() -> None:
    s = ConsumeState()
    gen = s.take(A0, 0)
    assert s.accept(A0, gen, [_stored(0), _stored(1), _stored(2)], 3, 0)
    s.release(10, 1)
    assert s.reopen(A0, 1)
    assert s.ack() and s.pending_commits() == {A0: 1}
    s.committed_ok(A0, 1)
    s.returned_again(A0, 1)
    assert s.ack() and s.pending_commits() == {A0: 3}
    assert not s.reopen(A0, 0), "committed already"


def test_release_merged_earliest_first() -> None:
    main, retry = ConsumeState(), ConsumeState()
    g1, g2 = main.take(A0, 0), retry.take(A0, 0)
    main.accept(
        A0, g1, [_stored(0, TIMER_DELIVER_MS="30"), _stored(1, TIMER_DELIVER_MS="10")], 2, 0
    )
    retry.accept(A0, g2, [_stored(0, "%RETRY%g", 1, uid="R", TIMER_DELIVER_MS="20")], 1, 0)
    out = release_merged([main, retry], 10, 100)
    assert [(r.msg_id, r.deliver_at_ms) for r in out] == [("id-1", 10), ("R", 20), ("id-0", 30)]
    assert release_merged([main, retry], 10, 100) == []
