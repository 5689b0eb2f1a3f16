"""DelayStore behaviour on a live store (real files, real threads)."""

from __future__ import annotations

import gc
import random
import threading
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.server.store.conftest import FakeClock, msg, pull_all, visible, wait_until

from qclient.server.store import (
    CancelOutcome,
    DelayStore,
    InvalidRecordError,
    NewMessage,
    StoreBusyError,
    StoreError,
    wall_clock_ms,
)
from qclient.server.store.cancel import locate
from qclient.server.store.dedupe import DedupeTable


def test_round_trip_fields_and_results(make_store) -> None:
    s = make_store(fsync=True)
    now = wall_clock_ms()
    m = NewMessage(
        "orders",
        2,
        "id-1",
        b"\x00body",
        now,
        key="k",
        tags="a||b",
        properties={"x": "1", "y": ""},
        flag=1,
    )
    res = s.submit([m]).result(timeout=10)
    assert [(r.msg_id, r.queue_id, r.deliver_at_ms, r.duplicate) for r in res] == [
        ("id-1", 2, now, False)
    ]
    wait_until(lambda: s.max_offset("orders", 2) == 1)
    [f] = s.pull("orders", 2, 0, 10)
    assert (
        f.msg_id,
        f.topic,
        f.queue_id,
        f.offset,
        f.body,
        f.key,
        f.tags,
        f.properties,
        f.deliver_at_ms,
        f.flag,
    ) == ("id-1", "orders", 2, 0, b"\x00body", "k", "a||b", {"x": "1", "y": ""}, now, 1)
    assert f.fired_at_ms >= now
    assert s.pull("orders", 2, 1, 10) == []
    assert s.pull("orders", 1, 0, 10) == []
    assert s.pull("nope", 0, 0, 10) == []
    st = s.stats()
    assert st["appended"] == 1 and st["fsyncs"] >= 1 and st["fired"] == 1


def test_none_early_real_clock(make_store) -> None:
    """Every message becomes visible no earlier than its deliver time, and all arrive."""
    s = make_store(fsync=True, bucket_ms=200, load_ahead_ms=100)
    rng = random.Random(7)
    now = wall_clock_ms()
    msgs = [msg(i, now + rng.randrange(0, 600)) for i in range(2000)]
    futs = [s.submit(msgs[i : i + 256]) for i in range(0, len(msgs), 256)]
    for f in futs:
        f.result(timeout=10)
    seen: dict[str, int] = {}
    offs = [0] * 4
    deadline = time.monotonic() + 10
    while len(seen) < len(msgs) and time.monotonic() < deadline:
        for q in range(4):
            got = s.pull("t", q, offs[q], 500)
            t_seen = wall_clock_ms()
            for f in got:
                assert t_seen >= f.deliver_at_ms, "visible before its time"
                assert f.fired_at_ms >= f.deliver_at_ms
                seen[f.msg_id] = f.fired_at_ms
            if got:
                offs[q] = got[-1].offset + 1
        time.sleep(0.002)
    assert len(seen) == len(msgs)
    assert sum(offs) == len(msgs)  # no duplicates


def test_not_visible_before_time_fake_clock(make_store) -> None:
    clock = FakeClock(1_000_000_000)
    s = make_store(clock=clock)
    s.submit([msg(0, clock.now + 100), msg(1, clock.now + 100)]).result(timeout=10)
    clock.advance(99)
    # the firing thread re-reads the clock at least every 50 ms: give it a few rounds
    time.sleep(0.2)
    assert visible(s, "t") == 0
    assert s.stats()["wheel_size"] == 2
    clock.advance(1)
    wait_until(lambda: visible(s, "t") == 2)
    assert all(f.fired_at_ms == clock.now for f in pull_all(s, "t"))


