"""Coalescing of concurrent single sends: a group commit on the client side.

Each broker has ``IN_FLIGHT`` request slots. A send that finds a free slot leaves at once,
in the caller's own thread, as a one-message request: no linger, no hand-off to another
thread. A send that finds every slot busy queues; when a slot frees up, everything queued
for that broker (up to the batch limits) leaves together in one request, sent by one of the
waiting callers (leader/follower, as in a database's group commit), and the callers the
finished request answered are woken once that next request is written. Concurrent callers
so share requests, and the broker shares one fsync among them.

Every fault-tolerance rule holds as for a lone send, because a coalesced request is an
ordinary send plan (``ProducerCore.plan_send``): per-request latency into the fault table,
the per-attempt share of the budget (the batch gets its oldest member's deadline, so time
spent queued counts), retries on another broker, caller ids pinned to their broker. A batch
whose broker was isolated while it queued is re-routed instead of sent there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .._models import SendResult
from ..errors import ProducerClosedError, QClientError, SendTimeoutError
from ._core import ProducerCore
from ._plan import Item

__all__ = ["SyncCoalescer"]

log = logging.getLogger(__name__)

Result = SendResult | QClientError
#: sends a chunk of items (``one_chunk``: all for one broker, queues assigned) within a
#: deadline and returns their results; the callback is called once its first request is
#: written
Run = Callable[[list[Item], float, bool, Callable[[], None]], Any]

#: requests in flight per broker for coalesced sends (the producer's
#: ``max_in_flight_per_broker`` if lower). Fewer slots make bigger shared requests: with
#: 64 threads on one broker, 1 slot gave batches of ~30 and cost 57-69 µs of client CPU and
#: 42-52 µs of broker CPU a message, 4 slots batches of ~9 and 77-95 + 64-74 µs.
IN_FLIGHT = 1


class _Waiter:
    """One caller's message; once it queues, ``done`` is held until the caller may look at
    the outcome (a caller that sends at once never waits: it gets no lock)."""

    __slots__ = ("batch", "deadline", "done", "item", "result")

    done: threading.Lock

    def __init__(self, item: Item, deadline: float) -> None:
        self.item = item
        self.deadline = deadline
        self.result: Result | None = None
        self.batch: list[_Waiter] | None = None  # set when this caller must send a batch

    def hold(self) -> None:
        """Before it queues: ``done`` taken, for whoever answers it to release."""
        self.done = threading.Lock()
        self.done.acquire()


class SyncCoalescer:
    """Leader/follower coalescing of ``Producer``'s single sends (see the module doc)."""

    def __init__(self, core: ProducerCore, run: Run, limit: int) -> None:
        self._core = core
        self._run = run
        self._limit = min(limit, IN_FLIGHT)
        self._lock = threading.Lock()
        self._queues: dict[str, deque[_Waiter]] = {}
        self._in_flight: dict[str, int] = {}
        #: answered callers not woken yet: the next request's sender wakes them once that
        #: request is written (or fails to be), so the request leaves before they all
        #: compete with its sender for the GIL
        self._answered: list[_Waiter] = []

    def send(self, item: Item, deadline: float) -> Result:
        """Send one message whose queue is chosen; its result or typed error."""
        assert item.queue is not None
        broker = item.queue.broker_name
        with self._lock:
            queue = self._queues.get(broker)
            busy = self._in_flight.get(broker, 0)
            if busy < self._limit and not queue:
                self._in_flight[broker] = busy + 1
                me = None
            else:
                if queue is None:
                    queue = self._queues[broker] = deque()
                me = _Waiter(item, deadline)
                me.hold()
                queue.append(me)
        if me is None:  # a free slot: the request leaves at once, alone
            return self._lead(broker, [item], deadline, [])
        batch = self._follow(broker, me)
        if batch is None:
            assert me.result is not None
            return me.result
        # this caller sends the batch it was handed (it is the batch's first member)
        deadline = min(w.deadline for w in batch)
        return self._lead(broker, [w.item for w in batch], deadline, batch[1:])

    def _follow(self, broker: str, me: _Waiter) -> list[_Waiter] | None:
        """Wait until a leader answered ``me`` (None) or handed it a batch to send."""
        try:
            # every plan in flight ends within its own deadline, so this wait is bounded
            # by the oldest of them; the margin covers a leader's last bookkeeping
            if not me.done.acquire(timeout=max(0.0, me.deadline - time.monotonic()) + 1.0):
                with self._lock:
                    queued = self._unqueue(broker, me)
                if queued:
                    self._timed_out(me)
                    return None
                me.done.acquire()  # taken into a batch as the wait ended: it is answered soon
        except BaseException:
            self._abandon(broker, me)
            raise
        return me.batch

    @staticmethod
    def _timed_out(me: _Waiter) -> None:
        me.result = SendTimeoutError(
            f"message {me.item.wire.msg_id} found no free request slot within send_timeout"
        )

    def _unqueue(self, broker: str, me: _Waiter) -> bool:
        queue = self._queues.get(broker)
        if queue is not None and me in queue:
            queue.remove(me)
            return True
        return False

    def _abandon(self, broker: str, me: _Waiter) -> None:
        """The caller left while waiting (KeyboardInterrupt): never strand a batch on it."""
        with self._lock:
            if self._unqueue(broker, me):
                return
            batch = me.batch
            if batch is None:
                return  # a member of another leader's batch: that leader answers it
            rest = [w for w in batch if w is not me]
            if rest:
                rest[0].batch = rest
            else:
                self._in_flight[broker] -= 1
                nxt = self._next_batch(broker)
                rest = nxt or []
        if rest:
            rest[0].done.release()
        self._wake_answered()

    def _wake_answered(self) -> None:
        """Wake the answered callers left for this request's sender (see ``_answered``)."""
        if not self._answered:
            return
        with self._lock:
            answered, self._answered = self._answered, []
        for w in answered:
            w.done.release()

    def _lead(
        self, broker: str, items: list[Item], deadline: float, others: list[_Waiter]
    ) -> Result:
        """Send ``items`` in this thread (the caller's first, then those of ``others``),
        answer ``others``, pass the slot on; returns the caller's result."""
        for i, it in enumerate(items):
            it.index = i
        one_chunk = self._core.strategy.latency_fault_tolerance.is_available(broker)
        if not one_chunk:  # isolated while these waited: choose again, avoiding it
            for it in items:
                it.queue, it.last_broker = None, broker
        results: list[Any]
        error: BaseException | None = None
        try:
            results = self._run(items, deadline, one_chunk, self._wake_answered)
        except Exception as exc:  # a bug must still answer every caller
            log.exception("sending %d coalesced message(s) to %s failed", len(items), broker)
            results = [exc if isinstance(exc, QClientError) else _wrap(exc)] * len(items)
        except BaseException as exc:  # interrupted: answer the others, then re-raise
            error = exc
            results = [ProducerClosedError("the sending thread was interrupted")] * len(items)
        self._wake_answered()  # if the request was never written
        for w, r in zip(others, results[1:], strict=True):
            w.result = r
        answered = others
        with self._lock:
            self._in_flight[broker] -= 1
            nxt = self._next_batch(broker)
            if nxt and answered:  # woken by nxt's sender once its request is out
                self._answered.extend(answered)
                answered = []
        if nxt:
            nxt[0].done.release()
        for w in answered:
            w.done.release()
        if error is not None:
            raise error
        result: Result = results[0]
        return result

    def _next_batch(self, broker: str) -> list[_Waiter] | None:
        """With the lock held: the queued batch a free slot of ``broker`` sends next, its
        first member designated to send it; the slot is taken."""
        queue = self._queues.get(broker)
        if not queue or self._in_flight.get(broker, 0) >= self._limit:
            return None
        cfg = self._core.cfg
        batch: list[_Waiter] = []
        size = 0
        while queue and len(batch) < cfg.batch_max_messages:
            s = queue[0].item.size
            if batch and size + s > cfg.batch_max_bytes:
                break
            batch.append(queue.popleft())
            size += s
        self._in_flight[broker] = self._in_flight.get(broker, 0) + 1
        batch[0].batch = batch
        return batch


def _wrap(exc: Exception) -> QClientError:
    return QClientError(f"send failed: {type(exc).__name__}: {exc}")
