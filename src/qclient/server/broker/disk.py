"""Disk-space guard: a broker whose data directory runs short of space refuses new
messages before its store runs out.

Below ``min_free_bytes`` free (``statvfs`` of the data directory, re-read at most every
``_TTL_S``), ``POST /v1/send`` answers 507 ``DISK_FULL``, a retryable code: the producer
moves to another broker. The reserve is what keeps the broker useful meanwhile: messages
already stored still fire into the consume logs, the dispatch log and checkpoints still
get written, and consumers are served. Sends are accepted again as soon as space returns
(RocketMQ's ``diskMaxUsedSpaceRatio`` guard, by bytes instead of a ratio).
"""

from __future__ import annotations

import os
import time

from qclient.protocol.wire import ErrorCode

from .._http import ApiError

__all__ = ["DiskGuard"]

_TTL_S = 0.05  # a statvfs per request would be cheap, but a burst needs only one
_MIB = 1 << 20


class DiskGuard:
    """Free-space check of one data directory."""

    def __init__(self, path: str, min_free_bytes: int, broker_name: str) -> None:
        self.path = path
        self.min_free_bytes = min_free_bytes
        self._name = broker_name
        self._free = -1
        self._read_at = -1.0
        self.refusals = 0

    def free_bytes(self) -> int:
        """Bytes free for an unprivileged writer (cached for ``_TTL_S``)."""
        now = time.monotonic()
        if now - self._read_at >= _TTL_S:
            st = os.statvfs(self.path)
            self._free = st.f_bavail * st.f_frsize
            self._read_at = now
        return self._free

    def check(self) -> None:
        """Raise ApiError(507, DISK_FULL) when free space is below the reserve."""
        if self.min_free_bytes <= 0:
            return
        free = self.free_bytes()
        if free < self.min_free_bytes:
            self.refusals += 1
            raise ApiError(
                507,
                ErrorCode.DISK_FULL,
                f"broker {self._name}: disk full: {free / _MIB:.1f} MiB free in its data "
                f"directory, below the reserve of {self.min_free_bytes / _MIB:.1f} MiB",
            )
