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
    RUNNING,
)
from typing import Any

__all__ = ["SendFuture", "settle_many"]

_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
_OPEN = frozenset((PENDING, RUNNING))


class SendFuture(Future):
    """A ``concurrent.futures.Future[SendResult]`` on a shared condition."""

    def __init__(self, condition: threading.Condition) -> None:  # no super(): no Condition
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._w: list[Any] | None = None
        self._cb: list[Any] | None = None

    # Future's two lists, made on first use: most futures never get a waiter
    # (``concurrent.futures.wait``) or a done callback, and each list is one more object
    # for the cyclic collector to track while the caller holds the future.
    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        if self._w is None:
            self._w = []
        return self._w

    @property
    def _done_callbacks(self) -> list[Any]:
        if self._cb is None:
            self._cb = []
        return self._cb

    def _wait(self, timeout: float | None) -> None:
        """Wait (holding the condition) until done or ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        while self._state not in _DONE:
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            self._condition.wait(remaining)

    def done(self) -> bool:
        return self._state in _DONE  # one read of a field set under the condition

    def result(self, timeout: float | None = None) -> Any:
        if self._state == FINISHED:  # settled: the fields below no longer change
            if self._exception is not None:
                raise self._exception
            return self._result
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
        if self._state == FINISHED:
            return self._exception
        with self._condition:
            self._wait(timeout)
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                raise CancelledError()
            if self._state != FINISHED:
                raise FutureTimeoutError()
            return self._exception


def settle_many(condition: threading.Condition, futures: list[Any], results: list[Any]) -> None:
    """Complete ``futures`` (each with its result, or exception when the result is a
    ``BaseException``) under one acquisition of their shared ``condition`` and one
    ``notify_all``; a future already done (cancelled by its caller) is skipped.

    Same effects as ``set_result`` / ``set_exception`` per future (state, waiters of
    ``concurrent.futures.wait``, done callbacks outside the lock), at a fraction of the
    cost: those take and notify the condition once per future.
    """
    with_callbacks: list[Any] = []  # SendFutures: their private fields are used
    foreign: list[tuple[Future[Any], Any]] = []
    with condition:
        for fut, res in zip(futures, results, strict=True):
            if fut._condition is not condition:
                foreign.append((fut, res))  # not one of ours: the public way, below
                continue
            if fut._state not in _OPEN:
                continue
            if isinstance(res, BaseException):
                fut._exception = res
                fut._state = FINISHED
                if fut._w:
                    for waiter in fut._w:
                        waiter.add_exception(fut)
            else:
                fut._result = res
                fut._state = FINISHED
                if fut._w:
                    for waiter in fut._w:
                        waiter.add_result(fut)
            if fut._cb:
                with_callbacks.append(fut)
        condition.notify_all()
    for fut in with_callbacks:
        fut._invoke_callbacks()
    for fut, res in foreign:
        if fut.done():
            continue
        try:
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)
        except Exception:  # cancelled meanwhile (InvalidStateError)
            pass
