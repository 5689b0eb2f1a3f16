"""Firing driven by the store's owner (``firing_thread`` off): ``fire_due()`` fires what
is due and never earlier, says when to call again, is woken by a sooner entry, fires a
backlog in bounded steps and stops with the store."""

from __future__ import annotations

import gc
import threading

import pytest
from tests.server.store.conftest import FakeClock, msg, visible, wait_until

from qclient.protocol.wire import MAX_FIRE_AHEAD_MS
from qclient.server.store import StoreConfig, firing


def test_fire_due_fires_at_the_due_ms_and_not_before(make_store) -> None:
    clock = FakeClock(5_000_000)
    s = make_store(clock=clock, firing_thread=False)
    assert not any(t.name == "store-firing" for t in threading.enumerate())
    s.submit([msg(0, clock.now + 20)]).result(10)
    wait = s.fire_due()
    assert wait is not None and wait > 0
    assert visible(s, "t") == 0
    clock.advance(19)
    s.fire_due()
    assert visible(s, "t") == 0, "fired before its millisecond"
    clock.advance(1)
    s.fire_due()
    assert visible(s, "t") == 1
    (m,) = s.pull("t", 0, 0, 10)
    assert m.fired_at_ms == m.deliver_at_ms == clock.now


def test_a_sooner_entry_calls_the_wake_and_a_backlog_fires_in_steps(make_store) -> None:
    clock = FakeClock(5_000_000)
    s = make_store(clock=clock, firing_thread=False)
    woken: list[None] = []
    s.set_fire_wake(lambda: woken.append(None))
    s.submit([msg(0, clock.now + 400)]).result(10)
    assert woken, "the first entry is the earliest"
    s.fire_due()
    woken.clear()
    s.submit([msg(1, clock.now + 500)]).result(10)
    assert not woken, "not sooner than the earliest"
    n = firing._DRIVEN_BATCH + 10
    s.submit([msg(i, clock.now + 100) for i in range(2, 2 + n)]).result(10)
    assert woken
    clock.advance(100)
    assert s.fire_due() == 0.0  # one step's worth fired, more is due now
    assert visible(s, "t") == firing._DRIVEN_BATCH
    wait = s.fire_due()
    assert wait is not None and wait > 0
    assert visible(s, "t") == n


def test_fire_due_answers_none_once_closed(make_store) -> None:
    s = make_store(firing_thread=False)
    s.close()
    assert s.fire_due() is None


def test_fired_messages_leave_nothing_for_the_cyclic_collector(make_store) -> None:
    """What firing keeps per message (records and index entries in memory until written
    or dropped) is bytes and ints: at 20k fired msgs/s, kept tuples filled the collector's
    older generations and their collections stalled the broker's loop for 10-20 ms."""
    clock = FakeClock(5_000_000)
    # the checkpoint (which writes the id index's fired entries out) not within the test
    s = make_store(clock=clock, firing_thread=False, checkpoint_interval_ms=600_000)
    n = 2000  # four due per ms, one per queue: a step per ms, an append per queue
    s.submit([msg(i, clock.now + 1 + i // 4) for i in range(n)]).result(10)
    clock.advance(1)
    s.fire_due()  # the queues' files and structures exist before counting
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(n // 4 - 1):
        clock.advance(1)
        s.fire_due()
    assert visible(s, "t") == n

    def grown() -> int:
        gc.collect()
        return len(gc.get_objects()) - before

    # the syncer lets go of each step's hand-off once it has written it
    wait_until(lambda: grown() < n // 20, timeout=10)


def test_fire_ahead_fires_that_early_and_no_earlier(make_store) -> None:
    clock = FakeClock(5_000_000)
    s = make_store(clock=clock, firing_thread=False, fire_ahead_ms=10)
    s.submit([msg(0, clock.now + 30)]).result(10)
    wait = s.fire_due()
    assert wait is not None and 0.015 <= wait <= 0.021  # until deliver_at - 10 ms
    clock.advance(19)
    s.fire_due()
    assert visible(s, "t") == 0, "fired before deliver_at - fire_ahead_ms"
    clock.advance(1)
    s.fire_due()
    (m,) = s.pull("t", 0, 0, 10)
    assert m.fired_at_ms == m.deliver_at_ms - 10 == clock.now
    # fired ahead of deliver_at is not late
    assert list(s._firing.lateness) == [0]


@pytest.mark.parametrize("ahead", [-1, MAX_FIRE_AHEAD_MS + 1])
def test_fire_ahead_out_of_range_is_refused(tmp_path, ahead: int) -> None:
    with pytest.raises(ValueError, match="fire_ahead_ms"):
        StoreConfig(tmp_path, fire_ahead_ms=ahead)
