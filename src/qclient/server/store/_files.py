"""Small file helpers: atomic replace, directory fsync, safe names, append-only file sets."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

from qclient.protocol.wire import TOPIC_RE

log = logging.getLogger(__name__)

#: a write failed for lack of space (or quota, or file-size limit): not the store's fault;
#: it can go on once space returns
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: appends buffered per file family rebuilt by recovery (schedule files, id index) before
#: the appending thread writes them itself; the checkpoint writes them every second, so
#: this is reached only above ~40k messages/s (24-byte entries)
SIDE_BUFFER_BYTES = 1 << 20


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (created/renamed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (tmp + fsync + rename + dir fsync)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written."""
    n = os.write(fd, data)  # all of it, almost always
    if n < len(data):
        view = memoryview(data)[n:]
        while view:
            n = os.write(fd, view)
            view = view[n:]


def check_name(name: str, what: str = "topic") -> str:
    """Return ``name`` if it is a valid topic/group name, else raise (TOPIC_RE allows no
    ``.`` or ``/``: no path tricks possible, ``.`` and ``..`` included)."""
    if not isinstance(name, str) or not TOPIC_RE.match(name):
        raise ValueError(f"invalid {what} name")
    return name


def aligned_find(data: bytes, needle: bytes, unit: int, field: int = 0) -> Iterator[int]:
    """Start offsets of the ``unit``-byte entries of ``data`` that hold ``needle`` at byte
    ``field`` of the entry, in order (a C-speed ``bytes.find`` scan, never a Python loop
    over every entry)."""
    i = data.find(needle)
    while i >= 0:
        start = i - field
        if start % unit == 0:
            yield start
            i = data.find(needle, start + unit + field)
        else:
            i = data.find(needle, i + 1)


def check_queue_id(queue_id: int) -> int:
    """Return ``queue_id`` if it is a sane queue number, else raise."""
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or not 0 <= queue_id < 65536:
        raise ValueError("invalid queue id")
    return queue_id


