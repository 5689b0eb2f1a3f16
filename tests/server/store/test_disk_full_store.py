"""The store on a disk that is really full: a group that cannot be written fails with
DiskFullError, leaves nothing behind, and the store goes on once space returns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.helpers import wait_until
from tests.server.conftest import fill

from qclient.server.store import (
    DelayStore,
    DiskFullError,
    NewMessage,
    StoreConfig,
    wall_clock_ms,
)


def _msgs(prefix: str, n: int, size: int) -> list[NewMessage]:
    return [NewMessage("t", 0, f"{prefix}{i}", bytes(size), 0) for i in range(n)]


def test_enospc_fails_the_group_cleanly_and_recovers(tmp_path, small_fs) -> None:
    mnt = small_fs(tmp_path / "disk", 4)
    cfg = StoreConfig(data_dir=mnt / "store", bucket_ms=1000, load_ahead_ms=500)
    s = DelayStore(cfg)
    s.open()
    try:
        s.submit(_msgs("ok", 10, 1000)).result(10)
        end = s.stats()["log_bytes"]
        ballast = fill(mnt, 200_000)
        with pytest.raises(DiskFullError, match="no space left"):
            s.submit(_msgs("big", 50, 10_000)).result(10)  # ~500 KB into ~200 KB
        assert s.stats()["log_bytes"] == end  # the partial write was cut off
        ballast.unlink()
        res = s.submit(_msgs("big", 50, 10_000)).result(10)  # same ids: not duplicates
        assert not any(r.duplicate for r in res)
        total = s.stats()["log_bytes"]
    finally:
        s.close()
    s2 = DelayStore(cfg)
    s2.open()
    try:
        assert s2.stats().get("torn_bytes_cut", 0) == 0
        assert s2.stats()["log_bytes"] == total > end
    finally:
        s2.close()


def test_firing_on_a_full_disk_waits_for_space_and_loses_nothing(tmp_path, small_fs) -> None:
    """The disk fills up completely (another process, say) while messages are due: firing
    and the syncer wait without half-writing anything, and catch up once space returns."""
    mnt = small_fs(tmp_path / "disk", 4)
    cfg = StoreConfig(data_dir=mnt / "store", bucket_ms=1000, load_ahead_ms=500)
    s = DelayStore(cfg)
    s.open()
    try:
        due = wall_clock_ms() + 1500
        msgs = [NewMessage("t", i % 4, f"m{i}", bytes(2000), due) for i in range(300)]
        s.submit(msgs).result(10)
        ballast = fill(mnt, 0)
        # due meanwhile: firing needs space for the consume logs, and finds none
        wait_until(
            lambda: s.stats().get("fire_errors", 0) + s.stats().get("no_space_errors", 0),
            10,
            "firing to meet the full disk",
        )
        assert s.stats().get("sync_errors", 0) == 0
        ballast.unlink()
        wait_until(lambda: _visible(s) >= 300, 15, "every message to fire once space returned")
        ids = [m.msg_id for q in range(4) for m in s.pull("t", q, 0, 1000)]
        assert sorted(set(ids)) == sorted(m.msg_id for m in msgs)
        assert s.stats().get("sync_errors", 0) == 0
        s.submit([NewMessage("t", 0, "after", b"x", 0)]).result(10)  # not broken
    finally:
        s.close()


def _visible(s: DelayStore) -> int:
    return sum(s.max_offset("t", q) for q in range(4))


def test_file_size_limit_fails_the_group_cleanly(tmp_path) -> None:
    """Without root (no tmpfs): RLIMIT_FSIZE in a child process makes writes past the
    limit fail with EFBIG, which the store treats as a full disk."""
    limit = 200_000
    r = subprocess.run(
        [sys.executable, "-m", "tests.server.store._fsize_child", str(tmp_path / "s"), str(limit)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "no space left" in out["error"]
    assert out["after"] == out["before"] <= limit  # the failed group left nothing behind
    s = DelayStore(StoreConfig(data_dir=tmp_path / "s", bucket_ms=1000, fsync=False))
    s.open()
    try:
        assert s.stats().get("torn_bytes_cut", 0) == 0
        assert s.stats()["log_bytes"] == out["end"]
        assert s.submit([NewMessage("t", 0, "small", b"x", 0)]).result(10)[0].duplicate
    finally:
        s.close()
