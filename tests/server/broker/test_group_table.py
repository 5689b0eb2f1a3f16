"""The broker's group table: a queue has one owner at a time and moves only after its
owner released it or stopped renewing its lease."""

from __future__ import annotations

from qclient.consumer import allocate_averagely
from qclient.server.broker.groups import GroupTable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_held_queue_is_not_granted_until_released() -> None:
    t = GroupTable(Clock())
    assert t.heartbeat("g", "t", "a", 3.0, [0, 1, 2, 3]) == (["a"], [0, 1, 2, 3])
    members, owned = t.heartbeat("g", "t", "b", 3.0, [2, 3])
    assert (members, owned) == (["a", "b"], [])  # a still holds them
    assert t.heartbeat("g", "t", "a", 3.0, [0, 1]) == (["a", "b"], [0, 1])  # releases 2, 3
    assert t.heartbeat("g", "t", "b", 3.0, [2, 3]) == (["a", "b"], [2, 3])
    assert t.hold("g", "t", "a", [0, 1, 2, 3]) == {0, 1}
    assert t.hold("g", "t", "b", [0, 1, 2, 3]) == {2, 3}


def test_an_expired_owner_loses_its_queues_and_membership() -> None:
    clock = Clock()
    t = GroupTable(clock)
    t.heartbeat("g", "t", "a", 3.0, [0, 1])
    clock.now += 2.0
    assert t.hold("g", "t", "a", [0]) == {0}  # a pull renews the lease of what it reads
    clock.now += 2.0  # queue 1 was last renewed 4 s ago, queue 0 2 s ago
    assert t.heartbeat("g", "t", "b", 3.0, [0, 1]) == (["a", "b"], [1])
    clock.now += 3.1  # a silent for more than its lease
    assert t.heartbeat("g", "t", "b", 3.0, [0, 1]) == (["b"], [0, 1])
    assert t.hold("g", "t", "a", [0, 1]) == set()


def test_leave_releases_everything_at_once() -> None:
    t = GroupTable(Clock())
    t.heartbeat("g", "t", "a", 3.0, [0, 1])
    t.heartbeat("g", "t", "b", 3.0, [])
    assert t.heartbeat("g", "t", "a", 3.0, [0, 1], leave=True) == (["b"], [])
    assert t.heartbeat("g", "t", "b", 3.0, [0, 1]) == (["b"], [0, 1])


def test_groups_and_topics_are_independent() -> None:
    t = GroupTable(Clock())
    assert t.heartbeat("g1", "t", "a", 3.0, [0])[1] == [0]
    assert t.heartbeat("g2", "t", "b", 3.0, [0])[1] == [0]
    assert t.heartbeat("g1", "u", "b", 3.0, [0])[1] == [0]


def test_allocation_is_contiguous_and_covers_every_queue_once() -> None:
    queues = [(b, q) for b in ("broker-a", "broker-b") for q in range(8)]
    for n in range(1, 20):
        members = sorted(f"m{i:02d}" for i in range(n))
        shares = [allocate_averagely(queues, members, m) for m in members]
        assert sorted(q for s in shares for q in s) == queues
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1
    assert allocate_averagely(queues, ["a", "b", "c"], "a") == queues[:6]
    assert allocate_averagely(queues, ["a", "b"], "z") == []
