"""RouteTable: registration, expiry, routes and the auto-create route."""

from __future__ import annotations

import pytest
from tests.integration.helpers import wait_until

from qclient.protocol import wire
from qclient.server.namesrv.route_table import RouteTable


def reg(name: str, addr: str, topics: dict[str, wire.TopicConfig] | None = None, **kw: object):
    return wire.BrokerRegistration(name, addr, topics=topics or {}, **kw)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> tuple[RouteTable, Clock]:
    clock = Clock()
    t = RouteTable(expire_ms=10_000)
    monkeypatch.setattr(t, "_now", clock)
    return t, clock


def test_register_is_new_once_per_address(table) -> None:
    t, _ = table
    assert t.register(reg("b1", "h:1"))
    assert not t.register(reg("b1", "h:1"))  # a heartbeat
    assert t.register(reg("b1", "h:2"))  # came back elsewhere
    assert [b.addr for b in t.brokers().brokers] == ["h:2"]


def test_unregister_needs_the_current_address(table) -> None:
    t, _ = table
    t.register(reg("b1", "h:1"))
    assert not t.unregister("b1", "h:9")
    assert t.unregister("b1", "h:1")
    assert t.brokers().brokers == []


def test_brokers_without_heartbeats_expire(table) -> None:
    t, clock = table
    t.register(reg("b1", "h:1"))
    clock.now += 5_000
    t.register(reg("b2", "h:2"))
    clock.now += 6_000
    assert t.expire() == ["b1"]
    assert [b.broker_name for b in t.brokers().brokers] == ["b2"]


def test_route_of_a_known_topic_masks_perm_by_the_broker(table) -> None:
    t, _ = table
    t.register(reg("b1", "h:1", {"t": wire.TopicConfig(4, 4)}, perm=wire.PERM_READ))
    t.register(reg("b2", "h:2", {"t": wire.TopicConfig(2, 2)}))
    route = t.route("t")
    assert route is not None and not route.auto_create
    assert [(q.broker_name, q.write_queue_nums, q.perm) for q in route.queue_datas] == [
        ("b1", 4, wire.PERM_READ),
        ("b2", 2, wire.PERM_READ_WRITE),
    ]


def test_unknown_topic_gets_the_auto_create_route_of_writable_brokers(table) -> None:
    t, _ = table
    t.register(reg("b1", "h:1", default_queue_nums=8))
    t.register(reg("b2", "h:2", perm=wire.PERM_READ))  # read-only: creates nothing
    t.register(reg("b3", "h:3", auto_create_topics=False))
    route = t.route("new")
    assert route is not None and route.auto_create
    assert [(q.broker_name, q.write_queue_nums) for q in route.queue_datas] == [("b1", 8)]
    t.unregister("b1", "h:1")
    assert t.route("new") is None


def test_routes_are_partial_until_the_broker_expiry_after_start() -> None:
    """Brokers registered before a restart may be missing until their next heartbeat,
    which comes within the expiry: routes say so until then."""
    t = RouteTable(expire_ms=300)
    t.register(reg("b1", "h:1", {"t": wire.TopicConfig(2, 2)}))
    first = t.route("t")
    assert first is not None and first.partial
    wait_until(lambda: not t.route("t").partial, 5, "routes to be complete")  # type: ignore[union-attr]
    auto = t.route("new")
    assert auto is not None and auto.auto_create and not auto.partial
