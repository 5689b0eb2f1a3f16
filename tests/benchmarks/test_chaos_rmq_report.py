"""The RocketMQ chaos audit's arithmetic: a copy is a commit-log record of a group, however
many replicas' consume queues list it, and a queue offset two replicas give to different
records is reported (apache/rocketmq#7689)."""

from __future__ import annotations

from benchmarks._chaos_rmq_audit import Copy
from benchmarks._chaos_rmq_report import queue_divergence


def _copy(mid: str, offset: int, phys: int, replica: str) -> Copy:
    return Copy(mid, "broker-b", 1, offset, 1_000, 1_000, 900, True, phys, replica)


def test_a_record_read_on_two_replicas_is_one_copy_and_a_shared_offset_is_reported() -> None:
    a, b = "127.0.0.1:1", "127.0.0.1:2"
    copies = [
        _copy("m1", 7346, 100, a),
        _copy("m1", 7346, 100, b),  # the same record through both replicas' queues
        _copy("m2", 7347, 200, a),  # offset 7347 names m2 on one replica ...
        _copy("m3", 7347, 300, b),  # ... and m3 on the other
        _copy("m3", 7348, 300, a),  # where the first replica lists m3 one later
    ]
    assert len({(c.group, c.phys) for c in copies}) == 3
    assert queue_divergence(copies) == [
        {
            "group": "broker-b",
            "queue": 1,
            "offset": 7347,
            "records": {"m2": [a], "m3": [b]},
        }
    ]
    assert queue_divergence(copies[:2]) == []
    # another group's commit log may hold a record at the same offset: not the same record
    other = Copy("m9", "broker-a", 1, 7347, 1_000, 1_000, 900, True, 200, a)
    assert queue_divergence([*copies, other])[0]["records"] == {"m2": [a], "m3": [b]}
