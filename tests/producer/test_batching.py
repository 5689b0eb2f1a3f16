"""send_async (accumulator, sender, futures), SendFuture, AsyncProducer, against fakes."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError, wait
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from qclient import AsyncProducer, Message, Producer
from qclient.errors import BatchSendError, BufferFullError, InvalidMessageError, QClientError
from qclient.producer._future import SendFuture

from .fakes import fake_cluster, wait_until


def test_send_future_shared_condition_semantics() -> None:
    cond = threading.Condition()
    a, b = SendFuture(cond), SendFuture(cond)
    with pytest.raises(FutureTimeout):
        a.result(timeout=0.05)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(a.result(timeout=5)))
    t.start()
    time.sleep(0.05)
    b.set_result("b")  # wakes a's waiter too: it must keep waiting, not time out
    time.sleep(0.05)
    assert t.is_alive()
    a.set_result("a")
    t.join(5)
    assert got == ["a"]
    c = SendFuture(cond)
    c.set_exception(InvalidMessageError("bad"))
    assert isinstance(c.exception(), InvalidMessageError)
    with pytest.raises(InvalidMessageError):
        c.result()
    d = SendFuture(cond)
    calls: list[object] = []
    d.add_done_callback(calls.append)
    assert d.cancel() and calls == [d]
    with pytest.raises(CancelledError):
        d.result()
    e = SendFuture(cond)
    threading.Timer(0.05, e.set_result, ("e",)).start()
    done, _ = wait([a, e], timeout=5)
    assert done == {a, e}


def test_send_async_batches_per_broker_and_flush() -> None:
    with (
        fake_cluster() as (ns, brokers),
        # a 30 s budget (10 s an attempt): on a starved host a fake broker answered a batch
        # after the default 1 s share, and its retry stored 100 messages twice, which is
        # the producer's documented ambiguity (tests/producer/test_ambiguous.py), not batching
        Producer(ns.addr, linger_ms=20, batch_max_messages=100, send_timeout=30.0) as p,
    ):
        futures = [p.send_async(Message("t", f"m{i}", delay=1)) for i in range(1000)]
        p.flush(timeout=20)
        assert all(f.done() and f.exception() is None for f in futures)
        assert sum(b.sends for b in brokers) <= 20  # batched: ~10 requests of 100, not 1000
        assert len({f.result().msg_id for f in futures}) == 1000
        assert sum(len(b.messages) for b in brokers) == 1000


def test_send_async_validation_raises_at_once() -> None:
    with fake_cluster() as (ns, _), Producer(ns.addr) as p, pytest.raises(InvalidMessageError):
        p.send_async(Message("t", b"x", delay=-1))


def test_buffer_full_blocks_or_raises() -> None:
    with fake_cluster(1) as (ns, (broker,)):
        p = Producer(
            ns.addr,
            send_timeout=3.0,  # the warm-up send must not time out on a loaded host
            max_buffered_messages=50,
            linger_ms=1,
            batch_max_messages=10,
            start_detector_enable=False,
        )
        try:
            p.send("t", b"warm")
            broker.mode = "hang"
            t0 = time.monotonic()
            full, blocked = None, 0.0
            for i in range(1000):
                t = time.monotonic()
                try:
                    p.send_async(Message("t", f"m{i}"))
                except BufferFullError as exc:
                    full = exc
                    break
                blocked = max(blocked, time.monotonic() - t)
                assert p._sender is not None and p._sender.accumulator.buffered <= 50
                if blocked > 0.2:
                    break
            assert full is not None or blocked > 0.2  # held back or refused, never unbounded
            assert time.monotonic() - t0 < 60
        finally:
            broker.mode = "ok"
            broker.release.set()
            p.close(timeout=10)


def test_close_fails_what_it_cannot_send() -> None:
    with fake_cluster(1) as (ns, (broker,)):
        p = Producer(ns.addr, send_timeout=5.0, linger_ms=1, start_detector_enable=False)
        p.send("t", b"warm")
        broker.mode = "hang"
        futures = [p.send_async(Message("t", f"m{i}")) for i in range(100)]
        t0 = time.monotonic()
        p.close(timeout=0.3)
        assert time.monotonic() - t0 < 8
        broker.release.set()
        assert all(f.done() for f in futures)
        assert all(isinstance(f.exception(), QClientError) for f in futures)


def test_async_producer_coalesces_concurrent_sends() -> None:
    async def main(addr: str) -> list[str]:
        async with AsyncProducer(addr) as ap:
            results = await asyncio.gather(
                *(ap.send_delayed("t", f"g{i}", delay=1) for i in range(500))
            )
            batch = await ap.send_batch([Message("t", f"b{i}") for i in range(300)])
            with pytest.raises(BatchSendError) as ei:
                await ap.send_batch(
                    [Message("t", b"x", msg_id="fail-me"), Message("t", b"y", msg_id="fine")]
                )
            assert [type(r).__name__ for r in ei.value.results] == [
                "InvalidMessageError",
                "SendResult",
            ]
            return [r.msg_id for r in results + batch]

    with fake_cluster() as (ns, brokers):
        for b in brokers:
            b.reject_ids = {"fail-me"}
        ids = asyncio.run(main(ns.addr))
        assert len(set(ids)) == 800
        assert sum(b.sends for b in brokers) < 200  # 500 concurrent sends coalesced


def test_wait_until_helper_is_bounded() -> None:
    assert not wait_until(lambda: False, 0.05)


def test_accumulator_bound_linger_and_flush_force() -> None:
    from concurrent.futures import Future

    from qclient._config import ProducerConfig
    from qclient._validation import to_wire
    from qclient.fault import ThreadLocalIndex
    from qclient.producer._plan import Item
    from qclient.producer.message_accumulator import MessageAccumulator
    from qclient.routing import TopicPublishInfo

    from .conftest import route

    cfg = ProducerConfig.create("h:1", max_buffered_messages=3, batch_max_messages=2, linger_ms=500)
    info = TopicPublishInfo.from_route("t", route(), index=ThreadLocalIndex())
    wakes: list[int] = []
    acc = MessageAccumulator(cfg, lambda: wakes.append(1))

    def add() -> None:
        acc.append(
            Item(0, to_wire(cfg, "t", b"x"), info, info.queues[0]), Future(), "broker-a", 0.1
        )

    add()
    add()  # full batch of 2: ready
    add()
    t0 = time.monotonic()
    with pytest.raises(BufferFullError):
        add()  # 3 buffered: blocks 0.1 s, then refuses
    assert time.monotonic() - t0 >= 0.09
    in_flight: dict[str, int] = {}
    ready, due = acc.drain(time.monotonic(), in_flight, 4)
    assert [len(b.items) for b in ready] == [2] and due is not None  # the open one lingers
    ready2, _ = acc.drain(due + 0.001, in_flight, 4)
    assert [len(b.items) for b in ready2] == [1] and in_flight == {"broker-a": 2}
    for b in ready + ready2:
        acc.complete(b)
    assert acc.buffered == 0
    add()  # room again
    assert wakes
