"""A message is never due, nor received, before the sender's own clock says its time,
whatever fraction of a millisecond its delay or the moment it was accepted falls on."""

from __future__ import annotations

import random
import time

from qclient import Consumer, LocalCluster, Producer

from .helpers import wait_until


def test_nothing_due_or_received_before_the_senders_clock(shared_cluster: LocalCluster) -> None:
    topic = "due-time"
    rng = random.Random(7)
    asked: dict[str, tuple[int, int]] = {}  # msg_id -> (sent_before_ns, delay_ns)
    with Producer(shared_cluster.namesrv) as p:
        for i in range(60):
            delay = rng.uniform(0.05, 0.3)  # fractions of a ms: rounding must go later
            before = time.time_ns()
            r = p.send_delayed(topic, b"x", delay=delay, msg_id=f"due-{i}")
            asked[r.msg_id] = (before, int(delay * 1e9))
    late: dict[str, float] = {}
    with Consumer(shared_cluster.namesrv, topic, "due-time") as c:

        def all_received() -> bool:
            for m in c.poll(max_messages=64, timeout=0.2):
                now = time.time_ns()
                before, delay_ns = asked[m.msg_id]
                assert m.deliver_at_ms * 1_000_000 >= before + delay_ns, m
                late[m.msg_id] = (now - before - delay_ns) / 1e6
            return len(late) == len(asked)

        wait_until(all_received, 20, "every message")
    assert min(late.values()) >= 0, sorted(late.items(), key=lambda kv: kv[1])[:3]
