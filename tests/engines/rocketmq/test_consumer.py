"""``RocketMQConsumer`` against a real Apache RocketMQ 5.5.0 cluster on 127.0.0.1 (one
NameServer, broker-a and broker-b, timer precision 100 ms): members of a group share the
topic's 8 queues (2 brokers x 4), each message once; a killed member's queues move to the
others and nothing is lost; a closed member's at once; two groups each get every message;
delayed messages never come before their time; what ``Producer`` sent comes back whole;
RocketMQ's own Java consumer shares a group with ours.

Members that are killed run as child processes (``_consumer_member.py``), so that the
broker sees their connections close as it would for a crashed service.
"""

from __future__ import annotations

import gc
import socket
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks._rocketmq_java import java_peer_available, read_lines, run_consume

from qclient import Message, Producer
from qclient.consumer import allocate_averagely
from qclient.engines.rocketmq.consumer import RocketMQConsumer
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.errors import ConsumerClosedError, NameServerUnavailableError

from ._consumer_helpers import (
    Member,
    drain,
    name,
    pct,
    send,
    send_batch,
    send_batch_raw,
    send_delayed_while_polling,
    wait_for,
)
from ._needs import needs_rocketmq

pytestmark = [
    pytest.mark.slow,
    pytest.mark.jvm,
    needs_rocketmq,
]

QUEUES = 4  # per broker: 8 in all


@pytest.fixture(scope="module")
def cluster(rocketmq_cluster: RocketMQCluster) -> RocketMQCluster:
    """tests/conftest.py's RocketMQ cluster: brokers are never stopped here."""
    return rocketmq_cluster


def _topic(cluster: RocketMQCluster, prefix: str = "tc") -> str:
    topic = name(prefix)
    cluster.create_topic(topic, QUEUES)
    return topic


ALL_QUEUES = sorted((f"broker-{b}", q) for b in "ab" for q in range(QUEUES))


# --- members in child processes ----------------------------------------------------------


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[[RocketMQCluster, str, str], Member]]:
    """Start member processes; every one is stopped after the test."""
    members: list[Member] = []

    def start(cluster: RocketMQCluster, topic: str, group: str) -> Member:
        m = Member(cluster, topic, group, tmp_path / f"member-{len(members)}.log")
        members.append(m)
        return m

    try:
        yield start
    finally:
        for m in members:
            m.stop()


def _converged(members: list[Member], queues: list[tuple[str, int]] = ALL_QUEUES) -> bool:
    """Every member reads its own share and together they read every queue."""
    held = [m.held() for m in members]
    flat = [k for h in held for k in h]
    return all(held) and len(flat) == len(set(flat)) and sorted(flat) == queues


# --- tests -------------------------------------------------------------------------------


def test_three_members_share_8_queues_exactly_once(cluster: RocketMQCluster, spawn: Any) -> None:
    topic, group = _topic(cluster), name("g")
    members = [spawn(cluster, topic, group) for _ in range(3)]
    wait_for(lambda: _converged(members), 60, "3 members share the 8 queues")
    ids = sorted(m.client_id for m in members)
    for m in members:  # RocketMQ's AllocateMessageQueueAveragely over sorted ids
        assert m.held() == allocate_averagely(ALL_QUEUES, ids, m.client_id)

    retried: set[str] = set()
    sent = send(cluster, topic, 3000, retried=retried)
    wait_for(
        lambda: sum(len(m.received()) for m in members) >= len(sent), 60, "3,000 messages read"
    )
    for m in members:
        m.close()
    got = Counter(i for m in members for i in m.received())
    assert set(got) == set(sent), f"lost {len(set(sent) - set(got))}"
    twice = {i for i, v in got.items() if v > 1}
    assert twice <= retried, f"{len(twice - retried)} read twice"  # a re-send may store twice
    assert all(m.received() for m in members)


