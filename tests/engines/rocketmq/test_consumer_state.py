"""The RocketMQ consumer's sans-I/O parts: held messages and commit offsets
(``state.ConsumeState``), who takes which queue when (``rebalance.Handover``), and what a
pulled message looks like to the application (``pull``)."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from qclient.consumer import allocate_averagely
from qclient.engines.rocketmq.message import StoredMessage
from qclient.engines.rocketmq.pull import PullStatus, parse_pull, to_received, user_properties
from qclient.engines.rocketmq.rebalance import (
    Handover,
    heartbeat_request,
    parse_consumer_list,
    read_offset,
    readable_queues,
)
from qclient.engines.rocketmq.remoting import RemotingCommand
from qclient.engines.rocketmq.state import ConsumeState
from qclient.protocol.wire import BrokerData, QueueData, TopicRoute

A0 = ("broker-a", 0)


def _msg(
    offset: int, deliver: int | None = None, uid: str | None = None, q: int = 0
) -> StoredMessage:
    props = {"UNIQ_KEY": uid or f"id-{q}-{offset}", "TAGS": "t", "color": "red"}
    if deliver is not None:
        props["TIMER_DELIVER_MS"] = str(deliver)
        props["TIMER_DEQUEUE_MS"] = str(deliver - 30)
    return StoredMessage("T", q, offset, 1000 + offset, 0, 1, 5, 0, b"b", props, f"OFF{offset}")


# --- ConsumeState ------------------------------------------------------------------------


def test_held_until_deliver_time_earliest_first() -> None:
    s = ConsumeState()
    gen = s.take(A0, 0)
    msgs = [_msg(0, 3000), _msg(1, 2000), _msg(2)]
    assert s.accept(A0, gen, msgs, 3, now_ms=1000)
    assert s.stats.early == 2 and s.stats.max_early_ms == 2000
    assert [m.offset for m in s.release(10, 1000)] == [2]  # immediate at once
    assert s.next_due_ms() == 2000
    assert s.release(10, 1999) == []
    assert [m.offset for m in s.release(10, 2000)] == [1]
    assert [m.offset for m in s.release(10, 5000)] == [0]
    assert s.next_due_ms() is None and s.total_held == 0


def test_commit_offset_is_the_first_not_returned() -> None:
    s = ConsumeState()
    gen = s.take(A0, 10)
    s.accept(A0, gen, [_msg(10, 3000), _msg(11, 2000), _msg(12)], 13, now_ms=0)
    s.release(10, 2000)  # 12 and 11 returned, 10 still held: nothing to commit yet
    assert not s.ack() and s.pending_commits() == {}
    s.release(10, 3000)
    assert s.ack() and s.pending_commits() == {A0: 13}
    s.committed_ok(A0, 13)
    assert s.pending_commits() == {} and s.committed() == {A0: 13}
    assert not s.ack()


def test_duplicate_uniq_key_dropped_but_counted_as_returned() -> None:
    s = ConsumeState()
    gen = s.take(A0, 0)
    s.accept(A0, gen, [_msg(0, uid="x"), _msg(1, uid="x"), _msg(2, uid="y")], 3, now_ms=0)
    assert [m.msg_id for m in s.release(10, 0)] == ["x", "y"]
    assert s.stats.duplicates_dropped == 1
    s.ack()
    assert s.pending_commits() == {A0: 3}


def test_stop_forgets_held_but_takes_the_next_ack() -> None:
    s = ConsumeState()
    gen = s.take(A0, 0)
    s.accept(A0, gen, [_msg(0), _msg(1), _msg(2, 9999)], 3, now_ms=0)
    assert len(s.release(2, 0)) == 2
    assert s.stop(A0) and s.unacked(A0)
    assert s.assignment() == [] and not s.owns(A0) and s.total_held == 0
    assert s.release(10, 10**13) == []  # the held one is never returned
    assert not s.accept(A0, gen, [_msg(3)], 4, now_ms=0)  # a pull in flight is refused
    s.ack()
    assert not s.unacked(A0)
    assert s.drop(A0) == 2  # what to commit before letting go
    assert s.drop(A0) is None


def test_taken_again_refuses_the_old_ownership() -> None:
    s = ConsumeState()
    old = s.take(A0, 0)
    new = s.take(A0, 5)
    assert not s.accept(A0, old, [_msg(0)], 1, now_ms=0)
    assert s.accept(A0, new, [_msg(5)], 6, now_ms=0)
    assert s.position(A0) == 6


def test_moved_offset_with_nothing_held_counts_as_consumed() -> None:
    s = ConsumeState()
    gen = s.take(A0, 0)
    assert s.advance(A0, gen, 40)
    s.ack()
    assert s.position(A0) == 40 and s.pending_commits() == {A0: 40}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=1, max_size=30),
    st.lists(st.integers(0, 60), min_size=1, max_size=10),
)
def test_never_early_and_commit_never_past_a_held_message(
    delays: list[int | None], clock: list[int]
) -> None:
    s = ConsumeState()
    gen = s.take(A0, 0)
    msgs = [_msg(i, None if d is None else 100 + d) for i, d in enumerate(delays)]
    s.accept(A0, gen, msgs, len(msgs), now_ms=100)
    returned: set[int] = set()
    for now in sorted(100 + t for t in clock):
        for m in s.release(1000, now):
            assert m.deliver_at_ms <= now or "TIMER_DELIVER_MS" not in msgs[m.offset].properties
            returned.add(m.offset)
        s.ack()
        pending = s.pending_commits().get(A0)
        first_held = min(set(range(len(msgs))) - returned, default=len(msgs))
        assert pending is None or pending == first_held


# --- Handover ----------------------------------------------------------------------------

Q = [(b, q) for b in ("a", "b") for q in range(4)]


def test_alone_takes_everything_at_once() -> None:
    h = Handover("m1", grace=1.5)
    assert h.plan(["m1"], Q, set(), now=0.0) == ([], Q)


def test_first_view_with_others_waits_the_grace() -> None:
    h = Handover("m2", grace=1.5)
    share = allocate_averagely(Q, ["m1", "m2"], "m2")
    assert h.plan(["m1", "m2"], Q, set(), now=0.0) == ([], [])
    assert h.next_claim() == 1.5
    assert h.plan(["m1", "m2"], Q, set(), now=1.5) == ([], share)


def test_a_dead_members_queues_at_once_a_live_ones_after_the_grace() -> None:
    h = Handover("m2", grace=1.5)
    mine = allocate_averagely(Q, ["m1", "m2", "m3"], "m2")
    h.plan(["m1", "m2", "m3"], Q, set(), now=0.0)
    _, took = h.plan(["m1", "m2", "m3"], Q, set(), now=2.0)
    assert took == mine
    lose, take = h.plan(["m1", "m2"], Q, set(mine), now=3.0)  # m3 died
    share = allocate_averagely(Q, ["m1", "m2"], "m2")
    from_m3 = [k for k in share if k in allocate_averagely(Q, ["m1", "m2", "m3"], "m3")]
    assert lose == sorted(set(mine) - set(share)) and take == from_m3
    assert h.next_claim() is None  # nothing came from m1, still alive


def test_a_claim_is_dropped_when_the_share_changes_back() -> None:
    h = Handover("m2", grace=1.5)
    h.plan(["m1", "m2"], Q, set(), now=0.0)
    assert h.claims
    assert set(h.claims) == set(allocate_averagely(Q, ["m1", "m2"], "m2"))
    h.plan(["m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"], Q, set(), now=0.5)
    assert h.claims == {("a", 1): 2.0}  # only the new share waits, m1 held it


# --- protocol bits -----------------------------------------------------------------------


def test_heartbeat_body() -> None:
    body = msgspec.json.decode(heartbeat_request("c1", "g", "T", 7).body)
    [data] = body["consumerDataSet"]
    assert body["clientID"] == "c1" and body["producerDataSet"] == []
    assert (data["groupName"], data["consumeType"], data["messageModel"]) == (
        "g",
        "CONSUME_ACTIVELY",
        "CLUSTERING",
    )
    assert data["consumeFromWhere"] == "CONSUME_FROM_FIRST_OFFSET"
    assert data["subscriptionDataSet"][0]["subString"] == "*"


def test_consumer_list_and_offsets() -> None:
    ok = RemotingCommand(0, body=b'{"consumerIdList":["b","a","b"]}')
    assert parse_consumer_list(ok) == ["a", "b"]
    none = RemotingCommand(1, remark="no consumer for this group, g")
    assert parse_consumer_list(none) == []
    assert parse_consumer_list(RemotingCommand(2, remark="busy")) is None
    assert read_offset(RemotingCommand(0, ext_fields={"offset": "12"})) == 12
    assert read_offset(RemotingCommand(0, ext_fields={"offset": "-1"})) is None
    assert read_offset(RemotingCommand(22, remark="Not found")) is None


def test_readable_queues_of_brokers_with_a_master() -> None:
    route = TopicRoute(
        "T",
        [QueueData("b", 2, 2, 6), QueueData("a", 3, 3, 6), QueueData("c", 2, 2, 6)],
        [
            BrokerData("a", {0: "h:1"}),
            BrokerData("b", {0: "h:2", 1: "h:3"}),
            BrokerData("c", {1: "h:4"}),  # no master: not read
        ],
    )
    masters, queues = readable_queues(route)
    assert masters == {"a": "h:1", "b": "h:2"}
    assert queues == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]


def test_user_properties_and_received_message() -> None:
    props = {
        "UNIQ_KEY": "U1",
        "KEYS": "k1",
        "TAGS": "t",
        "WAIT": "true",
        "REAL_TOPIC": "T",
        "TIMER_OUT_MS": "1",
        "CLUSTER": "DefaultCluster",
        "__RMQ.TRANSIENT.X": "1",
        "color": "red",
    }
    assert user_properties(props) == {"color": "red"}
    m = _msg(4, 2000, uid="U1")
    r = to_received(m, "broker-a")
    assert (r.msg_id, r.topic, r.tags, r.properties) == ("U1", "T", "t", {"color": "red"})
    assert (r.deliver_at_ms, r.fired_at_ms, r.broker_name, r.offset) == (2000, 1970, "broker-a", 4)
    assert r.extra["attempt"] == 1 and r.extra["offset_msg_id"] == "OFF4"
    plain = to_received(_msg(5), "broker-a")
    assert plain.deliver_at_ms == plain.fired_at_ms == 5  # store time


def test_pull_answers() -> None:
    nothing = RemotingCommand(19, ext_fields={"nextBeginOffset": "7", "maxOffset": "7"})
    r = parse_pull(nothing, 0, 7)
    assert (r.status, r.next_offset, r.messages) == (PullStatus.NO_NEW, 7, [])
    assert parse_pull(RemotingCommand(21, ext_fields={"nextBeginOffset": "9"}), 0, 2).status is (
        PullStatus.MOVED
    )
    assert parse_pull(RemotingCommand(24, remark="x"), 0, 0).status is PullStatus.ERROR
