"""Firing on the broker's event loop (the store's ``firing_thread`` off).

At a steady due rate the store fires every millisecond, and most of those milliseconds
a long poll is waiting for what fires. Fired on the loop, that poll is answered in the
same loop iteration; fired on a thread of its own, each millisecond also costs that
thread's wake-up, a cross-thread call to the loop and the GIL changing hands, which on
a small VM cost more CPU than the firing itself. A step's work is small (the due
records' reads and their consume-log copies, in memory and written every few ms; a
backlog is fired in bounded steps with the loop's other work in between).

The loop's own timers count whole milliseconds (uvloop's, and asyncio's epoll timeout),
so they fire ~0.5 ms into the due millisecond on average; on Linux a ``timerfd`` armed
at the due millisecond's wall-clock start wakes the loop ~0.1 ms into it instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import sys
import time
from typing import Protocol

__all__ = ["LoopFiring"]

log = logging.getLogger(__name__)

_RETRY_S = 0.1  # after an unexpected error, fire again this much later


class _Store(Protocol):
    def fire_due(self) -> float | None: ...


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


_CLOCK_REALTIME = 0
_TFD_TIMER_ABSTIME = 1


class WallTimer:
    """A Linux ``timerfd`` on the wall clock, armed at absolute times (ns resolution);
    readable once it expired."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.timerfd_create(_CLOCK_REALTIME, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd: int = fd
        # one spec, refilled at each arm: no ctypes objects built per millisecond
        self._spec = _ITimerSpec()
        self._spec_ref = ctypes.byref(self._spec)
        self._settime = self._libc.timerfd_settime

    @classmethod
    def create(cls) -> WallTimer | None:
        """A timer, or None where there is no timerfd (then use the loop's timers)."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls()
        except (OSError, AttributeError):  # no libc symbol, or refused
            return None

    def arm(self, at_ns: int) -> None:
        """Expire at ``at_ns`` (wall clock, ns since the epoch); 0 disarms."""
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(at_ns, 1_000_000_000)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, self._spec_ref, None):
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def expired(self) -> bool:
        """Consume the expiry; False if it was not (or no longer) expired."""
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class LoopFiring:
    """Calls ``store.fire_due()`` on the event loop at the times it asks for, and at
    once when :meth:`wake` says an entry due sooner arrived."""

    def __init__(
        self, store: _Store, loop: asyncio.AbstractEventLoop, *, wall_timer: bool = True
    ) -> None:
        self._store = store
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._wall = WallTimer.create() if wall_timer else None
        self._woken = False  # a wake-up call is scheduled and has not run yet
        self._stopped = False

    def start(self) -> None:
        """Fire what is due now and from then on (event loop thread)."""
        if self._wall is not None:
            self._loop.add_reader(self._wall.fd, self._on_wall_timer)
        self._run()

    def stop(self) -> None:
        """Fire nothing more (event loop thread)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._drop_wall()

    def _drop_wall(self) -> None:
        """Stop using the wall timer (the loop's timers serve from now on)."""
        if self._wall is not None:
            self._loop.remove_reader(self._wall.fd)
            self._wall.close()
            self._wall = None

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
        elif self._wall is None or not self._arm_wall(delay):
            # on the monotonic clock, not the loop's (uvloop's counts whole ms)
            self._timer = self._loop.call_at(time.monotonic() + delay, self._run)

    def _arm_wall(self, delay: float) -> bool:
        """Arm the wall timer ``delay`` seconds from now; False (and the loop's timers from
        now on) if the kernel refused."""
        assert self._wall is not None
        # the wait ends at a due millisecond's start (or is a cap): to the nearest ms, so
        # the few µs since it was computed do not move it past that start
        at_ms = round((time.time_ns() + delay * 1e9) / 1e6)
        try:
            self._wall.arm(at_ms * 1_000_000)
        except OSError:
            log.exception("timerfd failed; firing on the event loop's timers")
            self._drop_wall()
            return False
        return True

    def _on_wall_timer(self) -> None:
        if self._wall is not None and self._wall.expired():
            self._run()
