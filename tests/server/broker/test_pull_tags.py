"""A pull's tag filter where the broker reads the queue (``PullHandlers.read_from``): only
matching messages are served, the offsets move past the skipped ones but never past a
matching message left unserved (not due yet for a plain pull, or over the limit)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from qclient.server.broker.config import BrokerConfig
from qclient.server.broker.pull import PullHandlers
from qclient.server.store import DelayStore, NewMessage, StoreConfig, wall_clock_ms

#: by offset (the consume log's order is the firing order); the last two are due later
TAGS = ["B", "A", "B", "A", "B", None, "A", "B"]
LATER = {6: 3000, 7: 3100}


class Handlers(PullHandlers):
    def __init__(self, store: DelayStore, data_dir: Path) -> None:
        self.store = store
        self.config = BrokerConfig("b", str(data_dir), [])
        self.counters = defaultdict(int)


@pytest.fixture
def handlers(tmp_path: Path) -> Iterator[Handlers]:
    # fired up to 5 s ahead: offsets 6 and 7 are in the queue, not due yet
    cfg = StoreConfig(tmp_path / "data", bucket_ms=1000, load_ahead_ms=500, fsync=False)
    cfg.fire_ahead_ms = 5000
    store = DelayStore(cfg)
    store.open()
    try:
        now = wall_clock_ms()
        msgs = [
            NewMessage("t", 0, f"m{i}", b"x", now + LATER.get(i, 0), tags=tag)
            for i, tag in enumerate(TAGS)
        ]
        for m in msgs:  # one at a time: offsets in this order
            store.submit([m]).result(10)
        deadline = time.monotonic() + 10
        while store.max_offset("t", 0) < len(TAGS):
            assert time.monotonic() < deadline, "not fired"
            time.sleep(0.01)
        yield Handlers(store, tmp_path)
    finally:
        store.close()


def _read(h: Handlers, limit: int, hold: bool, tags: set[str] | None) -> tuple[list[int], dict]:
    ends: dict[int, int] = {}
    got, _due = h.read_from(
        "t", {0: 0}, limit, hold, None if tags is None else frozenset(tags), ends
    )
    return [m.offset for m in got], ends


def test_a_holding_pull_gets_the_matching_ones_and_the_offset_after_the_rest(handlers):
    assert _read(handlers, 10, True, {"A"}) == ([1, 3, 6], {0: 8})
    assert _read(handlers, 10, True, {"A", "B"}) == ([0, 1, 2, 3, 4, 6, 7], {})
    assert _read(handlers, 10, True, None) == (list(range(8)), {})


def test_the_offset_stops_at_a_matching_message_not_served(handlers):
    # a plain pull stops at the first matching message not due: skipped 4 and 5 only
    assert _read(handlers, 10, False, {"A"}) == ([1, 3], {0: 6})
    # over the limit: nothing skipped past the last one served
    assert _read(handlers, 1, True, {"A"}) == ([1], {})
    assert _read(handlers, 2, True, {"B"}) == ([0, 2], {})
    # nothing matches: every offset skipped
    assert _read(handlers, 10, True, {"C"}) == ([], {0: 8})
