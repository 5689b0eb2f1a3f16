"""``SendFuture``: the ``concurrent.futures.Future`` that ``send_async`` returns.

A plain ``Future`` builds its own ``threading.Condition`` (a lock, a deque, bound
methods), which measured as the largest single cost of ``send_async`` per message. A
``SendFuture`` shares one condition with every future of its producer; ``result`` and
``exception`` wait in a loop, so a wake-up meant for another future is harmless.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures._base import (  # stable since 3.2; the states Future itself uses
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
)
from typing import Any

__all__ = ["SendFuture"]

_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class SendFuture(Future):
    """A ``concurrent.futures.Future[SendResult]`` on a shared condition."""

    def __init__(self, condition: threading.Condition) -> None:  # no super(): no Condition
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    def _wait(self, timeout: float | None) -> None:
        """Wait (holding the condition) until done or ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        while self._state not in _DONE:
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            self._condition.wait(remaining)

    def result(self, timeout: float | None = None) -> Any:
        with self._condition:
            self._wait(timeout)
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                raise CancelledError()
            if self._state != FINISHED:
                raise FutureTimeoutError()
            if self._exception is not None:
                raise self._exception
            return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        with self._condition:
            self._wait(timeout)
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                raise CancelledError()
            if self._state != FINISHED:
                raise FutureTimeoutError()
            return self._exception
