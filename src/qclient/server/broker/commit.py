"""The broker's group commit: the send requests of one event-loop iteration share one
write and one fdatasync, and a lone request skips the thread hand-off.

Every send handler that runs in the same loop iteration queues its messages in the store
(``submit(defer=True)``); one callback scheduled for the next iteration then commits them
as one group. A lone small request (no other send in this group or still being committed)
commits on the loop thread: handing it to the store's committer thread and getting the
answer back costs more (futex wake-ups, GIL hand-offs, a thread-safe callback) than its
write, and the fdatasync releases the GIL anyway. When the caller knows that no other
request is waiting to be handled in this iteration (:meth:`LoopCommitter.store_now`),
it commits at once, inside the handler: no callback, no futures, two loop iterations
fewer. Anything
else goes to the committer thread, so that under concurrency the loop keeps parsing and
queueing the next requests while the disk syncs, and those form the next group.
Durability is the store's: a future completes only after its group's fdatasync.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from ..store import DelayStore, NewMessage, StoreResult

__all__ = ["INLINE_MAX_MESSAGES", "LoopCommitter"]

#: a lone request of at most this many messages commits on the loop thread (see the
#: module doc; measured in docs/DECISIONS.md)
INLINE_MAX_MESSAGES = 64

_Done = Future[list[StoreResult]]
_Waiter = asyncio.Future[list[StoreResult]]


class LoopCommitter:
    """Collects the submits of one loop iteration and commits them as one group."""

    def __init__(
        self,
        store: DelayStore,
        loop: asyncio.AbstractEventLoop,
        inline_max_messages: int = INLINE_MAX_MESSAGES,
    ) -> None:
        self._store = store
        self._loop = loop
        self._inline_max = inline_max_messages
        self._waiting: list[tuple[_Done, _Waiter]] = []
        self._messages = 0
        self._on_thread = 0  # requests handed to the committer thread, not yet answered

    def store_now(
        self,
        msgs: list[NewMessage],
        topics: Iterable[str] | None = None,
        refuse_after_ms: int | None = None,
    ) -> list[StoreResult] | None:
        """For a caller that knows no other request waits to be handled in this loop
        iteration: a small submit with no group forming is committed at once and its
        results returned; None: not now, :meth:`submit` it. Raises what
        ``DelayStore.store_now`` raises."""
        if self._waiting or self._on_thread or len(msgs) > self._inline_max:
            return None
        return self._store.store_now(
            msgs, validated=True, topics=topics, refuse_after_ms=refuse_after_ms
        )

    def submit(
        self,
        msgs: list[NewMessage],
        topics: Iterable[str] | None = None,
        refuse_after_ms: int | None = None,
    ) -> _Waiter:
        """Queue validated messages (see ``DelayStore.submit``); the future completes when
        they are durable. Raises what ``DelayStore.submit`` raises."""
        done = self._store.submit(
            msgs, validated=True, topics=topics, defer=True, refuse_after_ms=refuse_after_ms
        )
        fut: _Waiter = self._loop.create_future()
        if done.done():  # nothing to write (every message a duplicate)
            _copy(done, fut)
            return fut
        if not self._waiting:
            self._loop.call_soon(self._flush)
        self._waiting.append((done, fut))
        self._messages += len(msgs)
        return fut

    def _flush(self) -> None:
        waiting, self._waiting = self._waiting, []
        messages, self._messages = self._messages, 0
        if len(waiting) == 1 and messages <= self._inline_max and not self._on_thread:
            self._store.commit_pending()
        else:
            self._store.wake_committer()
        for done, fut in waiting:
            if done.done():
                _copy(done, fut)
            else:
                self._on_thread += 1
                done.add_done_callback(self._from_thread(fut))

    def _from_thread(self, fut: _Waiter) -> Callable[[_Done], None]:
        loop = self._loop

        def answer(done: _Done) -> None:
            self._on_thread -= 1
            _copy(done, fut)

        def callback(done: _Done) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(answer, done)

        return callback


def _copy(done: _Done, fut: _Waiter) -> None:
    if fut.done():
        return
    exc = done.exception()
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(done.result())
