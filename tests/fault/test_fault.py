"""The latency table, the fault table, the three selection tiers, the counters, the detector."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest
from tests.producer.conftest import route

from qclient.fault import (
    ContextIndex,
    Detector,
    LatencyFaultTolerance,
    MQFaultStrategy,
    ThreadLocalIndex,
)
from qclient.fault.index import POSITIVE_MASK
from qclient.routing import TopicPublishInfo


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(enable: bool = True, detector: bool = True) -> tuple[MQFaultStrategy, Clock]:
    clock = Clock()
    s = MQFaultStrategy(
        send_latency_fault_enable=enable,
        start_detector_enable=detector,
        fault_tolerance=LatencyFaultTolerance(timer=clock),
    )
    return s, clock


def info(queues: int = 4) -> TopicPublishInfo:
    return TopicPublishInfo.from_route("t", route("t", queues=queues), index=ThreadLocalIndex())


@pytest.mark.parametrize(
    ("latency", "isolation_ms"),
    [
        (0, 0),
        (49, 0),
        (50, 0),
        (99, 0),
        (100, 0),
        (549, 0),
        (550, 2000),
        (1799, 2000),
        (1800, 5000),
        (2999, 5000),
        (3000, 6000),
        (4999, 6000),
        (5000, 10000),
        (10000, 10000),
        (14999, 10000),
        (15000, 30000),
        (60000, 30000),
    ],
)
def test_latency_table(latency: int, isolation_ms: int) -> None:
    s, _ = make()
    assert s.compute_not_available_duration(latency) == isolation_ms


def test_isolating_failure_is_looked_up_as_10s() -> None:
    s, clock = make()
    s.update_fault_item("a", 3, isolation=True, reachable=False)
    item = s.latency_fault_tolerance.get("a")
    assert item is not None
    assert item.start_timestamp == pytest.approx(clock.now + 10.0)
    assert not s.latency_fault_tolerance.is_available("a")
    clock.now += 10.0
    assert s.latency_fault_tolerance.is_available("a")


def test_isolation_never_shortened_by_a_slow_answer_but_ended_by_a_fast_one() -> None:
    s, clock = make()
    s.update_fault_item("a", 3, isolation=True, reachable=False)  # 10 s
    s.update_fault_item("a", 600, isolation=False, reachable=True)  # 2 s: not shorter
    assert s.latency_fault_tolerance.get("a").start_timestamp == pytest.approx(clock.now + 10)
    s.update_fault_item("a", 5, isolation=False, reachable=True)  # a fast answer
    assert s.latency_fault_tolerance.is_available("a")


def test_disabled_fault_tolerance_records_nothing() -> None:
    s, _ = make(enable=False)
    s.update_fault_item("a", 20000, isolation=True, reachable=False)
    assert s.latency_fault_tolerance.items() == []


def test_selection_tiers() -> None:
    s, _clock = make()
    inf = info()
    # everything healthy: round robin over all 8 queues
    assert {s.select_one_message_queue(inf).broker_name for _ in range(8)} == {
        "broker-a",
        "broker-b",
    }
    # tier 1: avoid the unavailable broker and the one that just failed
    s.update_fault_item("broker-a", 5, isolation=True, reachable=True)
    assert {s.select_one_message_queue(inf).broker_name for _ in range(20)} == {"broker-b"}
    assert {s.select_one_message_queue(inf, "broker-b").broker_name for _ in range(8)} == {
        "broker-a"
    }  # tier 2: a is isolated but reachable
    # tier 2 filters unreachable brokers
    s.update_fault_item("broker-a", 5, isolation=True, reachable=False)
    s.update_fault_item("broker-b", 5, isolation=True, reachable=True)
    picks = {s.select_one_message_queue(inf).broker_name for _ in range(20)}
    assert picks == {"broker-b"}
    # tier 3: nothing passes either filter -> any broker but the one that just failed:
    # a's flags are older news than b's failure (RocketMQ's tier 3 may pick b again, and a
    # hung b then costs the send a second attempt share)
    s.update_fault_item("broker-b", 5, isolation=True, reachable=False)
    picks = {s.select_one_message_queue(inf, "broker-b").broker_name for _ in range(20)}
    assert picks == {"broker-a"}
    # a send that failed on every broker: the table ranks them, the one that just failed
    # only when no other ranks as well (a hung b is not retried while a answers others)
    s.update_fault_item("broker-a", 5, isolation=False, reachable=True)  # another call's answer
    failed = ("broker-b", "broker-a")
    picks = {
        s.select_one_message_queue(inf, "broker-a", failed=failed).broker_name for _ in range(20)
    }
    assert picks == {"broker-a"}
    s.update_fault_item("broker-a", 5, isolation=True, reachable=False)  # both flagged alike
    picks = {
        s.select_one_message_queue(inf, "broker-a", failed=failed).broker_name for _ in range(20)
    }
    assert picks == {"broker-b"}
    # tier 4: every broker flagged and no last one -> any queue
    assert {s.select_one_message_queue(inf).broker_name for _ in range(20)} == {
        "broker-a",
        "broker-b",
    }


def test_selection_without_fault_tolerance_avoids_only_the_last_broker() -> None:
    s, _ = make(enable=False)
    inf = info()
    assert {s.select_one_message_queue(inf, "broker-a").broker_name for _ in range(20)} == {
        "broker-b"
    }
    single = TopicPublishInfo.from_route("t", route("t", {"only": "h:1"}), index=ThreadLocalIndex())
    assert s.select_one_message_queue(single, "only").broker_name == "only"


def test_isolated_brokers_share_spreads_evenly() -> None:
    """apache/rocketmq#5672: the queue after a filtered one must not get its share."""
    s, _ = make()
    inf = info()
    s.update_fault_item("broker-a", 5, isolation=True, reachable=False)
    counts = collections.Counter(s.select_one_message_queue(inf) for _ in range(4000))
    assert {q.broker_name for q in counts} == {"broker-b"}
    assert max(counts.values()) - min(counts.values()) <= 1


