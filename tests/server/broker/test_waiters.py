"""Long polls waiting for fired messages: woken across threads only when one waits, and
never left waiting for something that fired between its read and its wait."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from qclient.server.broker.waiters import FireWaiters

DEADLINE_S = 10.0  # a wake-up that does not come fails the test after this long


class CountingLoop:
    """Records the cross-thread wake-ups asked of it."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls.append((fn, args))


def test_a_fire_with_nobody_waiting_does_not_wake_the_loop() -> None:
    w = FireWaiters()
    loop = CountingLoop()
    w.bind(loop)  # type: ignore[arg-type]
    before = w.seq
    w.fired({"t": 0})
    assert loop.calls == []
    assert w.seq == before + 1


def test_a_fire_after_the_read_ends_the_wait_at_once() -> None:
    """The pull read nothing, then messages fired before it registered: it must not wait
    for the next fire (or its timeout)."""

    async def main() -> None:
        w = FireWaiters()
        w.bind(asyncio.get_running_loop())
        seq = w.seq  # read before the store read
        w.fired({"t": 0})  # the firing thread looked: nobody was waiting yet
        await asyncio.wait_for(w.wait("t", 3600, seq), DEADLINE_S)

    asyncio.run(main())


def test_the_firing_thread_wakes_a_waiting_pull() -> None:
    async def main() -> None:
        w = FireWaiters()
        loop = asyncio.get_running_loop()
        w.bind(loop)
        seq = w.seq
        waiting = asyncio.ensure_future(w.wait("t", 3600, seq))
        await asyncio.sleep(0)  # registered
        threading.Thread(target=w.fired, args=({"t": 0},)).start()
        await asyncio.wait_for(waiting, DEADLINE_S)
        assert w._waiting == {}  # nothing left behind

    asyncio.run(main())


def test_a_fire_in_another_topic_does_not_end_the_wait_and_a_timeout_does() -> None:
    async def main() -> None:
        w = FireWaiters()
        w.bind(asyncio.get_running_loop())
        waiting = asyncio.ensure_future(w.wait("t", 0.2, w.seq))
        await asyncio.sleep(0)
        w._wake({"other": 0})
        await asyncio.sleep(0)
        assert not waiting.done()
        await asyncio.wait_for(waiting, DEADLINE_S)  # the 0.2 s timeout
        assert w._waiting == {}

    asyncio.run(main())


def test_wake_answers_every_pull_waiting_on_the_topic() -> None:
    async def main() -> None:
        w = FireWaiters()
        w.bind(asyncio.get_running_loop())
        pulls = [asyncio.ensure_future(w.wait("t", 3600, w.seq)) for _ in range(3)]
        await asyncio.sleep(0)
        w.wake("t")
        await asyncio.wait_for(asyncio.gather(*pulls), DEADLINE_S)

    asyncio.run(main())


def test_a_holding_pull_wakes_only_for_something_due_before_what_it_has() -> None:
    """Fired ahead at a steady rate, later messages wake no holding pull that has
    messages already; one due before its earliest (a short delay, a backlog) does. A
    plain pull wakes for either."""

    async def main() -> None:
        w = FireWaiters()
        w.bind(asyncio.get_running_loop())
        holding = asyncio.ensure_future(w.wait("t", 3600, w.seq, earlier_than=1_000))
        plain = asyncio.ensure_future(w.wait("t", 3600, w.seq))
        await asyncio.sleep(0)
        w.fired({"t": 1_000})  # on the loop thread: woken in this call
        await asyncio.sleep(0)
        assert plain.done() and not holding.done()
        w.fired({"t": 999})
        await asyncio.wait_for(holding, DEADLINE_S)
        assert w._waiting == {}  # every registration gone

    asyncio.run(main())
