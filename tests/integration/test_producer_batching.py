"""Issue 4 acceptance against a real LocalCluster: send_batch, send_async, AsyncProducer."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from concurrent.futures import Future

import pytest

from qclient import AsyncProducer, LocalCluster, Message, MessageBatch, Producer, SendResult
from qclient.errors import BufferFullError, QClientError, SendTimeoutError
from qclient.producer._plan import Item

from .helpers import drain, not_early, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # type: ignore[no-untyped-def]
    with LocalCluster(2, data_dir=str(tmp_path_factory.mktemp("batching"))) as c:
        yield c


def test_send_batch_2000_in_order_all_delivered(cluster: LocalCluster) -> None:
    bodies = [f"batch-{i}-".encode() * (1 + i % 7) for i in range(2000)]
    bodies[7] = b"z" * 10_000  # above the compression threshold: consumers see the original
    with Producer(cluster.namesrv) as p:
        results = p.send_batch(
            Message("batch", b, delay=0.5, msg_id=f"b-{i}") for i, b in enumerate(bodies)
        )
        stats = p.stats()
    assert [r.msg_id for r in results] == [f"b-{i}" for i in range(2000)]
    assert {r.broker_name for r in results} == {"broker-a", "broker-b"}
    assert stats["requests"] <= 20  # chunks of up to 256 per broker, not 2000 requests
    got = drain(cluster.namesrv, "batch", "g", 2000, timeout=30)
    delivered = {m.msg_id: m.body for m in got}
    assert len(delivered) == 2000
    assert all(delivered[f"b-{i}"] == b for i, b in enumerate(bodies))


def test_message_batch_columns_delivered_once_on_their_brokers(cluster: LocalCluster) -> None:
    n = 3000
    now_ms = int(time.time() * 1000)
    batch = MessageBatch(
        "columns",
        [f"col-{i}".encode() for i in range(n)],
        msg_ids=[f"c-{i}" for i in range(n)],
        delay_ms=[300 if i % 2 else None for i in range(n)],
        deliver_at_ms=[None if i % 2 else now_ms + 500 for i in range(n)],
        keys=[f"k{i % 10}" for i in range(n)],
    )
    with Producer(cluster.namesrv) as p:
        first = p.send_batch(batch)
        again = p.send_batch(batch[:1000])  # a replay: the same ids, the same brokers
    assert [r.msg_id for r in first] == [f"c-{i}" for i in range(n)]
    assert {r.broker_name for r in first} == {"broker-a", "broker-b"}
    assert [r.broker_name for r in again] == [r.broker_name for r in first[:1000]]
    assert all(r.deliver_at_ms == now_ms + 500 for r in first[::2])
    got = drain(cluster.namesrv, "columns", "g", n, timeout=30, settle=1.0)
    assert len(got) == n  # the replayed 1000 were deduplicated
    by_id = {m.msg_id: m for m in got}
    assert all(by_id[f"c-{i}"].body == f"col-{i}".encode() for i in range(n))
    assert by_id["c-7"].key == "k7"
    assert all(not_early(m) for m in got)


def test_5000_send_async_all_done_after_flush(cluster: LocalCluster) -> None:
    # a 30 s budget: the test is about flush settling every future, not about the budget;
    # at load 26 both brokers once went ~10 s without reading a request (WriteTimeout), and
    # the default 3 s failed 293 of the 5,000
    with Producer(cluster.namesrv, send_timeout=30) as p:
        futures = [p.send_async(Message("async5k", f"a{i}", delay=0.5)) for i in range(5000)]
        p.flush(timeout=60)
        assert all(f.done() for f in futures)
        results = [f.result() for f in futures]
    assert len({r.msg_id for r in results}) == 5000
    got = drain(cluster.namesrv, "async5k", "g", 5000, timeout=30)
    assert {m.msg_id for m in got} == {r.msg_id for r in results}


def test_callbacks_run_off_the_sender_thread(cluster: LocalCluster) -> None:
    import threading

    names: list[str] = []
    with Producer(cluster.namesrv) as p:
        fs = [p.send_async(Message("cb", b"x", delay=0.5)) for _ in range(50)]
        for f in fs:
            f.add_done_callback(lambda _f: names.append(threading.current_thread().name))
        p.flush(timeout=30)
    assert names and not any(n.startswith("qclient-sender") for n in names)


def test_only_broker_paused_send_async_is_bounded(tmp_path) -> None:
    with LocalCluster(1, data_dir=str(tmp_path), broker_expire=60.0) as c:
        broker = c.brokers[0]
        p = Producer(
            c.namesrv,
            send_timeout=1.0,
            max_buffered_messages=300,
            linger_ms=1.0,
            batch_max_messages=50,
        )

        def warm() -> bool:
            try:
                p.send("paused", b"warm")
            except SendTimeoutError:
                return False  # a fresh broker's first send, at load 29, outran the 1 s budget
            return True

        try:
            wait_until(warm, 30, "a first send to the fresh broker (route and connection)")
            broker.pause()
            futures: list[Future[SendResult]] = []
            full: BufferFullError | None = None
            blocked = 0.0
            t0 = time.monotonic()
            for i in range(2000):
                t = time.monotonic()
                try:
                    futures.append(p.send_async(Message("paused", f"m{i}", delay=1.0)))
                except BufferFullError as exc:
                    full = exc
                    break
                blocked = max(blocked, time.monotonic() - t)
                # bounded memory: never more buffered than allowed
                assert p._sender is not None and p._sender.accumulator.buffered <= 300
                if blocked > 0.3:
                    break  # the caller was held back: back-pressure works
            # either it blocked the caller or it refused: never an unbounded buffer
            assert full is not None or blocked > 0.3
            assert time.monotonic() - t0 < 10
        finally:
            broker.resume()
            p.close(timeout=10)
        assert all(f.done() for f in futures)


def test_close_with_pending_completes_every_future(cluster: LocalCluster) -> None:
    p = Producer(cluster.namesrv, linger_ms=50.0)
    futures = [p.send_async(Message("closing", f"c{i}", delay=0.5)) for i in range(3000)]
    p.close(timeout=30)
    assert all(f.done() for f in futures)
    ok = [f for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    assert all(isinstance(e, QClientError) for e in failed)
    assert len(ok) + len(failed) == 3000


def test_close_timeout_fails_pending_futures(tmp_path) -> None:
    with LocalCluster(1, data_dir=str(tmp_path), broker_expire=60.0) as c:
        broker = c.brokers[0]
        p = Producer(c.namesrv, send_timeout=5.0, linger_ms=1.0)
        p.send("stuck", b"warm")
        broker.pause()
        try:
            futures = [p.send_async(Message("stuck", f"s{i}", delay=1.0)) for i in range(200)]
            t0 = time.monotonic()
            p.close(timeout=0.5)
            assert time.monotonic() - t0 < 8
        finally:
            broker.resume()
        assert all(f.done() for f in futures)
        assert all(isinstance(f.exception(), QClientError) for f in futures)


def test_async_producer_gather_and_batch(cluster: LocalCluster) -> None:
    async def main() -> tuple[list[SendResult], list[SendResult], list[SendResult]]:
        async with AsyncProducer(cluster.namesrv) as ap:
            gathered = await asyncio.gather(
                *(ap.send_delayed("aio", f"g{i}", delay=0.5) for i in range(1000))
            )
            batch = await ap.send_batch([Message("aio", f"b{i}", delay=0.5) for i in range(1000)])
            columns = await ap.send_batch(MessageBatch("aio", [b"c"] * 500, delay_ms=[500] * 500))
            return list(gathered), batch, columns

    gathered, batch, columns = asyncio.run(main())
    assert len({r.msg_id for r in gathered}) == 1000 and len(batch) == 1000
    assert len({r.msg_id for r in columns}) == 500
    assert {r.broker_name for r in gathered} == {"broker-a", "broker-b"}
    got = drain(cluster.namesrv, "aio", "g", 2500, timeout=30)
    assert {m.msg_id for m in got} == {r.msg_id for r in gathered + batch + columns}


def test_buffered_sends_cost_the_collector_one_object_each(tmp_path) -> None:
    """A waiting ``send_async`` holds one object the cyclic collector tracks, its future:
    the plan's ``Item`` is untracked, so thousands buffered set off no long collections."""
    with LocalCluster(1, data_dir=str(tmp_path), broker_expire=60.0) as c:
        p = Producer(c.namesrv, send_timeout=5.0, linger_ms=1.0)
        p.send("held", b"warm")
        c.brokers[0].pause()
        try:
            gc.collect()
            before = len(gc.get_objects())
            futures = [p.send_async(Message("held", f"h{i}", delay=1.0)) for i in range(2000)]
            tracked = gc.get_objects()
            grown = len(tracked) - before
            items = sum(type(o) is Item for o in tracked)
            del tracked
            assert sum(f.done() for f in futures) < 100  # still waiting when counted
        finally:
            c.brokers[0].resume()
            p.close(timeout=10)
    assert items == 0
    assert grown < 2000 * 2, grown  # the futures, and what the sender holds meanwhile (was ~8k)


def test_failed_sends_leave_no_cycle_behind(tmp_path) -> None:
    """The errors of failed sends are freed with their futures: nothing the send path
    keeps holds on to them (a cycle through an untracked ``Item`` would, unseen by the
    collector)."""
    quiet = logging.getLogger("qclient")  # a captured warning's record holds the error
    level = quiet.level
    with LocalCluster(1, data_dir=str(tmp_path), broker_expire=60.0) as c:
        p = Producer(c.namesrv, send_timeout=1.0, linger_ms=1.0)
        try:
            quiet.setLevel(logging.ERROR)
            p.send("gone", b"warm")
            c.brokers[0].kill()
            futures = [p.send_async(Message("gone", f"g{i}", delay=1.0)) for i in range(50)]
            p.flush(timeout=30)
            errors = [f.exception(0) for f in futures]
        finally:
            quiet.setLevel(level)
            p.close(timeout=10)
    assert all(isinstance(e, QClientError) for e in errors)
    refs = [weakref.ref(e) for e in errors]
    del errors, futures
    gc.collect()
    assert [r for r in refs if r() is not None] == []
