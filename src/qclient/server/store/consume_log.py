"""Consume logs: per topic queue, a CRC'd log of fired messages plus an offset index.

``consume/<topic>/<queue_id>/log`` holds fired records (the message with ``fired_at_ms``,
its queue offset and the source position in the message log); ``index`` holds one
fixed-width ``(log position u64, size u32)`` entry per offset (RocketMQ ConsumeQueue
style), so ``pull(offset)`` is two preads. Only the log is fsync'd: the index is derived
and recovery rebuilds its tail from the log. Appends are written to the log in runs: the
firing thread writes what earlier appends left unwritten once ``WRITE_EVERY_S`` passed
(one write per queue every few ms instead of one per queue per 1-ms firing step: each
write extends the file, a journaled metadata change that cost ~17 us of the event loop's
time and an open door for the other threads to take the GIL), and the syncer writes the
rest before each fsync. A killed process loses at most that much of unsynced fired
copies, which fire again like any unsynced tail (their dispatch records follow the
fsync). The index entries of the newest offsets stay in memory until the syncer's next
``sync()`` writes them, and reads of those offsets take their entries from memory. The
record bytes of the newest offsets are
kept in memory too (within a byte budget shared by all queues, oldest dropped first): a
pull right after a fire, the usual case, decodes them from there, without a pread and
without checking again the CRC the firing path computed over those same bytes. Offsets
become *visible* to ``pull`` by
``publish``: right after the append, or only after the log is synced (the store's
``visible_before_sync``); offsets a crash took back are handled by recovery (offsets.py
``clamp``).
"""

from __future__ import annotations

import collections
import logging
import os
import struct
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import cast

from qclient.server.store import record as rec
from qclient.server.store._files import check_name, check_queue_id, fsync_dir, write_all
from qclient.server.store.types import FiredMessage

log = logging.getLogger(__name__)

INDEX = struct.Struct("<QI")
_RECENT_MAX = 20_000
_RECENT_SPAN_MS = 5_000
# record bytes of the newest offsets kept for pulls, all queues of a store together
# (consumers that keep up read within milliseconds of the fire: at 20k fired msgs/s of
# ~200 bytes this is seconds of them); older offsets are read from the files
KEPT_BYTES = 32 << 20
# a kept chunk as one int: queue slot | record count (32 bits) | bytes (48 bits)
_COUNT_SHIFT = 48
_SLOT_SHIFT = 80
_COUNT_MASK = (1 << 32) - 1
_SIZE_MASK = (1 << 48) - 1
#: the firing thread writes a queue's unwritten appends once this long passed since its
#: last write, or once this many bytes wait (the syncer writes the rest before its fsync)
WRITE_EVERY_S = 0.005
WRITE_BYTES = 1 << 20


def _from_memory(data: bytes, topic: str, queue_id: int, offset: int) -> FiredMessage:
    """The message of a consume-log record kept in memory since this process built it
    (its topic and queue are the queue's own)."""
    msg_id, key, tags, props, body, deliver, fired, flag = rec.trusted_fields(data)
    return FiredMessage(
        msg_id, topic, queue_id, offset, body, key, tags, props, deliver, fired, flag
    )


class Kept:
    """The record bytes that consume queues keep in memory, oldest dropped first once
    their sum passes ``limit`` (whichever queue they belong to).

    Each append is remembered as one int (queue slot, record count, bytes), not a tuple
    holding the queue: an int is not tracked by the cyclic garbage collector, and at 20k
    fired msgs/s tuples kept for seconds filled the older generations, whose collections
    then stalled the broker's event loop for 10-20 ms."""

    def __init__(self, limit: int = KEPT_BYTES) -> None:
        self.limit = limit
        self.bytes = 0
        self._queues: list[ConsumeQueue] = []  # by slot
        self._chunks: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()  # taken before a queue's lock, never after

    def slot(self, q: ConsumeQueue) -> int:
        """``q``'s number in this budget's chunks."""
        with self._lock:
            self._queues.append(q)
            return len(self._queues) - 1

    def added(self, slot: int, count: int, size: int) -> None:
        with self._lock:
            self._chunks.append(slot << _SLOT_SHIFT | count << _COUNT_SHIFT | size)
            self.bytes += size
            while self.bytes > self.limit:
                chunk = self._chunks.popleft()
                self.bytes -= chunk & _SIZE_MASK
                q = self._queues[chunk >> _SLOT_SHIFT]
                q._drop_kept((chunk >> _COUNT_SHIFT) & _COUNT_MASK)


