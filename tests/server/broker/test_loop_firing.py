"""Firing on the broker's event loop: due messages fire on the loop thread, never early,
and a long poll waiting for them is answered there without a cross-thread wake-up."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from qclient.server.broker.firing import LoopFiring, WallTimer
from qclient.server.broker.waiters import FireWaiters
from qclient.server.store import DelayStore, NewMessage, StoreConfig, wall_clock_ms

DEADLINE_S = 10.0  # a fire that does not come fails the test after this long


@pytest.mark.parametrize("wall_timer", [True, False], ids=["timerfd", "loop-timers"])
def test_fires_on_the_loop_and_answers_a_waiting_pull_there(
    tmp_path: Path, wall_timer: bool
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        cross: list[Any] = []  # what other threads asked of the loop
        plain = loop.call_soon_threadsafe

        def record(fn: Any, *args: Any) -> Any:
            cross.append(getattr(fn, "__qualname__", fn))
            return plain(fn, *args)

        loop.call_soon_threadsafe = record  # type: ignore[method-assign]
        cfg = StoreConfig(
            tmp_path / "data", bucket_ms=1000, load_ahead_ms=500, fsync=False, firing_thread=False
        )
        store = DelayStore(cfg)
        firing = LoopFiring(store, loop, wall_timer=wall_timer)
        store.set_fire_wake(firing.wake)
        await asyncio.to_thread(store.open)
        try:
            waiters = FireWaiters()
            waiters.bind(loop)
            fired_on: list[int] = []

            def listener(topics: set[str]) -> None:
                fired_on.append(threading.get_ident())
                waiters.fired(topics)

            store.add_fire_listener(listener)
            firing.start()
            waiting = asyncio.ensure_future(waiters.wait("t", 3600, waiters.seq))
            await asyncio.sleep(0)  # registered
            due = wall_clock_ms() + 30
            msgs = [NewMessage("t", 0, f"m{i}", b"x", due) for i in range(3)]
            await asyncio.to_thread(lambda: store.submit(msgs).result(DEADLINE_S))
            await asyncio.wait_for(waiting, DEADLINE_S)
            assert wall_clock_ms() >= due
            got = store.pull("t", 0, 0, 10)
            assert [m.msg_id for m in got] == ["m0", "m1", "m2"]
            assert all(m.fired_at_ms >= m.deliver_at_ms for m in got)
            assert fired_on and set(fired_on) == {threading.get_ident()}
            assert "FireWaiters._wake" not in cross
        finally:
            firing.stop()
            await asyncio.to_thread(store.close)

    asyncio.run(main())


def test_a_stopped_loop_firing_fires_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        cfg = StoreConfig(
            tmp_path / "data", bucket_ms=1000, load_ahead_ms=500, fsync=False, firing_thread=False
        )
        store = DelayStore(cfg)
        firing = LoopFiring(store, loop)
        store.set_fire_wake(firing.wake)
        await asyncio.to_thread(store.open)
        try:
            firing.start()
            firing.stop()
            now = wall_clock_ms()
            await asyncio.to_thread(
                lambda: store.submit([NewMessage("t", 0, "m0", b"x", now)]).result(DEADLINE_S)
            )
            await asyncio.sleep(0.05)  # a wake-up, had one been scheduled, has run
            assert store.max_offset("t", 0) == 0
            assert store.fire_due() is not None  # the store itself still fires when asked
            assert store.max_offset("t", 0) == 1
        finally:
            await asyncio.to_thread(store.close)

    asyncio.run(main())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_the_wall_timer_expires_at_its_time_and_disarms() -> None:
    timer = WallTimer.create()
    assert timer is not None
    try:
        at = time.time_ns() + 30_000_000
        timer.arm(at)
        assert not timer.expired()
        deadline = time.monotonic() + DEADLINE_S
        while not timer.expired():
            assert time.monotonic() < deadline, "the timer did not expire"
            time.sleep(0.005)
        assert time.time_ns() >= at
        timer.arm(time.time_ns() + 20_000_000)
        timer.arm(0)  # disarmed before it expires
        time.sleep(0.04)
        assert not timer.expired()
    finally:
        timer.close()
