"""Dedupe table: msg_id -> message-log position, bounded by time and count.

Memory is the main per-message cost of a store full of far-future messages, so the table
is compact: a ``dict[int, int]`` from a 60-bit hash of the id to the record's position
(both small ints), plus the hashes in insertion order in an ``array('q')`` ring for
eviction (~105 bytes per id in all). The original result is read back from the record on
a hit (a pread), which also rules out hash collisions.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable

_MASK60 = (1 << 60) - 1
_MARK_GRANULARITY_MS = 1_000


def id_hash(msg_id: str) -> int:
    """60-bit hash of a message id (process-local: the table is rebuilt at each open)."""
    return hash(msg_id) & _MASK60


class DedupeTable:
    """Time- and count-bounded map of id hashes to positions (one thread at a time)."""

    def __init__(self, window_ms: int, max_ids: int):
        self.window_ms = window_ms
        self.max_ids = max(1, max_ids)
        self._map: dict[int, int] = {}
        self._ring = array("q")
        self._head = 0
        self._marks: deque[list[int]] = deque()  # [time_ms, ring end index]

    def __len__(self) -> int:
        return len(self._map)

    def get(self, h: int) -> int | None:
        return self._map.get(h)

    def find(self, msg_id: str) -> tuple[int, int | None]:
        """``(id_hash(msg_id), position or None)`` in one call (the submit path's lookup)."""
        h = hash(msg_id) & _MASK60
        return h, self._map.get(h)

    def find_many(self, msg_ids: Iterable[str]) -> tuple[list[int], list[int | None]]:
        """:meth:`find` of each id: their hashes, and their positions or None."""
        hashes = [hash(m) & _MASK60 for m in msg_ids]
        return hashes, list(map(self._map.get, hashes))

    def add(self, h: int, position: int, now_ms: int) -> None:
        if h not in self._map:
            self._ring.append(h)
        self._map[h] = position
        self._mark(now_ms)
        if len(self._map) > self.max_ids:
            self._evict_to(self._head + len(self._map) - self.max_ids)

    def add_many(self, hashes: list[int], positions: list[int], now_ms: int) -> None:
        """``add(h, position, now_ms)`` for each pair, in order (the same resulting table)."""
        if not hashes:
            return
        m, ring, max_ids = self._map, self._ring, self.max_ids
        if m.keys().isdisjoint(hashes) and len(set(hashes)) == len(hashes):
            # all new and distinct (the usual case): the ring gets every one, in order;
            # evicting the overflow once at the end leaves what evicting per add would
            # (the ring past _head holds exactly the table's keys, oldest first)
            ring.extend(hashes)
            m.update(zip(hashes, positions, strict=True))
            self._mark(now_ms)
            if len(m) > max_ids:
                self._evict_to(self._head + len(m) - max_ids)
            return
        for h, position in zip(hashes, positions, strict=True):
            if h not in m:
                ring.append(h)
            m[h] = position
            if len(m) > max_ids:
                self._mark(now_ms)
                self._evict_to(self._head + len(m) - max_ids)
        self._mark(now_ms)

    def _mark(self, now_ms: int) -> None:
        marks = self._marks
        if marks and now_ms - marks[-1][0] < _MARK_GRANULARITY_MS:
            marks[-1][1] = len(self._ring)
        else:
            marks.append([now_ms, len(self._ring)])

    def expire(self, now_ms: int) -> None:
        """Forget ids older than the window."""
        cutoff = now_ms - self.window_ms
        while self._marks and self._marks[0][0] < cutoff:
            _, end = self._marks.popleft()
            self._evict_to(end)

    def _evict_to(self, end: int) -> None:
        ring, m = self._ring, self._map
        for i in range(self._head, min(end, len(ring))):
            m.pop(ring[i], None)
        self._head = max(self._head, min(end, len(ring)))
        while self._marks and self._marks[0][1] <= self._head:
            self._marks.popleft()
        if self._head > 65536 and self._head * 2 > len(ring):
            del ring[: self._head]
            for mk in self._marks:
                mk[1] -= self._head
            self._head = 0
