"""Producer.send against respx brokers: one test per outcome rule of the fault policy."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from qclient import Message, Producer
from qclient.errors import (
    AuthError,
    BatchSendError,
    BrokerUnavailableError,
    InvalidMessageError,
    NameServerUnavailableError,
    ProducerClosedError,
    RouteNotFoundError,
    SendTimeoutError,
)
from qclient.protocol.wire import (
    MSGPACK,
    CancelResponse,
    MessageResult,
    SendRequest,
    SendResponse,
    decode,
)

from .conftest import BROKERS, NS1, NS2, error_response, msgpack_response, ok_send, route

pytestmark = pytest.mark.usefixtures("respx_transport")

A, B = BROKERS["broker-a"], BROKERS["broker-b"]


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as m:
        m.get(f"http://{NS1}/v1/routes/t").mock(return_value=msgpack_response(route()))
        m.get(f"http://{NS1}/v1/routes/nope").mock(
            return_value=error_response(404, "TOPIC_NOT_FOUND")
        )
        for name, addr in BROKERS.items():
            m.post(f"http://{addr}/v1/send", name=f"send-{name}").mock(side_effect=ok_send(name))
            m.get(f"http://{addr}/health", name=f"health-{name}").mock(
                return_value=httpx.Response(200)
            )
        yield m


def producer(**kw: object) -> Producer:
    return Producer(NS1, start_detector_enable=kw.pop("detector", False), **kw)  # type: ignore[arg-type]


def fault(p: Producer, name: str):  # type: ignore[no-untyped-def]
    return next(f for f in p.fault_items() if f.name == name)


def sends_to(p: Producer, broker: str) -> None:
    """Make this thread's next selection land on ``broker`` (the round robin is per thread)."""
    info = p._core.cached_route("t")
    pos = next(i for i, q in enumerate(info.queues) if q.broker_name == broker)
    info.index._local.value = pos - 1 + 8 * 1000


def test_even_load_with_one_thread(mock: respx.MockRouter) -> None:
    # the round robin alone: with latency isolation on, one answer stalled > 550 ms by a
    # loaded machine would isolate a broker and skew the counts (tested elsewhere)
    with producer(send_latency_fault_enable=False) as p:
        counts = collections.Counter()
        for i in range(1600):
            r = p.send_delayed("t", f"m{i}", delay=10)
            counts[(r.broker_name, r.queue_id)] += 1
    assert len(counts) == 8
    assert all(abs(c - 200) <= 20 for c in counts.values()), counts


def test_transport_error_isolates_and_retries_elsewhere(mock: respx.MockRouter) -> None:
    mock.routes["send-broker-a"].mock(side_effect=httpx.ConnectError("refused"))
    mock.routes["health-broker-a"].mock(side_effect=httpx.ConnectError("refused"))
    with producer(detector=True) as p:
        p._info("t")  # route cached, nothing sent
        sends_to(p, "broker-a")
        r = p.send("t", b"x")
        assert r.broker_name == "broker-b"
        f = fault(p, "broker-a")
        assert not f.available and not f.reachable and f.isolated_until is not None
        assert p.stats()["retried"] >= 1
        # isolated: later sends do not touch broker-a
        before = mock.routes["send-broker-a"].call_count
        for _ in range(20):
            assert p.send("t", b"y").broker_name == "broker-b"
        assert mock.routes["send-broker-a"].call_count == before


def test_transport_error_without_detector_stays_reachable(mock: respx.MockRouter) -> None:
    mock.routes["send-broker-a"].mock(side_effect=httpx.ReadError("reset"))
    with producer(detector=False) as p:
        p._info("t")
        sends_to(p, "broker-a")
        assert p.send("t", b"x").broker_name == "broker-b"
        f = fault(p, "broker-a")
        assert not f.available and f.reachable  # RocketMQ: unreachable only with a detector


def test_retryable_broker_code_isolates_unreachable(mock: respx.MockRouter) -> None:
    mock.routes["send-broker-a"].mock(return_value=error_response(503, "BROKER_BUSY"))
    with producer() as p:
        p._info("t")
        sends_to(p, "broker-a")
        assert p.send("t", b"x").broker_name == "broker-b"
        f = fault(p, "broker-a")
        assert not f.available and not f.reachable


