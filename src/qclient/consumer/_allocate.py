"""Queue allocation among the members of a consumer group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["allocate_averagely"]

Q = TypeVar("Q")


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], me: str) -> list[Q]:
    """``me``'s contiguous share of ``queues`` (both sorted the same way by every member):
    RocketMQ's ``AllocateMessageQueueAveragely``, the first ``len(queues) % len(members)``
    members one queue more; ``[]`` when ``me`` is not a member or there are more members
    than queues and ``me`` comes late."""
    if me not in members or not queues:
        return []
    n, m = len(queues), len(members)
    idx = members.index(me)
    mod = n % m
    size = (1 if idx < n else 0) if n <= m else n // m + (1 if idx < mod else 0)
    start = idx * size if mod > 0 and idx < mod else idx * size + mod
    return list(queues[start : start + max(0, min(size, n - start))])