def test_even_load_one_thread() -> None:
    s, _ = make()
    inf = info()
    counts = collections.Counter(s.select_one_message_queue(inf) for _ in range(8000))
    assert len(counts) == 8
    assert all(abs(c - 1000) <= 100 for c in counts.values())


def test_thread_local_index() -> None:
    idx = ThreadLocalIndex()
    first = idx.increment_and_get()
    assert 0 <= first <= POSITIVE_MASK
    assert idx.increment_and_get() == (first + 1) & POSITIVE_MASK
    idx._local.value = POSITIVE_MASK  # masked increment wraps instead of going negative
    assert idx.increment_and_get() == 0
    other: list[int] = []
    t = threading.Thread(target=lambda: other.extend(idx.increment_and_get() for _ in range(3)))
    t.start()
    t.join()
    assert other[1] == other[0] + 1 and other[2] == other[0] + 2
    assert idx.increment_and_get() == 1  # this thread's counter is untouched by the other
    seen = set()
    for _ in range(20):
        idx.reset()
        seen.add(idx.increment_and_get())
    assert len(seen) > 15  # reset re-randomises


def test_context_index_tasks_have_their_own_counters() -> None:
    idx = ContextIndex()

    async def task() -> list[int]:
        out = [idx.increment_and_get()]
        await asyncio.sleep(0)
        out.append(idx.increment_and_get())
        await asyncio.sleep(0)
        out.append(idx.increment_and_get())
        return out

    async def main() -> list[list[int]]:
        idx.increment_and_get()  # the parent's counter must not be inherited by children
        return await asyncio.gather(*(task() for _ in range(50)))

    runs = asyncio.run(main())
    for r in runs:
        assert r[1] == (r[0] + 1) & POSITIVE_MASK and r[2] == (r[0] + 2) & POSITIVE_MASK
    assert len({r[0] for r in runs}) > 40  # not all starting from one shared counter