def test_deadline_exceeded_is_a_definite_failure_retried_elsewhere(
    mock: respx.MockRouter,
) -> None:
    """The broker stored nothing (its clock ran ahead past the deadline's margin): the
    attempt failed for sure, so the retry goes elsewhere and no copy is left to cancel."""
    mock.routes["send-broker-a"].mock(
        return_value=error_response(504, "DEADLINE_EXCEEDED", "nothing stored")
    )
    with producer() as p:
        p._info("t")
        sends_to(p, "broker-a")
        r = p.send_delayed("t", b"x", delay=30)
        assert r.broker_name == "broker-b"
        assert mock.routes["send-broker-a"].call_count == 1
        assert p.stats()["retried"] >= 1
        assert p._ambiguous.pending() == 0  # a definite answer: nothing to cancel


def test_every_attempt_carries_its_own_deadline(mock: respx.MockRouter) -> None:
    seen: list[tuple[str, int, float, float]] = []  # broker, deadline, sent at, timeout

    def hung(name: str):  # type: ignore[no-untyped-def]
        def handler(request: httpx.Request) -> httpx.Response:
            req = decode(request.content, SendRequest, MSGPACK)
            assert req.deadline_ms is not None
            timeout = request.extensions["timeout"]["read"]
            seen.append((name, req.deadline_ms, time.time() * 1000, timeout))
            raise httpx.ReadTimeout("hung", request=request)

        return handler

    for name in BROKERS:
        mock.routes[f"send-{name}"].mock(side_effect=hung(name))
    with producer(send_timeout=3.0, retry_times=2) as p, pytest.raises(SendTimeoutError):
        p.send("t", b"x")
    assert len(seen) == 3
    for _name, deadline, sent_at, timeout in seen:
        # the attempt's start plus its timeout: after the request left, not far after
        assert sent_at < deadline <= sent_at + timeout * 1000 + 1
    assert seen[0][1] < seen[1][1] < seen[2][1]


def test_per_message_retryable_status_retried_with_same_id(mock: respx.MockRouter) -> None:
    seen: list[str] = []

    def store_error(request: httpx.Request) -> httpx.Response:
        req = decode(request.content, SendRequest, MSGPACK)
        seen.extend(m.msg_id for m in req.messages)
        return msgpack_response(
            SendResponse(
                broker_name="broker-a",
                results=[
                    MessageResult(msg_id=m.msg_id, status="STORE_ERROR", error="disk")
                    for m in req.messages
                ],
            )
        )

    mock.routes["send-broker-a"].mock(side_effect=store_error)
    ok_b = ok_send("broker-b")

    def record_b(request: httpx.Request) -> httpx.Response:
        seen.extend(m.msg_id for m in decode(request.content, SendRequest, MSGPACK).messages)
        return ok_b(request)

    mock.routes["send-broker-b"].mock(side_effect=record_b)
    with producer() as p:
        info = p._info("t")
        seen.clear()
        # an id the caller chose goes to its own broker: take one that lives on broker-a
        fixed = next(
            f"fixed-{i}"
            for i in range(100)
            if p._core.select(info, msg_id=f"fixed-{i}").broker_name == "broker-a"
        )
        r = p.send("t", b"x", msg_id=fixed)
    assert r.broker_name == "broker-b" and r.msg_id == fixed
    assert seen == [fixed, fixed]  # same id on both attempts: the broker dedupes


@pytest.mark.parametrize(
    ("status", "code", "exc"),
    [
        (400, "INVALID_DELAY", InvalidMessageError),
        (401, "UNAUTHORIZED", AuthError),
        (403, "FORBIDDEN", AuthError),
    ],
)
def test_final_errors_not_retried_not_isolating(
    mock: respx.MockRouter, status: int, code: str, exc: type[Exception]
) -> None:
    mock.routes["send-broker-a"].mock(return_value=error_response(status, code, "nope"))
    mock.routes["send-broker-b"].mock(return_value=error_response(status, code, "nope"))
    with producer() as p, pytest.raises(exc) as ei:
        p.send("t", b"x")
    assert code in str(ei.value)
    total = mock.routes["send-broker-a"].call_count + mock.routes["send-broker-b"].call_count
    assert total == 1
    assert all(f.available and f.reachable for f in p.fault_items())


def test_all_attempts_fail(mock: respx.MockRouter) -> None:
    for name in BROKERS:
        mock.routes[f"send-{name}"].mock(side_effect=httpx.ConnectError("refused"))
    with producer(retry_times=2) as p:
        with pytest.raises(BrokerUnavailableError):
            p.send("t", b"x")
        total = sum(mock.routes[f"send-{n}"].call_count for n in BROKERS)
        assert total == 3  # 1 + retry_times
        assert p.stats()["failed"] == 1


