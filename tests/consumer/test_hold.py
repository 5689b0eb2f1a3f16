"""The consumer's hold: nothing released before its time, due ones earliest first, and
the offset to commit never past a message not returned yet."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from qclient.consumer._hold import ClockOffset, HeldMessages
from qclient.protocol import wire


def _msg(q: int, offset: int, deliver_at_ms: int) -> wire.PulledMessage:
    return wire.PulledMessage(f"{q}-{offset}", "t", b"", q, offset, deliver_at_ms, 0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 50), max_size=12), min_size=1, max_size=4),
    st.lists(st.integers(1, 8), min_size=1, max_size=30),
    st.integers(1, 10),
)
def test_release_never_early_and_commits_stop_at_the_first_held(
    dues: list[list[int]], steps: list[int], limit: int
) -> None:
    held = HeldMessages()
    held.clock("b").add(remote_ns=0, local_ns=0)  # the broker's clock is ours
    for q, ds in enumerate(dues):  # each queue's messages in offset order
        held.add("b", [_msg(q, off, d) for off, d in enumerate(ds)])
    returned: dict[int, set[int]] = {q: set() for q in range(len(dues))}
    committable: dict[int, int] = {}
    now_ms = 0
    for step in [*steps, 100]:
        now_ms += step
        while True:
            out, commit = held.release(limit, now_ns=now_ms * 1_000_000)
            assert len(out) <= limit
            dues_out = [m.deliver_at_ms for m in out]
            assert dues_out == sorted(dues_out), "earliest first"
            for m in out:
                assert m.deliver_at_ms <= now_ms, "released before its time"
                returned[m.queue_id].add(m.offset)
            for (_b, q), off in commit.items():
                first_held = next(
                    (o for o in range(len(dues[q])) if o not in returned[q]), len(dues[q])
                )
                assert off == first_held, (q, off, first_held)
                committable[q] = off
            if len(out) < limit:
                break
    assert len(held) == 0
    assert all(returned[q] == set(range(len(ds))) for q, ds in enumerate(dues))
    assert all(committable.get(q, 0) == len(ds) for q, ds in enumerate(dues) if ds)


def test_drop_forgets_a_queue() -> None:
    held = HeldMessages()
    held.clock("b").add(remote_ns=0, local_ns=0)
    held.add("b", [_msg(0, 0, 5), _msg(1, 0, 5), _msg(0, 1, 6)])
    held.drop("b", 0)
    out, commit = held.release(10, now_ns=10 * 1_000_000)
    assert [(m.queue_id, m.offset) for m in out] == [(1, 0)]
    assert commit == {("b", 1): 1}


def test_release_time_follows_the_brokers_clock() -> None:
    held = HeldMessages()
    # the broker's clock is 3 ms ahead of ours (its answer took 0.5 ms to arrive)
    held.clock("b").add(remote_ns=103_000_000, local_ns=100_500_000)
    held.add("b", [_msg(0, 0, 110)])
    assert held.next_release_ns() == 107_500_000  # 110 ms by the estimate, a bit late
    assert held.release(1, now_ns=107_499_999) == ([], {})
    out, _ = held.release(1, now_ns=107_500_000)
    assert len(out) == 1


def test_clock_offset_keeps_the_windows_largest_sample() -> None:
    t = [0.0]
    c = ClockOffset(window_s=10, monotonic=lambda: t[0])
    assert c.ns is None
    c.add(1_000, 0)  # transit-skewed samples: the largest is the closest
    c.add(900, 0)
    assert c.ns == 1_000
    t[0] = 11.0  # the 1_000 sample left the window (a stepped clock is followed)
    c.add(500, 0)
    assert c.ns == 500


def test_without_a_broker_clock_our_wall_clock_decides() -> None:
    held = HeldMessages()
    due_ms = time.time_ns() // 1_000_000 + 50
    held.add("b", [_msg(0, 0, due_ms)])
    release = held.next_release_ns()
    assert release is not None
    wall_to_mono = time.time_ns() - time.monotonic_ns()
    assert abs(release - (due_ms * 1_000_000 - wall_to_mono)) < 2_000_000  # ms, not steps
