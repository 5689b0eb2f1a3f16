"""Dispatch log: per bucket, the message-log positions that fired (u64 each).

Written after the consume log holding the fired copies is synced, so a crash can only
re-fire (duplicate), never lose. On recovery, a bucket's wheel entries minus this set are
what is still due. When a fully fired bucket is cleaned up, its dispatch file outlives its
schedule file by a dedupe window (``mtime`` marks the cleanup), so "has this id fired?"
stays answerable for as long as the id can be looked up -- even if a late message
recreates the bucket.

On recovery a tail of zero entries is cut too: a crash after a file grew but before its
data reached the disk leaves zeros (XFS, ext4 ``data=writeback``), and a zero entry
would mark the message at position 0 as fired -- a loss. Cutting a real 0 entry can only
fire that one message again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from array import array
from pathlib import Path

from qclient.server.store._files import AppendFiles, aligned_find

log = logging.getLogger(__name__)
_TAIL_CHUNK = 1 << 16


class DispatchLog(AppendFiles):
    """Per-bucket fired-position files."""

    def __init__(self, directory: Path, *, fsync: bool):
        super().__init__(directory, ".dsp", 8, fsync=fsync)

    def recover(self) -> list[int]:
        """Scan the directory, cut partial entries and zero-filled tails; the keys, sorted."""
        keys = super().recover()
        for k in keys:
            size = self.size(k)
            end = _zero_tail_start(self.path(k), size)
            if end < size:
                log.warning("cutting a torn tail of %d zero bytes off %s", size - end, self.path(k))
                os.truncate(self.path(k), end)
                self._set_size(k, end)
        return keys

    def add(self, bucket: int, positions: list[int]) -> None:
        self.append(bucket, array("Q", positions).tobytes())

    def positions(self, bucket: int) -> set[int]:
        a = array("Q")
        a.frombytes(self.read(bucket))
        return set(a)

    def contains(self, bucket: int, position: int) -> bool:
        """Whether ``position`` fired (an aligned C-speed search of the bucket's file)."""
        data = self.read(bucket)
        return next(aligned_find(data, struct.pack("<Q", position), 8), None) is not None

    def mtime(self, bucket: int) -> float | None:
        try:
            return os.path.getmtime(self.path(bucket))
        except FileNotFoundError:
            return None

    def touch(self, bucket: int) -> None:
        """Mark the file as orphaned now (its bucket's schedule file was removed)."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path(bucket))


def _zero_tail_start(path: Path, size: int) -> int:
    """Where the trailing run of all-zero 8-byte entries of the file starts."""
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - _TAIL_CHUNK)
            f.seek(start)
            chunk = f.read(end - start).rstrip(b"\0")
            if chunk:
                last = start + len(chunk)  # one past the last non-zero byte
                return min(size, -(-last // 8) * 8)
            end = start
    return 0