def test_millisecond_ordering(make_store) -> None:
    clock = FakeClock(2_000_000_000)
    s = make_store(clock=clock)
    times = list(range(clock.now + 10, clock.now + 510))
    random.Random(1).shuffle(times)
    s.submit([NewMessage("t", 0, f"id{t}", b"", t) for t in times]).result(timeout=10)
    clock.advance(1000)
    wait_until(lambda: s.max_offset("t", 0) == 500)
    got = s.pull("t", 0, 0, 1000)
    assert [f.deliver_at_ms for f in got] == sorted(times)


def test_overdue_fires_at_once(make_store) -> None:
    s = make_store()
    now = wall_clock_ms()
    s.submit([msg(i, now - 60_000 - i) for i in range(10)]).result(timeout=10)
    wait_until(lambda: visible(s, "t") == 10, timeout=5)


def test_far_future_stays_on_disk(make_store) -> None:
    s = make_store(bucket_ms=60_000, load_ahead_ms=60_000)
    week = wall_clock_ms() + 7 * 86_400_000
    for i in range(0, 5000, 500):
        s.submit([msg(j, week + j) for j in range(i, i + 500)]).result(timeout=10)
    st = s.stats()
    assert st["wheel_size"] == 0
    assert st["active_buckets"] == 0
    assert 1 <= st["unloaded_buckets"] <= 2  # 5 s of deliver times may straddle a bucket
    assert st["appended"] == 5000


def test_dedupe_same_batch_inflight_and_later(make_store) -> None:
    s = make_store(fsync=True)
    at = wall_clock_ms() + 60_000
    a = NewMessage("t", 1, "dup", b"a", at)
    b = NewMessage("t", 3, "dup", b"b", at + 5)  # same id, other content: still a duplicate
    f1 = s.submit([a, b, a])
    f2 = s.submit([b])  # likely still in flight
    r1, r2 = f1.result(timeout=10), f2.result(timeout=10)
    assert [r.duplicate for r in r1] == [False, True, True]
    assert all((r.queue_id, r.deliver_at_ms) == (1, at) for r in r1 + r2)
    assert r2[0].duplicate
    r3 = s.submit([b]).result(timeout=10)[0]
    assert (r3.duplicate, r3.queue_id, r3.deliver_at_ms) == (True, 1, at)
    assert s.stats()["appended"] == 1


def test_dedupe_window_expires(make_store) -> None:
    clock = FakeClock(3_000_000_000)
    s = make_store(clock=clock, dedupe_window_ms=10_000)
    m = msg(0, clock.now + 10**6)
    assert not s.submit([m]).result(timeout=10)[0].duplicate
    clock.advance(5_000)
    assert s.submit([m]).result(timeout=10)[0].duplicate
    clock.advance(7_000)
    s.submit([msg(1, clock.now + 10**6)]).result(timeout=10)  # triggers expiry
    assert not s.submit([m]).result(timeout=10)[0].duplicate


def test_dedupe_count_bound(make_store) -> None:
    s = make_store(dedupe_max_ids=100)
    at = wall_clock_ms() + 10**6
    s.submit([msg(i, at) for i in range(300)]).result(timeout=10)
    assert s.stats()["dedupe_ids"] == 100
    assert s.submit([msg(299, at)]).result(timeout=10)[0].duplicate
    assert not s.submit([msg(0, at)]).result(timeout=10)[0].duplicate


def test_cancel_before_fire_and_states(make_store) -> None:
    # a fake clock: "before fire" holds however long the submit's fsync and the cancels
    # take on a loaded host (a real 400 ms could pass before the first cancel)
    clock = FakeClock(13_000_000_000)
    s = make_store(clock=clock, fsync=True)
    now = clock.now
    res = s.submit([msg(0, now + 400), msg(1, now + 400), msg(2, now + 86_400_000)]).result(10)
    assert s.cancel("t", "m0", res[0].deliver_at_ms).result(10) == CancelOutcome(True, None)
    assert s.cancel("t", "m0", res[0].deliver_at_ms).result(10).reason == "already_cancelled"
    assert s.cancel("t", "m2", res[2].deliver_at_ms).result(10).cancelled  # unloaded bucket
    assert s.cancel("t", "zz", now).result(10).reason == "not_found"
    assert s.cancel("other", "m1", res[1].deliver_at_ms).result(10).reason == "not_found"
    clock.advance(400)
    wait_until(lambda: visible(s, "t") == 1)
    assert [f.msg_id for f in pull_all(s, "t")] == ["m1"]
    assert s.cancel("t", "m1", res[1].deliver_at_ms).result(10).reason == "already_fired"
    assert s.stats()["cancelled"] == 2


