"""Unit tests of the store's stages on real files, without the store's threads."""

from __future__ import annotations

import errno
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qclient.server.store import record as rec
from qclient.server.store._shared import Shared
from qclient.server.store.checkpoint import Checkpoint
from qclient.server.store.committer import Committer
from qclient.server.store.consume_log import ConsumeQueue
from qclient.server.store.dedupe import DedupeTable, id_hash
from qclient.server.store.files import StoreFiles
from qclient.server.store.firing import Firing
from qclient.server.store.intake import Intake
from qclient.server.store.loader import Loader
from qclient.server.store.replay import Replayer
from qclient.server.store.retention import Retention
from qclient.server.store.syncer import Syncer
from qclient.server.store.types import (
    InvalidRecordError,
    NewMessage,
    StoreBusyError,
    StoreConfig,
)
from qclient.server.store.wheel import Wheel

BUCKET = 1000
NOW = 5_000_000


class Stages:
    """The stages of one store wired by hand; ``files`` open, closed by the fixture."""

    def __init__(self, tmp_path: Path, **cfg: object):
        self.now = NOW
        config = StoreConfig(data_dir=tmp_path, bucket_ms=BUCKET, fsync=False, **cfg)  # type: ignore[arg-type]
        self.files = StoreFiles(config)
        self.files.open()
        self.sh = Shared(config, lambda: self.now, BUCKET, self.files)
        self.woken = 0
        self.loader = Loader(self.sh)
        self.replayer = Replayer(self.sh, self._wake)
        self.checkpoint = Checkpoint(self.sh, self.replayer)
        self.retention = Retention(self.sh, self.replayer, self.checkpoint)

    def _wake(self) -> None:
        self.woken += 1

    def append(self, *msgs: tuple[str, int]) -> list[tuple[int, int, int, int, int]]:
        """Write messages ``(msg_id, deliver_at)`` to the message log; their replay items."""
        datas = [
            rec.encode(
                rec.KIND_MESSAGE, mid, "t", b"x", queue_id=0, received_ms=NOW, deliver_at_ms=at
            )
            for mid, at in msgs
        ]
        positions = self.files.mlog.append(datas)
        return [
            (p, len(d), rec.KIND_MESSAGE, at, 0)
            for p, d, (_, at) in zip(positions, datas, msgs, strict=True)
        ]


@pytest.fixture
def stages(tmp_path: Path):
    st = Stages(tmp_path)
    try:
        yield st
    finally:
        st.files.close()


# ---------------------------------------------------------------- wheel loading state
def test_wheel_loading_state_is_driven_by_its_methods() -> None:
    w = Wheel(BUCKET)
    w.add_unloaded(7)
    w.add_unloaded(3)
    assert not w.is_loaded(3)
    assert w.start_load(2) is None  # nothing due by bucket 2: everything <= 2 is loaded
    assert w.is_loaded(2) and not w.is_loaded(3)
    assert w.start_load(5) == 3
    assert w.is_loading(3) and w.is_loaded(3)  # being loaded counts as loaded
    w.finish_load(3)
    assert w.is_loaded(3) and not w.is_loading(3)
    assert w.start_load(5) is None
    assert w.is_loaded(5) and not w.is_loaded(7)
    assert w.start_load(9) == 7


def test_wheel_note_entries_takes_cancels_and_max_position() -> None:
    w = Wheel(BUCKET)
    entries = [(1000, 10, 5, rec.KIND_MESSAGE), (1001, 30, 5, rec.KIND_CANCEL), (1002, 20, 5, 0)]
    w.note_entries(1, entries, rec.KIND_CANCEL)
    assert w.is_cancelled(1, 30) and not w.is_cancelled(1, 10)
    assert w.state[1].max_pos == 30
    w.uncancel(1, 30)
    assert not w.is_cancelled(1, 30)


# ---------------------------------------------------------------- dedupe
def test_dedupe_find_hashes_like_id_hash() -> None:
    t = DedupeTable(window_ms=1000, max_ids=10)
    assert t.find("a") == (id_hash("a"), None)
    t.add(id_hash("a"), 42, 0)
    assert t.find("a") == (id_hash("a"), 42)


# ---------------------------------------------------------------- intake
@pytest.mark.parametrize(
    ("m", "error"),
    [
        (NewMessage("a/b", 0, "i", b"", NOW), "invalid topic name"),
        (NewMessage("t", 70000, "i", b"", NOW), "invalid queue id"),
        (NewMessage("t", 0, "", b"", NOW), "msg_id must be"),
        (NewMessage("t", 0, "i", b"", -1), "deliver_at_ms out of range"),
        (NewMessage("t", 0, "i", "s", NOW), "body must be bytes"),  # type: ignore[arg-type]
        (NewMessage("t", 0, "i", b"x" * 600, NOW), "message too large"),
    ],
)
def test_intake_names_the_first_problem(tmp_path: Path, m: NewMessage, error: str) -> None:
    intake = Intake(StoreConfig(data_dir=tmp_path, max_record_bytes=500))
    with pytest.raises(InvalidRecordError, match=error):
        intake.encode([m], NOW)


