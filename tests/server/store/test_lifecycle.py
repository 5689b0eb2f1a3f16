"""Lookup / cancel / reschedule by id on a live store (real files, real threads)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from qclient.server.store import (
    DelayStore,
    FiredMessage,
    NewMessage,
    StoreConfig,
    wall_clock_ms,
)
from qclient.server.store._files import AppendFiles, sync_fds
from qclient.server.store.id_index import PARTS, IdIndex, id_key, record_key
from qclient.server.store.record import KIND_MESSAGE, encode


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., DelayStore]]:
    """``open_store(**config)`` -> an opened store on ``tmp_path/data``, closed at teardown."""
    stores: list[DelayStore] = []

    def factory(**cfg: Any) -> DelayStore:
        cfg.setdefault("bucket_ms", 1000)
        cfg.setdefault("load_ahead_ms", 500)
        cfg.setdefault("fsync", False)
        s = DelayStore(StoreConfig(data_dir=tmp_path / "data", **cfg))
        s.open()
        stores.append(s)
        return s

    yield factory
    for s in stores:
        s.close()


def _until(cond: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
    return v


def _fired(s: DelayStore, topic: str = "t") -> list[FiredMessage]:
    out = []
    for q in range(4):
        out.extend(s.pull(topic, q, 0, 1000))
    return out


def _send(s: DelayStore, msg_id: str, deliver_at: int, topic: str = "t") -> None:
    s.submit([NewMessage(topic, 1, msg_id, b"body", deliver_at, key="k")]).result(timeout=10)


def test_index_entries_and_keys(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path / "ids", fsync=False)
    ix.recover()
    ix.add_stored([("a", 10, 1000), ("b", 20, 2000), ("a", 30, 3000)])
    assert [(p, t) for p, _k, t in ix.find("a")] == [(10, 1000), (30, 3000)]
    assert ix.find("zzz") == []
    data = encode(KIND_MESSAGE, "an-id", "t", b"x")
    assert record_key(data) == id_key("an-id")
    assert id_key("x") == id_key("x") and id_key("x") != id_key("y") and PARTS == 128
    assert ix.compact(25) == 2  # positions 10 and 20 are gone with their segments
    assert [p for p, _k, _t in ix.find("a")] == [30] and ix.find("b") == []
    ix.close()
    again = IdIndex(tmp_path / "ids", fsync=False)
    assert again.recover() and [p for p, _k, _t in again.find("a")] == [30]
    again.close()


def test_lookup_cancel_and_states(open_store: Callable[..., DelayStore]) -> None:
    s = open_store()
    now = wall_clock_ms()
    far = now + 7 * 86_400_000
    _send(s, "far", far)
    _send(s, "soon", now + 200)
    st = s.lookup("t", "far")
    assert st is not None and (st.state, st.deliver_at_ms, st.queue_id) == ("scheduled", far, 1)
    assert s.lookup("t", "nope") is None
    assert s.lookup("other", "far") is None  # ids are per topic
    assert s.cancel_id("t", "far").cancelled
    assert s.lookup("t", "far").state == "cancelled"  # type: ignore[union-attr]
    assert s.cancel_id("t", "far").reason == "already_cancelled"
    assert s.cancel_id("t", "nope").reason == "not_found"
    _until(lambda: _fired(s))
    st = s.lookup("t", "soon")
    assert st is not None and st.state == "fired" and st.fired_at_ms >= now + 200  # type: ignore[operator]
    assert s.cancel_id("t", "soon").reason == "already_fired"
    assert s.reschedule("t", "soon", now).state == "fired"
    assert s.reschedule("t", "far", now).state == "cancelled"
    out = s.reschedule("t", "nope", now)
    assert not out.rescheduled and out.state is None


def test_reschedule_earlier_and_later_fire_once_at_the_new_time(
    open_store: Callable[..., DelayStore],
) -> None:
    s = open_store()
    now = wall_clock_ms()
    _send(s, "early", now + 60_000)
    _send(s, "late", now + 300)
    new_early = now + 400
    new_late = now + 1500
    assert s.reschedule("t", "early", new_early).rescheduled
    assert s.reschedule("t", "late", new_late).rescheduled
    assert s.lookup("t", "late").deliver_at_ms == new_late  # type: ignore[union-attr]
    fired = _until(lambda: [f for f in _fired(s) if f.msg_id == "early"])
    assert [f.deliver_at_ms for f in fired] == [new_early]
    assert fired[0].fired_at_ms >= new_early and fired[0].body == b"body"
    time.sleep(max(0, (now + 900 - wall_clock_ms()) / 1000))
    assert [f.msg_id for f in _fired(s)] == ["early"]  # the old time of "late" did not fire
    fired = _until(lambda: [f for f in _fired(s) if f.msg_id == "late"])
    assert fired[0].deliver_at_ms == new_late and fired[0].fired_at_ms >= new_late
    assert fired[0].key == "k"
    st = s.lookup("t", "late")
    assert st is not None and st.state == "fired" and st.deliver_at_ms == new_late


def test_state_survives_restart_and_index_rebuilds(
    open_store: Callable[..., DelayStore], tmp_path: Path
) -> None:
    s = open_store()
    now = wall_clock_ms()
    far = now + 86_400_000
    for i in range(50):
        _send(s, f"m{i}", far + i)
    s.reschedule("t", "m1", far + 5000)
    s.cancel_id("t", "m2")
    s.close()
    for wipe in (False, True):
        if wipe:  # an index newer than the data: rebuilt from the whole message log
            shutil.rmtree(tmp_path / "data" / "ids")
        s = open_store()
        assert s.lookup("t", "m0").deliver_at_ms == far  # type: ignore[union-attr]
        assert s.lookup("t", "m1").deliver_at_ms == far + 5000  # type: ignore[union-attr]
        assert s.lookup("t", "m2").state == "cancelled"  # type: ignore[union-attr]
        assert s.lookup("t", "m49").state == "scheduled"  # type: ignore[union-attr]
        s.close()


def test_lookup_finds_entries_still_buffered(
    open_store: Callable[..., DelayStore], tmp_path: Path
) -> None:
    """Index entries wait in memory until the checkpoint; lookup, cancel and reschedule
    find them there (the dedupe table remembers one id only, so it cannot answer)."""
    s = open_store(checkpoint_interval_ms=600_000, dedupe_max_ids=1)
    far = wall_clock_ms() + 86_400_000
    for i in range(20):
        _send(s, f"m{i}", far + i)
    ids = tmp_path / "data" / "ids"
    assert sum(p.stat().st_size for p in ids.iterdir()) == 0  # nothing written yet
    for i in range(20):
        st = s.lookup("t", f"m{i}")
        assert st is not None and (st.state, st.deliver_at_ms) == ("scheduled", far + i)
    assert s.cancel_id("t", "m3").cancelled
    assert s.reschedule("t", "m4", far + 9000).rescheduled
    assert s.lookup("t", "m3").state == "cancelled"  # type: ignore[union-attr]
    assert s.lookup("t", "m4").deliver_at_ms == far + 9000  # type: ignore[union-attr]
    s.close()
    assert sum(p.stat().st_size for p in ids.iterdir()) >= 21 * 24  # written on close
    s = open_store(dedupe_max_ids=1)
    assert s.lookup("t", "m4").deliver_at_ms == far + 9000  # type: ignore[union-attr]
    assert s.lookup("t", "m19").state == "scheduled"  # type: ignore[union-attr]


def test_buffered_append_files(tmp_path: Path) -> None:
    """Buffered appends: read and size see them; flush, take_dirty and the size limit
    write them (one write per file); replace drops them."""
    files = AppendFiles(tmp_path / "f", ".x", 4, fsync=True, buffer_bytes=16)
    files.append(1, b"aaaa")
    files.append(1, b"bbbb")
    files.append(2, b"cccc")
    assert files.size(1) == 8 and files.read(1) == b"aaaabbbb" and files.read(1, 4) == b"aaaa"
    assert not files.path(1).exists() and not files.path(2).exists()
    fds = files.take_dirty()  # the checkpoint's: written, then fsync'd by the caller
    sync_fds(fds)
    assert len(fds) == 3  # two files and the directory that got them
    assert files.path(1).read_bytes() == b"aaaabbbb" and files.read(2) == b"cccc"
    files.append(1, b"dddd")
    assert files.read(1) == b"aaaabbbbdddd" and files.read(1, 10) == b"aaaabbbb"
    files.append(2, b"eeee")
    assert files.path(2).read_bytes() == b"cccc"
    files.append(3, b"ffff" * 2)  # 16 bytes pending in all: the limit writes them
    assert files.path(1).read_bytes() == b"aaaabbbbdddd" and files.path(3).exists()
    assert files.path(2).read_bytes() == b"cccceeee"
    files.append(1, b"gggg")
    files.replace(1, b"zzzz")
    assert files.read(1) == b"zzzz" and files.size(1) == 4
    files.close()
    assert files.path(1).read_bytes() == b"zzzz"


def test_without_index_lookup_uses_the_dedupe_window(
    open_store: Callable[..., DelayStore], tmp_path: Path
) -> None:
    s = open_store(id_index=False)
    _send(s, "x", wall_clock_ms() + 60_000)
    assert s.lookup("t", "x").state == "scheduled"  # type: ignore[union-attr]
    assert not (tmp_path / "data" / "ids").exists()


def test_retention_compacts_the_index(open_store: Callable[..., DelayStore]) -> None:
    s = open_store(
        segment_bytes=4096,
        bucket_ms=100,
        load_ahead_ms=50,
        checkpoint_interval_ms=50,
        retain_fired_ms=0,
        dedupe_window_ms=0,
    )
    now = wall_clock_ms()
    for i in range(0, 300, 30):
        s.submit([NewMessage("t", j % 4, f"m{j}", b"x" * 100, now + j) for j in range(i, i + 30)])
    _send(s, "far", now + 86_400_000)  # pins its own segment: its entry stays
    for i in range(300, 400, 50):  # more segments after it
        s.submit([NewMessage("t", j % 4, f"m{j}", b"x" * 100, now) for j in range(i, i + 50)])
    _until(lambda: s.stats().get("id_index_compacted", 0) >= 100)
    assert s.lookup("t", "far").state == "scheduled"  # type: ignore[union-attr]
    assert s.lookup("t", "m0") is None  # its segment is gone, and its index entry with it
