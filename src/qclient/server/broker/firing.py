"""Firing on the broker's event loop (the store's ``firing_thread`` off).

At a steady due rate the store fires every millisecond, and most of those milliseconds
a long poll is waiting for what fires. Fired on the loop, that poll is answered in the
same loop iteration; fired on a thread of its own, each millisecond also costs that
thread's wake-up, a cross-thread call to the loop and the GIL changing hands, which on
a small VM cost more CPU than the firing itself. A step's work is small (the due
records' reads and one consume-log write per queue; a backlog is fired in bounded
steps with the loop's other work in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

__all__ = ["LoopFiring"]

log = logging.getLogger(__name__)

_RETRY_S = 0.1  # after an unexpected error, fire again this much later


class _Store(Protocol):
    def fire_due(self) -> float | None: ...


class LoopFiring:
    """Calls ``store.fire_due()`` on the event loop at the times it asks for, and at
    once when :meth:`wake` says an entry due sooner arrived."""

    def __init__(self, store: _Store, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._woken = False  # a wake-up call is scheduled and has not run yet
        self._stopped = False

    def start(self) -> None:
        """Fire what is due now and from then on (event loop thread)."""
        self._run()

    def stop(self) -> None:
        """Fire nothing more (event loop thread)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def wake(self) -> None:
        """An entry due sooner than the earliest arrived (any thread; the store's lock
        may be held, so this only schedules the call)."""
        if self._woken or self._stopped:
            return
        self._woken = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: stopping
            self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        self._woken = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stopped:
            return
        try:
            delay = self._store.fire_due()
        except Exception:  # a bug must not silently stop all firing
            log.exception("firing error")
            delay = _RETRY_S
        if delay is None or self._stopped:
            return
        if delay <= 0:  # more due now: after the loop's other ready work
            self._timer = self._loop.call_at(self._loop.time(), self._run)
        else:
            # on the monotonic clock, not the loop's (uvloop's counts whole ms)
            self._timer = self._loop.call_at(time.monotonic() + delay, self._run)
