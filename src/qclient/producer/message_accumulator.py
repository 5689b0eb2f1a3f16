"""The accumulator of ``send_async``: per-broker batches with linger, size limits and a
bound on buffered messages (aiokafka's ``message_accumulator`` shape)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from .._config import ProducerConfig
from .._models import SendResult
from ..errors import BufferFullError, ProducerClosedError, SendTimeoutError
from ._plan import Item

__all__ = ["MessageAccumulator", "ProducerBatch"]


@dataclass(eq=False)
class ProducerBatch:
    """Messages bound for one broker, and the futures of their callers."""

    broker: str
    created: float
    items: list[Item] = field(default_factory=list)
    futures: list[Future[SendResult]] = field(default_factory=list)
    nbytes: int = 0
    done: threading.Event = field(default_factory=threading.Event)


class MessageAccumulator:
    """Thread-safe batching. Producers ``append``; the sender ``drain``s ready batches
    and calls ``complete`` once a batch's futures are settled."""

    def __init__(self, cfg: ProducerConfig, wakeup: Callable[[], None]) -> None:
        self.linger = cfg.linger_ms / 1000.0
        self.max_messages = cfg.batch_max_messages
        self.max_bytes = cfg.batch_max_bytes
        self.max_buffered = cfg.max_buffered_messages
        self.wakeup = wakeup
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._open: dict[str, ProducerBatch] = {}
        self._ready: deque[ProducerBatch] = deque()
        self._incomplete: set[ProducerBatch] = set()
        self._flushing = 0
        self.buffered = 0
        self.closed = False

    def append(
        self, item: Item, future: Future[SendResult], broker: str, block_timeout: float
    ) -> None:
        """Add one message; blocks while the buffer is full, up to ``block_timeout``
        seconds, then raises ``BufferFullError``."""
        size = item.size
        wake = False
        with self._lock:
            if self.buffered >= self.max_buffered and not self.closed:
                deadline = time.monotonic() + block_timeout
                while self.buffered >= self.max_buffered and not self.closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise BufferFullError(
                            f"{self.buffered} messages buffered (max_buffered_messages="
                            f"{self.max_buffered}) and no room within {block_timeout}s"
                        )
                    self._space.wait(remaining)
            if self.closed:
                raise ProducerClosedError("producer is closed")
            batch = self._open.get(broker)
            if batch is not None and batch.nbytes + size > self.max_bytes:
                del self._open[broker]
                self._ready.append(batch)
                batch, wake = None, True
            if batch is None:
                batch = ProducerBatch(broker, time.monotonic())
                self._open[broker] = batch
                self._incomplete.add(batch)
                wake = True  # the sender must arm this batch's linger timer
            item.index = len(batch.items)
            batch.items.append(item)
            batch.futures.append(future)
            batch.nbytes += size
            self.buffered += 1
            if len(batch.items) >= self.max_messages or batch.nbytes >= self.max_bytes:
                del self._open[broker]
                self._ready.append(batch)
                wake = True
        if wake:
            self.wakeup()

    def drain(
        self, now: float, in_flight: dict[str, int], max_in_flight: int
    ) -> tuple[list[ProducerBatch], float | None]:
        """Batches to send now (full, lingered long enough, or flushing), within the
        per-broker in-flight limit, and when the next open batch will be due."""
        out: list[ProducerBatch] = []
        next_due: float | None = None
        with self._lock:
            if self._ready:
                keep: deque[ProducerBatch] = deque()
                for b in self._ready:
                    if in_flight.get(b.broker, 0) < max_in_flight:
                        in_flight[b.broker] = in_flight.get(b.broker, 0) + 1
                        out.append(b)
                    else:
                        keep.append(b)
                self._ready = keep
            force = self._flushing > 0 or self.closed
            for broker, b in list(self._open.items()):
                due = b.created + self.linger
                if force or now >= due:
                    if in_flight.get(broker, 0) < max_in_flight:
                        in_flight[broker] = in_flight.get(broker, 0) + 1
                        del self._open[broker]
                        out.append(b)
                elif next_due is None or due < next_due:
                    next_due = due
        return out, next_due

    def complete(self, batch: ProducerBatch) -> None:
        """The batch's futures are settled: free its room in the buffer."""
        with self._lock:
            self.buffered -= len(batch.items)
            self._incomplete.discard(batch)
            self._space.notify_all()
        batch.done.set()

    def has_pending(self) -> bool:
        """Messages not yet handed to the sender."""
        with self._lock:
            return bool(self._open or self._ready)

    def flush(self, timeout: float | None) -> None:
        """Wait until every batch that exists now has completed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            batches = list(self._incomplete)
            self._flushing += 1
        try:
            self.wakeup()
            for b in batches:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not b.done.wait(remaining):
                    left = sum(not x.done.is_set() for x in batches)
                    raise SendTimeoutError(f"flush timed out with {left} batch(es) pending")
        finally:
            with self._lock:
                self._flushing -= 1

    def close(self) -> None:
        """No more appends; waiting appenders fail; everything buffered becomes due."""
        with self._lock:
            self.closed = True
            self._space.notify_all()
        self.wakeup()

    def take_all(self) -> list[ProducerBatch]:
        """Remove and return every batch not yet handed to the sender (abort path)."""
        with self._lock:
            out = list(self._ready) + list(self._open.values())
            self._ready.clear()
            self._open.clear()
        return out