def test_offsets_commit_and_persist(make_store, tmp_path) -> None:
    s = make_store()
    assert s.committed_offset("g", "t", 0) == 0
    now = wall_clock_ms()
    s.submit([msg(i, now) for i in range(32)]).result(10)  # 8 in each queue
    wait_until(lambda: visible(s, "t") == 32)
    s.commit_offset("g", "t", 0, 5)
    s.commit_offset("g", "t", 3, 7)
    s.commit_offset("h", "t", 0, 1)
    assert s.committed_offset("g", "t", 0) == 5
    s.close()
    s2 = make_store()
    assert (
        s2.committed_offset("g", "t", 0),
        s2.committed_offset("g", "t", 3),
        s2.committed_offset("h", "t", 0),
        s2.committed_offset("g", "u", 0),
    ) == (5, 7, 1, 0)
    with pytest.raises(ValueError):
        s2.commit_offset("../g", "t", 0, 1)
    with pytest.raises(ValueError):
        s2.commit_offset("g", "t", 0, -1)


def test_fire_listener_gets_topics(make_store) -> None:
    s = make_store()
    got: list[set[str]] = []
    ev = threading.Event()

    def cb(topics: set[str]) -> None:
        got.append(topics)
        ev.set()

    s.add_fire_listener(cb)
    s.submit([msg(0, wall_clock_ms(), topic="a"), msg(1, wall_clock_ms(), topic="b")]).result(10)
    assert ev.wait(5)
    wait_until(lambda: set().union(*got) == {"a", "b"})


@pytest.mark.parametrize(
    "bad",
    [
        NewMessage("../etc", 0, "i", b"", 0),
        NewMessage("a/b", 0, "i", b"", 0),
        NewMessage("", 0, "i", b"", 0),
        NewMessage("t", -1, "i", b"", 0),
        NewMessage("t", 70000, "i", b"", 0),
        NewMessage("t", 0, "", b"", 0),
        NewMessage("t", 0, "i", b"", -5),
        NewMessage("t", 0, "i", b"", 10**15),
        NewMessage("t", 0, "i", b"", 0, key="k" * 70000),
    ],
)
def test_bad_input_stores_nothing(make_store, bad: NewMessage) -> None:
    s = make_store()
    good = msg(0, wall_clock_ms() + 10**6)
    with pytest.raises(InvalidRecordError):
        s.submit([good, bad])
    assert s.stats()["appended"] == 0
    assert not s.submit([good]).result(10)[0].duplicate
    with pytest.raises(ValueError):
        s.pull("..", 0, 0, 1)


def test_too_large_and_busy(make_store) -> None:
    s = make_store(max_pending_messages=10, max_record_bytes=1000)
    with pytest.raises(InvalidRecordError):
        s.submit([msg(0, 0, body=b"x" * 2000)])
    with pytest.raises(StoreBusyError):
        s.submit([msg(i, 0) for i in range(11)])
    assert len(s.submit([msg(i, 0) for i in range(10)]).result(10)) == 10


def test_closed_store_refuses_and_second_open_of_dir_fails(make_store, tmp_path) -> None:
    s = make_store()
    with pytest.raises(StoreError):
        make_store()  # same data dir, locked
    s.close()
    s.close()
    with pytest.raises(StoreError):
        s.submit([msg(0, 0)])


