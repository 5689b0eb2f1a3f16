"""A message whose id the caller chose goes to the same broker every time, so that
broker's dedupe sees a re-send (retried Spark task, application replay)."""

from __future__ import annotations

import collections
import threading

from tests.producer.conftest import route

from qclient.fault import ThreadLocalIndex
from qclient.fault.strategy import id_order, id_owner
from qclient.routing import TopicPublishInfo

from .test_fault import info, make


def test_same_id_same_queue_every_time_and_from_every_thread() -> None:
    s, _ = make()
    inf = info()
    first = {f"id-{i}": s.select_for_id(inf, f"id-{i}") for i in range(200)}
    seen: list[bool] = []

    def again() -> None:
        seen.append(all(s.select_for_id(inf, k) == q for k, q in first.items()))

    threads = [threading.Thread(target=again) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [True] * 4


def test_ids_spread_over_brokers_and_queues() -> None:
    s, _ = make()
    inf = info()
    counts = collections.Counter(s.select_for_id(inf, f"order-{i}") for i in range(8000))
    assert len(counts) == len(inf.queues)
    share = 8000 / len(inf.queues)
    assert all(abs(n - share) < 0.15 * share for n in counts.values()), counts


def test_isolated_broker_is_skipped_and_only_its_ids_move() -> None:
    s, _ = make()
    inf = info()
    brokers = sorted({q.broker_name for q in inf.queues})
    before = {f"k{i}": s.select_for_id(inf, f"k{i}") for i in range(400)}
    s.update_fault_item(brokers[0], 0, isolation=True, reachable=False)
    after = {k: s.select_for_id(inf, k) for k in before}
    assert all(q.broker_name != brokers[0] for q in after.values())
    moved = [k for k in before if before[k] != after[k]]
    assert moved and all(before[k].broker_name == brokers[0] for k in moved)


def test_retry_goes_to_the_ids_next_broker() -> None:
    s, _ = make()
    inf = info()
    q1 = s.select_for_id(inf, "abc")
    q2 = s.select_for_id(inf, "abc", last_broker=q1.broker_name)
    assert q2.broker_name != q1.broker_name
    assert s.select_for_id(inf, "abc", last_broker=q1.broker_name) == q2


def test_fault_tolerance_off_still_pins() -> None:
    s, _ = make(enable=False)
    inf = info()
    assert len({s.select_for_id(inf, "same") for _ in range(50)}) == 1


def test_a_slow_but_reachable_broker_keeps_its_ids() -> None:
    s, _ = make()
    inf = info()
    before = {f"k{i}": s.select_for_id(inf, f"k{i}") for i in range(200)}
    for b in {q.broker_name for q in inf.queues}:
        s.update_fault_item(b, 2000, isolation=False, reachable=True)  # 5 s isolation
    assert {k: s.select_for_id(inf, k) for k in before} == before


def test_id_order_is_the_order_select_for_id_tries_brokers_in() -> None:
    s, _ = make()
    brokers = {f"broker-{c}": f"127.0.0.1:{10911 + i}" for i, c in enumerate("abc")}
    inf = TopicPublishInfo.from_route("t", route("t", brokers=brokers), index=ThreadLocalIndex())
    for i in range(200):
        order = id_order(f"id-{i}", brokers)
        assert order[0] == id_owner(f"id-{i}", brokers)
        assert s.select_for_id(inf, f"id-{i}").broker_name == order[0]
        # its own broker failed: the next one stands in
        assert s.select_for_id(inf, f"id-{i}", last_broker=order[0]).broker_name == order[1]
