"""The producer's fast paths give what the general paths give: bulk queue selection,
the ``WireBuilder`` fast validation, and settling a batch of ``SendFuture``s at once."""

from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, as_completed, wait
from datetime import timedelta
from typing import Any

import pytest

from qclient._config import ProducerConfig
from qclient._models import Message, SendResult, SendStatus
from qclient._validation import WireBuilder, message_to_wire
from qclient.errors import InvalidMessageError, QClientError
from qclient.fault import ContextIndex, MQFaultStrategy, ThreadLocalIndex
from qclient.fault.index import POSITIVE_MASK
from qclient.producer._future import SendFuture, settle_many
from qclient.producer._plan import Item
from qclient.routing import TopicPublishInfo

from .conftest import route


def _info(queues: int) -> TopicPublishInfo:
    return TopicPublishInfo.from_route("t", route("t", queues=queues), index=ThreadLocalIndex())


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 300])
@pytest.mark.parametrize("start", [0, 5, POSITIVE_MASK - 3])
def test_select_many_equals_one_at_a_time(n: int, start: int) -> None:
    s = MQFaultStrategy()
    a, b = _info(4), _info(4)
    a.index._local.value = b.index._local.value = start
    many = s.select_many(a, n)
    one = [s.select_one_message_queue(b) for _ in range(n)]
    assert many == one
    # and both counters are where n single selections leave them
    assert a.index.increment_and_get() == b.index.increment_and_get()


def test_context_index_advance() -> None:
    idx = ContextIndex()
    first = idx.advance(5)
    assert idx.increment_and_get() == (first + 5) & POSITIVE_MASK


def test_select_many_falls_back_when_a_broker_is_isolated() -> None:
    s = MQFaultStrategy()
    info = _info(4)
    isolated = info.queues[0].broker_name
    s.update_fault_item(isolated, 3000, True, True)
    picked = s.select_many(info, 20)
    assert len(picked) == 20 and all(q.broker_name != isolated for q in picked)


CFG = ProducerConfig.create("127.0.0.1:1", max_delay=timedelta(days=1))
NOW = time.time()


@pytest.mark.parametrize(
    "message",
    [
        Message("t", b"x" * 100, delay=60),
        Message("t", b"x", delay=1.5, key="k", tags="a"),
        Message("t", b"x", deliver_at=NOW + 60, msg_id="id-1"),
        Message("t", b"x"),
        Message("t", "text", delay=60),
        Message("t", b"x", properties={"a": "b"}, delay=0),
        Message("t", b"x" * 5000, delay=60),  # compressed: slow path
    ],
)
def test_wire_builder_same_wire_as_message_to_wire(message: Message) -> None:
    b = WireBuilder(CFG)
    for _ in range(2):  # the second time the topic is known: the fast path
        fast, slow = b.message(message), message_to_wire(CFG, message)
        if message.msg_id is None:
            assert fast.msg_id != slow.msg_id
            fast.msg_id = slow.msg_id
        assert fast == slow


@pytest.mark.parametrize(
    "message",
    [
        Message("t", b"x", delay=-1),
        Message("t", b"x", delay=float("nan")),
        Message("t", b"x", delay=86400 + 1),
        Message("t", b"x", delay=True),  # type: ignore[arg-type]
        Message("t", b"x", deliver_at=NOW + 2 * 86400),
        Message("t", b"x", deliver_at=float("nan")),
        Message("t", b"x", delay=1, deliver_at=NOW),
        Message("t", b"x", msg_id=""),
        Message("t", b"x", key=5),  # type: ignore[arg-type]
        Message("bad topic", b"x"),
        Message("t", 5),  # type: ignore[arg-type]
    ],
)
def test_wire_builder_same_errors(message: Message) -> None:
    b = WireBuilder(CFG)
    b.message(Message("t", b"x"))  # "t" is a known topic now
    with pytest.raises(QClientError) as slow:
        message_to_wire(CFG, message)
    with pytest.raises(type(slow.value)) as fast:
        b.message(message)
    assert str(fast.value) == str(slow.value)


def test_wire_builder_batch_names_the_bad_message() -> None:
    b = WireBuilder(CFG)
    msgs = [Message("t", b"x", delay=1)] * 3 + [Message("t", b"x", delay=-1)]
    with pytest.raises(InvalidMessageError, match="message #3: delay must be >= 0"):
        b.messages(msgs)
    ids = [w.msg_id for w in b.messages([Message("t", b"x", delay=1)] * 100)]
    assert len(set(ids)) == 100