def test_far_future_memory_is_small(make_store) -> None:
    """40k x 1 KiB a week ahead: no bodies or wheel entries in memory, only the dedupe ids."""
    psutil = pytest.importorskip("psutil")
    s = make_store(bucket_ms=3_600_000, load_ahead_ms=1_800_000)
    proc = psutil.Process()
    week = wall_clock_ms() + 7 * 86_400_000
    body = bytes(range(256)) * 4
    s.submit([msg(0, week, body=body)]).result(10)  # warm up
    gc.collect()
    before = proc.memory_info().rss
    for i in range(1, 40_001, 500):
        s.submit([msg(j, week + j, body=body) for j in range(i, i + 500)]).result(10)
    gc.collect()
    grown = proc.memory_info().rss - before
    st = s.stats()
    assert st["wheel_size"] == 0 and st["appended"] == 40_001
    assert grown < 12 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB"


def test_schedule_find_is_aligned(tmp_path) -> None:
    from qclient.server.store.schedule_log import ENTRY, ScheduleLog

    slog = ScheduleLog(tmp_path / "s", fsync=False)
    # deliver times whose bytes also occur misaligned inside other fields
    entries = [(7, 7 << 8, 7, 1), (7 << 8, 7, 1, 2), (7, 99, 3, 1), (5, 7, 0, 2)]
    slog.append(3, b"".join(ENTRY.pack(*e) for e in entries))
    assert slog.find(3, deliver_at_ms=7) == [entries[0], entries[2]]
    assert slog.find(3, position=7) == [entries[1], entries[3]]
    assert slog.find(3, position=12345) == []
    assert slog.find(4, deliver_at_ms=7) == []
    slog.close()


def test_cancel_slow_path_when_id_forgotten(make_store) -> None:
    s = make_store(dedupe_max_ids=1)
    at = wall_clock_ms() + 86_400_000
    res = s.submit([msg(i, at + i % 3) for i in range(50)]).result(10)
    assert s.stats()["dedupe_ids"] == 1
    assert s.cancel("t", "m10", res[10].deliver_at_ms).result(10).cancelled
    assert s.cancel("t", "m10", res[10].deliver_at_ms).result(10).reason == "already_cancelled"
    assert s.cancel("t", "m11", res[10].deliver_at_ms).result(10).reason == "not_found"


