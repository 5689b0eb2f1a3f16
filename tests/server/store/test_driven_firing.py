"""Firing driven by the store's owner (``firing_thread`` off): ``fire_due()`` fires what
is due and never earlier, says when to call again, is woken by a sooner entry, fires a
backlog in bounded steps and stops with the store."""

from __future__ import annotations

import threading

from tests.server.store.conftest import FakeClock, msg, visible

from qclient.server.store import firing


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
