"""Segmented, append-only, CRC'd message log.

Segments are files named by their 20-digit base offset; a record's global *position* is
its byte offset in the concatenation of the segments (a new segment starts exactly at the
previous end, so positions are gapless). A record never spans two segments. Reads are
``os.pread`` by position. Only the last segment can have a torn tail (a segment is
fsync'd before the next is created), which :meth:`MessageLog.truncate` cuts off.

A record that fails its CRC with whole records after it is not a torn tail but a corrupt
record (a bit flip on disk): :meth:`MessageLog.scan` reports and skips it, keeping the
records after it -- cutting there would drop acknowledged messages. Its position stays
in the log, so a schedule entry that points at it fails the CRC check when it is due and
is dropped, never fired with the wrong content.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

from qclient.server.store import record as rec
from qclient.server.store._files import fsync_dir, write_all

log = logging.getLogger(__name__)

SUFFIX = ".log"
_SCAN_CHUNK = 4 << 20


class MessageLog:
    """The message log of one store. ``append``/``sync``/``truncate`` from one thread."""

    def __init__(self, directory: Path, segment_bytes: int, *, fsync: bool):
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.dir.mkdir(parents=True, exist_ok=True)
        self._bases: list[int] = []
        self._read_fds: dict[int, int] = {}
        self._rlock = threading.Lock()
        self._wfd: int | None = None
        self._graveyard: list[tuple[float, int]] = []  # reader fds of deleted segments
        self.end = 0  # next write position
        self.corrupt_skipped = 0  # corrupt records that scan() stepped over

    # --- open / recovery -----------------------------------------------------------
    def open(self) -> None:
        bases = []
        for p in self.dir.iterdir():
            n = p.name
            if n.endswith(SUFFIX) and n[: -len(SUFFIX)].isdigit():
                bases.append(int(n[: -len(SUFFIX)]))
        bases.sort()
        self._bases = bases
        if bases:
            last = bases[-1]
            self.end = last + os.path.getsize(self.segment_path(last))
        else:
            self._bases = [0]
            self.end = 0
            self._wfd = self._create(0)
            return
        self._wfd = os.open(self.segment_path(self._bases[-1]), os.O_WRONLY | os.O_APPEND)

    def segment_path(self, base: int) -> Path:
        return self.dir / f"{base:020d}{SUFFIX}"

    def _create(self, base: int) -> int:
        fd = os.open(
            self.segment_path(base), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644
        )
        if self.fsync:
            fsync_dir(self.dir)
        return fd

    def segments(self) -> list[tuple[int, int, float]]:
        """(base, size, mtime seconds) of every segment, oldest first."""
        out = []
        for b in self._bases:
            st = os.stat(self.segment_path(b))
            out.append((b, st.st_size, st.st_mtime))
        return out

    def scan(self, start: int) -> Iterator[tuple[int, rec.Record | None, int]]:
        """Yield ``(position, record, length)`` from ``start`` to the end. A corrupt record
        followed by a whole one is logged, counted in :attr:`corrupt_skipped` and skipped;
        at a bad tail (nothing whole after it) yield ``(position, None, 0)`` and continue
        with the next segment."""
        i = max(0, bisect.bisect_right(self._bases, start) - 1)
        for base in self._bases[i:]:
            pos = max(start, base)
            path = self.segment_path(base)
            with open(path, "rb") as f:
                f.seek(pos - base)
                buf = b""
                off = 0
                while True:
                    if len(buf) - off < rec.HEADER_SIZE or _need_more(buf, off):
                        more = f.read(_SCAN_CHUNK)
                        if not more:
                            break
                        buf = buf[off:] + more
                        off = 0
                        continue
                    try:
                        r, n = rec.decode(buf, off)
                    except rec.CorruptRecord as exc:
                        nxt = _next_whole(f.fileno(), pos - base + 1)
                        if nxt is None:
                            break
                        log.error(
                            "%s: corrupt record at position %d (%s): %d bytes skipped",
                            path.name,
                            pos,
                            exc,
                            nxt + base - pos,
                        )
                        self.corrupt_skipped += 1
                        pos = nxt + base
                        f.seek(nxt)
                        buf, off = b"", 0
                        continue
                    yield pos, r, n
                    pos += n
                    off += n
                if off < len(buf):
                    yield pos, None, 0

    def truncate(self, position: int) -> None:
        """Cut the log at ``position`` (drops later segments)."""
        if self._wfd is not None:
            os.close(self._wfd)
        i = max(0, bisect.bisect_right(self._bases, position) - 1)
        for b in self._bases[i + 1 :]:
            self._close_reader(b)
            self.segment_path(b).unlink()
        self._bases = self._bases[: i + 1]
        base = self._bases[-1]
        os.truncate(self.segment_path(base), position - base)
        self._close_reader(base)
        self._wfd = os.open(self.segment_path(base), os.O_WRONLY | os.O_APPEND)
        self.end = position
        if self.fsync:
            os.fsync(self._wfd)
            fsync_dir(self.dir)

    # --- write -----------------------------------------------------------------------
    def append(self, records: list[bytes], sizes: list[int] | None = None) -> list[int]:
        """Write records (not yet synced); return their positions. ``sizes``: their
        lengths, if the caller has them."""
        assert self._wfd is not None
        base = self._bases[-1]
        end = self.end
        if sizes is None:
            sizes = list(map(len, records))
        total = sum(sizes)
        if end - base + total <= self.segment_bytes and records:
            # all in the current segment (no record would roll it): one write, the
            # positions summed in C
            write_all(self._wfd, b"".join(records))
            self.end = end + total
            return list(accumulate(sizes[:-1], initial=end))
        positions = []
        chunk: list[bytes] = []
        for data in records:
            if end > base and end - base + len(data) > self.segment_bytes:
                write_all(self._wfd, b"".join(chunk))
                chunk = []
                self.end = end
                self._roll()
                base = self._bases[-1]
            positions.append(end)
            chunk.append(data)
            end += len(data)
        write_all(self._wfd, b"".join(chunk))
        self.end = end
        return positions

    def _roll(self) -> None:
        assert self._wfd is not None
        if self.fsync:
            os.fdatasync(self._wfd)
        os.close(self._wfd)
        self._wfd = self._create(self.end)
        with self._rlock:  # copy-on-write: readers bisect a list that never changes
            self._bases = [*self._bases, self.end]

    def sync(self) -> None:
        if self.fsync and self._wfd is not None:
            os.fdatasync(self._wfd)

    # --- read ------------------------------------------------------------------------
    def _reader(self, base: int) -> int:
        fd = self._read_fds.get(base)
        if fd is None:
            with self._rlock:
                fd = self._read_fds.get(base)
                if fd is None:
                    fd = os.open(self.segment_path(base), os.O_RDONLY)
                    self._read_fds[base] = fd
        return fd

    def _close_reader(self, base: int) -> None:
        with self._rlock:
            fd = self._read_fds.pop(base, None)
        if fd is not None:
            os.close(fd)

    def read(self, position: int, size: int) -> bytes:
        """The ``size`` bytes at ``position`` (short if beyond the end or deleted)."""
        bases = self._bases
        i = bisect.bisect_right(bases, position) - 1
        if i < 0:
            return b""
        base = bases[i]
        try:
            return os.pread(self._reader(base), size, position - base)
        except FileNotFoundError:
            return b""  # deleted by retention meanwhile

    def segment_bounds(self) -> list[tuple[int, int]]:
        """(base, end) of every sealed segment (all but the active one), oldest first."""
        bases = self._bases
        return [(bases[i], bases[i + 1]) for i in range(len(bases) - 1)]

    def delete_segments_before(self, position: int) -> int:
        """Delete the sealed segments that end at or before ``position``; returns how many.
        Their reader fds stay open a minute (a concurrent pread never sees a reused fd)."""
        now = time.monotonic()
        with self._rlock:
            bases = self._bases
            k = 0
            while k + 1 < len(bases) and bases[k + 1] <= position:
                k += 1
            doomed = bases[:k]
            if doomed:
                self._bases = bases[k:]
                self._graveyard.extend(
                    (now, self._read_fds.pop(b)) for b in doomed if b in self._read_fds
                )
            old = [fd for t, fd in self._graveyard if now - t > 60]
            self._graveyard = [(t, fd) for t, fd in self._graveyard if now - t <= 60]
        for fd in old:
            os.close(fd)
        for b in doomed:
            self.segment_path(b).unlink(missing_ok=True)
        if doomed and self.fsync:
            fsync_dir(self.dir)
        return len(doomed)

    def read_record(self, position: int, size: int = 0) -> rec.Record | None:
        """Decode the record at ``position`` (``size`` 0: unknown); None if invalid."""
        try:
            if size <= 0:
                head = self.read(position, rec.PRE.size)
                size = rec.peek_length(head)
            r, _ = rec.decode(self.read(position, size))
            return r
        except rec.CorruptRecord:
            return None

    def close(self) -> None:
        if self._wfd is not None:
            if self.fsync:
                os.fdatasync(self._wfd)
            os.close(self._wfd)
            self._wfd = None
        with self._rlock:
            fds, self._read_fds = self._read_fds, {}
            graves, self._graveyard = self._graveyard, []
        for fd in [*fds.values(), *(fd for _, fd in graves)]:
            os.close(fd)


def _next_whole(fd: int, start: int) -> int | None:
    """File offset of the first whole, valid record at or after ``start`` (found by its
    magic, then checked by length and CRC), or None: the rest of the file is a torn tail."""
    magic = rec.PRE.pack(rec.MAGIC, 0, 0)[:4]
    at = start
    while True:
        chunk = os.pread(fd, _SCAN_CHUNK + rec.PRE.size, at)
        if len(chunk) < rec.HEADER_SIZE:
            return None
        i = chunk.find(magic)
        while 0 <= i <= _SCAN_CHUNK:
            try:
                size = rec.peek_length(chunk, i)
                rec.decode(os.pread(fd, size, at + i))
                return at + i
            except rec.CorruptRecord:
                i = chunk.find(magic, i + 1)
        if len(chunk) <= _SCAN_CHUNK:
            return None
        at += _SCAN_CHUNK


def _need_more(buf: bytes, off: int) -> bool:
    try:
        n = rec.peek_length(buf, off)
    except rec.CorruptRecord:
        return False  # let decode report it
    return len(buf) - off < n
