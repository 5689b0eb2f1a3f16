"""lookup / cancel / reschedule against respx brokers: how copies on several brokers merge,
and the remaining delay a retry carries."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import respx

from qclient import MessageState, Producer
from qclient.errors import AuthError, BrokerUnavailableError, MessageNotScheduledError
from qclient.producer._core import Item, carry_remaining_delay
from qclient.protocol.wire import LookupResponse, RescheduleResponse, WireMessage

from .conftest import BROKERS, NS1, error_response, msgpack_response, route

pytestmark = pytest.mark.usefixtures("respx_transport")

A, B = BROKERS["broker-a"], BROKERS["broker-b"]


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as m:
        m.get(f"http://{NS1}/v1/routes/t").mock(return_value=msgpack_response(route()))
        yield m


def _producer() -> Producer:
    return Producer(NS1, start_detector_enable=False, send_timeout=1.0)


def _lookup(m: respx.MockRouter, addr: str, answer: object) -> None:
    if isinstance(answer, httpx.Response):
        m.post(f"http://{addr}/v1/lookup").mock(return_value=answer)
    elif isinstance(answer, Exception):
        m.post(f"http://{addr}/v1/lookup").mock(side_effect=answer)
    else:
        m.post(f"http://{addr}/v1/lookup").mock(return_value=msgpack_response(answer))


def test_lookup_merges_copies(mock: respx.MockRouter) -> None:
    _lookup(mock, A, LookupResponse("broker-a", True, "scheduled", 1, 5000))
    _lookup(mock, B, LookupResponse("broker-b", True, "fired", 2, 4990, 5001))
    with _producer() as p:
        info = p.lookup("t", "id-1")
    assert info is not None
    assert (info.state, info.broker_name, info.fired_at_ms, info.copies) == (
        MessageState.FIRED,
        "broker-b",
        5001,
        2,
    )


def test_lookup_earliest_scheduled_and_unknown(mock: respx.MockRouter) -> None:
    _lookup(mock, A, LookupResponse("broker-a", True, "scheduled", 1, 5000))
    _lookup(mock, B, LookupResponse("broker-b", True, "scheduled", 0, 4998))
    with _producer() as p:
        info = p.lookup("t", "id-1")
        assert info is not None and (info.broker_name, info.deliver_at_ms) == ("broker-b", 4998)
        assert info.state == "scheduled" and info.fired_at_ms is None


def test_lookup_with_an_unreachable_broker(mock: respx.MockRouter) -> None:
    _lookup(mock, A, LookupResponse("broker-a", True, "cancelled", 1, 5000))
    _lookup(mock, B, httpx.ConnectError("refused"))
    with _producer() as p:
        info = p.lookup("t", "id-1")  # found on a: b's failure is only logged
        assert info is not None and info.state == MessageState.CANCELLED and info.copies == 1


def test_lookup_unknown_cannot_be_claimed_when_a_broker_is_down(mock: respx.MockRouter) -> None:
    _lookup(mock, A, LookupResponse("broker-a", False))
    _lookup(mock, B, httpx.ConnectError("refused"))
    with _producer() as p, pytest.raises(BrokerUnavailableError):
        p.lookup("t", "id-1")


def test_lookup_refusal_is_final(mock: respx.MockRouter) -> None:
    _lookup(mock, A, error_response(403, "FORBIDDEN", "topic not allowed"))
    _lookup(mock, B, error_response(403, "FORBIDDEN", "topic not allowed"))
    with _producer() as p, pytest.raises(AuthError):
        p.lookup("t", "id-1")
    assert mock.routes[1].call_count == 1  # not retried


def test_reschedule_moves_every_copy_and_reports_states(mock: respx.MockRouter) -> None:
    answers = {
        A: [
            RescheduleResponse("broker-a", True, None, 1, 9000),
            RescheduleResponse("broker-a", False, "fired"),
        ],
        B: [
            RescheduleResponse("broker-b", True, None, 2, 9001),
            RescheduleResponse("broker-b", False, "cancelled"),
        ],
    }
    for addr, seq in answers.items():
        mock.post(f"http://{addr}/v1/reschedule").mock(
            side_effect=[msgpack_response(x) for x in seq]
        )
    with _producer() as p:
        r = p.reschedule("t", "id-1", delay=5)
        assert (r.msg_id, r.broker_name, r.queue_id, r.deliver_at_ms) == (
            "id-1",
            "broker-a",
            1,
            9000,
        )
        with pytest.raises(MessageNotScheduledError) as err:
            p.reschedule("t", "id-1", delay=5)
        assert err.value.state == MessageState.FIRED


def test_retry_carries_the_remaining_delay() -> None:
    def item(**kw: object) -> Item:
        return Item(0, WireMessage(topic="t", queue_id=0, msg_id="m", body=b"", **kw), None)  # type: ignore[arg-type]

    delayed, absolute, now = item(delay_ms=5000), item(deliver_at_ms=123), item()
    short = item(delay_ms=300)
    first = time.monotonic() - 1.2
    carry_remaining_delay([delayed, absolute, now, short], first)
    assert 3700 <= delayed.wire.delay_ms <= 3800
    assert (absolute.wire.delay_ms, absolute.wire.deliver_at_ms, now.wire.delay_ms) == (
        None,
        123,
        None,
    )
    assert short.wire.delay_ms == 0  # overdue: deliver now
    carry_remaining_delay([delayed], first - 1.0)  # a later retry: from the first delay
    assert 2700 <= delayed.wire.delay_ms <= 2800