class ConsumeQueue:
    """One topic queue's consume log. ``append`` from one thread, ``read`` from any."""

    def __init__(
        self, directory: Path, topic: str, queue_id: int, *, fsync: bool, kept: Kept | None = None
    ):
        self.dir = directory
        self.topic = topic
        self.queue_id = queue_id
        self.fsync = fsync
        self.next = 0  # next offset to append
        self.visible = 0  # offsets below this can be pulled
        self.log_end = 0  # the log's end once every append is written
        self._log_fd = -1
        self._idx_fd = -1
        self._synced_end = 0
        # appended records not written to the log yet (under _idx_lock); writers (the
        # firing thread, the syncer) take _write_lock, so runs land in order
        self._write_lock = threading.Lock()
        self._unwritten: list[bytes] = []
        self._unwritten_bytes = 0
        self._written_end = 0  # the log file's end
        self._written_next = 0  # offsets below this are in the log file
        self._written_at = 0.0  # time.monotonic() of the last write
        self._drop_owed = 0  # kept records to drop once written (see _drop_kept)
        self._new_dirs = False
        # index entries of offsets idx_base.. not written to the index file yet
        self._idx_lock = threading.Lock()
        self._idx_base = 0
        self._idx_tail: list[tuple[int, int]] = []
        # record bytes of offsets mem_base..next (under _idx_lock), within kept's budget
        self._kept = kept if kept is not None else Kept()
        self._kept_slot = self._kept.slot(self)
        self._mem_base = 0
        # _mem[_mem_dead:] are the kept records; the entries before are dropped ones
        # (None), removed from the list only once they are half of it: a front deletion
        # moves every pointer after it, and at a steady fire rate the budget drops a few
        # records per queue per firing step
        self._mem: list[bytes | None] = []
        self._mem_dead = 0

    def open(self) -> list[rec.Record]:
        """Open and recover; returns the records fired in the last few seconds before the
        previous stop (their dispatch may not have been logged)."""
        # a new queue's directory entries are made durable by the first sync(), on the
        # syncer thread, before any of its offsets become visible
        self._new_dirs = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
        self._log_fd = os.open(self.dir / "log", flags, 0o644)
        self._idx_fd = os.open(self.dir / "index", flags, 0o644)
        log_size = os.fstat(self._log_fd).st_size
        n = os.fstat(self._idx_fd).st_size // INDEX.size
        # drop index entries whose record is gone or torn
        end = 0
        while n > 0:
            pos, size = INDEX.unpack(os.pread(self._idx_fd, INDEX.size, (n - 1) * INDEX.size))
            if pos + size <= log_size and self._valid(pos, size):
                end = pos + size
                break
            n -= 1
        os.ftruncate(self._idx_fd, n * INDEX.size)
        # index the log's records after the last indexed one; cut a torn tail
        extra = []
        pos = end
        while pos < log_size:
            head = os.pread(self._log_fd, rec.PRE.size, pos)
            try:
                size = rec.peek_length(head)
            except rec.CorruptRecord:
                break
            if pos + size > log_size or not self._valid(pos, size):
                break
            extra.append(INDEX.pack(pos, size))
            pos += size
        if pos < log_size:
            log.warning("%s/%d: cutting %d torn bytes", self.topic, self.queue_id, log_size - pos)
            os.ftruncate(self._log_fd, pos)
        if extra:
            write_all(self._idx_fd, b"".join(extra))
        self.next = self.visible = self._idx_base = self._mem_base = n + len(extra)
        self._written_next = self.next
        self.log_end = self._synced_end = self._written_end = pos
        self._written_at = time.monotonic()
        return self._recent()

    def _valid(self, pos: int, size: int) -> bool:
        try:
            rec.decode(os.pread(self._log_fd, size, pos))
        except rec.CorruptRecord:
            return False
        return True

    def _recent(self) -> list[rec.Record]:
        if self.next == 0:
            return []
        first = max(0, self.next - _RECENT_MAX)
        records = [r for r, _ in self._read_raw(first, self.next - first)]
        if not records:
            return []
        cutoff = max(r.fired_at_ms for r in records) - _RECENT_SPAN_MS
        return [r for r in records if r.fired_at_ms >= cutoff]

    def append(self, items: Iterable[tuple[bytes, int, int]]) -> int:
        """Append fired messages ``(message record bytes, source position, fired_at_ms)``;
        not yet visible. Returns how many were appended. Raises OSError (nothing of these
        appended) when the earlier appends due to be written cannot be."""
        if self._unwritten and (
            self._unwritten_bytes >= WRITE_BYTES
            or time.monotonic() - self._written_at >= WRITE_EVERY_S
        ):
            # (disk full) the firing thread retries the whole batch, later
            self.write()
        chunks = []
        index = []
        off = self.next
        pos = self.log_end
        to_fired = rec.to_fired
        for raw, src, fired_at in items:
            data = to_fired(raw, fired_at, off, src)
            chunks.append(data)
            index.append((pos, len(data)))
            pos += len(data)
            off += 1
        if not chunks:
            return 0
        size = pos - self.log_end
        with self._idx_lock:
            self._idx_tail.extend(index)
            self._mem.extend(chunks)
            self._unwritten.extend(chunks)
            self._unwritten_bytes += size
            self.log_end = pos
            count = off - self.next
            self.next = off
        self._kept.added(self._kept_slot, len(chunks), size)
        return count

    def write(self) -> None:
        """Write the appended records not in the log file yet (any thread); on failure
        nothing of them is in the file and they stay to be written."""
        with self._write_lock:
            with self._idx_lock:
                chunks, self._unwritten = self._unwritten, []
                size, self._unwritten_bytes = self._unwritten_bytes, 0
                upto = self.next
            if not chunks:
                return
            try:
                write_all(self._log_fd, b"".join(chunks))
            except OSError:
                os.ftruncate(self._log_fd, self._written_end)  # nothing half-written
                with self._idx_lock:
                    self._unwritten[:0] = chunks
                    self._unwritten_bytes += size
                raise
            self._written_end += size
            self._written_at = time.monotonic()
            with self._idx_lock:
                self._written_next = upto
                owed = self._drop_owed
        if owed:
            self._drop_kept(0)

    def _drop_kept(self, count: int) -> None:
        """Forget the ``count`` oldest records kept in memory (their reads go to the file);
        records not written yet are dropped only once they are."""
        with self._idx_lock:
            want = count + self._drop_owed
            n = min(want, self._written_next - self._mem_base)
            self._drop_owed = want - n
            if n <= 0:
                return
            mem, dead = self._mem, self._mem_dead
            mem[dead : dead + n] = [None] * n  # the bytes are freed now
            dead += n
            if dead > len(mem) // 2:
                del mem[:dead]
                dead = 0
            self._mem_dead = dead
            self._mem_base += n

    def write_index(self) -> None:
        """Write the index entries kept in memory (the syncer's thread, and close)."""
        with self._idx_lock:
            entries = list(self._idx_tail)
        if not entries:
            return
        pack = INDEX.pack
        try:
            write_all(self._idx_fd, b"".join([pack(p, n) for p, n in entries]))
        except OSError:
            os.ftruncate(self._idx_fd, self._idx_base * INDEX.size)  # nothing half-written
            raise
        with self._idx_lock:
            del self._idx_tail[: len(entries)]
            self._idx_base += len(entries)

    def sync(self) -> int:
        """Write the index entries kept in memory and fdatasync the log; returns the
        offset up to which the log is durable (publish it)."""
        upto = self.next
        self.write()
        self.write_index()
        if self._new_dirs and self.fsync:
            fsync_dir(self.dir)
            fsync_dir(self.dir.parent)
            fsync_dir(self.dir.parent.parent)
        self._new_dirs = False
        if self.fsync and self._written_end != self._synced_end:
            end = self._written_end
            os.fdatasync(self._log_fd)
            self._synced_end = end
        return upto

    def publish(self, upto: int) -> None:
        if upto > self.visible:
            self.visible = upto

    def _index(self, offset: int, count: int) -> list[tuple[int, int]]:
        """``(log position, size)`` of ``count`` offsets from ``offset`` (fewer past the
        end): from the index file, then from the entries not written yet."""
        with self._idx_lock:
            base = self._idx_base
            mem = self._idx_tail[max(0, offset - base) : max(0, offset + count - base)]
        if offset >= base:
            return mem
        n = min(count, base - offset)  # written before base moved past them
        raw = os.pread(self._idx_fd, n * INDEX.size, offset * INDEX.size)
        entries = list(INDEX.iter_unpack(raw[: len(raw) - len(raw) % INDEX.size]))
        return entries + mem if len(entries) == n else entries

    def _memory(self, offset: int, count: int) -> list[bytes] | None:
        """The record bytes of ``count`` offsets from ``offset`` (fewer past the end), or
        None when ``offset`` is older than what memory keeps."""
        with self._idx_lock:
            if offset < self._mem_base:
                return None
            start = offset - self._mem_base + self._mem_dead
            return cast("list[bytes]", self._mem[start : start + count])  # live ones only

    def _read_raw(self, offset: int, count: int) -> list[tuple[rec.Record, int]]:
        entries = self._index(offset, count)
        if not entries:
            return []
        start = entries[0][0]
        stop = entries[-1][0] + entries[-1][1]
        data = os.pread(self._log_fd, stop - start, start)
        out = []
        for i, (pos, _size) in enumerate(entries):
            try:
                r, _ = rec.decode(data, pos - start)
            except rec.CorruptRecord as exc:
                # never handed out with changed bytes; skipped, so the queue's consumers
                # move on to the offsets after it instead of stopping there for good
                log.error(
                    "%s/%d: corrupt record at offset %d (%s); skipped",
                    self.topic,
                    self.queue_id,
                    offset + i,
                    exc,
                )
                continue
            out.append((r, offset + i))
        return out

    def read(self, offset: int, max_messages: int) -> list[FiredMessage]:
        """Up to ``max_messages`` visible messages from ``offset``."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        n = min(max_messages, self.visible - offset)
        if n <= 0:
            return []
        mem = self._memory(offset, n)
        if mem is not None:
            try:
                return [
                    _from_memory(b, self.topic, self.queue_id, offset + i)
                    for i, b in enumerate(mem)
                ]
            except rec.CorruptRecord:
                pass  # not expected; the file's path checks, reports and skips the record
            in_file = n
        else:
            # older than what memory keeps: from the file up to where memory starts, then
            # from memory (the newest records may not be in the file yet)
            with self._idx_lock:
                in_file = min(n, self._mem_base - offset)
        out = [
            FiredMessage(
                r.msg_id,
                r.topic,
                r.queue_id,
                off,
                r.body,
                r.key,
                r.tags,
                r.properties,
                r.deliver_at_ms,
                r.fired_at_ms,
                r.flag,
            )
            for r, off in self._read_raw(offset, in_file)
        ]
        if in_file < n:
            out += self.read(offset + in_file, n - in_file)
        return out

    def close(self) -> None:
        if self._idx_fd >= 0:
            self.write()
            self.write_index()
        for fd in (self._log_fd, self._idx_fd):
            if fd >= 0:
                if self.fsync:
                    os.fsync(fd)
                os.close(fd)
        self._log_fd = self._idx_fd = -1


class ConsumeLogs:
    """All consume queues of a store, created on first fire."""

    def __init__(self, directory: Path, *, fsync: bool):
        self.dir = directory
        self.fsync = fsync
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._kept = Kept()
        self._lock = threading.Lock()
        self.dir.mkdir(parents=True, exist_ok=True)

    def open_all(self) -> list[rec.Record]:
        """Open (recover) every existing queue; returns their recently fired records."""
        recent: list[rec.Record] = []
        for tdir in sorted(self.dir.iterdir()):
            try:
                topic = check_name(tdir.name)
            except ValueError:
                continue
            for qdir in sorted(tdir.iterdir()):
                if qdir.name.isdigit() and int(qdir.name) < 65536:
                    q = ConsumeQueue(qdir, topic, int(qdir.name), fsync=self.fsync, kept=self._kept)
                    recent.extend(q.open())
                    self._queues[(topic, int(qdir.name))] = q
        return recent

    def get(self, topic: str, queue_id: int, *, create: bool) -> ConsumeQueue | None:
        key = (topic, queue_id)
        q = self._queues.get(key)
        if q is not None or not create:
            return q
        check_name(topic)
        check_queue_id(queue_id)
        with self._lock:
            q = self._queues.get(key)
            if q is None:
                q = ConsumeQueue(
                    self.dir / topic / str(queue_id),
                    topic,
                    queue_id,
                    fsync=self.fsync,
                    kept=self._kept,
                )
                q.open()
                self._queues[key] = q
        return q

    def close(self) -> None:
        with self._lock:
            for q in self._queues.values():
                q.close()
            self._queues.clear()
