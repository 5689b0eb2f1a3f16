"""Scheduled messages by deliver second (the broker's ``scheduled_messages_due`` gauge):
the counting structure itself, and a store's counts through stores, cancels,
reschedules, fires and a restart."""

from __future__ import annotations

import time
from pathlib import Path

from qclient.server.store import DelayStore, NewMessage, StoreConfig
from qclient.server.store.due import DUE_BOUNDS_S, DueCounts

NOW = 1_800_000_000_000  # a whole minute (divisible by 60 000)
MIN = 60_000
HOUR = 3_600_000


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _open(path: Path, clock: Clock) -> DelayStore:
    cfg = StoreConfig(data_dir=path, bucket_ms=1000, load_ahead_ms=500, fsync=False)
    store = DelayStore(cfg, clock_ms=clock)
    store.open()
    return store


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _by_label(counts: list[int]) -> dict[str, int]:
    labels = [f"{b}s" for b in DUE_BOUNDS_S] + ["inf"]
    return dict(zip(labels, counts, strict=True))


def test_within_is_cumulative_by_the_second_and_counts_overdue_everywhere():
    due = DueCounts()
    due.add([NOW - 10_000])  # overdue
    due.add([NOW + 3_000, NOW + 5_999])  # second NOW+5: within 5 s
    due.add([NOW + 6_000])  # second NOW+6: not within 5 s
    due.add([NOW + 59_000, NOW + 61_000, NOW + 299_000, NOW + 90_000 * 1000])
    got = _by_label(due.within(NOW))
    assert got == {
        "5s": 3,
        "60s": 5,
        "300s": 7,
        "900s": 7,
        "3600s": 7,
        "14400s": 7,
        "28800s": 7,
        "86400s": 7,
        "inf": 8,
    }
    # a bound that cuts a minute in the middle counts that minute's seconds up to it
    assert due.within(NOW + 30_000)[:2] == [4, 6]  # 5 s: up to NOW+35 s; 60 s: NOW+90 s
    due.add([NOW + 3_000, NOW + 5_999, NOW - 10_000], -1)
    assert due.within(NOW)[0] == 0
    assert due.within(NOW)[-1] == 5


def test_a_minute_whose_counts_return_to_zero_is_forgotten():
    due = DueCounts()
    stamps = [NOW + i * 1000 for i in range(120)]
    due.add(stamps)
    due.add(stamps, -1)
    assert due.within(NOW) == [0] * (len(DUE_BOUNDS_S) + 1)
    assert not due._totals and not due._seconds


def test_store_counts_follow_stores_cancels_reschedules_fires_and_a_restart(tmp_path: Path):
    clock = Clock(NOW)
    soon = [NewMessage("t", i % 4, f"soon-{i}", b"x", NOW + 2_000) for i in range(3)]
    mins = [NewMessage("t", i % 4, f"min-{i}", b"x", NOW + 4 * MIN) for i in range(2)]
    later = [NewMessage("t", i % 4, f"later-{i}", b"x", NOW + 2 * HOUR) for i in range(4)]
    store = _open(tmp_path / "d", clock)
    try:
        store.submit(soon + mins + later).result(10)
        assert _by_label(store.due_within()) == {
            "5s": 3,
            "60s": 3,
            "300s": 5,
            "900s": 5,
            "3600s": 5,
            "14400s": 9,
            "28800s": 9,
            "86400s": 9,
            "inf": 9,
        }
        assert store.cancel("t", "later-0", NOW + 2 * HOUR).result(10).cancelled
        assert store.due_within()[-1] == 8
        assert store.reschedule("t", "min-0", NOW + 3_000).rescheduled
        assert store.due_within()[:3] == [4, 4, 5]
        clock.now += 4_000  # soon-* and min-0 come due and fire
        _wait(lambda: store.stats()["fired"] == 4)
        assert store.due_within()[:3] == [0, 0, 1]
        assert store.due_within()[-1] == 4
    finally:
        store.close()
    clock.now += MIN
    store = _open(tmp_path / "d", clock)
    try:
        # the far bucket is not loaded: counted from its schedule file at open, each
        # message once, the cancelled one not at all
        assert _by_label(store.due_within()) == {
            "5s": 0,
            "60s": 0,
            "300s": 1,
            "900s": 1,
            "3600s": 1,
            "14400s": 4,
            "28800s": 4,
            "86400s": 4,
            "inf": 4,
        }
        clock.now = NOW + 4 * MIN + 1_000
        _wait(lambda: store.due_within()[-1] == 3)
    finally:
        store.close()
