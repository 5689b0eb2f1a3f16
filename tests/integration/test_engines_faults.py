"""Faults on both engines, one test body each, against real processes: a broker killed
(SIGKILL) or hung (SIGSTOP) while a producer sends, and a group member killed while it
reads. Each engine's cluster (2 brokers) starts once for the module; a test restarts or
resumes what it broke before it ends, even when it fails.

A producer that retries after an attempt with no answer may leave a copy of a message on
the broker that did not answer (neither engine dedupes across brokers), so the checks are
"no acknowledged message lost" and "none received before its deliver time"; duplicates
are counted and printed, not asserted.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from qclient import Consumer, LocalCluster, Message, Producer, SendResult
from qclient.errors import QClientError

from .helpers import check_delivered, drain_ids, engine_topic, wait_until

# the [rocketmq] tests are in the jvm group (tests/_budget.py): one worker runs them one
# after another, so this module's RocketMQ cluster never runs beside another module's
pytestmark = [pytest.mark.timeout(300)]

ENGINES = ["qclient", "rocketmq"]
#: a group member in its own process (prints ``ready <id>``, then one line per poll)
MEMBER = Path(__file__).parents[1] / "consumer" / "_member.py"


@pytest.fixture(scope="module", params=ENGINES)
def cluster(request: pytest.FixtureRequest):
    with LocalCluster(brokers=2, engine=request.param) as c:
        yield c


def test_kill9_one_broker_while_sending(cluster):
    """A broker SIGKILLed while one thread sends 1,500 delayed messages (after ~500): at
    most 2 errors reach the caller, and every acknowledged message is delivered once the
    broker is back."""
    topic = engine_topic(cluster, "kill9")
    victim = cluster.brokers[0]
    acked: dict[str, SendResult] = {}
    errors: list[QClientError] = []
    done = [0]
    killed_at: list[int] = []
    t0 = time.monotonic()
    try:
        with Producer(cluster.namesrv) as p:

            def sender() -> None:
                for i in range(1500):
                    try:
                        r = p.send_delayed(topic, f"m{i}", delay=1.0)
                    except QClientError as exc:
                        errors.append(exc)
                    else:
                        acked[r.msg_id] = r
                    done[0] += 1

            th = threading.Thread(target=sender, name="kill9-sender")
            th.start()
            try:
                wait_until(lambda: done[0] >= 500 or not th.is_alive(), 120, "500 sends")
                killed_at.append(done[0])
                victim.kill()  # the sender goes on: its next send may be in flight now
            finally:
                th.join(180)
            assert not th.is_alive(), "the sender did not finish within 180 s"
        sent_s = time.monotonic() - t0
        by_broker = Counter(r.broker_name for r in acked.values())
        print(
            f"\n[{cluster.engine}] killed {victim.name} after {killed_at} sends; 1500 sends in "
            f"{sent_s:.1f} s; {len(errors)} errors {[repr(e) for e in errors[:2]]}; "
            f"acked per broker {dict(by_broker)}"
        )
        assert len(errors) <= 2, errors
        assert len(acked) >= 1498
    finally:
        if not victim.running:
            t1 = time.monotonic()
            victim.start()
            print(f"[{cluster.engine}] {victim.name} restarted in {time.monotonic() - t1:.1f} s")
    cluster.create_topic(topic, 4)  # waits until the name server routes it to both again
    got = drain_ids(cluster.namesrv, topic, "g-kill9", set(acked), timeout=90)
    check_delivered(got, acked)


def test_sigstop_one_broker_then_sigcont(cluster):
    """A broker SIGSTOPped while one thread sends: no call waits longer than one attempt's
    share of ``send_timeout`` (and a little); after SIGCONT sends reach it again; every
    acknowledged message is delivered."""
    topic = engine_topic(cluster, "pause")
    victim = cluster.brokers[0]
    send_timeout, retry_times, slack = 3.0, 2, 0.35
    share = send_timeout / (retry_times + 1)
    acked: dict[str, SendResult] = {}
    errors: list[QClientError] = []
    latencies: list[float] = []

    def send(p: Producer, body: str) -> SendResult | None:
        t = time.monotonic()
        try:
            r = p.send_delayed(topic, body, delay=1.0)
        except QClientError as exc:
            errors.append(exc)
            return None
        finally:
            latencies.append(time.monotonic() - t)
        acked[r.msg_id] = r
        return r

    # a route refresh every second: the qclient name server drops a broker silent for
    # 4 s, and the producer must see it routed again once it resumes
    with Producer(
        cluster.namesrv,
        send_timeout=send_timeout,
        retry_times=retry_times,
        route_refresh_interval=1.0,
    ) as p:
        for i in range(50):
            send(p, f"w{i}")
        assert not errors, errors
        latencies.clear()
        victim.pause()
        try:
            for i in range(300):
                send(p, f"m{i}")
        finally:
            victim.resume()
        resumed = time.monotonic()
        paused = sorted(latencies)
        # a call that met the hung broker waits one attempt's share there, then sends
        # elsewhere as any call does: its bound is the share, the slack, and the slowest
        # call that never waited on the hung broker (a loaded 2-core host stretches those
        # to a few hundred ms), at most half a share (two shares is what must not happen)
        normal = max((t for t in paused if t < share / 2), default=0.0)
        limit = share + slack + min(normal, share / 2)
        slow = sum(1 for t in paused if t >= share / 2)
        print(
            f"\n[{cluster.engine}] 300 sends with {victim.name} paused: max {paused[-1]:.3f} s "
            f"(limit {limit:.3f} s), slowest of the others {normal:.3f} s, median "
            f"{paused[len(paused) // 2]:.4f} s, {slow} over {share / 2:.2f} s, "
            f"{len(errors)} errors"
        )
        assert paused[-1] < limit, f"a call took {paused[-1]:.3f} s"
        assert not errors, errors[:3]

        def back_in_use() -> bool:
            r = send(p, "after")
            return r is not None and r.broker_name == victim.name

        wait_until(back_in_use, 30, f"a send acknowledged by {victim.name} after SIGCONT")
        back = time.monotonic() - resumed
        for i in range(20):
            send(p, f"a{i}")
        print(f"[{cluster.engine}] {victim.name} acknowledged a send {back:.2f} s after SIGCONT")
        assert not errors, errors[:3]
    got = drain_ids(cluster.namesrv, topic, "g-pause", set(acked), timeout=60)
    check_delivered(got, acked)


class _Member:
    """An in-process group member polling on a thread; ``got`` is every id it returned."""

    def __init__(self, namesrv: str, topic: str, group: str) -> None:
        self.consumer = Consumer(namesrv, topic, group)
        self.got: list[str] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="member", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.consumer.poll(64, timeout=0.2)
            except Exception as exc:  # reported by the test
                self.errors.append(exc)
                return
            self.got.extend(m.msg_id for m in batch)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def test_killed_member_queues_move_nothing_lost(cluster, tmp_path: Path):
    """A member (its own process) SIGKILLed while it reads: its queues move to the member
    left, and every message is read by one of the two (what the dead one printed counts
    as read)."""
    topic = engine_topic(cluster, "member")
    group = f"g-member-{cluster.engine}"
    out_path = tmp_path / "child.out"
    with out_path.open("w") as out:
        # a short session on the qclient engine: its brokers notice a silent member when
        # its lease runs out; RocketMQ's brokers when its connections close
        child = subprocess.Popen(
            [sys.executable, str(MEMBER), cluster.namesrv, topic, group, "1.5"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def child_batches() -> list[list[str]]:
        lines = out_path.read_text().splitlines()
        return [ln.split()[1:] for ln in lines if ln and not ln.startswith("ready")]

    def child_ids() -> Counter[str]:
        return Counter(i for batch in child_batches() for i in batch)

    member: _Member | None = None
    try:
        wait_until(
            lambda: out_path.read_text().startswith("ready") or child.poll() is not None,
            60,
            "the child member to start",
        )
        assert child.poll() is None, out_path.read_text()[-2000:]
        member = _Member(cluster.namesrv, topic, group)
        # 8 queues over the two: each holds 4 once the group settled
        wait_until(lambda: len(member.consumer.assignment()) == 4, 60, "the two to share 8 queues")
        with Producer(cluster.namesrv, send_timeout=15.0) as p:
            results = p.send_batch(
                [Message(topic, f"g{i}", delay=0.5 + 3.0 * i / 1500) for i in range(1500)]
            )
        sent = {r.msg_id for r in results}
        wait_until(lambda: sum(child_ids().values()) >= 100, 60, "the child to read 100")
        child.kill()
        child.wait(10)
        killed_at = time.monotonic()
        read_by_child = sum(child_ids().values())
        wait_until(lambda: len(member.consumer.assignment()) == 8, 30, "its queues to move")
        taken = time.monotonic() - killed_at

        def all_read() -> bool:
            return sent <= set(member.got) | set(child_ids())

        wait_until(all_read, 60, "every message read by one of the two")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if member is not None:
            member.stop()
    assert member is not None and not member.errors, member.errors if member else None
    got = Counter(member.got) + child_ids()
    dups = sum(n - 1 for n in got.values())
    print(
        f"\n[{cluster.engine}] killed member: {read_by_child} read by it, its queues moved "
        f"{taken:.2f} s after SIGKILL; {dups} read twice (returned to it, not yet committed)"
    )
    # how soon its queues moved is printed above, not asserted: a timing goal, which
    # benchmarks/rebalance_bench.py measures; the wait for them has a deadline
    assert not sent - set(got), f"lost {len(sent - set(got))} of {len(sent)}"