def test_cancel_racing_the_firing_thread(make_store) -> None:
    """A cancel meets its message at each stage of firing, each stage held open so the
    interleaving is forced, not hoped for: not yet due (cancelled); popped by the firing
    thread and being appended (already_fired); and fired and dispatched between the
    cancel's read of the dispatch log and its decision under the scheduler lock
    (already_fired: the wheel's dispatch generation makes it read again). Each message is
    delivered or reported cancelled, never both, never neither."""
    clock = FakeClock(12_000_000_000)
    s = make_store(clock=clock, bucket_ms=1000, load_ahead_ms=10_000)
    n = 1000
    base = clock.now + 1000
    msgs = [msg(i, base + i) for i in range(n)]
    res = s.submit(msgs).result(10)
    # due after every message of "t": once it is visible, firing has passed all of them
    s.submit([NewMessage("end", 0, "end", b"", base + n)]).result(10)
    wait_until(lambda: s.stats()["wheel_size"] == n + 1)
    sh = s._sh
    half = n // 2  # messages 0..half-1 come due at once, the rest stay scheduled
    late_reader = 7  # a due message whose cancel reads the dispatch log before it is written
    found = locate(sh, "t", msgs[late_reader].msg_id, res[late_reader].deliver_at_ms)
    assert found is not None
    late_pos = found[0]

    # the firing thread pops what is due, then waits inside its step until released
    popped: list[int] = []
    in_step, release = threading.Event(), threading.Event()
    fire = s._firing._fire

    def held_fire(due: list[tuple[int, int, int]], now: int) -> None:
        popped.append(len(due))
        in_step.set()
        assert release.wait(10)
        fire(due, now)

    s._firing._fire = held_fire  # type: ignore[method-assign]
    # the late reader's first (unlocked) read of the dispatch log finds nothing; firing is
    # released only then, and the read returns once the syncer has dispatched the message
    read_once, contains = threading.Event(), s._files.dlog.contains

    def racing_contains(bucket: int, position: int) -> bool:
        found = contains(bucket, position)
        if position == late_pos and not read_once.is_set():
            assert not found
            read_once.set()
            wait_until(lambda: late_pos not in sh.wheel.firing)
        return found

    s._files.dlog.contains = racing_contains  # type: ignore[method-assign]

    clock.advance(1000 + half - 1)
    assert in_step.wait(10)
    assert popped == [half]
    outcomes: dict[str, CancelOutcome] = {}
    late = threading.Thread(
        target=lambda: outcomes.setdefault(
            msgs[late_reader].msg_id,
            s.cancel("t", msgs[late_reader].msg_id, res[late_reader].deliver_at_ms).result(10),
        )
    )
    late.start()
    assert read_once.wait(10)
    order = [i for i in range(n) if i != late_reader]
    random.Random(3).shuffle(order)
    # all decided while the due half is popped and not yet appended (each cancel decides
    # at the call; its future completes once the tombstone is durable)
    pending = {msgs[i].msg_id: s.cancel("t", msgs[i].msg_id, res[i].deliver_at_ms) for i in order}
    release.set()
    outcomes.update((k, f.result(10)) for k, f in pending.items())
    late.join(10)
    assert not late.is_alive()

    by_reason = Counter(o.reason for o in outcomes.values())
    assert by_reason == {"already_fired": half, None: n - half}
    assert all(outcomes[m.msg_id].reason == "already_fired" for m in msgs[:half])
    cancelled = {k for k, o in outcomes.items() if o.cancelled}
    clock.advance(n)  # every deliver time has passed
    wait_until(lambda: visible(s, "end") == 1)
    wait_until(lambda: visible(s, "t") == n - len(cancelled))
    delivered = Counter(f.msg_id for f in pull_all(s, "t"))
    assert max(delivered.values()) == 1
    assert not cancelled & set(delivered)
    assert cancelled | set(delivered) == {m.msg_id for m in msgs}
    # and once settled, every message says what became of it
    asked = {
        m.msg_id: s.cancel("t", m.msg_id, r.deliver_at_ms) for m, r in zip(msgs, res, strict=True)
    }
    again = {k: f.result(10) for k, f in asked.items()}
    assert {k for k, o in again.items() if o.reason == "already_cancelled"} == cancelled
    assert {k for k, o in again.items() if o.reason == "already_fired"} == set(delivered)


def test_back_pressure_by_bytes_while_the_committer_is_stuck(make_store) -> None:
    s = make_store(max_pending_bytes=50_000)
    entered, release = threading.Event(), threading.Event()
    orig = s._files.mlog.sync

    def stuck_sync() -> None:
        entered.set()
        assert release.wait(10)
        orig()

    s._files.mlog.sync = stuck_sync  # type: ignore[method-assign]
    at = wall_clock_ms() + 10**6
    first = s.submit([msg(0, at, body=b"x" * 1000)])
    assert entered.wait(5)  # the committer is inside the group's sync
    queued = s.submit([msg(i, at, body=b"x" * 1000) for i in range(1, 40)])  # ~45 KB pending
    with pytest.raises(StoreBusyError):
        s.submit([msg(i, at, body=b"x" * 1000) for i in range(40, 50)])
    assert s.stats()["busy_rejections"] == 1
    release.set()
    assert len(first.result(10)) == 1 and len(queued.result(10)) == 39
    assert s.stats()["pending_bytes"] == 0
    assert not s.submit([msg(45, at)]).result(10)[0].duplicate  # the refused ones were not kept


