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
fewer. A send answered by a direct handler (parsed outside any task) hands its messages
over with a callback (:meth:`LoopCommitter.store_soon`) and the end-of-iteration commit
decides: the only request of its iteration is stored in one pass (``store_now``), no
future made. Anything
else goes to the committer thread, so that under concurrency the loop keeps parsing and
queueing the next requests while the disk syncs, and those form the next group.
Durability is the store's: a future completes only after its group's fdatasync.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from functools import partial

from ..store import DelayStore, NewMessage, StoreResult
from ..store.record import WireFields

__all__ = ["INLINE_MAX_MESSAGES", "LoopCommitter", "Outcome"]

#: a lone request of at most this many messages commits on the loop thread (see the
#: module doc; measured in docs/decisions/0006-broker-group-commit-on-the-loop.md)
INLINE_MAX_MESSAGES = 64

_Done = Future[list[StoreResult]]
_Waiter = asyncio.Future[list[StoreResult]]
#: what a direct send gets once its messages are durable: the results, or the error
Outcome = list[StoreResult] | BaseException
#: messages to store: NewMessages, or messages with their deliver times (see
#: ``DelayStore.submit``'s ``deliver_ats``)
_Messages = Sequence[NewMessage] | Sequence[WireFields]
_Later = tuple[
    _Messages, Iterable[str] | None, int | None, Callable[[Outcome], None], list[int] | None
]


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
        # submits of this iteration, each with what hands its outcome over (on the loop)
        self._waiting: list[tuple[_Done, Callable[[_Done], None]]] = []
        self._later: list[_Later] = []  # store_soon()s of this iteration, not submitted yet
        self._messages = 0
        self._on_thread = 0  # requests handed to the committer thread, not yet answered

    def store_now(
        self,
        msgs: _Messages,
        topics: Iterable[str] | None = None,
        refuse_after_ms: int | None = None,
        deliver_ats: list[int] | None = None,
    ) -> list[StoreResult] | None:
        """For a caller that knows no other request waits to be handled in this loop
        iteration: a small submit with no group forming is committed at once and its
        results returned; None: not now, :meth:`submit` it. Raises what
        ``DelayStore.store_now`` raises."""
        if not self._alone(len(msgs)):
            return None
        return self._store_now(msgs, topics, refuse_after_ms, deliver_ats)

    def submit(
        self,
        msgs: _Messages,
        topics: Iterable[str] | None = None,
        refuse_after_ms: int | None = None,
        deliver_ats: list[int] | None = None,
    ) -> _Waiter:
        """Queue validated messages (see ``DelayStore.submit``); the future completes when
        they are durable. Raises what ``DelayStore.submit`` raises."""
        done = self._submit_deferred(msgs, topics, refuse_after_ms, deliver_ats)
        fut: _Waiter = self._loop.create_future()
        if done.done():  # nothing to write (every message a duplicate)
            _copy(fut, done)
            return fut
        if not self._waiting and not self._later:
            self._loop.call_soon(self._flush)
        self._waiting.append((done, partial(_copy, fut)))
        self._messages += len(msgs)
        return fut

    def store_soon(
        self,
        msgs: _Messages,
        topics: Iterable[str] | None,
        refuse_after_ms: int | None,
        done: Callable[[Outcome], None],
        deliver_ats: list[int] | None = None,
    ) -> None:
        """Commit validated messages with the other sends of this loop iteration; then
        ``done(results)``, or ``done(error)`` with what ``DelayStore.submit`` or the
        group commit raised -- on the loop thread, never before this returns."""
        if not self._waiting and not self._later:
            self._loop.call_soon(self._flush)
        self._later.append((msgs, topics, refuse_after_ms, done, deliver_ats))
        self._messages += len(msgs)

    def _alone(self, messages: int) -> bool:
        """No other send is queued in this iteration or on the committer thread, and
        ``messages`` is few enough to commit on the loop thread."""
        return (
            not self._waiting
            and not self._later
            and not self._on_thread
            and messages <= self._inline_max
        )

    def _store_now(
        self,
        msgs: _Messages,
        topics: Iterable[str] | None,
        refuse_after_ms: int | None,
        deliver_ats: list[int] | None,
    ) -> list[StoreResult]:
        return self._store.store_now(
            msgs,
            validated=True,
            topics=topics,
            refuse_after_ms=refuse_after_ms,
            deliver_ats=deliver_ats,
        )

    def _submit_deferred(
        self,
        msgs: _Messages,
        topics: Iterable[str] | None,
        refuse_after_ms: int | None,
        deliver_ats: list[int] | None,
    ) -> _Done:
        return self._store.submit(
            msgs,
            validated=True,
            topics=topics,
            defer=True,
            refuse_after_ms=refuse_after_ms,
            deliver_ats=deliver_ats,
        )

    def _flush(self) -> None:
        later, self._later = self._later, []
        waiting, self._waiting = self._waiting, []
        messages, self._messages = self._messages, 0
        if len(later) == 1 and not waiting and self._alone(messages):
            # the only send of its iteration: stored in one pass, on this thread
            msgs, topics, refuse_after, answer, ats = later[0]
            outcome: Outcome
            try:
                outcome = self._store_now(msgs, topics, refuse_after, ats)
            except Exception as exc:
                outcome = exc
            answer(outcome)
            return
        for msgs, topics, refuse_after, answer, ats in later:
            try:
                submitted = self._submit_deferred(msgs, topics, refuse_after, ats)
            except Exception as exc:
                answer(exc)
                continue
            waiting.append((submitted, partial(_deliver, answer)))
        if not waiting:
            return
        if len(waiting) == 1 and self._alone(messages):
            self._store.commit_pending()
        else:
            self._store.wake_committer()
        for done, hand_over in waiting:
            if done.done():
                hand_over(done)
            else:
                self._on_thread += 1
                done.add_done_callback(self._from_thread(hand_over))

    def _from_thread(self, hand_over: Callable[[_Done], None]) -> Callable[[_Done], None]:
        loop = self._loop

        def answer(done: _Done) -> None:
            self._on_thread -= 1
            hand_over(done)

        def callback(done: _Done) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(answer, done)

        return callback


def _copy(fut: _Waiter, done: _Done) -> None:
    if fut.done():
        return
    exc = done.exception()
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(done.result())


def _deliver(answer: Callable[[Outcome], None], done: _Done) -> None:
    exc = done.exception()
    answer(exc if exc is not None else done.result())
