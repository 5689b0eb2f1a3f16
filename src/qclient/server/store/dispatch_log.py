"""Dispatch log: per bucket, the message-log positions that fired (u64 each).

Written after the consume log holding the fired copies is synced, so a crash can only
re-fire (duplicate), never lose. On recovery, a bucket's wheel entries minus this set are
what is still due. When a fully fired bucket is cleaned up, its dispatch file outlives its
schedule file by a dedupe window (``mtime`` marks the cleanup), so "has this id fired?"
stays answerable for as long as the id can be looked up -- even if a late message
recreates the bucket.
"""

from __future__ import annotations

import contextlib
import os
import struct
from array import array
from pathlib import Path

from qclient.server.store._files import AppendFiles, aligned_find


class DispatchLog(AppendFiles):
    """Per-bucket fired-position files."""

    def __init__(self, directory: Path, *, fsync: bool):
        super().__init__(directory, ".dsp", 8, fsync=fsync)

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