def test_killed_member_queues_move_nothing_lost(cluster: RocketMQCluster, spawn: Any) -> None:
    topic, group = _topic(cluster), name("g")
    members = [spawn(cluster, topic, group) for _ in range(3)]
    wait_for(lambda: _converged(members), 60, "3 members share the 8 queues")
    first = send(cluster, topic, 1500, "before")
    victim, survivors = members[0], members[1:]
    wait_for(lambda: len(victim.received()) >= 100, 30, "the victim read some")
    orphans = set(victim.held())
    victim.kill()
    taken = wait_for(
        lambda: orphans <= {k for m in survivors for k in m.held()}, 30, "its queues taken"
    )
    # queues that shift between the survivors wait out the handover grace
    settled = taken + wait_for(lambda: _converged(survivors), 30, "the survivors converge")
    print(f"\nafter SIGKILL: its queues taken in {taken:.2f} s, shares settled in {settled:.2f} s")
    assert settled < 5.0
    second = send(cluster, topic, 1500, "after")
    want = set(first) | set(second)
    wait_for(lambda: want <= {i for m in members for i in m.received()}, 60, "every message read")
    for m in survivors:
        m.close()
    got = Counter(i for m in members for i in m.received())
    dups = sum(v - 1 for v in got.values())
    print(f"read twice after the kill (returned, not yet committed): {dups}")
    assert set(got) == want


def test_close_rebalances_at_once_without_duplicates(cluster: RocketMQCluster, spawn: Any) -> None:
    topic, group = _topic(cluster), name("g")
    members = [spawn(cluster, topic, group) for _ in range(2)]
    wait_for(lambda: _converged(members), 60, "2 members share the 8 queues")
    retried: set[str] = set()
    sent = send(cluster, topic, 1000, retried=retried)
    leaver, stayer = members
    wait_for(lambda: len(leaver.received()) >= 50, 30, "the leaver read some")
    start = time.monotonic()
    leaver.close()
    closed = time.monotonic() - start
    moved = wait_for(lambda: stayer.held() == ALL_QUEUES, 10, "the stayer reads every queue")
    print(f"\nclose() took {closed:.2f} s; the stayer held every queue {moved:.2f} s later")
    assert moved < 2.0
    wait_for(lambda: set(sent) <= set(leaver.received()) | set(stayer.received()), 60, "all read")
    stayer.close()
    got = Counter(leaver.received() + stayer.received())
    assert set(got) == set(sent)
    twice = {i for i, v in got.items() if v > 1}
    assert twice <= retried, "a closed member commits what it returned"
    assert leaver.stats is not None and leaver.stats["duplicates_dropped"] == 0


def test_member_joining_mid_stream_takes_its_share(cluster: RocketMQCluster, spawn: Any) -> None:
    topic, group = _topic(cluster), name("g")
    first = spawn(cluster, topic, group)
    wait_for(lambda: first.held() == ALL_QUEUES, 60, "the first member reads every queue")
    sent: list[str] = []
    errors: list[BaseException] = []

    def produce() -> None:  # 2,000 messages over ~4 s
        try:
            with Producer(cluster.namesrv) as p:
                for lo in range(0, 2000, 25):
                    batch = [Message(topic, f"j-{lo + i}", msg_id=name("j")) for i in range(25)]
                    send_batch(p, batch)
                    sent.extend(str(m.msg_id) for m in batch)
                    time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    sender = threading.Thread(target=produce)
    sender.start()
    try:
        wait_for(lambda: len(first.received()) >= 300, 30, "the first member read some")
        joiner = spawn(cluster, topic, group)
        took = wait_for(lambda: _converged([first, joiner]), 30, "the joiner takes its share")
    finally:
        sender.join(60)
    assert not errors, errors
    print(f"\njoin: shares settled {took:.2f} s after the joiner started")
    wait_for(lambda: set(sent) <= set(first.received()) | set(joiner.received()), 60, "all read")
    first.close()
    joiner.close()
    got = Counter(first.received() + joiner.received())
    assert set(got) == set(sent) and joiner.received()
    print(f"read twice on the join: {sum(v - 1 for v in got.values())}")


def test_two_groups_each_get_every_message(cluster: RocketMQCluster) -> None:
    topic = _topic(cluster)
    with (
        RocketMQConsumer((cluster.namesrv_addr,), topic, name("g1")) as c1,
        RocketMQConsumer((cluster.namesrv_addr,), topic, name("g2")) as c2,
    ):
        sent = set(send(cluster, topic, 400))
        for c in (c1, c2):
            got = [m.msg_id for m, _ in drain(c, sent, 60)]
            assert sorted(got) == sorted(sent)


