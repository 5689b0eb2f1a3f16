"""Fetched messages held until their deliver time, and the commit offsets they allow.

A broker fires messages into its consume logs up to ``fire_ahead_ms`` before they are due
(``wire.DEFAULT_FIRE_AHEAD_MS``) and hands them early to pulls that say they hold them: a
broker that stalls for less than that (a preempted vCPU, a slow fsync round) then delays
no consumer, which releases each message on its own timer.

"Due" is by the broker's wall clock, which the consumer maps onto its own monotonic clock
per broker from the ``clock_ns`` of its answers: the largest ``clock_ns - our monotonic
time at receipt`` over the last :data:`OFFSET_WINDOW_S`. Each sample is the true offset
minus the answer's transit time, so the estimate errs late, never early. Monotonic, so
that a step of this host's wall clock moves no release; a window rather than all time
lets the broker's clock be followed when it is stepped or slewed.

Within a queue messages are released out of offset order (a short delay sent after a long
one fires after it); the offset to commit is the lowest one not returned yet, or, once
all are returned, the pull's next offset (past what a tag filter skipped).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from .._models import ReceivedMessage
from ..protocol import wire
from ._received import from_pulled

__all__ = ["ClockOffset", "HeldMessages"]

OFFSET_WINDOW_S = 5.0

Key = tuple[str, int]  # (broker name, queue id)


class ClockOffset:
    """A broker's wall clock minus our monotonic clock (ns), estimated low: the windowed
    maximum of the samples (a monotonic deque, O(1) amortized a sample)."""

    def __init__(
        self, window_s: float = OFFSET_WINDOW_S, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._window = window_s
        self._mono = monotonic
        self._samples: deque[tuple[float, int]] = deque()  # (taken at, sample), decreasing

    def add(self, remote_ns: int, local_ns: int) -> None:
        """The broker's clock read ``remote_ns`` at or before ours read ``local_ns``."""
        sample = remote_ns - local_ns
        now = self._mono()
        q = self._samples
        while q and q[-1][1] <= sample:
            q.pop()
        q.append((now, sample))
        while q[0][0] < now - self._window:
            q.popleft()

    @property
    def ns(self) -> int | None:
        """The estimate, None before any sample."""
        q = self._samples
        if not q:
            return None
        now = self._mono()
        while len(q) > 1 and q[0][0] < now - self._window:
            q.popleft()
        return q[0][1]


class HeldMessages:
    """Fetched, not yet returned messages: a heap by local release time, plus per queue
    the offsets not returned yet (for what may be committed). Each becomes a
    :class:`ReceivedMessage` only when released: an answer brings ~20 ms of messages at
    once, and building them all then would hold up the releases due meanwhile."""

    def __init__(
        self,
        convert: Callable[[wire.PulledMessage, str], ReceivedMessage] = from_pulled,
        clocks: dict[str, ClockOffset] | None = None,
    ) -> None:
        """``convert``: a pulled message as the application sees it; ``clocks``: the
        brokers' clock offsets, when shared with other holders."""
        # (release ns, seq, message, broker)
        self._heap: list[tuple[int, int, wire.PulledMessage, str]] = []
        self._seq = 0
        self._convert = convert
        self._open: dict[Key, deque[int]] = {}  # fetched offsets, in offset order
        self._returned: dict[Key, set[int]] = {}  # of those, returned out of order
        self._end: dict[Key, int] = {}  # the pulls' next offset, past skipped messages
        self._offsets: dict[str, ClockOffset] = {} if clocks is None else clocks

    def __len__(self) -> int:
        return len(self._heap)

    def clock(self, broker: str) -> ClockOffset:
        c = self._offsets.get(broker)
        if c is None:
            c = self._offsets[broker] = ClockOffset()
        return c

    def add(
        self,
        broker: str,
        messages: Iterable[wire.PulledMessage],
        ends: Mapping[int, int] | None = None,
    ) -> dict[Key, int]:
        """Hold ``messages`` of ``broker`` (each queue's in offset order); ``ends``: per
        queue, the offset after what the pull read (returned or skipped). Returns the
        offsets that may be committed now: queues with nothing held whose end moved."""
        off = self.clock(broker).ns
        if off is None:  # a broker that sends no clock: trust ours
            off = time.time_ns() - time.monotonic_ns()
        heap, push = self._heap, heapq.heappush
        for m in messages:
            key = (broker, m.queue_id)
            self._seq += 1
            push(heap, (m.deliver_at_ms * 1_000_000 - off, self._seq, m, broker))
            dq = self._open.get(key)
            if dq is None:
                dq = self._open[key] = deque()
            dq.append(m.offset)
        commit: dict[Key, int] = {}
        for q, end in (ends or {}).items():
            key = (broker, q)
            if key in self._open:
                if end > self._end.get(key, 0):
                    self._end[key] = end
            else:
                commit[key] = end
        return commit

    def next_release_ns(self) -> int | None:
        """Our monotonic clock (ns) when the earliest held message is due; None if none
        held."""
        return self._heap[0][0] if self._heap else None

    def release(
        self, limit: int, now_ns: int | None = None
    ) -> tuple[list[ReceivedMessage], dict[Key, int]]:
        """Up to ``limit`` messages due by ``now_ns`` (our monotonic clock), earliest first, and per
        queue they came from the offset that may now be committed."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        heap, pop, convert = self._heap, heapq.heappop, self._convert
        out: list[ReceivedMessage] = []
        commit: dict[Key, int] = {}
        while heap and heap[0][0] <= now and len(out) < limit:
            _at, _seq, m, broker = pop(heap)
            out.append(convert(m, broker))
            key = (broker, m.queue_id)
            dq = self._open[key]
            if dq[0] != m.offset:  # an earlier offset is still held
                self._returned.setdefault(key, set()).add(m.offset)
                commit[key] = dq[0]
                continue
            last = dq.popleft()
            ret = self._returned.get(key)
            while ret and dq and dq[0] in ret:
                last = dq.popleft()
                ret.discard(last)
            # the lowest offset not returned yet; all returned: the one after them
            commit[key] = dq[0] if dq else max(last + 1, self._end.get(key, 0))
        for key in commit:
            if not self._open[key]:
                del self._open[key]
                self._returned.pop(key, None)
                self._end.pop(key, None)
        return out, commit

    def drop(self, broker: str, queue_id: int) -> None:
        """Forget the held messages of a queue no longer owned."""
        key = (broker, queue_id)
        self._open.pop(key, None)
        self._returned.pop(key, None)
        self._end.pop(key, None)
        kept = [e for e in self._heap if (e[3], e[2].queue_id) != key]
        if len(kept) != len(self._heap):
            heapq.heapify(kept)
            self._heap = kept
