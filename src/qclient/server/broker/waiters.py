"""Long polls waiting for fired messages, woken by the store's firing thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping

__all__ = ["FireWaiters"]


def _release(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class FireWaiters:
    """Pulls waiting for the next messages fired in a topic.

    A pull reads :attr:`seq` before it reads the store and, if it found nothing, calls
    :meth:`wait` with it. The firing thread calls :meth:`fired` after it made messages
    pullable. A wake-up crosses threads (a write to the event loop's self-pipe and a loop
    iteration) only when a pull waits on one of the fired topics: at a steady due rate
    most pulls find messages at once, and the firing thread fires every millisecond.
    ``seq`` closes the race with a pull that read just before the messages became
    pullable and registers just after the firing thread looked: the firing thread bumps
    ``seq`` before it looks, the pull registers before it compares ``seq``, so one of the
    two always sees the other.

    A holding pull that already has messages (its reader keeps each until its time, and
    the pull is answered once the earliest is due soon, by its own timer) waits with
    ``earlier_than``, that earliest deliver time: only a fire of something due before it
    can change the answer, so only that wakes it. Messages fired ahead of their time at a
    steady rate then wake nobody.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        # topic -> waiting future -> its ``earlier_than`` (None: any fire wakes it)
        self._waiting: dict[str, dict[asyncio.Future[None], int | None]] = {}
        #: bumped (by the firing thread) each time messages become pullable
        self.seq = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake-ups go to ``loop`` (called on its thread)."""
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def fired(self, topics: Mapping[str, int]) -> None:
        """Messages of ``topics`` (topic -> the earliest deliver time, ms, among them)
        are pullable now (any thread)."""
        self.seq += 1
        loop = self._loop
        if loop is None:
            return
        for topic in topics:
            if self._waiting.get(topic):
                if threading.get_ident() == self._loop_thread:  # fired on the loop
                    self._wake(topics)
                    return
                with contextlib.suppress(RuntimeError):  # the loop is closed: stopping
                    loop.call_soon_threadsafe(self._wake, topics)
                return

    def _wake(self, topics: Mapping[str, int]) -> None:
        for topic, earliest in topics.items():
            waiting = self._waiting.get(topic)
            if not waiting:
                continue
            # released ones leave at once: later fires need not look at them again
            woken = [f for f, lim in waiting.items() if lim is None or earliest < lim]
            for fut in woken:
                del waiting[fut]
                _release(fut)

    def wake(self, topic: str) -> None:
        """End the waits on ``topic`` now (event loop thread): each pull looks again."""
        for fut in self._waiting.pop(topic, {}):
            _release(fut)

    async def wait(
        self, topic: str, timeout: float, seq: int, earlier_than: int | None = None
    ) -> None:
        """Return once something fires in ``topic`` after ``seq`` was read (at once if
        something did already; with ``earlier_than``, only something due before that,
        ms), or after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiting.setdefault(topic, {})[fut] = earlier_than
        try:
            if self.seq != seq or timeout <= 0:
                return
            timer = loop.call_later(timeout, _release, fut)
            try:
                await fut
            finally:
                timer.cancel()
        finally:
            waiting = self._waiting.get(topic, {})
            waiting.pop(fut, None)
            if not waiting:
                self._waiting.pop(topic, None)