def test_delayed_messages_never_early(cluster: RocketMQCluster) -> None:
    topic = _topic(cluster)
    with RocketMQConsumer((cluster.namesrv_addr,), topic, name("g")) as c:
        delays = [1.0 + 2.0 * (i % 40) / 40 for i in range(120)]
        deliver, got = send_delayed_while_polling(cluster, c, topic, delays, 0.01)
        stats = c.stats()
    assert sorted(m.msg_id for m, _ in got) == sorted(deliver)
    for m, at in got:
        assert m.deliver_at_ms == deliver[m.msg_id]
        assert at >= m.deliver_at_ms, f"{m.msg_id} returned {m.deliver_at_ms - at} ms early"
    fired = [m.fired_at_ms - m.deliver_at_ms for m, _ in got]
    print(
        f"\nbroker fire time - deliver time: min {min(fired)} ms; "
        f"pulled before their time: {stats['early']} of {len(got)}, "
        f"by up to {stats['max_early_ms']} ms"
    )


def test_lateness_of_1s_delays(cluster: RocketMQCluster) -> None:
    """Receive lateness (local return time - deliver time) of 1 s delays, reported with
    its parts: the broker's fire lateness and fire -> return."""
    topic = _topic(cluster)
    with RocketMQConsumer((cluster.namesrv_addr,), topic, name("g")) as c:
        deliver, got = send_delayed_while_polling(cluster, c, topic, [1.0] * 300, 0.005)
    assert len(got) == len(deliver) == 300
    late = [at - m.deliver_at_ms for m, at in got]
    fire = [m.fired_at_ms - m.deliver_at_ms for m, _ in got]
    hand = [at - m.extra["store_ms"] for m, at in got]
    assert min(late) >= 0
    print(
        f"\n1 s delays x {len(late)}: receive lateness p50 {statistics.median(late):.0f} ms, "
        f"p99 {pct(late, 0.99)} ms (broker fire lateness p50 {statistics.median(fire):.0f} / "
        f"p99 {pct(fire, 0.99)} ms; stored -> returned p50 {statistics.median(hand):.0f} / "
        f"p99 {pct(hand, 0.99)} ms)"
    )


def test_producer_message_comes_back_whole(cluster: RocketMQCluster) -> None:
    topic = _topic(cluster)
    props = {"color": "red", "n": "1", "unicode": "élan ✓"}
    body = bytes(range(256)) * 4
    with Producer(cluster.namesrv) as p:
        sent = p.send(topic, body, key="order-7", tags="tagA", properties=props)
    with RocketMQConsumer((cluster.namesrv_addr,), topic, name("g")) as c:
        [(m, _)] = drain(c, {sent.msg_id}, 30)
        assert (m.msg_id, m.topic, m.body) == (sent.msg_id, topic, body)
        assert (m.key, m.tags, m.properties) == ("order-7", "tagA", props)
        assert (m.broker_name, m.queue_id) == (sent.broker_name, sent.queue_id)
        assert m.deliver_at_ms == m.fired_at_ms and m.extra["attempt"] == 1
        wait_for(lambda: c.assignment() == ALL_QUEUES, 10, "one member reads every queue")
        assert c.members() == [c.client_id]
        c.commit()
        assert c.committed()[(m.broker_name, m.queue_id)] == m.offset + 1


def test_message_handed_over_early_is_held_until_its_time(cluster: RocketMQCluster) -> None:
    topic = _topic(cluster)
    with RocketMQConsumer((cluster.namesrv_addr,), topic, name("g")) as c:
        wait_for(lambda: c.assignment() == ALL_QUEUES, 10, "one member reads every queue")
        uid = uuid.uuid4().hex.upper()
        deliver = time.time_ns() // 1_000_000 + 1500
        send_batch_raw(cluster, topic, {"UNIQ_KEY": uid, "TIMER_DELIVER_MS": str(deliver)}, b"e")
        [(m, at)] = drain(c, {uid}, 10)
        stats = c.stats()
    assert m.deliver_at_ms == deliver and at >= deliver
    assert m.extra["store_ms"] < deliver - 500  # readable well before its time
    assert stats["early"] == 1 and stats["max_early_ms"] > 500
    print(f"\nstored {deliver - m.extra['store_ms']} ms early, returned {at - deliver} ms late")


def test_duplicate_uniq_key_returned_once(cluster: RocketMQCluster) -> None:
    topic = _topic(cluster)
    with Producer(cluster.namesrv) as p:
        first = p.send(topic, b"once", key="k")
        again = p.send(topic, b"once", key="k", msg_id=first.msg_id)  # a retry's copy
    assert again.msg_id == first.msg_id
    with RocketMQConsumer((cluster.namesrv_addr,), topic, name("g")) as c:
        got = [m.msg_id for m, _ in drain(c, {first.msg_id}, 10)]
        deadline = time.monotonic() + 10
        while c.stats()["duplicates_dropped"] < 1:  # dropped when a poll reaches it
            assert time.monotonic() < deadline, "the copy was not dropped"
            got += [m.msg_id for m in c.poll(10, 0.2)]
        assert got == [first.msg_id]
        assert c.stats()["fetched"] == 2 and c.stats()["returned"] == 1


