"""Routes from a RocketMQ NameServer reached again on a new connection are ``partial``
while it may not have heard from every broker (sans-I/O: ``_Failover`` decides)."""

from __future__ import annotations

import pytest

from qclient.engines.rocketmq.nameserver import REREGISTER_S, _Failover
from qclient.protocol.wire import BrokerData, QueueData, TopicRoute

ROUTE = TopicRoute(
    "t",
    [QueueData("broker-a", 4, 4, 6)],
    [BrokerData("broker-a", {0: "127.0.0.1:1"}, "c")],
)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


def test_first_connection_is_not_young(clock: _Clock) -> None:
    f = _Failover(["ns1"], 1.0, clock)
    conn = object()
    f.asking("ns1", conn)
    f.asking("ns1", conn)
    assert f.young("ns1", ROUTE).partial is False


def test_a_new_connection_makes_routes_partial_for_the_registration_period(clock: _Clock) -> None:
    f = _Failover(["ns1", "ns2"], 1.0, clock)
    f.asking("ns1", object())
    f.asking("ns2", object())
    f.asking("ns1", object())  # reconnected: ns1 may have restarted, ns2 not
    assert f.young("ns1", ROUTE).partial is True
    assert f.young("ns2", ROUTE).partial is False
    assert ROUTE.partial is False  # the answer itself is left as it was
    clock.now += REREGISTER_S - 0.1
    assert f.young("ns1", ROUTE).partial is True
    clock.now += 0.2
    assert f.young("ns1", ROUTE).partial is False


def test_already_partial_routes_stay_so(clock: _Clock) -> None:
    f = _Failover(["ns1"], 1.0, clock)
    f.asking("ns1", object())
    auto = TopicRoute("t", [], [], auto_create=True, partial=True)
    assert f.young("ns1", auto) is auto