def test_settle_many_is_set_result_and_set_exception() -> None:
    cond = threading.Condition()
    futs: list[Any] = [SendFuture(cond) for _ in range(4)]
    seen: list[Any] = []
    futs[0].add_done_callback(lambda f: seen.append(f.result()))
    assert futs[3].cancel()
    plain: Future[Any] = Future()  # not on the shared condition: settled the public way
    err = QClientError("boom")
    waiter = threading.Thread(
        target=lambda: seen.append(
            len(wait([futs[1]], timeout=5, return_when=FIRST_COMPLETED).done)
        )
    )
    waiter.start()
    settle_many(cond, [*futs, plain], ["a", err, "c", "d", "e"])
    waiter.join(5)
    assert futs[0].result() == "a" and futs[2].result(timeout=0) == "c"
    assert futs[1].exception() is err
    with pytest.raises(QClientError):
        futs[1].result()
    with pytest.raises(CancelledError):
        futs[3].result()
    assert plain.result() == "e"
    assert sorted(map(str, seen)) == ["1", "a"]
    assert all(f.done() for f in futs)


def test_send_futures_make_their_lists_on_first_use() -> None:
    """``as_completed`` and ``wait`` install waiters, callbacks append: each gets a list
    when it first asks, and a future nobody waits on holds none."""
    cond = threading.Condition()
    futs: list[Any] = [SendFuture(cond) for _ in range(3)]
    assert futs[0]._w is None and futs[0]._cb is None
    order: list[Any] = []
    settler = threading.Thread(target=settle_many, args=(cond, futs, ["x", "y", "z"]))
    it = as_completed(futs, timeout=5)
    settler.start()
    order.extend(f.result() for f in it)
    settler.join(5)
    assert sorted(order) == ["x", "y", "z"]
    assert all(f._w == [] for f in futs)  # the waiters were removed again
    assert SendFuture(cond)._w is None


def test_items_are_not_tracked_by_the_collector() -> None:
    """An ``Item`` never holds an error or anything else that leads back to it (see its
    docstring), so it is left out of the collector's passes."""
    it = Item(0, message_to_wire(CFG, Message("t", b"x")), _info(2))
    it.ambiguous += ("broker-a",)
    assert not gc.is_tracked(it)
    assert "error" not in Item.__struct_fields__


def test_send_result_is_not_tracked_by_the_collector() -> None:
    """Results are never part of a cycle: a program holding many costs no collection."""
    r = SendResult("id", SendStatus.SEND_OK, "b", 1, 1_000, "t")
    assert not gc.is_tracked(r)
    assert r == SendResult("id", SendStatus.SEND_OK, "b", 1, 1_000, "t") and hash(r)


def _reference_select_for_id(
    s: MQFaultStrategy, info: TopicPublishInfo, msg_id: str, last_broker: str | None = None
) -> Any:
    """select_for_id as first written (one broker set, sort and list per call)."""
    import xxhash

    queues = info.queues
    brokers = {q.broker_name for q in queues}
    candidates = brokers - {last_broker} if last_broker in brokers else brokers
    _unavailable, unreachable = s.latency_fault_tolerance.unhealthy()
    candidates = (candidates - unreachable) or candidates
    key = msg_id.encode()

    def score(broker: str) -> int:
        return xxhash.xxh3_64_intdigest(key, xxhash.xxh3_64_intdigest(broker.encode()))

    broker = max(sorted(candidates), key=score)
    mine = [q for q in queues if q.broker_name == broker]
    pick = xxhash.xxh3_64_intdigest(key)
    return mine[pick % len(mine)]


@pytest.mark.parametrize("unreachable", [False, True])
def test_select_for_id_and_ids_unchanged(unreachable: bool) -> None:
    s = MQFaultStrategy()
    brokers = {f"broker-{c}": f"127.0.0.1:{10911 + i}" for i, c in enumerate("abc")}
    info = TopicPublishInfo.from_route(
        "t", route("t", brokers=brokers, queues=3), index=ThreadLocalIndex()
    )
    if unreachable:
        s.update_fault_item("broker-b", 100, False, False)
    ids = [f"j:job:{i}" for i in range(500)]
    expected = [_reference_select_for_id(s, info, i) for i in ids]
    assert s.select_for_ids(info, ids) == expected
    assert [s.select_for_id(info, i) for i in ids] == expected
    for last in ("broker-a", "broker-c"):
        assert [s.select_for_id(info, i, last) for i in ids[:100]] == [
            _reference_select_for_id(s, info, i, last) for i in ids[:100]
        ]
    assert {q.broker_name for q in expected} == (
        {"broker-a", "broker-c"} if unreachable else set(brokers)
    )
