"""Natural batching of the hand-backs bound for one broker.

Concurrent ``retry_later`` / ``dead_letter`` calls (an application handing messages back
from several threads) to the same broker share send requests: the first caller sends
what is queued, the others wait; when its request is answered, the first one still
waiting sends the next batch. No linger: a lone call is sent at once, and a batch is
whatever queued while the previous request was out. A broker pays a request's cost once
for the batch (a one-message request costs it ~40 times a message of a batch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..protocol import wire

__all__ = ["Lane", "Outcome"]

#: messages and body bytes of one batch at most (one message whatever its size)
MAX_BATCH = 256
MAX_BATCH_BYTES = 4 << 20


class Outcome:
    """One copy's answer: the broker's result, or the error of its whole request, and
    how many copies that request carried."""

    __slots__ = ("batched", "done", "error", "lead", "message", "result")

    def __init__(self, message: wire.WireMessage) -> None:
        self.message = message
        self.done = threading.Event()
        self.result: wire.MessageResult | None = None
        self.error: BaseException | None = None
        self.batched = 1
        self.lead = False  # woken to send the next batch, not with an answer


class Lane:
    """The hand-backs to one broker; ``send(messages)`` makes one request and returns
    the results in order (or raises for the whole request)."""

    def __init__(self, send: Callable[[list[wire.WireMessage]], list[wire.MessageResult]]):
        self._send = send
        self._lock = threading.Lock()
        self._queue: list[Outcome] = []
        self._busy = False  # a request is out (or about to be): callers queue

    def call(self, message: wire.WireMessage) -> Outcome:
        """Send ``message`` (alone or with others queued meanwhile); its outcome."""
        mine = Outcome(message)
        with self._lock:
            self._queue.append(mine)
            lead = not self._busy
            self._busy = True
        if not lead:
            mine.done.wait()
            if not mine.lead:
                return mine
        # the queue's first: in the batch this call sends
        self._send_next()
        return mine

    def _send_next(self) -> None:
        with self._lock:
            batch: list[Outcome] = []
            size = 0
            for o in self._queue:
                n = len(o.message.body)
                if batch and (len(batch) >= MAX_BATCH or size + n > MAX_BATCH_BYTES):
                    break
                batch.append(o)
                size += n
            del self._queue[: len(batch)]
        try:
            results = self._send([o.message for o in batch])
            for o, r in zip(batch, results, strict=True):
                o.result = r
        except BaseException as exc:  # (every waiter raises it, none hangs)
            for o in batch:
                o.error = exc
        for o in batch:
            o.batched = len(batch)
        with self._lock:
            nxt = self._queue[0] if self._queue else None
            if nxt is None:
                self._busy = False
            else:
                nxt.lead = True
        for o in batch:
            o.done.set()
        if nxt is not None:
            nxt.done.set()
