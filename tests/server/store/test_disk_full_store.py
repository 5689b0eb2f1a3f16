"""The store on a disk that is really full: a group that cannot be written fails with
DiskFullError, leaves nothing behind, and the store goes on once space returns."""

from __future__ import annotations

import pytest
from tests.server.conftest import fill

from qclient.server.store import DelayStore, DiskFullError, NewMessage, StoreConfig


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
