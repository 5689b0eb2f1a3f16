"""Index entries kept in memory until the syncer writes them (a consume queue's newest
offsets, the id index's FIRED and STORED entries): reads see the same before and after
the write, and after a reopen."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qclient.server.store import id_index
from qclient.server.store import record as rec
from qclient.server.store.consume_log import ConsumeQueue, Kept
from qclient.server.store.id_index import FIRED, STORED, IdIndex, id_key, record_key


def _fired(i: int) -> tuple[bytes, int, int]:
    raw = rec.encode(rec.KIND_MESSAGE, f"m{i}", "t", b"x" * i, queue_id=1, deliver_at_ms=1000 + i)
    return raw, 100 + i, 2000 + i


def _ids(q: ConsumeQueue, offset: int, n: int) -> list[str]:
    return [m.msg_id for m in q.read(offset, n)]


def test_reads_across_written_and_in_memory_index_entries(tmp_path: Path) -> None:
    q = ConsumeQueue(tmp_path / "t" / "1", "t", 1, fsync=False)
    q.open()
    q.append([_fired(i) for i in range(5)])
    q.publish(q.sync())  # entries 0-4 written to the index file
    q.append([_fired(i) for i in range(5, 50)])  # 5-49 in memory only
    q.publish(q.next)
    want = [f"m{i}" for i in range(50)]
    assert _ids(q, 0, 50) == want
    assert _ids(q, 0, 3) == want[:3]  # wholly in the file, a long tail in memory
    assert _ids(q, 3, 10) == want[3:13]  # across the boundary
    assert _ids(q, 20, 100) == want[20:]  # wholly in memory, past the end
    assert [m.fired_at_ms for m in q.read(7, 1)] == [2007]
    q.sync()
    assert _ids(q, 3, 10) == want[3:13]
    q.append([_fired(i) for i in range(50, 60)])
    q.publish(q.next)
    q.close()  # writes what is still in memory
    again = ConsumeQueue(tmp_path / "t" / "1", "t", 1, fsync=False)
    again.open()
    assert again.next == 60
    assert _ids(again, 0, 100) == [f"m{i}" for i in range(60)]
    again.close()


def test_an_index_never_written_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    q = ConsumeQueue(tmp_path / "q", "t", 0, fsync=False)
    q.open()
    q.append([_fired(i) for i in range(8)])
    q.write()  # the records (not their index entries) are in the log
    # a kill -9: the entries in memory are gone, the log has every record
    reopened = ConsumeQueue(tmp_path / "q", "t", 0, fsync=False)
    reopened.open()
    assert reopened.next == 8
    assert _ids(reopened, 0, 8) == [f"m{i}" for i in range(8)]
    reopened.close()
    q.close()


def test_fired_entries_kept_apart_are_found_before_and_after_a_flush(tmp_path: Path) -> None:
    ids = IdIndex(tmp_path / "ids", fsync=False)
    ids.recover()
    m1, other = (rec.encode(rec.KIND_MESSAGE, i, "t", b"x") for i in ("m1", "other"))
    ids.add_fired([(m1, 40, 1234), (other, 80, 1)])
    assert ids.find("m1") == [(40, FIRED, 1234)]
    assert ids.take_dirty() is not None  # the checkpoint's flush
    assert ids.find("m1") == [(40, FIRED, 1234)]
    ids.add_fired([(m1, 90, 2000)])
    ids.close()
    again = IdIndex(tmp_path / "ids", fsync=False)
    again.recover()
    assert again.find("m1") == [(40, FIRED, 1234), (90, FIRED, 2000)]
    again.close()


def _synced_parts(ids: IdIndex) -> set[int]:
    """The partitions whose fds the checkpoint would fsync now (the fds closed unsynced)."""
    parts = set()
    for fd in ids.take_dirty():
        name = os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1]
        os.close(fd)
        if name.endswith(".idx"):
            parts.add(int(name[: -len(".idx")]))
    return parts


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_partitions_with_fired_entries_only_are_fsynced_in_turns(tmp_path: Path) -> None:
    ids = IdIndex(tmp_path / "ids", fsync=True)
    ids.recover()
    fired = rec.encode(rec.KIND_MESSAGE, "fired-only", "t", b"x")
    part = id_key("fired-only") & (id_index.PARTS - 1)
    ids.add_fired([(fired, 40, 1234)])
    stored_part = id_key("stored") & (id_index.PARTS - 1)
    assert stored_part != part
    turns = []
    for turn in range(id_index.FIRED_SYNC_TURNS):
        ids.add_stored([("stored", 100 + turn, 5)])  # every checkpoint has STORED entries
        synced = _synced_parts(ids)
        assert stored_part in synced  # the replay checkpoint needs these: at once
        if part in synced:
            turns.append(turn)
    assert turns == [part % id_index.FIRED_SYNC_TURNS]  # once, in its turn
    assert _synced_parts(ids) == set()  # nothing new: nothing left to fsync
    assert ids.find("fired-only") == [(40, FIRED, 1234)]
    ids.close()


def test_stored_entries_handed_over_are_found_until_and_after_they_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(id_index, "STAGED_MAX", 4)
    ids = IdIndex(tmp_path / "ids", fsync=False)
    ids.recover()
    ids.add_stored([("m1", 40, 1234), ("m2", 80, 99)])
    assert ids.find("m1") == [(40, STORED, 1234)]  # kept as handed over
    assert ids._files.size(id_key("m1") & (id_index.PARTS - 1)) == 0
    ids.add_stored([(f"n{i}", 100 + i, i) for i in range(3)])  # 5 > 4 wait: moved
    assert ids._staged == [] and ids._staged_count == 0
    assert ids.find("m1") == [(40, STORED, 1234)] and ids.find("n2") == [(102, STORED, 2)]
    ids.add_stored([("m1", 500, 4321)])
    assert ids.find("m1") == [(40, STORED, 1234), (500, STORED, 4321)]  # written order
    ids.close()  # writes what waits
    again = IdIndex(tmp_path / "ids", fsync=False)
    again.recover()
    assert again.find("m1") == [(40, STORED, 1234), (500, STORED, 4321)]
    assert again.find("m2") == [(80, STORED, 99)]
    again.close()


def _varied(i: int) -> tuple[bytes, int, int]:
    raw = rec.encode(
        rec.KIND_MESSAGE,
        f"m{i}-é",
        "t",
        bytes([i % 256]) * (i % 7),
        flag=i % 3,
        queue_id=1,
        received_ms=500 + i,
        deliver_at_ms=1000 + i,
        key=None if i % 2 else f"k{i}",
        tags=None if i % 3 else "a||b",
        properties=None if i % 4 else {"p": str(i), "ü": ""},
    )
    return raw, 100 + i, 2000 + i


def test_records_kept_in_memory_read_as_the_files_do(tmp_path: Path) -> None:
    kept = Kept(limit=8 * len(_varied(39)[0]))  # the newest ~8 records
    q = ConsumeQueue(tmp_path / "t" / "1", "t", 1, fsync=False, kept=kept)
    q.open()
    for start in range(0, 40, 5):
        q.append([_varied(i) for i in range(start, start + 5)])
        q.write()  # as the firing thread does every few ms
    q.publish(q.next)
    assert q._memory(0, 1) is None  # dropped: read from the file
    assert q._memory(39, 5) == [rec.to_fired(_varied(39)[0], 2039, 39, 139)]
    assert kept.bytes <= kept.limit
    live = q.read(0, 100)
    q.close()
    again = ConsumeQueue(tmp_path / "t" / "1", "t", 1, fsync=False)
    again.open()
    assert again._memory(0, 1) is None  # nothing kept after a reopen: all from the file
    from_files = again.read(0, 100)
    again.close()
    assert [m.offset for m in live] == list(range(40))
    assert live == from_files
    assert any(m.key and m.tags and m.properties for m in live)


def test_queues_share_one_budget_oldest_dropped_first(tmp_path: Path) -> None:
    size = len(rec.to_fired(_fired(1000)[0], 0, 0, 0))
    kept = Kept(limit=4 * size)
    a = ConsumeQueue(tmp_path / "a", "t", 1, fsync=False, kept=kept)
    b = ConsumeQueue(tmp_path / "b", "t", 1, fsync=False, kept=kept)
    a.open()
    b.open()
    a.append([_fired(1000)] * 3)
    b.append([_fired(1000)] * 2)  # a's first append (3 records) is over the budget ...
    assert len(a._memory(0, 10) or []) == 3, "dropped before it was in the file"
    a.write()  # ... and is dropped once written
    assert a._memory(0, 10) is None
    assert b._memory(0, 10) is not None and len(b._memory(0, 10) or []) == 2
    assert kept.bytes == 2 * size
    a.append([_fired(1000)] * 2)
    assert a._memory(3, 10) is not None and kept.bytes == 4 * size
    a.publish(a.next)
    b.publish(b.next)
    assert _ids(a, 0, 100) == ["m1000"] * 5  # the dropped ones from the file
    assert _ids(b, 0, 100) == ["m1000"] * 2
    a.close()
    b.close()


def test_a_read_from_the_file_runs_on_into_records_not_written_yet(tmp_path: Path) -> None:
    size = len(rec.to_fired(_fired(7)[0], 0, 0, 0))
    q = ConsumeQueue(tmp_path / "q", "t", 1, fsync=False, kept=Kept(limit=4 * size))
    q.open()
    q.append([_fired(7)] * 5)  # over the budget ...
    q.write()  # ... and written: dropped from memory
    q.append([_fired(7)] * 3)  # not written yet: in memory only
    q.publish(q.next)
    assert q._memory(0, 1) is None and q._memory(5, 3) is not None
    assert [m.offset for m in q.read(0, 100)] == list(range(8))
    assert [m.offset for m in q.read(4, 2)] == [4, 5]
    q.close()


def test_records_dropped_from_memory_leave_reads_and_the_kept_list_right(tmp_path: Path) -> None:
    """The budget drops a few records per append: every offset still reads the same
    message (from memory or the file), and dropped entries do not pile up in the list."""
    one = len(rec.to_fired(_fired(1)[0], 0, 0, 0))
    q = ConsumeQueue(tmp_path / "t" / "1", "t", 1, fsync=False, kept=Kept(limit=20 * one))
    q.open()
    for step in range(200):
        q.append([_fired(1) for _ in range(3)])
        if step % 7 == 0:
            q.publish(q.sync())  # written: the budget may drop them from memory now
    q.publish(q.sync())
    kept = q._memory(q._mem_base, q.next)
    assert kept is not None and len(kept) == q.next - q._mem_base <= 21
    assert None not in kept
    assert len(q._mem) <= 2 * len(kept) + 3  # dropped entries are removed in runs
    got = q.read(0, 1000)
    assert [m.offset for m in got] == list(range(600))
    assert all(m.msg_id == "m1" and m.fired_at_ms == 2001 for m in got)
    q.close()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=60), min_size=1, max_size=20, unique=True))
def test_fired_entries_are_found_under_the_key_of_their_id(
    tmp_path_factory: pytest.TempPathFactory, msg_ids: list[str]
) -> None:
    """add_fired keys each entry by its record: the same key id_key gives for the id."""
    ids = IdIndex(tmp_path_factory.mktemp("ids"), fsync=False)
    ids.recover()
    records = [rec.encode(rec.KIND_MESSAGE, m, "t", b"x") for m in msg_ids]
    ids.add_fired([(r, 100 + i, 7) for i, r in enumerate(records)])
    for i, m in enumerate(msg_ids):
        assert (100 + i, FIRED, 7) in ids.find(m)
        assert record_key(records[i]) == id_key(m)
    ids.close()
