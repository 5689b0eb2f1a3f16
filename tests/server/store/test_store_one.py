"""``store_now`` of one message takes a one-pass path of its own: the same answers,
counters, tables and failures as a group commit of one."""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qclient.server.store import (
    DelayStore,
    DiskFullError,
    NewMessage,
    StoreBusyError,
    StoreConfig,
    StoreError,
)

TOPIC = "t"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DelayStore]:
    s = DelayStore(
        StoreConfig(data_dir=tmp_path / "store", bucket_ms=60_000, max_pending_messages=2)
    )
    s.open()
    try:
        yield s
    finally:
        s.close()


def _one(msg_id: str, ahead_ms: int = 3_600_000) -> list[NewMessage]:
    return [NewMessage(TOPIC, 1, msg_id, b"x" * 100, int(time.time() * 1000) + ahead_ms)]


def test_one_message_is_durable_counted_indexed_and_deduplicated(store: DelayStore) -> None:
    before = store.stats()
    [r] = store.store_now(_one("a"))
    assert r.msg_id == "a" and r.queue_id == 1 and not r.duplicate
    stats = store.stats()
    for key in ("fsyncs", "groups", "appended", "stored", "scheduled"):
        assert stats[key] - before[key] == 1, key
    assert stats["pending"] == 0 and stats["pending_bytes"] == 0
    status = store.lookup(TOPIC, "a")  # through the id index
    assert status is not None and status.deliver_at_ms == r.deliver_at_ms
    [again] = store.store_now(_one("a", 7_200_000))  # the original's answer
    assert again.duplicate and again.deliver_at_ms == r.deliver_at_ms
    assert store.stats()["duplicates"] - before["duplicates"] == 1
    assert store.stats()["appended"] == stats["appended"]


def test_an_id_in_flight_waits_for_its_record(store: DelayStore) -> None:
    first = store.submit(_one("f"), defer=True)  # queued, not written yet
    [dup] = store.store_now(_one("f", 7_200_000))  # commits the queue, then answers
    [orig] = first.result(timeout=5)
    assert dup.duplicate and dup.deliver_at_ms == orig.deliver_at_ms and not orig.duplicate


def test_a_full_queue_refuses_it(store: DelayStore) -> None:
    store.submit(_one("q0") + _one("q1"), defer=True)
    with pytest.raises(StoreBusyError):
        store.store_now(_one("q2"))
    store.commit_pending()
    assert store.stats()["busy_rejections"] == 1
    assert not store.store_now(_one("q2"))[0].duplicate  # nothing of it was kept


@pytest.mark.parametrize(
    ("err", "raised"), [(errno.EIO, StoreError), (errno.ENOSPC, DiskFullError)]
)
def test_a_failed_write_stores_nothing(store: DelayStore, err: int, raised: type) -> None:
    mlog = store._sh.files.mlog
    real = mlog.append
    end = mlog.end

    def broken(datas: list[bytes]) -> list[int]:
        real(datas)  # written, then the error: the log is cut back
        raise OSError(err, "no")

    mlog.append = broken  # type: ignore[method-assign]
    try:
        with pytest.raises(raised):
            store.store_now(_one("w"))
    finally:
        mlog.append = real  # type: ignore[method-assign]
    stats = store.stats()
    assert mlog.end == end and stats["pending"] == 0 and stats["pending_bytes"] == 0
    assert store.lookup(TOPIC, "w") is None
    assert not store.store_now(_one("w"))[0].duplicate  # a retry is stored
