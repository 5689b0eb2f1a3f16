"""What a RocketMQ group member holds, sans-I/O: the queues it owns, where each is read
up to, the messages fetched and not returned yet, and the offsets it may commit.

Never before its time: RocketMQ's timer moves a message into its queue when its wheel
slot (``floor(deliver / precision)``) comes up, so up to one precision *before* its
TIMER_DELIVER_MS. A fetched message is held until TIMER_DELIVER_MS by the local wall
clock (the producer set it from its own; the two are the caller's to keep in step), then
released, earliest first; other messages are released at once, in fetch order.

Commits: a queue's commit offset is its lowest fetched offset not returned yet (all
returned: the next offset to fetch), so a member that dies hands over exactly what it did
not return. ``poll`` acknowledges what earlier polls returned (``ack``); what is
acknowledged and not yet committed is what the member commits.

Duplicates: a producer retry may store a message twice under one UNIQ_KEY (brokers do not
dedupe); a message whose UNIQ_KEY this member returned recently is dropped (counted) and
treated as returned. A retry of a message keeps its UNIQ_KEY with one more reconsume
time: the pair is what counts.

Tags: with ``accepts`` (the group's tag filter) a fetched message it refuses is never
held or returned and counts as consumed; the broker already skipped most of them (by tag
hash), this catches the rest, as the Java client's own check does.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import LRUCache

from ..._models import ReceivedMessage
from . import message as msg
from .message import StoredMessage
from .pull import deliver_at_ms, to_received
from .rebalance import Key

__all__ = ["ConsumeState", "ConsumeStats", "release_merged"]

#: UNIQ_KEYs remembered for duplicate drops (about 100 bytes each)
DEDUPE_IDS = 100_000
#: the generation of a queue being let go (real ones count from 1)
_STOPPED = 0


@dataclass(slots=True)
class ConsumeStats:
    """Counters of one member. ``early``: messages fetched before their deliver time (and
    held), ``max_early_ms``: the most any was early by (deliver time - fetch time)."""

    duplicates_dropped: int = 0
    early: int = 0
    max_early_ms: int = 0
    fetched: int = 0
    returned: int = 0
    filtered: int = 0  # fetched, refused by the tag filter


@dataclass(slots=True, eq=False)
class _Queue:
    gen: int
    position: int  # the next offset to fetch
    open: deque[int] = field(default_factory=deque)  # fetched, not returned (offset order)
    returned: set[int] = field(default_factory=set)  # of ``open``, returned out of order
    held: int = 0
    delivered: int | None = None  # commit offset after what was returned
    acked: int | None = None  # commit offset after what was acknowledged
    committed: int | None = None  # what the broker confirmed


class ConsumeState:
    """The member's queues and held messages. Not thread-safe: the caller locks."""

    def __init__(
        self,
        dedupe_ids: int = DEDUPE_IDS,
        accepts: Callable[[str | None], bool] | None = None,
    ) -> None:
        self._accepts = accepts
        self._queues: dict[Key, _Queue] = {}
        # (hold until ms, seq, key, gen, message); entries of a queue let go are skipped
        self._heap: list[tuple[int, int, Key, int, StoredMessage]] = []
        self._seq = 0
        self._gen = 0
        self._seen: LRUCache[str, bool] = LRUCache(maxsize=dedupe_ids)
        self.total_held = 0
        self.stats = ConsumeStats()

    # --- ownership ------------------------------------------------------------------

    def take(self, key: Key, offset: int) -> int:
        """Own ``key`` from ``offset``; returns the ownership's generation (fetches of an
        earlier ownership of the same queue are refused)."""
        self.drop(key)
        self._gen += 1
        self._queues[key] = _Queue(self._gen, offset)
        return self._gen

    def stop(self, key: Key) -> bool:
        """Stop reading ``key``: what is held of it is forgotten (never returned), fetches
        in flight are refused; it stays until :meth:`drop` so that a poll meanwhile can
        still acknowledge what earlier polls returned of it. False if not owned."""
        q = self._queues.get(key)
        if q is None or q.gen == _STOPPED:
            return q is not None
        q.gen = _STOPPED
        self.total_held -= q.held
        q.held = 0
        return True

    def unacked(self, key: Key) -> bool:
        """Whether some of what was returned of ``key`` is not acknowledged yet."""
        q = self._queues.get(key)
        return q is not None and q.delivered is not None and q.delivered != q.acked

    def drop(self, key: Key) -> int | None:
        """Let ``key`` go with what is held of it; returns the acknowledged offset to
        commit first, if it is ahead of what the broker confirmed."""
        q = self._queues.pop(key, None)
        if q is None:
            return None
        self.total_held -= q.held
        if q.acked is not None and (q.committed is None or q.acked > q.committed):
            return q.acked
        return None

    def owns(self, key: Key, gen: int | None = None) -> bool:
        """Whether ``key`` is read (by ownership ``gen``)."""
        q = self._queues.get(key)
        return q is not None and q.gen != _STOPPED and (gen is None or q.gen == gen)

    def position(self, key: Key) -> int:
        return self._queues[key].position

    def held(self, key: Key) -> int:
        q = self._queues.get(key)
        return q.held if q is not None else 0

    def assignment(self) -> list[Key]:
        """The queues read now (not those stopped), sorted."""
        return sorted(k for k, q in self._queues.items() if q.gen != _STOPPED)

    # --- fetching -------------------------------------------------------------------

    def accept(
        self, key: Key, gen: int, messages: list[StoredMessage], next_offset: int, now_ms: int
    ) -> bool:
        """Hold the messages a fetch from the queue's position answered (offset order)
        and move the position to ``next_offset``; False (nothing taken) when the queue was
        let go or taken again meanwhile."""
        q = self._queues.get(key)
        if q is None or q.gen != gen:
            return False
        heap, stats, accepts = self._heap, self.stats, self._accepts
        n = 0
        for m in messages:
            if m.queue_offset < q.position:
                continue  # already fetched
            if accepts is not None and not accepts(m.properties.get(msg.TAGS)):
                stats.filtered += 1
                q.position = m.queue_offset + 1
                continue
            at = deliver_at_ms(m)
            if at is not None and at > now_ms:
                stats.early += 1
                stats.max_early_ms = max(stats.max_early_ms, at - now_ms)
            self._seq += 1
            heapq.heappush(heap, (at or 0, self._seq, key, gen, m))
            q.open.append(m.queue_offset)
            q.position = m.queue_offset + 1
            n += 1
        q.held += n
        self.total_held += n
        stats.fetched += n
        if next_offset > q.position:
            q.position = next_offset
        if not q.open:
            q.delivered = q.position
        return True

    def advance(self, key: Key, gen: int, next_offset: int) -> bool:
        """A fetch found nothing to return: continue at ``next_offset`` (a moved offset
        skips what is no longer stored; with nothing held that counts as consumed)."""
        q = self._queues.get(key)
        if q is None or q.gen != gen:
            return False
        if next_offset >= 0 and next_offset != q.position:
            q.position = next_offset
            if not q.open:
                q.delivered = next_offset
        return True

    # --- returning ------------------------------------------------------------------

    def _top(self) -> tuple[int, int, Key, int, StoredMessage] | None:
        """The earliest live held entry (stale ones of queues let go are discarded)."""
        heap, queues = self._heap, self._queues
        while heap:
            e = heap[0]
            q = queues.get(e[2])
            if q is not None and q.gen == e[3]:
                return e
            heapq.heappop(heap)
        return None

    def next_due_ms(self) -> int | None:
        """When the earliest held message is due (epoch ms), None when none is held."""
        e = self._top()
        return None if e is None else e[0]

    def release(self, limit: int, now_ms: int) -> list[ReceivedMessage]:
        """Up to ``limit`` held messages due by ``now_ms``, earliest first; duplicates
        (a UNIQ_KEY returned recently) are dropped and count as returned."""
        out: list[ReceivedMessage] = []
        seen, stats = self._seen, self.stats
        while len(out) < limit:
            e = self._top()
            if e is None or e[0] > now_ms:
                break
            heapq.heappop(self._heap)
            _, _, key, _, m = e
            q = self._queues[key]
            q.held -= 1
            self.total_held -= 1
            self._returned(q, m.queue_offset)
            uid = m.properties.get(msg.UNIQ_KEY)
            if uid is not None:
                if m.reconsume_times:
                    uid = f"{uid}#{m.reconsume_times}"
                if uid in seen:
                    stats.duplicates_dropped += 1
                    continue
                seen[uid] = True
            out.append(to_received(m, key[0]))
        stats.returned += len(out)
        return out

    @staticmethod
    def _returned(q: _Queue, offset: int) -> None:
        dq = q.open
        if not dq or dq[0] != offset:  # an earlier offset is still held
            q.returned.add(offset)
            return
        dq.popleft()
        ret = q.returned
        while ret and dq and dq[0] in ret:
            ret.discard(dq.popleft())
        q.delivered = dq[0] if dq else q.position

    def reopen(self, key: Key, offset: int) -> bool:
        """Count the returned message at ``offset`` of ``key`` as not returned again (a
        failed ``retry_later``): commits stop before it until it is returned again
        (:meth:`returned_again`) or the queue is let go. False if ``key`` is not owned or
        the offset is no longer ahead of what was committed."""
        q = self._queues.get(key)
        if q is None or q.gen == _STOPPED or offset >= q.position:
            return False
        if q.committed is not None and offset < q.committed:
            return False
        if offset in q.returned:
            q.returned.discard(offset)
        elif offset not in q.open:
            # deque keeps its order: insert in place (few entries are open)
            items = list(q.open)
            insort(items, offset)
            q.open = deque(items)
        q.delivered = q.open[0]
        if q.acked is not None and q.acked > offset:
            q.acked = offset  # acknowledged by a poll since, not committed yet
        return True

    def returned_again(self, key: Key, offset: int) -> None:
        """The message at ``offset`` of ``key``, reopened, is processed after all."""
        q = self._queues.get(key)
        if q is not None and offset in q.open:
            self._returned(q, offset)

    # --- commits --------------------------------------------------------------------

    def ack(self) -> bool:
        """Acknowledge everything returned so far; True when that moved an offset."""
        moved = False
        for q in self._queues.values():
            if q.delivered is not None and q.delivered != q.acked:
                q.acked = q.delivered
                moved = True
        return moved

    def pending_commits(self, broker: str | None = None) -> dict[Key, int]:
        """Acknowledged offsets the broker has not confirmed, of one broker or all."""
        return {
            key: q.acked
            for key, q in self._queues.items()
            if q.acked is not None
            and (q.committed is None or q.acked > q.committed)
            and (broker is None or key[0] == broker)
        }

    def recommit(self, broker: str) -> None:
        """Commit ``broker``'s acknowledged offsets again: its master changed, and a new
        master may not have the group's commits (5.5.0 slaves do not copy them once the
        group pulled, apache/rocketmq#10284)."""
        for key, q in self._queues.items():
            if key[0] == broker and q.acked is not None:
                q.committed = None

    def committed_ok(self, key: Key, offset: int) -> None:
        """The broker stored ``offset`` for ``key``."""
        q = self._queues.get(key)
        if q is not None and (q.committed is None or offset > q.committed):
            q.committed = offset

    def committed(self) -> dict[Key, int]:
        return {k: q.committed for k, q in self._queues.items() if q.committed is not None}


def release_merged(states: list[ConsumeState], limit: int, now_ms: int) -> list[ReceivedMessage]:
    """Up to ``limit`` messages due by ``now_ms`` from several states (a member's topic
    and its retry topic), earliest first across them."""
    live = [s for s in states if s.total_held]
    if len(live) <= 1:
        return live[0].release(limit, now_ms) if live else []
    out: list[ReceivedMessage] = []
    while len(out) < limit:
        best: ConsumeState | None = None
        best_due = now_ms + 1
        for s in live:
            due = s.next_due_ms()
            if due is not None and due < best_due:
                best, best_due = s, due
        if best is None:
            break
        # one at a time: each call takes at least the due entry it found
        out += best.release(1, now_ms)
    return out