def sync_fds(fds: list[int]) -> None:
    """fsync and close fds returned by :meth:`AppendFiles.take_dirty`."""
    for fd in fds:
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class AppendFiles:
    """A family of append-only files keyed by an int, named ``{key:020d}{suffix}`` in a dir.

    Keeps at most ``max_open`` write fds (LRU); tracks each file's size and which files were
    written since the last :meth:`sync`. All methods must be called under one external lock
    or from one thread, except :meth:`read`, which only reads.

    ``buffer_bytes`` > 0: appends are kept in memory and written together -- by
    :meth:`flush`, :meth:`take_dirty` (so a checkpoint's fsync covers every append made
    before it), :meth:`close`, or once that many bytes are buffered -- instead of one write
    per call. For files rebuilt from the message log after a crash (schedule files, id
    index): what a ``kill -9`` loses of the buffer, recovery re-adds. :meth:`read` and
    :meth:`size` see the buffered appends too.
    """

    def __init__(
        self,
        directory: Path,
        suffix: str,
        unit: int,
        *,
        fsync: bool,
        max_open: int = 64,
        buffer_bytes: int = 0,
    ):
        self.dir = directory
        self.suffix = suffix
        self.unit = unit
        self.fsync = fsync
        self.max_open = max_open
        self.buffer_bytes = buffer_bytes
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._sizes: dict[int, int] = {}  # each file's size, its buffered appends included
        self._on_disk: dict[int, int] = {}  # bytes written to each file
        self._pending: dict[int, list[bytes]] = {}  # appends not written yet, by file
        self._pending_bytes = 0
        # read() takes a file's written size and its pending appends together, so a
        # flush between the two can neither hide nor repeat an append
        self._view = threading.Lock()
        self._dirty: set[int] = set()
        self._dir_dirty = False  # a file was created since the last sync
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, key: int) -> Path:
        return self.dir / f"{key:020d}{self.suffix}"

    def recover(self) -> list[int]:
        """Scan the directory, cut partial units off each file; return the keys, sorted."""
        keys = []
        for p in self.dir.iterdir():
            name = p.name
            if not name.endswith(self.suffix) or not name[: -len(self.suffix)].isdigit():
                if name.endswith(".tmp"):
                    p.unlink(missing_ok=True)
                continue
            key = int(name[: -len(self.suffix)])
            size = p.stat().st_size
            if size % self.unit:
                log.warning("cutting a torn tail of %d bytes off %s", size % self.unit, p)
                size -= size % self.unit
                os.truncate(p, size)
            self._set_size(key, size)
            keys.append(key)
        keys.sort()
        return keys

    def _set_size(self, key: int, size: int) -> None:
        """File ``key`` holds ``size`` bytes on disk and nothing buffered."""
        self._sizes[key] = self._on_disk[key] = size

    def size(self, key: int) -> int:
        return self._sizes.get(key, 0)

    def _fd(self, key: int) -> int:
        fd = self._fds.get(key)
        if fd is not None:
            self._fds.move_to_end(key)
            return fd
        fd = os.open(self.path(key), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._fds[key] = fd
        while len(self._fds) > self.max_open:
            # a dirty file stays in _dirty: take_dirty() reopens it by path for its fsync
            _old, ofd = self._fds.popitem(last=False)
            os.close(ofd)
        return fd

    def append(self, key: int, data: bytes) -> None:
        """Append ``data`` (a whole number of units) to file ``key`` (buffered: see the
        class doc)."""
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = []
        pending.append(data)
        n = len(data)
        self._sizes[key] = self._sizes.get(key, 0) + n
        self._pending_bytes += n
        if self._pending_bytes >= self.buffer_bytes:
            if self.buffer_bytes <= 0:
                self._write(key)
            else:
                self.flush()

    def flush(self) -> None:
        """Write every buffered append to its file (one write per file)."""
        for key in list(self._pending):
            self._write(key)

    def _write(self, key: int) -> None:
        """Write file ``key``'s pending appends; on failure they stay pending and the
        file is cut back to its last whole write."""
        pending = self._pending.get(key)
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        created = key not in self._on_disk
        written = self._on_disk.get(key, 0)
        fd = self._fd(key)
        try:
            write_all(fd, data)
        except OSError:
            # a partial unit would shift every later one: cut back to the last whole one
            os.ftruncate(fd, written)
            raise
        with self._view:
            self._on_disk[key] = written + len(data)
            del self._pending[key]
        self._pending_bytes -= len(data)
        self._dirty.add(key)
        if created:
            self._dir_dirty = True  # made durable by the next sync, not under the caller's lock

    def read(self, key: int, upto: int | None = None) -> bytes:
        """Read file ``key`` from the start up to ``upto`` bytes (whole units only),
        buffered appends included."""
        with self._view:
            on_disk = self._on_disk.get(key, 0)
            pending = self._pending.get(key)
            tail = b"".join(pending) if pending else b""
        limit = on_disk if upto is None else min(upto, on_disk)
        try:
            with open(self.path(key), "rb") as f:
                data = f.read(limit)
        except FileNotFoundError:
            data = b""
        if tail and (upto is None or upto > on_disk):
            data += tail if upto is None else tail[: upto - on_disk]
        return data[: len(data) - len(data) % self.unit]

    def sync(self) -> None:
        """fsync every file written since the last sync."""
        sync_fds(self.take_dirty())

    def take_dirty(self, defer: Callable[[int], bool] | None = None) -> list[int]:
        """Write the buffered appends; then duplicates of the fds written since the last
        call, for :func:`sync_fds` outside the caller's lock (a dup stays valid even if
        the LRU closes the original). A file ``defer(key)`` is true of stays marked
        written, for a later call."""
        self.flush()
        dirty = self._dirty
        if defer is None:
            self._dirty = set()
        else:
            self._dirty = {k for k in dirty if defer(k)}
            dirty -= self._dirty
        dir_dirty, self._dir_dirty = self._dir_dirty, False
        if not self.fsync:
            return []
        fds = []
        for k in dirty:
            if k in self._fds:
                fds.append(os.dup(self._fds[k]))
            elif k in self._sizes:  # evicted from the LRU since it was written
                with contextlib.suppress(FileNotFoundError):
                    fds.append(os.open(self.path(k), os.O_RDONLY))
        if dir_dirty:
            fds.append(os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY))
        return fds

    def _forget(self, key: int) -> None:
        """Close file ``key``'s fd and drop its buffered appends and dirty mark."""
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)
        self._dirty.discard(key)
        with self._view:
            dropped = self._pending.pop(key, None)
        if dropped:
            self._pending_bytes -= sum(map(len, dropped))

    def replace(self, key: int, data: bytes) -> None:
        """Atomically replace file ``key`` with ``data`` (whole units; tmp + fsync + rename);
        its buffered appends are dropped (``data`` is the whole new content)."""
        self._forget(key)
        atomic_write(self.path(key), data, fsync=self.fsync)
        with self._view:
            self._set_size(key, len(data))

    def remove(self, key: int) -> None:
        self._forget(key)
        with self._view:
            self._sizes.pop(key, None)
            self._on_disk.pop(key, None)
        self.path(key).unlink(missing_ok=True)

    def close(self) -> None:
        self.sync()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