def test_closed_consumer(cluster: RocketMQCluster) -> None:
    topic = _topic(cluster)
    with RocketMQConsumer((cluster.namesrv_addr,), topic, name("g")) as c:
        assert repr(c).startswith("RocketMQConsumer(") and not c.closed
    assert c.closed
    c.close()  # idempotent
    with pytest.raises(ConsumerClosedError):
        c.poll()
    assert list(c) == []


def test_no_namesrv_raises_and_an_unknown_topic_reads_nothing(cluster: RocketMQCluster) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with RocketMQConsumer((dead,), "T", name("g")) as c:
        start = time.monotonic()
        with pytest.raises(NameServerUnavailableError):
            c.poll(timeout=10)
        assert time.monotonic() - start < 5
    with RocketMQConsumer((cluster.namesrv_addr,), name("nosuch"), name("g")) as c:
        assert c.poll(timeout=1.0) == [] and c.assignment() == []


def test_consumer_dropped_unclosed_leaves_the_group(cluster: RocketMQCluster) -> None:
    topic, group = _topic(cluster), name("g")
    with RocketMQConsumer((cluster.namesrv_addr,), topic, group) as stays:
        gone = RocketMQConsumer((cluster.namesrv_addr,), topic, group)
        wait_for(lambda: len(stays.assignment()) == 4, 30, "two members share the queues")
        del gone
        gc.collect()
        left = wait_for(lambda: stays.assignment() == ALL_QUEUES, 10, "the other holds all")
        assert stays.members() == [stays.client_id]
    print(f"\ngarbage-collected member's queues moved in {left:.2f} s")


@pytest.mark.skipif(java_peer_available() is not None, reason=str(java_peer_available()))
def test_java_consumer_shares_the_group(cluster: RocketMQCluster, tmp_path: Path) -> None:
    """RocketMQ's own DefaultLitePullConsumer and ours in one group: the queues split
    between them, each message read by one."""
    topic, group = _topic(cluster), name("g")
    java: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    # the Java consumer prints each message as it reads it, and stops once the stop file is
    # there: the test stops it when the two members together have read every message
    out, stop = tmp_path / "java.jsonl", tmp_path / "stop"

    def run_java() -> None:
        try:
            java.extend(
                run_consume(
                    cluster.namesrv_addr, topic, group, 10**6, 90, stop_file=stop, out_path=out
                )
            )
        except BaseException as exc:
            errors.append(exc)

    with RocketMQConsumer((cluster.namesrv_addr,), topic, group) as c:
        wait_for(lambda: c.assignment() == ALL_QUEUES, 10, "ours reads every queue")
        peer = threading.Thread(target=run_java)
        peer.start()
        try:
            wait_for(lambda: len(c.members()) == 2, 30, "the Java consumer joins")
            share = allocate_averagely(ALL_QUEUES, c.members(), c.client_id)
            wait_for(lambda: c.assignment() == share, 10, "ours gives the Java one its share")
            retried: set[str] = set()
            sent = set(send(cluster, topic, 400, retried=retried))
            ours: list[str] = []

            def everything_read() -> bool:
                ours.extend(m.msg_id for m in c.poll(64, 0.2) if m.msg_id in sent)
                return set(ours) | {m["uniqKey"] for m in read_lines(out)} >= sent

            wait_for(everything_read, 60, "the two members to read every message")
            # a copy read twice would come soon after: a short settle on our side
            settle = time.monotonic() + 2.0
            while time.monotonic() < settle:
                ours.extend(m.msg_id for m in c.poll(64, 0.2) if m.msg_id in sent)
        finally:
            stop.touch()
            peer.join(80)
    assert not errors, errors
    theirs = [m["uniqKey"] for m in java]
    assert ours and theirs
    got = Counter(ours + theirs)
    assert set(got) == sent
    assert {i for i, v in got.items() if v > 1} <= retried, "each message read by one member"
    assert {(m["brokerName"], m["queueId"]) for m in java}.isdisjoint(share)
