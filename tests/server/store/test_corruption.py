"""Torn tails and corrupt records in every log kind: the store opens, cuts what a crash
left half-written, loses nothing acknowledged, reports what it dropped, and never fires
a record whose bytes changed."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qclient.server.store import DelayStore, FiredMessage, NewMessage, StoreConfig

T0 = 9_000_000_000_000  # a fixed clock start, on a bucket boundary
BUCKET = 1000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def _wait(cond: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


def _msg(i: int, deliver_at: int) -> NewMessage:
    return NewMessage("t", i % 2, f"m{i}", f"body-{i}".encode() * 10, deliver_at)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Callable[[Clock], DelayStore]]:
    """``store(clock)`` opens the store of ``tmp_path/data``; every one is closed at the end."""
    opened: list[DelayStore] = []

    def factory(clock: Clock) -> DelayStore:
        cfg = StoreConfig(
            data_dir=tmp_path / "data", bucket_ms=BUCKET, load_ahead_ms=500, fsync=False
        )
        s = DelayStore(cfg, clock_ms=clock)
        s.open()
        opened.append(s)
        return s

    try:
        yield factory
    finally:
        for s in opened:
            s.close()


def _fired(s: DelayStore) -> list[FiredMessage]:
    out: list[FiredMessage] = []
    for q in (0, 1):
        out.extend(s.pull("t", q, 0, 10_000))
    return out


def _visible(s: DelayStore) -> int:
    return sum(s.max_offset("t", q) for q in (0, 1))


def _check_all_fired(s: DelayStore, n: int, clock: Clock) -> None:
    """Every one of m0..m{n-1} fires once, on time, with its own body."""
    _wait(lambda: _visible(s) >= n)
    got = _fired(s)
    ids = sorted(int(f.msg_id[1:]) for f in got)
    assert ids == list(range(n))
    for f in got:
        assert f.body == f"body-{f.msg_id[1:]}".encode() * 10
        assert f.fired_at_ms >= f.deliver_at_ms


def _rewind_checkpoint(data: Path, to: int) -> None:
    """As if the crash came before the replay checkpoint passed ``to``."""
    (data / "checkpoint.json").write_text(json.dumps({"version": 1, "replay_offset": to}))


def _segment(data: Path) -> Path:
    [seg] = sorted((data / "commitlog").iterdir())
    return seg


def _only_file(d: Path) -> Path:
    [f] = sorted(d.iterdir())
    return f


GARBAGE = {"random": lambda n: os.urandom(n), "zeros": lambda n: bytes(n)}


# --- message log --------------------------------------------------------------------


@pytest.mark.parametrize("fill", sorted(GARBAGE))
def test_message_log_garbage_tail(store, tmp_path, caplog, fill) -> None:
    clock = Clock()
    s = store(clock)
    s.submit([_msg(i, T0 + 2000) for i in range(20)]).result(10)
    end = s.stats()["log_bytes"]
    s.close()
    with open(_segment(tmp_path / "data"), "ab") as f:
        f.write(GARBAGE[fill](1000))
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert s2.stats()["log_bytes"] == end
    assert "torn tail of 1000 bytes" in caplog.text
    s2.submit([_msg(20, T0 + 2000)]).result(10)  # appends go after the cut
    clock.now += 3000
    _check_all_fired(s2, 21, clock)


def test_message_log_tail_cut_mid_record(store, tmp_path, caplog) -> None:
    clock = Clock()
    s = store(clock)
    s.submit([_msg(i, T0 + 2000) for i in range(10)]).result(10)
    whole = s.stats()["log_bytes"]
    s.submit([_msg(10, T0 + 2000)]).result(10)
    s.close()
    _rewind_checkpoint(tmp_path / "data", whole)
    os.truncate(_segment(tmp_path / "data"), whole + 30)
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert s2.stats()["log_bytes"] == whole
    assert "torn tail of 30 bytes" in caplog.text
    clock.now += 3000
    _check_all_fired(s2, 10, clock)  # m10 was the torn write: never acknowledged


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))


def test_message_log_bit_flip_before_checkpoint_is_not_fired(store, tmp_path, caplog) -> None:
    """A record already replayed into the schedule log rots on disk: its CRC catches it
    when it is due; it is reported and dropped, everything else fires."""
    clock = Clock()
    s = store(clock)
    s.submit([_msg(i, T0 + 2000) for i in range(5)]).result(10)
    second = s.stats()["log_bytes"]
    s.submit([_msg(i, T0 + 2000) for i in range(5, 10)]).result(10)
    s.close()
    _flip(_segment(tmp_path / "data"), second + 80)  # in the body of m5
    s2 = store(clock)
    with caplog.at_level(logging.ERROR, "qclient"):
        clock.now += 3000
        _wait(lambda: _visible(s2) == 9 and s2.stats()["corrupt_records"] == 1)
    assert sorted(f.msg_id for f in _fired(s2)) == sorted(f"m{i}" for i in range(10) if i != 5)
    assert "crc mismatch" in caplog.text


def test_message_log_bit_flip_after_checkpoint_keeps_later_records(store, tmp_path, caplog) -> None:
    """A corrupt record in the middle of the active segment, not yet replayed: recovery
    skips that one record and keeps every whole record after it (a torn tail has none)."""
    clock = Clock()
    s = store(clock)
    s.submit([_msg(i, T0 + 2000) for i in range(5)]).result(10)
    second = s.stats()["log_bytes"]
    s.submit([_msg(i, T0 + 2000) for i in range(5, 10)]).result(10)
    end = s.stats()["log_bytes"]
    s.close()
    data = tmp_path / "data"
    _rewind_checkpoint(data, 0)
    for p in (data / "schedule").iterdir():
        p.unlink()  # the crash came before the schedule entries were written
    _flip(_segment(data), second + 80)
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert s2.stats()["log_bytes"] == end  # nothing cut
    assert f"corrupt record at position {second}" in caplog.text
    clock.now += 3000
    _wait(lambda: _visible(s2) == 9)
    assert sorted(f.msg_id for f in _fired(s2)) == sorted(f"m{i}" for i in range(10) if i != 5)


# --- schedule log -------------------------------------------------------------------


def _crash_after_replay(store, tmp_path: Path, clock: Clock) -> tuple[DelayStore, Path]:
    """Store m0..m9 due in bucket T0+2 s, checkpoint at 0 (a crash before it advanced)."""
    s = store(clock)
    s.submit([_msg(i, T0 + 2000 + i) for i in range(10)]).result(10)
    s.close()
    data = tmp_path / "data"
    _rewind_checkpoint(data, 0)
    return s, data


def test_schedule_log_tail_cut_mid_entry(store, tmp_path, caplog) -> None:
    clock = Clock()
    _, data = _crash_after_replay(store, tmp_path, clock)
    sched = _only_file(data / "schedule")
    os.truncate(sched, sched.stat().st_size - 10)
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert "cutting a torn tail of 14 bytes" in caplog.text
    clock.now += 3000
    _check_all_fired(s2, 10, clock)


@pytest.mark.parametrize("fill", sorted(GARBAGE))
def test_schedule_log_garbage_tail(store, tmp_path, caplog, fill) -> None:
    clock = Clock()
    _, data = _crash_after_replay(store, tmp_path, clock)
    sched = _only_file(data / "schedule")
    with open(sched, "ab") as f:
        f.write(GARBAGE[fill](24 * 40 + 5))
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert "cutting a torn tail of 5 bytes" in caplog.text
    clock.now += 3000
    _check_all_fired(s2, 10, clock)
    assert _visible(s2) == 10  # no garbage entry fired anything


# --- dispatch log -------------------------------------------------------------------


def _half_fired(store, tmp_path: Path, clock: Clock) -> tuple[DelayStore, Path]:
    """m0 (at position 0) is due late in the bucket, m1..m9 early; m1..m9 have fired."""
    s = store(clock)
    s.submit([_msg(0, T0 + 2900)]).result(10)
    s.submit([_msg(i, T0 + 2000 + i) for i in range(1, 10)]).result(10)
    clock.now = T0 + 2100
    _wait(lambda: _visible(s) == 9)
    dsp = tmp_path / "data" / "dispatch"
    _wait(lambda: dsp.exists() and any(dsp.iterdir()))
    s.close()
    return s, tmp_path / "data"


def test_dispatch_log_tail_cut_mid_entry(store, tmp_path, caplog) -> None:
    clock = Clock()
    _, data = _half_fired(store, tmp_path, clock)
    dsp = _only_file(data / "dispatch")
    os.truncate(dsp, dsp.stat().st_size - 3)
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert "cutting a torn tail of 5 bytes" in caplog.text
    clock.now = T0 + 3000
    _wait(lambda: _visible(s2) >= 10)
    got = _fired(s2)
    # the lost dispatch entry is restored from the consume log: nothing fires twice
    assert sorted(int(f.msg_id[1:]) for f in got) == list(range(10))


@pytest.mark.parametrize("fill", sorted(GARBAGE))
def test_dispatch_log_garbage_tail(store, tmp_path, caplog, fill) -> None:
    clock = Clock()
    _, data = _half_fired(store, tmp_path, clock)
    dsp = _only_file(data / "dispatch")
    with open(dsp, "ab") as f:
        f.write(GARBAGE[fill](8 * 30 + 3))
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert "cutting a torn tail" in caplog.text
    clock.now = T0 + 3000
    _wait(lambda: _visible(s2) >= 10)
    assert sorted(int(f.msg_id[1:]) for f in _fired(s2)) == list(range(10))


# --- consume log --------------------------------------------------------------------


def _fired_all(store, clock: Clock) -> DelayStore:
    s = store(clock)
    s.submit([_msg(i, T0 + 100 + i) for i in range(10)]).result(10)
    clock.now = T0 + 1000
    _wait(lambda: _visible(s) == 10)
    s.close()
    return s


@pytest.mark.parametrize("fill", sorted(GARBAGE))
def test_consume_log_garbage_tail(store, tmp_path, caplog, fill) -> None:
    clock = Clock()
    _fired_all(store, clock)
    q0 = tmp_path / "data" / "consume" / "t" / "0"
    size = (q0 / "log").stat().st_size
    with open(q0 / "log", "ab") as f:
        f.write(GARBAGE[fill](700))
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert "cutting 700 torn bytes" in caplog.text
    assert (q0 / "log").stat().st_size == size
    _check_all_fired(s2, 10, clock)
    s2.submit([_msg(10, 0)]).result(10)  # later fires append after the cut
    _wait(lambda: _visible(s2) == 11)
    assert [f.offset for f in s2.pull("t", 0, 0, 100)] == list(range(6))


def test_consume_log_tail_cut_mid_record(store, tmp_path, caplog) -> None:
    clock = Clock()
    _fired_all(store, clock)
    q0 = tmp_path / "data" / "consume" / "t" / "0"
    os.truncate(q0 / "log", (q0 / "log").stat().st_size - 7)
    for p in (tmp_path / "data" / "dispatch").iterdir():
        p.unlink()  # written after the consume log's sync, so lost with its tail
    with caplog.at_level(logging.WARNING, "qclient"):
        s2 = store(clock)
    assert "torn bytes" in caplog.text
    # the last fired copy on queue 0 is gone: it was not durable, so it was not
    # dispatched either, and it fires again (at-least-once, never lost)
    _wait(lambda: _visible(s2) == 10)
    assert sorted(int(f.msg_id[1:]) for f in _fired(s2)) == list(range(10))


def test_consume_log_bit_flip_is_skipped_and_reported(store, tmp_path, caplog) -> None:
    clock = Clock()
    _fired_all(store, clock)
    q0 = tmp_path / "data" / "consume" / "t" / "0"
    _flip(q0 / "log", 100)  # in the first record's body
    s2 = store(clock)
    with caplog.at_level(logging.ERROR, "qclient"):
        got = s2.pull("t", 0, 0, 100)
    # the corrupt copy is never handed out; the ones after it are (no stuck consumer)
    assert [f.msg_id for f in got] == ["m2", "m4", "m6", "m8"]
    assert [f.offset for f in got] == [1, 2, 3, 4]
    assert "corrupt record at offset 0" in caplog.text
