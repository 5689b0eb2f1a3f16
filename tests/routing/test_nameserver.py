"""NameServerClient: failover among name servers, unknown topics, typed errors."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import respx
from tests.producer.conftest import NS1, NS2, error_response, msgpack_response, route

from qclient.errors import InvalidMessageError, NameServerUnavailableError, RouteNotFoundError
from qclient.protocol.wire import BrokerInfo, BrokerList
from qclient.routing import AsyncNameServerClient, NameServerClient

pytestmark = pytest.mark.usefixtures("respx_transport")


@respx.mock
def test_route_from_first_name_server() -> None:
    respx.get(f"http://{NS1}/v1/routes/orders").mock(return_value=msgpack_response(route("orders")))
    with NameServerClient([NS1, NS2], timeout=1.0) as ns:
        r = ns.get_route("orders")
    assert r.topic == "orders"
    assert {q.broker_name for q in r.queue_datas} == {"broker-a", "broker-b"}


@respx.mock
def test_failover_to_second_and_stick_to_it() -> None:
    first = respx.get(f"http://{NS1}/v1/routes/t").mock(side_effect=httpx.ConnectError("down"))
    second = respx.get(f"http://{NS2}/v1/routes/t").mock(return_value=msgpack_response(route()))
    ns = NameServerClient(f"{NS1},{NS2}", timeout=1.0)
    assert ns.get_route("t").topic == "t"
    assert ns.get_route("t").topic == "t"
    ns.close()
    assert first.call_count == 1  # the one that answered is asked first afterwards
    assert second.call_count == 2


@respx.mock
def test_unknown_topic_names_topic_and_servers() -> None:
    for ns in (NS1, NS2):
        respx.get(f"http://{ns}/v1/routes/nope").mock(
            return_value=error_response(404, "TOPIC_NOT_FOUND", "no such topic")
        )
    with NameServerClient([NS1, NS2]) as ns, pytest.raises(RouteNotFoundError) as ei:
        ns.get_route("nope")
    assert ei.value.topic == "nope"
    assert ei.value.namesrv == [NS1, NS2]
    assert "nope" in str(ei.value) and NS1 in str(ei.value) and NS2 in str(ei.value)


@respx.mock
def test_all_down_is_unavailable() -> None:
    respx.get(f"http://{NS1}/v1/routes/t").mock(side_effect=httpx.ConnectError("refused"))
    respx.get(f"http://{NS2}/v1/routes/t").mock(return_value=httpx.Response(500, text="boom"))
    with NameServerClient([NS1, NS2]) as ns, pytest.raises(NameServerUnavailableError) as ei:
        ns.get_route("t")
    assert NS1 in str(ei.value) and NS2 in str(ei.value)


@respx.mock
def test_list_brokers_and_json_answers() -> None:
    body = BrokerList(
        brokers=[BrokerInfo(broker_name="b", addr="h:1", cluster="c", perm=6, last_heartbeat_ms=1)]
    )
    import msgspec

    respx.get(f"http://{NS1}/v1/brokers").mock(
        return_value=httpx.Response(
            200, content=msgspec.json.encode(body), headers={"content-type": "application/json"}
        )
    )
    with NameServerClient(NS1) as ns:
        assert ns.list_brokers().brokers[0].broker_name == "b"


def test_invalid_topic_rejected_before_network() -> None:
    with NameServerClient(NS1) as ns, pytest.raises(InvalidMessageError):
        ns.get_route("bad topic")


@respx.mock
def test_topic_with_percent_is_quoted() -> None:
    r = respx.get(f"http://{NS1}/v1/routes/a%25b").mock(return_value=msgpack_response(route("a%b")))
    with NameServerClient(NS1) as ns:
        assert ns.get_route("a%b").topic == "a%b"
    assert r.called


def test_async_client_failover() -> None:
    async def main() -> None:
        with respx.mock:
            respx.get(f"http://{NS1}/v1/routes/t").mock(side_effect=httpx.ReadTimeout("slow"))
            respx.get(f"http://{NS2}/v1/routes/t").mock(return_value=msgpack_response(route()))
            async with AsyncNameServerClient([NS1, NS2], timeout=0.5) as ns:
                assert (await ns.get_route("t")).topic == "t"

    asyncio.run(main())
