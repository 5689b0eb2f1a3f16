"""The copies ``retry_later`` and ``dead_letter`` send on qclient's engine, the message a
retry comes back as, and the held messages' commit offsets past skipped ones (no I/O)."""

from __future__ import annotations

import zlib

from qclient import ReceivedMessage
from qclient.consumer._failures import (
    PROP_ATTEMPTS,
    PROP_ORIGIN_MSG_ID,
    PROP_ORIGIN_TOPIC,
    PROP_REASON,
)
from qclient.consumer._hold import HeldMessages
from qclient.consumer._retry import (
    PROP_RETRY,
    dlq_copy,
    dlq_msg_id,
    from_retry,
    queue_for,
    retry_copy,
    retry_msg_id,
)
from qclient.protocol import wire

NOW = 1_800_000_000_000


def _received(body: bytes = b"body", attempt: int = 1) -> ReceivedMessage:
    return ReceivedMessage(
        "id-1", "orders", body, "k", "TagA", {"p": "1"}, NOW, NOW, "b0", 2, 7, attempt
    )


def _pulled(copy: wire.WireMessage, offset: int = 0) -> wire.PulledMessage:
    return wire.PulledMessage(
        msg_id=copy.msg_id,
        topic=copy.topic,
        body=copy.body,
        queue_id=copy.queue_id,
        offset=offset,
        deliver_at_ms=NOW + (copy.delay_ms or 0),
        fired_at_ms=NOW,
        key=copy.key,
        tags=copy.tags,
        properties=copy.properties,
        flag=copy.flag,
    )


def test_a_retry_comes_back_as_the_original_one_attempt_later():
    copy = retry_copy(_received(attempt=2), "billing", 1.0004, queues=4)
    assert copy.topic == "%RETRY%billing"
    assert copy.delay_ms == 1001  # rounded up: never early
    assert copy.msg_id == retry_msg_id("billing", "id-1", 3) != "id-1"
    assert copy.properties == {"p": "1", PROP_RETRY: "3 orders id-1"}
    back = from_retry(_pulled(copy, offset=5), "b1")
    assert (back.msg_id, back.topic, back.body, back.key, back.tags) == (
        "id-1",
        "orders",
        b"body",
        "k",
        "TagA",
    )
    assert back.properties == {"p": "1"} and back.attempt == 3
    assert (back.broker_name, back.queue_id, back.offset) == ("b1", copy.queue_id, 5)


def test_big_bodies_travel_compressed_and_come_back_whole():
    body = b"x" * 10_000
    copy = retry_copy(_received(body), "g", 1)
    assert copy.flag & wire.FLAG_COMPRESSED and zlib.decompress(copy.body) == body
    assert from_retry(_pulled(copy), "b").body == body


def test_a_message_in_a_retry_topic_without_bookkeeping_is_shown_as_it_is():
    plain = wire.PulledMessage("x", "%RETRY%g", b"b", 0, 0, NOW, NOW, properties={"a": "b"})
    back = from_retry(plain, "b0")
    assert (back.msg_id, back.topic, back.attempt, back.properties) == (
        "x",
        "%RETRY%g",
        1,
        {"a": "b"},
    )


def test_ids_are_one_per_group_message_and_attempt():
    assert retry_msg_id("g", "m", 2) == retry_msg_id("g", "m", 2)
    ids = {retry_msg_id("g", "m", 2), retry_msg_id("g", "m", 3), retry_msg_id("h", "m", 2)}
    assert len(ids) == 3
    assert dlq_msg_id("g", "m") != dlq_msg_id("h", "m")
    assert wire.MSG_ID_RE.match(retry_msg_id("g", "m" * 128, 16))
    assert queue_for("m", 0) == 0 and {queue_for(f"m{i}", 4) for i in range(64)} == {0, 1, 2, 3}


def test_a_dead_lettered_copy_names_its_origin():
    copy = dlq_copy(_received(attempt=4), "billing", "no such customer")
    assert (copy.topic, copy.msg_id, copy.delay_ms, copy.deliver_at_ms) == (
        "%DLQ%billing",
        dlq_msg_id("billing", "id-1"),
        None,
        None,
    )
    assert copy.properties == {
        "p": "1",
        PROP_ORIGIN_TOPIC: "orders",
        PROP_ORIGIN_MSG_ID: "id-1",
        PROP_ATTEMPTS: "4",
        PROP_REASON: "no such customer",
    }
    assert (copy.body, copy.key, copy.tags) == (b"body", "k", "TagA")


def _pm(offset: int, deliver_at: int = NOW) -> wire.PulledMessage:
    return wire.PulledMessage(f"m{offset}", "t", b"", 0, offset, deliver_at, deliver_at)


def test_skipped_offsets_are_committed_with_what_was_returned():
    held = HeldMessages()
    held.clock("b").add(NOW * 1_000_000, 0)  # broker clock = our monotonic + NOW ms
    # offsets 3 and 5 returned, 4, 6 and 7 skipped by a tag filter: the pull ends at 8
    assert held.add("b", [_pm(3), _pm(5)], {0: 8}) == {}
    out, commit = held.release(10, now_ns=0)
    assert [m.offset for m in out] == [3, 5]
    assert commit == {("b", 0): 8}
    # a pull that skipped everything: committable at once, nothing held
    assert held.add("b", [], {0: 12}) == {("b", 0): 12}
    assert len(held) == 0


def test_skipped_end_waits_for_a_held_message():
    held = HeldMessages()
    held.clock("b").add(NOW * 1_000_000, 0)
    held.add("b", [_pm(0, NOW + 100), _pm(1)], {0: 5})
    out, commit = held.release(10, now_ns=0)
    assert [m.offset for m in out] == [1] and commit == {("b", 0): 0}
    out, commit = held.release(10, now_ns=100_000_000)
    assert [m.offset for m in out] == [0] and commit == {("b", 0): 5}
