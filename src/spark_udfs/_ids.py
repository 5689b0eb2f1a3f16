"""Deterministic message ids, so a retried task or a replayed micro-batch re-sends the
same ids and the broker deduplicates them.

An id is ``<scope digest>-<partition>-<row>``: the scope is the streaming query id and
batch id (the query id survives restarts from a checkpoint), or a job-level id for a
batch write; the partition id and the row's position in its partition complete it.
"""

from __future__ import annotations

import hashlib
import uuid

__all__ = ["IdScope", "batch_scope", "new_job_id", "streaming_scope"]


def new_job_id() -> str:
    """A fresh job-level id for one batch write (made once on the driver)."""
    return uuid.uuid4().hex


class IdScope:
    """Derives the ids of one (scope, partition): ``ids(start, n)`` for rows start..start+n."""

    __slots__ = ("_prefix", "digest")

    def __init__(self, scope: str, partition_id: int) -> None:
        # 16 hex digits (64 bits) of the scope keep ids short and collisions negligible.
        self.digest = hashlib.blake2b(scope.encode(), digest_size=8).hexdigest()
        self._prefix = f"{self.digest}-{partition_id}-"

    def id(self, row: int) -> str:
        return f"{self._prefix}{row}"

    def ids(self, start: int, n: int) -> list[str]:
        p = self._prefix
        return [f"{p}{i}" for i in range(start, start + n)]


def streaming_scope(query_id: str, batch_id: int | str) -> str:
    """The scope of one micro-batch of a streaming query."""
    return f"q:{query_id}:{batch_id}"


def batch_scope(job_id: str) -> str:
    """The scope of one batch write job."""
    return f"j:{job_id}"