def test_per_attempt_timeout_is_a_share_of_the_budget(mock: respx.MockRouter) -> None:
    timeouts: list[float] = []

    def slow(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"]["read"])
        raise httpx.ReadTimeout("hung", request=request)

    for name in BROKERS:
        mock.routes[f"send-{name}"].mock(side_effect=slow)
    with producer(send_timeout=3.0, retry_times=2) as p:
        from qclient.errors import SendTimeoutError

        with pytest.raises(SendTimeoutError):
            p.send("t", b"x")
    assert len(timeouts) == 3
    assert timeouts[0] == pytest.approx(1.0, abs=0.05)  # 3 s over 3 attempts
    assert all(t <= 3.0 for t in timeouts)


def test_unknown_topic(mock: respx.MockRouter) -> None:
    with producer() as p, pytest.raises(RouteNotFoundError) as ei:
        p.send("nope", b"x")
    assert ei.value.topic == "nope" and NS1 in str(ei.value)


def test_no_name_server_at_all() -> None:
    with respx.mock(assert_all_called=False) as m:
        m.get(f"http://{NS1}/v1/routes/t").mock(side_effect=httpx.ConnectError("down"))
        m.get(f"http://{NS2}/v1/routes/t").mock(side_effect=httpx.ConnectError("down"))
        with (
            Producer([NS1, NS2], start_detector_enable=False) as p,
            pytest.raises(NameServerUnavailableError),
        ):
            p.send("t", b"x")


def test_validation_before_network(mock: respx.MockRouter) -> None:
    with producer(max_message_size=10) as p:
        with pytest.raises(InvalidMessageError):
            p.send_delayed("t", b"x", delay=-1)
        with pytest.raises(InvalidMessageError):
            p.send_delayed("t", b"x")
        with pytest.raises(InvalidMessageError):
            p.send("bad topic", b"x")
        from qclient.errors import MessageTooLargeError

        with pytest.raises(MessageTooLargeError):
            p.send("t", b"x" * 11)
    assert not mock.routes["send-broker-a"].called and not mock.routes["send-broker-b"].called


def test_batch_in_order_and_partial_failure(mock: respx.MockRouter) -> None:
    with producer(batch_max_messages=50) as p:
        msgs = [Message("t", f"m{i}", delay=5, msg_id=f"id{i}") for i in range(400)]
        results = p.send_batch(msgs)
        assert [r.msg_id for r in results] == [f"id{i}" for i in range(400)]
        on_a = sum(r.broker_name == "broker-a" for r in results)
        assert 150 < on_a < 250  # the ids are spread by their hash
        # one request per 50 messages per broker
        assert mock.routes["send-broker-a"].call_count == -(-on_a // 50)
        assert mock.routes["send-broker-b"].call_count == -(-(400 - on_a) // 50)

        # one broker answers INVALID_MESSAGE for odd ids: those fail, the rest go through
        def picky(request: httpx.Request) -> httpx.Response:
            req = decode(request.content, SendRequest, MSGPACK)
            return msgpack_response(
                SendResponse(
                    broker_name="broker-a",
                    results=[
                        MessageResult(
                            msg_id=m.msg_id,
                            status="INVALID_MESSAGE" if int(m.msg_id[2:]) % 2 else "SEND_OK",
                            queue_id=m.queue_id,
                            error="odd",
                        )
                        for m in req.messages
                    ],
                )
            )

        mock.routes["send-broker-a"].mock(side_effect=picky)
        with pytest.raises(BatchSendError) as ei:
            p.send_batch(msgs[:100])
        err = ei.value
        assert len(err.results) == 100
        assert all(isinstance(err.results[i], InvalidMessageError) for i, _ in err.failed)
        assert len(err.failed) + len(err.succeeded) == 100 and err.failed and err.succeeded


def test_cancel(mock: respx.MockRouter) -> None:
    # a cancel asks every broker of the topic (a retried send may have left a copy on
    # another one): True when any copy was cancelled
    answers = {A: [True, False], B: [False, False]}

    def answer(addr: str) -> Any:
        cancelled = answers[addr].pop(0)
        reason = None if cancelled else "already_fired"
        return msgpack_response(CancelResponse(cancelled=cancelled, reason=reason))

    route_a = mock.post(f"http://{A}/v1/cancel").mock(side_effect=lambda _r: answer(A))
    route_b = mock.post(f"http://{B}/v1/cancel").mock(side_effect=lambda _r: answer(B))
    with producer() as p:
        p._info("t")
        sends_to(p, "broker-a")
        r = p.send_delayed("t", b"x", delay=60)
        assert p.cancel(r) is True
        assert p.cancel(topic="t", msg_id=r.msg_id) is False
    assert route_a.call_count == route_b.call_count == 2


def test_closed_producer_and_idempotent_close(mock: respx.MockRouter) -> None:
    p = producer()
    p.close()
    p.close()
    with pytest.raises(ProducerClosedError):
        p.send("t", b"x")
    assert "closed" in repr(p)


def test_signing_headers_when_keys_given(mock: respx.MockRouter) -> None:
    with producer(access_key="app1", secret_key="s3cr3t") as p:
        p.send("t", b"x")
        assert "s3cr3t" not in repr(p)
    req = next(c.request for n in BROKERS for c in mock.routes[f"send-{n}"].calls)
    assert req.headers["X-QC-Access-Key"] == "app1"
    assert len(req.headers["X-QC-Signature"]) == 64
    assert "s3cr3t" not in str(req.headers)


def _id_homed_on(broker: str) -> str:
    from qclient.fault.strategy import id_order

    return next(i for i in (f"pin-{k}" for k in range(1000)) if id_order(i, BROKERS)[0] == broker)


def _timeout_then_ok(name: str, timeouts: int):  # type: ignore[no-untyped-def]
    """A broker that stores what it is sent but whose first ``timeouts`` answers are lost
    (a read timeout on the client: the attempt may have been stored)."""
    ok = ok_send(name)
    seen = [0]

    def handler(request: httpx.Request) -> httpx.Response:
        seen[0] += 1
        if seen[0] <= timeouts:
            raise httpx.ReadTimeout("answer lost", request=request)
        return ok(request)

    return handler


def test_pinned_id_is_retried_where_its_timed_out_attempt_may_be_stored(
    mock: respx.MockRouter,
) -> None:
    """A caller-chosen id whose attempt timed out goes back to the same broker and queue
    (which holds or deduplicates the copy), not to its stand-in: nothing to clean up."""
    mid = _id_homed_on("broker-a")
    mock.routes["send-broker-a"].mock(side_effect=_timeout_then_ok("broker-a", 1))
    queues: list[int] = []
    original = mock.routes["send-broker-a"].side_effect

    def spy(request: httpx.Request) -> httpx.Response:
        queues.append(decode(request.content, SendRequest, MSGPACK).messages[0].queue_id)
        return original(request)

    mock.routes["send-broker-a"].mock(side_effect=spy)
    with producer() as p:
        r = p.send_delayed("t", b"x", delay=30, msg_id=mid)
        assert r.broker_name == "broker-a"
        assert mock.routes["send-broker-b"].call_count == 0
        assert len(queues) == 2 and queues[0] == queues[1]  # the same queue again
        assert p._ambiguous.counts["noted"] == 0


def test_pinned_id_last_attempt_goes_to_its_next_broker(mock: respx.MockRouter) -> None:
    """A broker that never answers holds a pinned id for all attempts but the last, which
    goes to the id's next broker; the possible copy on the first is owed a clean-up."""
    mid = _id_homed_on("broker-a")
    mock.routes["send-broker-a"].mock(side_effect=_timeout_then_ok("broker-a", 99))
    with producer(send_timeout=3.0, retry_times=2) as p:
        r = p.send_delayed("t", b"x", delay=30, msg_id=mid)
        assert r.broker_name == "broker-b"
        assert mock.routes["send-broker-a"].call_count == 2
        assert p._ambiguous.counts["noted"] == 1


def test_pinned_id_refused_is_retried_on_its_next_broker(mock: respx.MockRouter) -> None:
    """A refused connection stored nothing: the retry goes to the id's next broker."""
    mid = _id_homed_on("broker-a")
    mock.routes["send-broker-a"].mock(side_effect=httpx.ConnectError("refused"))
    with producer() as p:
        r = p.send_delayed("t", b"x", delay=30, msg_id=mid)
        assert r.broker_name == "broker-b"
        assert mock.routes["send-broker-a"].call_count == 1
        assert p._ambiguous.counts["noted"] == 0
