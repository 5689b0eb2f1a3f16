"""The in-memory due structure: a min-heap of packed ints over the *loaded* buckets.

Each entry is one int ``deliver_at_ms << 64 | position << 24 | size`` (ms precision, ~48
bytes per entry, compared natively by ``heapq``). Only buckets the loader has loaded
(``load_ahead_ms`` before they start) have entries here; everything further out lives
only in the schedule log on disk.

Loading discipline (QMQ's loading cursor, done with one lock): the schedule log is only
appended under the store's scheduler lock, and the replayer pushes a new entry straight
into the heap when its bucket ``is_loaded`` -- which includes the bucket *being* loaded.
The loader, under the lock, marks bucket ``b`` as loading and notes the file size as its
cursor; it then reads ``[0, cursor)`` without the lock and merges under the lock. Entries
appended after the cursor were pushed by the replayer, entries before it are read by the
loader: none is lost and none is loaded twice.

The rule: **a position is in the wheel at most once**, and a popped one is not pushed
again until its firing failed (:meth:`Wheel.unfire`). ``pop_due`` skips a copy only while
the first is firing; once the syncer has dispatched it, a second copy would fire the
message again. So a bucket is loaded once: a load that fails part-way keeps the bucket
loading with its cursor and is resumed, never restarted with a new cursor (which would
read the entries the replayer pushed meanwhile a second time).

The loading state (``loaded_upto``, ``loading``, the extra loaded buckets) is the
wheel's own: the loader drives it through :meth:`Wheel.start_load` and
:meth:`Wheel.finish_load`, everyone else asks :meth:`Wheel.is_loaded`.

Every method must be called with the scheduler lock held.
"""

from __future__ import annotations

import heapq

_POS_BITS = 40
_SIZE_BITS = 24
_POS_MASK = (1 << _POS_BITS) - 1
_SIZE_MASK = (1 << _SIZE_BITS) - 1
MAX_POSITION = _POS_MASK
MAX_SIZE = _SIZE_MASK


class BucketState:
    """Bookkeeping of one loaded bucket."""

    __slots__ = ("max_pos", "outstanding")

    def __init__(self) -> None:
        self.outstanding = 0  # pushed, not yet dispatched or skipped
        self.max_pos = -1  # highest message position seen in this bucket


