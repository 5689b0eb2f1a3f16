"""Unique message ids: a per-process random prefix, the time and a counter.

The prefix is re-drawn in a forked child (``os.register_at_fork``), so a parent and its
children never hand out the same id even though they share the counter's state.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator

__all__ = ["msg_ids", "new_msg_id"]

_prefix = ""
_counter = itertools.count()


def _reseed() -> None:
    global _prefix, _counter
    _prefix = os.urandom(8).hex()
    _counter = itertools.count()


_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_msg_id() -> str:
    """A 36-character hex id, unique across processes, roughly time-ordered per process."""
    # next() on itertools.count is atomic under the GIL: no lock needed between threads.
    return f"{_prefix}{time.time_ns() // 1_000_000:012x}{next(_counter) & 0xFFFFFFFF:08x}"


def msg_ids() -> Iterator[str]:
    """Ids as ``new_msg_id``'s, for one batch: the clock is read once (half the cost)."""
    head = f"{_prefix}{time.time_ns() // 1_000_000:012x}"
    return (f"{head}{c & 0xFFFFFFFF:08x}" for c in _counter)