def test_detector_round_rules() -> None:
    s, clock = make()
    lft = s.latency_fault_tolerance
    s.update_fault_item("a", 5, isolation=True, reachable=False)
    s.update_fault_item("b", 5, isolation=False, reachable=True)  # healthy: never probed
    s.update_fault_item("gone", 5, isolation=True, reachable=False)
    answers = {"h:a": False}
    probed: list[str] = []

    def probe(addr: str, timeout: float) -> bool:
        probed.append(addr)
        return answers[addr]

    resolve = {"a": "h:a", "b": "h:b"}.get
    # a failing probe: unreachable, kept isolated past its time until a probe can clear it
    clock.now += 9.99
    assert lft.detect_round(resolve, probe, interval=2.0, timeout=0.2) == 1
    assert probed == ["h:a"]
    assert lft.get("gone") is None  # left the route
    a = lft.get("a")
    assert a is not None and not a.reachable
    clock.now += 0.5  # past the original 10 s isolation
    assert not lft.is_available("a")
    # not probed again before its check stamp
    assert lft.detect_round(resolve, probe, interval=2.0, timeout=0.2) == 0
    # the broker answers again: reachable, isolation over
    clock.now += 2.0
    answers["h:a"] = True
    assert lft.detect_round(resolve, probe, interval=2.0, timeout=0.2) == 1
    assert a.reachable and lft.is_available("a")
    # a reachable broker that starts failing probes is marked unreachable (PR #11146)
    s.update_fault_item("a", 5, isolation=True, reachable=True)
    clock.now += 2.0
    answers["h:a"] = False
    lft.detect_round(resolve, probe, interval=2.0, timeout=0.2)
    assert not a.reachable


def test_detector_toggle_at_runtime() -> None:
    s, _ = make(detector=False)
    s.update_fault_item("a", 5, isolation=True, reachable=False)
    probes: list[str] = []
    d = Detector(
        s,
        {"a": "h:a"}.get,
        lambda addr, t: probes.append(addr) or True,
        interval=0.05,
        timeout=0.01,
    )
    assert d.run_once() == 0 and probes == []
    s.start_detector_enable = True
    assert d.run_once() == 1 and probes == ["h:a"]
    assert s.latency_fault_tolerance.is_available("a")


def test_detector_thread_runs_and_stops() -> None:
    s, _clock = make()
    s.update_fault_item("a", 5, isolation=True, reachable=False)
    done = threading.Event()

    def probe(addr: str, timeout: float) -> bool:
        done.set()
        return True

    d = Detector(s, {"a": "h:a"}.get, probe, interval=0.05, timeout=0.01)
    d.start()
    try:
        assert done.wait(5.0)
    finally:
        d.stop()
    assert not d.is_alive()


def test_a_fault_policy_is_one_class_given_to_the_producer() -> None:
    """A custom policy sees every attempt's outcome and alone decides the fault table."""
    from qclient import Producer
    from qclient.fault import FaultPolicy, Outcome

    seen: list[tuple[str, Outcome]] = []

    class NeverIsolate(FaultPolicy):
        def apply(self, strategy, broker, latency_ms, outcome):  # type: ignore[no-untyped-def]
            seen.append((broker, outcome))
            strategy.update_fault_item(broker, latency_ms, False, True)

    with Producer("127.0.0.1:1", start_detector_enable=False, fault_policy=NeverIsolate()) as p:
        p._core.record("broker-a", 20.0, Outcome.TRANSPORT)
        assert seen == [("broker-a", Outcome.TRANSPORT)]
        (item,) = p.fault_items()
        assert item.available  # the default policy isolates a transport failure for 10 s


def test_the_default_policy_isolates_a_transport_failure() -> None:
    from qclient import Producer
    from qclient.fault import Outcome

    with Producer("127.0.0.1:1", start_detector_enable=False) as p:
        p._core.record("broker-a", 20.0, Outcome.TRANSPORT)
        (item,) = p.fault_items()
        assert not item.available
