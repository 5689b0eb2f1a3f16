"""Fired messages are pullable before the consume log's fsync, and a crash that takes
back an unsynced tail someone already pulled and committed loses nothing."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from tests.server.store.conftest import visible, wait_until

from qclient.server.store import NewMessage, wall_clock_ms

INDEX = struct.Struct("<QI")


def test_visible_and_listeners_woken_before_the_fsync(make_store) -> None:
    # a long sync interval: the second fire waits ~1 s for its group fsync
    s = make_store(fsync=True, sync_interval_ms=1000)
    woken: list[set[str]] = []
    s.add_fire_listener(woken.append)
    s.submit([NewMessage("t", 0, "m0", b"x", wall_clock_ms())]).result(10)
    wait_until(lambda: s.stats()["consume_fsyncs"] >= 1 and woken)
    synced = s.stats()["consume_fsyncs"]
    s.submit([NewMessage("t", 0, "m1", b"x", wall_clock_ms() + 50)]).result(10)
    wait_until(lambda: visible(s, "t", 1) == 2, timeout=1.5)
    assert len(woken) >= 2
    assert s.stats()["consume_fsyncs"] == synced, "became visible only after its fsync"
    assert [m.msg_id for m in s.pull("t", 0, 1, 10)] == ["m1"]


def test_visible_only_after_the_fsync_when_configured(make_store) -> None:
    s = make_store(fsync=True, visible_before_sync=False)
    s.submit([NewMessage("t", 0, "m0", b"x", wall_clock_ms())]).result(10)
    wait_until(lambda: visible(s, "t", 1) == 1)
    assert s.stats()["consume_fsyncs"] >= 1


def _lose_tail(data: Path, keep: int) -> None:
    """What an OS crash can do to a consume log that was pulled before its fsync: the
    records from ``keep`` on are gone, and so are their dispatch records (written only
    after the fsync). Dispatch files are removed whole: recovery re-adds the survivors'."""
    qdir = data / "consume" / "t" / "0"
    with open(qdir / "index", "r+b") as f:
        pos, _ = INDEX.unpack(os.pread(f.fileno(), INDEX.size, keep * INDEX.size))
        f.truncate(keep * INDEX.size)
    os.truncate(qdir / "log", pos)
    for p in (data / "dispatch").iterdir():
        p.unlink()


def test_commit_past_a_lost_tail_is_clamped_and_nothing_is_lost(make_store, tmp_path) -> None:
    data = tmp_path / "data"
    s = make_store(data_dir=data)
    now = wall_clock_ms()
    s.submit([NewMessage("t", 0, f"m{i}", b"x", now) for i in range(20)]).result(10)
    wait_until(lambda: visible(s, "t", 1) == 20)
    s.commit_offset("g", "t", 0, 20)  # the consumer pulled and committed all 20
    s.close()
    _lose_tail(data, 10)
    s2 = make_store(data_dir=data)
    assert s2.committed_offset("g", "t", 0) == 10
    assert s2.stats()["offsets_clamped"] == 1
    wait_until(lambda: visible(s2, "t", 1) == 20)  # the 10 lost copies fire again
    again = s2.pull("t", 0, s2.committed_offset("g", "t", 0), 100)
    assert sorted(m.msg_id for m in again) == sorted(f"m{i}" for i in range(10, 20))
    assert [m.msg_id for m in s2.pull("t", 0, 0, 10)] == [f"m{i}" for i in range(10)]