class Wheel:
    """Min-heap of due entries plus the loaded/unloaded bucket sets."""

    def __init__(self, bucket_ms: int):
        self.bucket_ms = bucket_ms
        self.heap: list[int] = []
        self._loaded_upto = -1  # every bucket <= this is loaded
        self._loaded_extra: set[int] = set()  # loaded buckets > _loaded_upto
        self._loading: int | None = None  # the bucket the loader is reading, if any
        self.unloaded: set[int] = set()  # buckets > _loaded_upto with entries on disk
        self._unloaded_heap: list[int] = []  # the same, for the earliest (lazy deletion)
        self.state: dict[int, BucketState] = {}
        self.cancelled: dict[int, set[int]] = {}  # bucket -> cancelled positions
        # popped, not yet in the dispatch log (small: one sync group); with the dispatch
        # log it answers "has this fired?" without a per-message set per bucket
        self.firing: set[int] = set()
        self.dispatch_gen = 0  # bumped whenever positions leave ``firing``

    def is_loaded(self, b: int) -> bool:
        """Bucket ``b`` is loaded or being loaded: new entries go straight into the heap."""
        return b <= self._loaded_upto or b == self._loading or b in self._loaded_extra

    def is_loading(self, b: int) -> bool:
        return b == self._loading

    def start_load(self, target: int) -> int | None:
        """The earliest unloaded bucket ``<= target``, now marked loading; None if there is
        none (then every bucket up to ``target`` counts as loaded)."""
        first = self.earliest_unloaded()
        if first is None or first > target:
            if target > self._loaded_upto:
                self._loaded_upto = target
                self._loaded_extra = {x for x in self._loaded_extra if x > target}
            return None
        self.unloaded.discard(first)
        self._loading = first
        return first

    def finish_load(self, b: int) -> None:
        """The loader has merged bucket ``b``'s file: it stays loaded."""
        self._loaded_extra.add(b)
        self._loading = None

    def note_entries(self, b: int, entries: list[tuple[int, int, int, int]], cancel: int) -> None:
        """Take the cancels and the highest position of bucket ``b``'s schedule entries
        ``(deliver_at, position, size, kind)``; ``cancel`` is the cancel entries' kind."""
        st = self.state_for(b)
        max_pos = st.max_pos
        for _d, pos, _size, kind in entries:
            if kind == cancel:
                self.cancel(b, pos)
            if pos > max_pos:
                max_pos = pos
        st.max_pos = max_pos

    def add_unloaded(self, b: int) -> None:
        if b not in self.unloaded:
            self.unloaded.add(b)
            heapq.heappush(self._unloaded_heap, b)

    def earliest_unloaded(self) -> int | None:
        """The earliest bucket waiting to be loaded (O(log n), no scan)."""
        h = self._unloaded_heap
        while h and h[0] not in self.unloaded:
            heapq.heappop(h)  # loaded meanwhile
        return h[0] if h else None

    def state_for(self, b: int) -> BucketState:
        st = self.state.get(b)
        if st is None:
            st = self.state[b] = BucketState()
        return st

    def is_cancelled(self, b: int, pos: int) -> bool:
        s = self.cancelled.get(b)
        return s is not None and pos in s

    def cancel(self, b: int, pos: int) -> None:
        self.cancelled.setdefault(b, set()).add(pos)

    def uncancel(self, b: int, pos: int) -> None:
        """Undo :meth:`cancel` of a tombstone that was never written."""
        s = self.cancelled.get(b)
        if s is not None:
            s.discard(pos)

    def push(self, deliver_at_ms: int, pos: int, size: int) -> bool:
        """Add a due entry of a loaded bucket; True if it is the new earliest."""
        key = (deliver_at_ms << 64) | (pos << _SIZE_BITS) | size
        st = self.state_for(deliver_at_ms // self.bucket_ms)
        st.outstanding += 1
        if pos > st.max_pos:
            st.max_pos = pos
        heapq.heappush(self.heap, key)
        return self.heap[0] == key

    def note_position(self, b: int, pos: int) -> None:
        """Remember that bucket ``b`` references ``pos`` (for safe file removal)."""
        st = self.state_for(b)
        if pos > st.max_pos:
            st.max_pos = pos

    def next_due(self) -> int | None:
        return self.heap[0] >> 64 if self.heap else None

    def pop_due(self, now_ms: int, limit: int) -> list[tuple[int, int, int]]:
        """Pop up to ``limit`` entries due at ``now_ms``, skipping cancelled ones; each
        returned ``(deliver_at_ms, position, size)`` is marked firing."""
        heap = self.heap
        out: list[tuple[int, int, int]] = []
        bound = (now_ms + 1) << 64
        # this loop runs once per fired message: its lookups are bound once per call
        pop, firing, cancelled = heapq.heappop, self.firing, self.cancelled
        while heap and heap[0] < bound and len(out) < limit:
            key = pop(heap)
            deliver_at = key >> 64
            pos = (key >> _SIZE_BITS) & _POS_MASK
            # (no cancelled set at all is the common case: no bucket arithmetic then)
            if pos in firing or (
                cancelled and self.is_cancelled(deliver_at // self.bucket_ms, pos)
            ):
                self.state_for(deliver_at // self.bucket_ms).outstanding -= 1
                continue
            firing.add(pos)
            out.append((deliver_at, pos, key & _SIZE_MASK))
        return out

    def dispatched(self, b: int, positions: list[int]) -> None:
        """Fired entries of bucket ``b`` are now in the dispatch log."""
        st = self.state.get(b)
        if st is not None:
            st.outstanding -= len(positions)
        self.firing.difference_update(positions)
        self.dispatch_gen += 1

    def unfire(self, deliver_at_ms: int, pos: int, size: int) -> None:
        """Put back an entry whose firing failed."""
        self.firing.discard(pos)
        self.state_for(deliver_at_ms // self.bucket_ms).outstanding -= 1
        self.push(deliver_at_ms, pos, size)

    def drop(self, b: int) -> None:
        """Forget a fully fired bucket (its files are being removed)."""
        self.state.pop(b, None)
        self.cancelled.pop(b, None)