def test_intake_validated_path_encodes_like_the_checked_path(tmp_path: Path) -> None:
    intake = Intake(StoreConfig(data_dir=tmp_path))
    msgs = [NewMessage("t", i % 4, f"m{i}", b"body", NOW + i) for i in range(5)]
    checked = intake.encode(msgs, NOW)  # also remembers the topic as checked
    assert intake.encode(msgs, NOW, validated=True) == checked


# ---------------------------------------------------------------- replay + loader
def test_replay_writes_schedule_and_wakes_the_loader_only_when_due_soon(stages: Stages) -> None:
    soon, later = NOW + 100, NOW + 10 * 86_400_000
    items = stages.append(("a", soon), ("b", later))
    stages.replayer.replay(items, stages.files.mlog.end)
    assert stages.replayer.replayed == stages.files.mlog.end
    assert stages.files.slog.size(soon // BUCKET) and stages.files.slog.size(later // BUCKET)
    assert stages.sh.wheel.heap == []  # nothing loaded yet
    assert stages.woken == 1  # "a" is within load_ahead_ms
    assert sorted(stages.replayer.lowest_positions()) == [items[0][0], items[1][0]]


def test_loader_loads_due_buckets_minus_fired_and_cancelled(stages: Stages) -> None:
    at = NOW + 100
    items = stages.append(("a", at), ("b", at + 1), ("c", at + 2))
    stages.replayer.replay(items, stages.files.mlog.end)
    b = at // BUCKET
    stages.files.dlog.add(b, [items[0][0]])  # "a" fired before a restart
    with stages.sh.sched:
        stages.sh.wheel.cancel(b, items[1][0])  # "b" cancelled
    assert stages.loader.step()
    assert not stages.loader.step()  # the far buckets are not due
    with stages.sh.sched:
        assert stages.sh.wheel.pop_due(at + 10, 10) == [(at + 2, items[2][0], items[2][1])]
    # a message replayed into the now loaded bucket goes straight into the wheel
    more = stages.append(("d", at + 3))
    stages.replayer.replay(more, stages.files.mlog.end)
    assert stages.sh.wheel.next_due() == at + 3


class _FailOnce:
    """Wraps a file method: the first call runs ``meanwhile`` and then raises OSError."""

    def __init__(self, real: Any, meanwhile: Callable[[], None]):
        self.real, self.meanwhile, self.calls = real, meanwhile, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.meanwhile()
            raise OSError(errno.EIO, "injected read error")
        return self.real(*args)


@pytest.mark.parametrize("failing", ["slog.entries", "dlog.positions"])
def test_a_failed_load_resumes_and_fires_each_position_once(
    stages: Stages, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The interleaving that fired one stored message twice: the loader's read of a
    bucket fails while the committer replays a message into it (the bucket counts as
    loaded, so the message goes straight into the wheel); the message fires and, before
    the syncer dispatches it, the load is retried. A retry that re-read the file with a
    new cursor pushed the message again, and after the dispatch it fired a second time."""
    w, sh = stages.sh.wheel, stages.sh
    at = NOW + 100
    b = at // BUCKET
    early = stages.append(("early", at))  # in the file before the load starts
    stages.replayer.replay(early, stages.files.mlog.end)
    late: list[tuple[int, int, int, int, int]] = []

    def replay_during_load() -> None:
        late.extend(stages.append(("late", at + 1)))
        stages.replayer.replay(late, stages.files.mlog.end)

    kind, name = failing.split(".")
    part = getattr(stages.files, kind)
    monkeypatch.setattr(part, name, _FailOnce(getattr(part, name), replay_during_load))
    with pytest.raises(OSError, match="injected"):
        stages.loader.step()
    assert len(w.heap) == 1  # "late" went straight into the wheel
    stages.now = at + 1
    fired: list[int] = []
    with sh.sched:
        first = w.pop_due(stages.now, 10)  # "late" fires; its dispatch is not written yet
    assert [pos for _, pos, _ in first] == [late[0][0]]
    fired += [pos for _, pos, _ in first]
    assert stages.loader.step()  # the retry
    assert not w.is_loading(b) and w.is_loaded(b)
    stages.files.dlog.add(b, fired)  # the syncer dispatches "late"
    with sh.sched:
        w.dispatched(b, fired)
        second = w.pop_due(stages.now, 10)
    fired += [pos for _, pos, _ in second]
    assert sorted(fired) == sorted([early[0][0], late[0][0]])  # each position once
    assert w.heap == [] and w.state[b].outstanding == 1  # "early" is firing
    assert sh.stats["loaded_buckets"] == 1


def test_a_failed_consume_append_retries_only_the_copies_not_appended(
    stages: Stages, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A firing step over two queues whose second append fails (disk full): the first
    queue's copy is delivered and must not fire again when the step is retried."""
    at = NOW + 100
    datas = [
        rec.encode(rec.KIND_MESSAGE, mid, "t", b"x", queue_id=q, received_ms=NOW, deliver_at_ms=at)
        for mid, q in (("a", 0), ("b", 1))
    ]
    positions = stages.files.mlog.append(datas)
    items = [(p, len(d), rec.KIND_MESSAGE, at, 0) for p, d in zip(positions, datas, strict=True)]
    stages.replayer.replay(items, stages.files.mlog.end)
    assert stages.loader.step()
    syncer = Syncer(stages.sh, stages.checkpoint, stages.retention)
    firing = Firing(stages.sh, syncer)
    real_append = ConsumeQueue.append
    failed: list[int] = []

    def append(q: ConsumeQueue, fired: Any) -> int:
        if q.queue_id == 1 and not failed:
            failed.append(1)
            raise OSError(errno.ENOSPC, "injected: no space")
        return real_append(q, fired)

    monkeypatch.setattr(ConsumeQueue, "append", append)
    stages.now = at
    firing._step()  # "a" is appended, "b" fails
    assert failed and stages.sh.stats["fire_errors"] == 1
    firing._step()  # the retry
    consume = stages.files.consume
    got = {q: [m.msg_id for m in consume.get("t", q, create=False).read(0, 10)] for q in (0, 1)}
    assert got == {0: ["a"], 1: ["b"]}
    assert stages.sh.stats["fired"] == 2
    syncer._sync_fired(syncer._work)  # both dispatched: nothing left firing
    assert stages.files.dlog.positions(at // BUCKET) == set(positions)
    assert not stages.sh.wheel.firing


# ---------------------------------------------------------------- checkpoint + retention
def test_checkpoint_round_trip_and_unreadable_file(stages: Stages, tmp_path: Path) -> None:
    assert stages.checkpoint.read() == 0
    stages.replayer.replay(stages.append(("a", NOW)), stages.files.mlog.end)
    stages.checkpoint.write()
    assert stages.checkpoint.read() == stages.files.mlog.end == stages.checkpoint.written
    (tmp_path / "checkpoint.json").write_text("{not json")
    assert stages.checkpoint.read() == 0


def test_a_failed_store_keeps_its_last_checkpoint(stages: Stages, tmp_path: Path) -> None:
    stages.checkpoint.write()
    stages.replayer.replay(stages.append(("a", NOW)), stages.files.mlog.end)
    stages.sh.broken = OSError("disk")
    stages.checkpoint.write()
    assert json.loads((tmp_path / "checkpoint.json").read_text())["replay_offset"] == 0


def test_retention_removes_a_fully_fired_bucket_and_keeps_its_dispatch_a_while(
    tmp_path: Path,
) -> None:
    st = Stages(tmp_path, retain_fired_ms=0, dedupe_window_ms=60_000)
    try:
        items = st.append(("a", NOW))
        st.replayer.replay(items, st.files.mlog.end)
        b = NOW // BUCKET
        assert st.loader.step()
        w = st.sh.wheel
        with st.sh.sched:
            assert w.pop_due(NOW, 10)
            w.dispatched(b, [items[0][0]])
        st.files.dlog.add(b, [items[0][0]])
        st.checkpoint.write()
        st.now = NOW + 2 * BUCKET
        st.retention.cleanup()
        assert not st.files.slog.size(b) and b not in w.state
        assert st.files.dlog.size(b)  # an orphan until the dedupe window has passed
        assert st.sh.stats["buckets_removed"] == 1
    finally:
        st.files.close()


# ---------------------------------------------------------------- committer
def _ats(msgs: list[NewMessage]) -> list[int]:
    """The deliver times the store hands the committer with its messages."""
    return [m.deliver_at_ms for m in msgs]


def test_committer_back_pressure_and_duplicates(tmp_path: Path) -> None:
    st = Stages(tmp_path, max_pending_messages=3)
    committer = Committer(st.sh, st.replayer, lambda: None)
    t = threading.Thread(target=committer.run)
    t.start()
    try:
        intake = Intake(st.sh.config)
        msgs = [NewMessage("t", 0, f"m{i}", b"x", NOW + 10**6) for i in range(4)]
        with pytest.raises(StoreBusyError):
            committer.submit(msgs, intake.encode(msgs, NOW), deliver_ats=_ats(msgs))
        assert committer.pending == 0
        first = committer.submit(
            msgs[:2], intake.encode(msgs[:2], NOW), deliver_ats=_ats(msgs[:2])
        ).result(10)
        again = committer.submit(
            msgs[:2], intake.encode(msgs[:2], NOW), deliver_ats=_ats(msgs[:2])
        ).result(10)
        assert [r.duplicate for r in first] == [False, False]
        assert [r.duplicate for r in again] == [True, True]
        assert committer.pending == 0 and committer.pending_bytes == 0
    finally:
        committer.stop()
        t.join(10)
        st.files.close()