def test_many_buckets_more_than_open_files(make_store, tmp_path) -> None:
    """Deliver times spread over more buckets than the fd LRU holds; all fire, across a
    restart too."""
    clock = FakeClock(10_000_000_000)
    s = make_store(clock=clock, bucket_ms=10, load_ahead_ms=0, fsync=True)
    for rnd in range(3):
        batch = [msg(i, clock.now + 1000 + i * 7) for i in range(rnd * 100, rnd * 100 + 100)]
        s.submit(batch).result(10)
    s.close()  # writes the buffered schedule entries: one file per bucket
    assert len(list((tmp_path / "data" / "schedule").iterdir())) > 200
    s2 = make_store(clock=clock, bucket_ms=10, load_ahead_ms=0, fsync=True)
    clock.advance(5000)  # past the last deliver time (1000 + 299 * 7)
    wait_until(lambda: visible(s2, "t") == 300)
    assert len({f.msg_id for f in pull_all(s2, "t")}) == 300


def test_fire_failure_is_retried_without_loss_or_duplicates(make_store, monkeypatch) -> None:
    from qclient.server.store.consume_log import ConsumeQueue

    s = make_store()
    orig = ConsumeQueue.append
    failures = []

    def flaky(self, items):
        if not failures:
            failures.append(1)
            raise OSError(28, "No space left on device")
        return orig(self, items)

    monkeypatch.setattr(ConsumeQueue, "append", flaky)
    now = wall_clock_ms()
    s.submit([msg(i, now, topic="f") for i in range(8)]).result(10)
    wait_until(lambda: visible(s, "f") == 8)
    assert failures and s.stats()["fire_errors"] >= 1
    assert Counter(f.msg_id for f in pull_all(s, "f")) == {f"m{i}": 1 for i in range(8)}


@pytest.mark.parametrize(
    "bad",
    [
        NewMessage("../etc", 0, "i", b"", 0),
        NewMessage("a/b", 0, "i", b"", 0),
        NewMessage("t", 0, "i", b"x" * 2000, 0),  # over max_record_bytes
    ],
)
def test_validated_submit_still_checks_topics_and_sizes(make_store, bad: NewMessage) -> None:
    """submit(validated=True) skips only what the broker checked: a bad topic or an
    oversized record is still refused, and nothing of the call is stored."""
    s = make_store(max_record_bytes=1000)
    good = msg(0, wall_clock_ms() + 10**6, body=b"x" * 10)
    with pytest.raises(InvalidRecordError):
        s.submit([good, bad], validated=True)
    assert s.stats()["appended"] == 0


def test_validated_submit_stores_what_the_checked_path_stores(make_store, tmp_path) -> None:
    clock = FakeClock(1_700_000_000_000)
    a = make_store(clock=clock, data_dir=tmp_path / "a")
    b = make_store(clock=clock, data_dir=tmp_path / "b")
    msgs = [msg(i, clock.now + 500 + i, body=bytes([i]) * i) for i in range(50)]
    msgs.append(msg(50, clock.now + 10, key="k", tags="t", properties={"p": "v"}))
    msgs.append(msg(3, clock.now + 999))  # a duplicate id within the call
    ra = a.submit(msgs, validated=True).result(10)
    rb = b.submit(msgs).result(10)
    assert ra == rb and ra[-1].duplicate
    clock.advance(2000)
    wait_until(lambda: visible(a, "t") == 51 and visible(b, "t") == 51)

    def fired(s: DelayStore) -> list[tuple]:
        return sorted(
            (m.msg_id, m.body, m.deliver_at_ms, m.key, m.tags, m.properties)
            for m in pull_all(s, "t")
        )

    assert fired(a) == fired(b)


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.lists(st.integers(0, 40), max_size=12), max_size=8),
    max_ids=st.integers(1, 30),
)
def test_dedupe_add_many_equals_adding_one_by_one(batches: list[list[int]], max_ids: int) -> None:
    one, many = DedupeTable(60_000, max_ids), DedupeTable(60_000, max_ids)
    pos = 0
    for k, hashes in enumerate(batches):
        now = 1000 * k
        positions = list(range(pos, pos + len(hashes)))
        pos += len(hashes)
        for h, p in zip(hashes, positions, strict=True):
            one.add(h, p, now)
        many.add_many(hashes, positions, now)
        assert many._map == one._map
        assert list(many._ring[many._head :]) == list(one._ring[one._head :])
