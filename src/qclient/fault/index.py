"""Round-robin counters for queue selection: per thread, or per asyncio task."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
import threading

__all__ = ["POSITIVE_MASK", "ContextIndex", "ThreadLocalIndex"]

POSITIVE_MASK = 0x7FFFFFFF
_ids = itertools.count()


class ThreadLocalIndex:
    """RocketMQ's ``ThreadLocalIndex``: each thread has its own counter, random start."""

    __slots__ = ("_local",)

    def __init__(self) -> None:
        self._local = threading.local()

    def increment_and_get(self) -> int:
        local = self._local
        try:
            value = (local.value + 1) & POSITIVE_MASK
        except AttributeError:
            value = random.getrandbits(31)
        local.value = value
        return value

    def advance(self, n: int) -> int:
        """``n`` calls of ``increment_and_get`` at once (n >= 1): returns the first value;
        the i-th is ``(first + i) & POSITIVE_MASK``."""
        first = self.increment_and_get()
        self._local.value = (first + n - 1) & POSITIVE_MASK
        return first

    def reset(self) -> None:
        """Re-randomise this thread's counter (used on a retry)."""
        self._local.value = random.randrange(POSITIVE_MASK)


class ContextIndex:
    """Per-asyncio-task counter (a ``ContextVar``), so tasks do not share one thread's.

    A task inherits a copy of its parent's context; the owner check makes a task that
    merely inherited the parent's counter start its own, instead of every task of one
    ``gather`` picking the same next queue.
    """

    __slots__ = ("_var",)

    def __init__(self) -> None:
        self._var: contextvars.ContextVar[tuple[object, int] | None] = contextvars.ContextVar(
            f"qclient_queue_index_{next(_ids)}", default=None
        )

    @staticmethod
    def _owner() -> object:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        return task if task is not None else threading.current_thread()

    def increment_and_get(self) -> int:
        owner = self._owner()
        held = self._var.get()
        if held is None or held[0] is not owner:
            value = random.getrandbits(31)
        else:
            value = (held[1] + 1) & POSITIVE_MASK
        self._var.set((owner, value))
        return value

    def advance(self, n: int) -> int:
        """``n`` calls of ``increment_and_get`` at once (n >= 1): returns the first value."""
        first = self.increment_and_get()
        self._var.set((self._owner(), (first + n - 1) & POSITIVE_MASK))
        return first

    def reset(self) -> None:
        self._var.set((self._owner(), random.randrange(POSITIVE_MASK)))
