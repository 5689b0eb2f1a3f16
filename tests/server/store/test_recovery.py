"""Restart, crash and torn-tail recovery of the DelayStore."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from tests.server.store.conftest import FakeClock, msg, pull_all, visible, wait_until

from qclient.server.store import wall_clock_ms

ROOT = Path(__file__).resolve().parents[3]


def test_clean_restart_no_refire_no_loss(make_store, tmp_path) -> None:
    s = make_store(fsync=True)
    now = wall_clock_ms()
    s.submit([msg(i, now + (i % 50)) for i in range(500)]).result(10)
    far = s.submit([msg(i, now + 3_600_000) for i in range(500, 600)]).result(10)
    wait_until(lambda: visible(s, "t") == 500)
    s.commit_offset("g", "t", 0, 100)
    s.close()
    s2 = make_store(fsync=True)
    st = s2.stats()
    assert st["wheel_size"] == 0  # everything due was already dispatched
    assert st["fired"] == 0
    assert visible(s2, "t") == 500
    assert s2.committed_offset("g", "t", 0) == 100
    ids = Counter(f.msg_id for f in pull_all(s2, "t"))
    assert len(ids) == 500 and max(ids.values()) == 1
    # the far-future ones are still there: dedupe remembers them, cancel finds them
    assert s2.submit([msg(550, 0)]).result(10)[0].duplicate
    assert s2.cancel("t", "m550", far[50].deliver_at_ms).result(10).cancelled


def test_overdue_at_restart_fires_at_once(make_store) -> None:
    clock = FakeClock(4_000_000_000)
    s = make_store(clock=clock)
    s.submit([msg(i, clock.now + 10_000 + i) for i in range(200)]).result(10)
    assert s.stats()["wheel_size"] == 0
    s.close()
    clock.advance(60_000)
    s2 = make_store(clock=clock)
    wait_until(lambda: visible(s2, "t") == 200)
    fired = pull_all(s2, "t")
    assert all(f.fired_at_ms == clock.now for f in fired)


def test_cancel_survives_restart(make_store) -> None:
    clock = FakeClock(5_000_000_000)
    s = make_store(clock=clock, fsync=True)
    res = s.submit(
        [msg(0, clock.now + 300), msg(1, clock.now + 300), msg(2, clock.now + 50_000)]
    ).result(10)
    assert s.cancel("t", "m0", res[0].deliver_at_ms).result(10).cancelled
    assert s.cancel("t", "m2", res[2].deliver_at_ms).result(10).cancelled
    s.close()
    clock.advance(100_000)
    s2 = make_store(clock=clock, fsync=True)
    wait_until(lambda: visible(s2, "t") == 1)
    assert [f.msg_id for f in pull_all(s2, "t")] == ["m1"]
    assert s2.cancel("t", "m0", res[0].deliver_at_ms).result(10).reason == "already_cancelled"
    assert s2.cancel("t", "m2", res[2].deliver_at_ms).result(10).reason == "already_cancelled"
    assert s2.cancel("t", "m1", res[1].deliver_at_ms).result(10).reason == "already_fired"
    s2.close()
    s3 = make_store(clock=clock)  # the tombstones also came back from the checkpointed state
    time.sleep(0.1)
    assert visible(s3, "t") == 1


def _segment(data_dir: Path) -> Path:
    [seg] = sorted((data_dir / "commitlog").iterdir())
    return seg


def test_torn_tail_garbage_is_cut(make_store, tmp_path) -> None:
    clock = FakeClock(6_000_000_000)
    s = make_store(clock=clock)
    s.submit([msg(i, clock.now + 10_000) for i in range(100)]).result(10)
    end = s.stats()["log_bytes"]
    s.close()
    with open(_segment(tmp_path / "data"), "ab") as f:
        f.write(os.urandom(333))
    s2 = make_store(clock=clock)
    st = s2.stats()
    assert st["log_bytes"] == end and st["torn_bytes_cut"] == 333
    s2.submit([msg(100, clock.now + 10_000)]).result(10)
    s2.close()
    clock.advance(20_000)
    s3 = make_store(clock=clock)
    wait_until(lambda: visible(s3, "t") == 101)
    assert len({f.msg_id for f in pull_all(s3, "t")}) == 101


def test_torn_tail_mid_record_is_cut(make_store, tmp_path) -> None:
    clock = FakeClock(7_000_000_000)
    s = make_store(clock=clock)
    s.submit([msg(i, clock.now + 10_000) for i in range(10)]).result(10)
    cut_at = s.stats()["log_bytes"]
    s.submit([msg(10, clock.now + 10_000)]).result(10)
    s.close()
    # forget the replay checkpoint too, as if the crash came before it advanced
    (tmp_path / "data" / "checkpoint.json").unlink()
    for p in (tmp_path / "data" / "schedule").iterdir():
        p.unlink()
    os.truncate(_segment(tmp_path / "data"), cut_at + 20)
    clock.advance(20_000)
    s2 = make_store(clock=clock)
    assert s2.stats()["log_bytes"] == cut_at
    wait_until(lambda: visible(s2, "t") == 10)
    assert "m10" not in {f.msg_id for f in pull_all(s2, "t")}
    assert not s2.submit([msg(10, clock.now)]).result(10)[0].duplicate  # it was never stored


def test_consume_log_torn_tail(make_store, tmp_path) -> None:
    s = make_store()
    s.submit([msg(0, 0, topic="c"), msg(4, 0, topic="c")]).result(10)
    wait_until(lambda: s.max_offset("c", 0) == 2)
    s.close()
    qdir = tmp_path / "data" / "consume" / "c" / "0"
    with open(qdir / "log", "ab") as f:
        f.write(b"\x51\x44\x51\x31garbage")
    with open(qdir / "index", "ab") as f:
        f.write(b"\x01\x02\x03")  # partial index entry
    s2 = make_store()
    assert s2.max_offset("c", 0) == 2
    assert [f.msg_id for f in s2.pull("c", 0, 0, 10)] == ["m0", "m4"]
    s2.submit([msg(8, 0, topic="c")]).result(10)
    wait_until(lambda: s2.max_offset("c", 0) == 3)
    assert [f.offset for f in s2.pull("c", 0, 0, 10)] == [0, 1, 2]


def test_bucket_loading_race(make_store) -> None:
    """Messages landing in the bucket being loaded are neither lost nor loaded twice."""
    clock = FakeClock(8_000_000_000)  # bucket aligned
    s = make_store(clock=clock, bucket_ms=1000, load_ahead_ms=0)
    target = clock.now + 5_000
    s.submit([msg(i, target + i) for i in range(100)]).result(10)
    entered, release = threading.Event(), threading.Event()
    orig = s._files.slog.entries

    def slow_entries(bucket: int, upto: int | None = None):
        if bucket == target // 1000:
            entered.set()
            assert release.wait(10)
        return orig(bucket, upto)

    s._files.slog.entries = slow_entries  # type: ignore[method-assign]
    clock.advance(5_000)  # the loader now loads the bucket ...
    assert entered.wait(5)
    s.submit([msg(i, target + i) for i in range(100, 200)]).result(10)  # ... during the load
    assert s.stats()["wheel_size"] >= 100
    release.set()
    clock.advance(1_000)
    wait_until(lambda: visible(s, "t") == 200)
    time.sleep(0.1)
    ids = Counter(f.msg_id for f in pull_all(s, "t"))
    assert len(ids) == 200 and max(ids.values()) == 1


def test_fully_fired_buckets_are_removed(make_store, tmp_path) -> None:
    cfg = {"bucket_ms": 100, "load_ahead_ms": 50, "checkpoint_interval_ms": 50}
    s = make_store(retain_fired_ms=0, dedupe_window_ms=1000, **cfg)
    now = wall_clock_ms()
    res = s.submit([msg(i, now + i) for i in range(300)]).result(10)
    wait_until(lambda: visible(s, "t") == 300)
    sched, dispatch = tmp_path / "data" / "schedule", tmp_path / "data" / "dispatch"
    wait_until(lambda: not any(sched.iterdir()), timeout=10)
    # the dispatch files outlive their buckets by a dedupe window: "fired" stays answerable
    assert s.cancel("t", "m5", res[5].deliver_at_ms).result(10).reason == "already_fired"
    wait_until(lambda: not any(dispatch.iterdir()), timeout=10)
    s.close()
    s2 = make_store(**cfg)
    time.sleep(0.2)
    assert visible(s2, "t") == 300
    assert s2.stats()["fired"] == 0


def _child(data_dir: Path, n: int, spread_ms: int, *extra: str) -> subprocess.Popen[str]:
    args = [str(data_dir), str(n), str(spread_ms), *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.server.store._crash_child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def _read_until(proc: subprocess.Popen[str], pred, timeout: float = 60) -> list[str]:
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line.strip())
        if pred(line.strip()):
            return lines
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"child did not get there: {lines[-3:]}")


@pytest.mark.parametrize("kill_when", ["acked", "firing"])
def test_kill_9_loses_nothing(make_store, tmp_path, kill_when: str) -> None:
    n = 3000
    data_dir = tmp_path / "data"
    proc = _child(data_dir, n, spread_ms=1500)
    try:
        if kill_when == "acked":
            lines = _read_until(proc, lambda ln: ln == "ACKED")
        else:
            lines = _read_until(
                proc, lambda ln: ln.startswith("FIRED") and int(ln.split()[1]) >= n // 2
            )
        acked = sum(int(ln.split()[2]) for ln in lines if ln.startswith("ACK "))
        assert acked == n
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    s = make_store(data_dir=data_dir, fsync=True)
    wait_until(lambda: len({f.msg_id for f in pull_all(s, "t")}) == n, timeout=20)
    fired = Counter(f.msg_id for f in pull_all(s, "t"))
    dups = sum(fired.values()) - n
    assert dups <= n // 100, f"{dups} duplicates"


def test_kill_9_while_submitting_keeps_every_ack(make_store, tmp_path) -> None:
    data_dir = tmp_path / "data"
    proc = _child(data_dir, 200_000, 1000, "stream")
    try:
        acked: list[tuple[int, int]] = []

        def enough(ln: str) -> bool:
            if ln.startswith("ACK "):
                acked.append((int(ln.split()[1]), int(ln.split()[2])))
            return sum(c for _, c in acked) >= 3000

        _read_until(proc, enough)
        os.kill(proc.pid, signal.SIGKILL)  # more batches are in flight right now
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    want = {f"m{j}" for first, count in acked for j in range(first, first + count)}
    s = make_store(data_dir=data_dir, fsync=True)
    wait_until(lambda: want <= {f.msg_id for f in pull_all(s, "t")}, timeout=20)
    fired = Counter(f.msg_id for f in pull_all(s, "t"))
    assert sum(fired.values()) - len(fired) <= len(fired) // 100


def test_kill_9_with_buffered_schedule_and_index_entries(make_store, tmp_path) -> None:
    """Schedule and id-index entries wait in memory for the checkpoint; a kill -9 before it
    loses them all, and recovery rebuilds both from the message log."""
    n = 1000
    data_dir = tmp_path / "data"
    proc = _child(data_dir, n, 120_000, "buffered")
    try:
        _read_until(proc, lambda ln: ln == "ACKED")
        # acknowledged, yet nothing of the derived entries is on disk
        for sub in ("ids", "schedule"):
            assert sum(p.stat().st_size for p in (data_dir / sub).iterdir()) == 0
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    s = make_store(data_dir=data_dir, fsync=True)
    now = wall_clock_ms()
    states = {}
    for j in range(n):
        status = s.lookup("t", f"m{j}")
        assert status is not None, f"m{j} not found after recovery"
        states[j] = (status.state, status.deliver_at_ms)
    # due in more than a few seconds: still scheduled, at the time it was given
    later = [j for j, (_, at) in states.items() if at > now + 5000]
    assert len(later) > n // 2
    assert all(states[j][0] == "scheduled" for j in later)
    entries = sum(p.stat().st_size for p in (data_dir / "schedule").iterdir()) // 24
    assert entries >= n  # the recovered schedule files are written by the open's checkpoint


def test_many_segments_roll_fire_and_rebuild_dedupe(make_store, tmp_path) -> None:
    clock = FakeClock(9_000_000_000)
    cfg = {"segment_bytes": 4096, "dedupe_max_ids": 100}
    s = make_store(clock=clock, **cfg)
    for i in range(0, 500, 50):
        s.submit([msg(j, clock.now + 10_000 + j) for j in range(i, i + 50)]).result(10)
    segments = sorted((tmp_path / "data" / "commitlog").iterdir())
    assert len(segments) > 10
    s.close()
    clock.advance(1_000)
    s2 = make_store(clock=clock, **cfg)
    st = s2.stats()
    assert st["dedupe_ids"] == 100  # only the newest ids, read from the last segments
    assert s2.submit([msg(499, 0)]).result(10)[0].duplicate
    assert s2.submit([msg(400, 0)]).result(10)[0].duplicate
    assert not s2.submit([msg(0, clock.now + 20_000, topic="u")]).result(10)[0].duplicate
    clock.advance(20_000)
    wait_until(lambda: visible(s2, "t") == 500)
    fired = pull_all(s2, "t")
    assert sorted(int(f.msg_id[1:]) for f in fired) == list(range(500))
    assert all(len(f.body) == 100 for f in fired)


def test_unreadable_meta_fails_open_cleanly(make_store, tmp_path) -> None:
    from qclient.server.store import StoreError

    s = make_store()
    s.close()
    (tmp_path / "data" / "meta.json").write_text("{not json")
    with pytest.raises(StoreError, match="cannot open"):
        make_store()
    (tmp_path / "data" / "meta.json").write_text('{"version": 1, "bucket_ms": 1000}')
    make_store()  # the failed open released the directory lock


def test_old_segments_are_removed_once_nothing_needs_them(make_store, tmp_path) -> None:
    cfg = {
        "segment_bytes": 4096,
        "bucket_ms": 100,
        "load_ahead_ms": 50,
        "checkpoint_interval_ms": 50,
        "retain_fired_ms": 0,
        "dedupe_window_ms": 0,
    }
    s = make_store(**cfg)
    commitlog = tmp_path / "data" / "commitlog"
    now = wall_clock_ms()
    for i in range(0, 300, 30):
        s.submit([msg(j, now + j) for j in range(i, i + 30)]).result(10)
    # more than 10 segments written (retention may already be removing the first ones)
    assert s.stats()["log_bytes"] > 10 * cfg["segment_bytes"]
    wait_until(lambda: visible(s, "t") == 300)
    wait_until(lambda: len(list(commitlog.iterdir())) == 1, timeout=10)  # the active one
    assert len(pull_all(s, "t")) == 300  # the consume logs hold their own copies
    # a far-future message pins its segment (and the ones after it)
    later = wall_clock_ms() + 1500
    s.submit([msg(1000, later)]).result(10)
    s.submit([msg(j, now) for j in range(1001, 1100)]).result(10)  # rolls more segments
    wait_until(lambda: visible(s, "t") == 399)
    # retention runs on the syncer thread after checkpoints: waited for, not slept on
    wait_until(lambda: s.stats()["segments_removed"] > 10, timeout=10)
    s.close()
    s2 = make_store(**cfg)
    wait_until(lambda: visible(s2, "t") == 400, timeout=10)
    assert "m1000" in {f.msg_id for f in pull_all(s2, "t")}
