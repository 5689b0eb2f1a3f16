"""Id index: message id -> message-log positions, on disk, hash-partitioned.

``ids/<part>.idx`` (``PARTS`` files, chosen by the id's stable 64-bit key) hold 24-byte
entries ``key u64 | position u64 | kind << 56 | time_ms``: ``STORED`` (a message or a
rescheduled copy was written at ``position``; time = its deliver time) and ``FIRED``
(the record at ``position`` fired; time = when). Nothing of it stays in memory but the
open file descriptors and each file's size, so a broker holding millions of far-future
messages finds any id with one read of one partition (1M ids: ~190 KB) and a C-speed
aligned search, instead of a map in RAM.

The index is derived state, like the schedule files: ``STORED`` entries are added after
the group commit's fsync and before the replay checkpoint moves past them, kept in memory
as the committer hands them over (ids, not yet hashed, packed or split by partition: that
is done for all of them at once when they are moved to the partitions' buffers, at the
checkpoint or once ``STAGED_MAX`` wait) and then buffered per partition (one write per
partition per checkpoint instead of per group commit; lookups see both); the checkpoint
writes and fsyncs the partitions first, so recovery only
re-adds what came after it (a repeated entry is harmless: readers fold entries by
position). ``FIRED`` entries are buffered too, packed per partition apart from the
rest until the next flush (the firing thread neither writes nor waits for a flush's
writes): what a
``kill -9`` loses of them, recovery re-adds from the consume logs' recently fired
records. They only date a fired message in lookups (whether it fired is the dispatch
log's to say), so a partition written since its last fsync with nothing but ``FIRED``
entries is fsync'd by one checkpoint in ``FIRED_SYNC_TURNS``, the partitions taking
turns: at a steady fire rate every partition gets ``FIRED`` entries every second, and
fsyncing all ``PARTS`` at every checkpoint would be ~130 journal commits a second competing
with the consume logs' writes. A partition with ``STORED`` entries is fsync'd at the
next checkpoint, as the replay checkpoint requires; an operating-system crash can lose
the fired times of up to ``FIRED_SYNC_TURNS`` checkpoints (the lookup then says fired,
time unknown), a ``kill -9`` none (they were written). Readers verify every position by
reading the record back (the key is a hash, and a torn log tail may have been
rewritten), so a stale or colliding entry is never trusted.
When retention deletes old log segments, :meth:`IdIndex.compact` drops the entries that
pointed into them, so the index grows with what the log keeps, not with all ever stored.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path

from qclient.server.store import record as rec
from qclient.server.store._files import SIDE_BUFFER_BYTES, AppendFiles, aligned_find

__all__ = ["FIRED", "FIRED_SYNC_TURNS", "PARTS", "STORED", "IdIndex", "id_key", "record_key"]

ENTRY = struct.Struct("<QQQ")
#: STORED entries kept as handed over before the adding thread moves them to the
#: partitions itself (a lookup scans them: this bounds its cost to ~0.3 ms)
STAGED_MAX = 8192
PARTS = 128  # partitions (a power of two): fds kept open, 1/PARTS of the ids read per lookup
#: checkpoints per fsync of a partition holding only FIRED entries since its last one
FIRED_SYNC_TURNS = 32
_PART_MASK = PARTS - 1
STORED = 1
FIRED = 2
_TIME_MASK = (1 << 56) - 1
_KEY = struct.Struct("<Q")
_POS = _KEY  # the position, 8 bytes into an entry
# where a record keeps len(msg_id): after PRE and the fixed fields before it
_ID_LEN = struct.Struct("<H")
_ID_LEN_AT = rec.PRE.size + struct.calcsize("<Biiqqqqq")


def _key(b: bytes) -> int:
    # CRC-32 and Adler-32 side by side: stable across processes and restarts, and ~2.5x
    # cheaper than an 8-byte blake2b on the commit path; a collision only costs a read,
    # since every hit is verified against the record
    return zlib.crc32(b) | zlib.adler32(b) << 32


def id_key(msg_id: str) -> int:
    """Stable 64-bit key of a message id (the same in every process and after restarts)."""
    return _key(msg_id.encode())


def record_key(data: bytes) -> int:
    """:func:`id_key` of the id inside an encoded record, without decoding the record."""
    (n,) = _ID_LEN.unpack_from(data, _ID_LEN_AT)
    start = rec.HEADER_SIZE
    return _key(data[start : start + n])


class IdIndex:
    """The partitioned id index of one store (thread-safe)."""

    def __init__(self, directory: Path, *, fsync: bool):
        self._files = AppendFiles(
            directory,
            ".idx",
            ENTRY.size,
            fsync=fsync,
            max_open=PARTS,
            buffer_bytes=SIDE_BUFFER_BYTES,
        )
        self._lock = threading.Lock()
        self._kept_lock = threading.Lock()
        # FIRED entries kept apart (add_fired), packed back to back per partition: bytes,
        # not a tuple per fired message (tuples alive until the checkpoint filled the
        # cyclic collector's generations, whose passes pause the event loop), and already
        # split, so a flush hands each partition its entries whole
        self._fired = [bytearray() for _ in range(PARTS)]
        # STORED entries as add_stored got them, not yet in the partitions' buffers
        self._staged: list[list[tuple[str, int, int]]] = []
        self._staged_count = 0
        # partitions given STORED entries since the last take_dirty (fsync'd by the next)
        self._stored_parts: set[int] = set()
        self._sync_turn = 0

    def recover(self) -> bool:
        """Cut torn entries off the partition files; False if there were none at all (a
        new index over an older data directory: recovery then indexes the whole log)."""
        return bool(self._files.recover())

    def add(self, kind: int, items: Iterable[tuple[int, int, int]]) -> None:
        """Append ``(key, position, time_ms)`` entries of one kind (buffered per partition,
        like every append: see ``AppendFiles``)."""
        parts: dict[int, list[bytes]] = {}
        pack = ENTRY.pack
        tag = kind << 56
        for key, pos, t in items:
            p = key & _PART_MASK
            chunk = parts.get(p)
            if chunk is None:
                chunk = parts[p] = []
            chunk.append(pack(key, pos, tag | (t & _TIME_MASK)))
        with self._lock:
            self._append(parts)
            if kind != FIRED:
                self._stored_parts.update(parts)

    def _append(self, parts: dict[int, list[bytes]]) -> None:
        """Append each partition's entries in one buffered write (``_lock`` held)."""
        for p, chunk in parts.items():
            self._files.append(p, b"".join(chunk))

    def add_fired(self, items: Iterable[tuple[bytes, int, int]]) -> None:
        """Add the FIRED entries of ``(message record, position, fired_at_ms)`` (the firing
        thread): kept apart until the next flush, under a lock no write is made with."""
        pack = ENTRY.pack
        key_of = record_key
        tag = FIRED << 56
        fired = self._fired
        with self._kept_lock:
            for data, pos, t in items:
                key = key_of(data)
                fired[key & _PART_MASK] += pack(key, pos, tag | (t & _TIME_MASK))

    def _move_fired(self) -> None:
        """Hand the FIRED entries kept apart to the partitions' buffers (``_lock`` held);
        each is dropped from memory only once appended, so :meth:`find` always sees it."""
        with self._kept_lock:
            taken = [(p, bytes(entries)) for p, entries in enumerate(self._fired) if entries]
        if not taken:
            return
        self._append({p: [data] for p, data in taken})
        with self._kept_lock:
            for p, data in taken:
                del self._fired[p][: len(data)]

    def add_stored(self, items: list[tuple[str, int, int]]) -> None:
        """Index messages written to the log: ``(msg_id, position, deliver_at_ms)`` (the
        committer's hot path: the list is kept as it is -- the caller hands it over and
        does not change it -- until :meth:`flush` or :meth:`take_dirty` moves it to the
        partitions, or more than ``STAGED_MAX`` entries wait)."""
        if not items:
            return
        with self._kept_lock:
            self._staged.append(items)
            self._staged_count += len(items)
            over = self._staged_count > STAGED_MAX
        if over:
            with self._lock:
                self._move_staged()

    def _move_staged(self) -> None:
        """Hash, pack and append the staged STORED entries to their partitions' buffers
        (``_lock`` held); each group leaves the staged list only once appended, so
        :meth:`find` always sees it."""
        with self._kept_lock:
            staged = list(self._staged)
        if not staged:
            return
        parts: dict[int, list[bytes]] = {}
        pack = ENTRY.pack
        crc, adler = zlib.crc32, zlib.adler32
        tag = STORED << 56
        count = 0
        for group in staged:
            count += len(group)
            for m, pos, t in group:
                b = m.encode()
                key = crc(b) | adler(b) << 32
                chunk = parts.get(key & _PART_MASK)
                if chunk is None:
                    chunk = parts[key & _PART_MASK] = []
                chunk.append(pack(key, pos, tag | (t & _TIME_MASK)))
        self._append(parts)
        self._stored_parts.update(parts)
        with self._kept_lock:
            del self._staged[: len(staged)]
            self._staged_count -= count

    def find(self, msg_id: str) -> list[tuple[int, int, int]]:
        """Entries of ``msg_id`` (and of any id with the same hash) as ``(position, kind,
        time_ms)``, in the order they were written."""
        key = id_key(msg_id)
        with self._kept_lock:  # first: an entry leaves these lists only once appended
            staged = [(p, t) for group in self._staged for m, p, t in group if m == msg_id]
            fired = bytes(self._fired[key & _PART_MASK])
        data = self._files.read(key & _PART_MASK)
        out = []
        for off in aligned_find(data, _KEY.pack(key), ENTRY.size):
            _k, pos, info = ENTRY.unpack_from(data, off)
            out.append((pos, info >> 56, info & _TIME_MASK))
        out.extend((pos, STORED, t & _TIME_MASK) for pos, t in staged)
        for off in aligned_find(fired, _KEY.pack(key), ENTRY.size):
            _k, pos, info = ENTRY.unpack_from(fired, off)
            out.append((pos, info >> 56, info & _TIME_MASK))
        return out

    def compact(self, below: int) -> int:
        """Drop the entries of positions before ``below`` (their log segments are deleted);
        returns how many. One partition at a time, each replaced atomically."""
        dropped = 0
        size = ENTRY.size
        with self._lock:
            self._move_staged()
        for p in range(PARTS):
            with self._lock:
                data = self._files.read(p)
                keep = [
                    data[o : o + size]
                    for o in range(0, len(data), size)
                    if _POS.unpack_from(data, o + 8)[0] >= below
                ]
                n = len(data) // size - len(keep)
                if n:
                    self._files.replace(p, b"".join(keep))
                    dropped += n
        return dropped

    def flush(self) -> None:
        """Write the buffered entries to their partitions."""
        with self._lock:
            self._move_staged()
            self._move_fired()
            self._files.flush()

    def take_dirty(self) -> list[int]:
        """Write the buffered entries; fds of the partitions to fsync now (see
        ``AppendFiles``): those given STORED entries since the last call, and those
        written with FIRED entries only whose turn it is (the rest wait for theirs)."""
        with self._lock:
            self._move_staged()
            self._move_fired()
            stored, self._stored_parts = self._stored_parts, set()
            turn = self._sync_turn
            self._sync_turn = (turn + 1) % FIRED_SYNC_TURNS
            return self._files.take_dirty(
                lambda p: p not in stored and p % FIRED_SYNC_TURNS != turn
            )

    def close(self) -> None:
        with self._lock:
            self._move_staged()
            self._move_fired()
            self._files.close()
