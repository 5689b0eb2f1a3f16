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
def table() -> tuple[RouteTable, Clock]:
    clock = Clock()
    return RouteTable(expire_ms=10_000, clock=clock), clock


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


AUTO = wire.TopicConfig(4, 4, auto_created=True)


def started(t: RouteTable, clock: Clock, *regs: wire.BrokerRegistration) -> None:
    """Register ``regs`` and let the name server's own start-up window pass."""
    for r in regs:
        t.register(r)
    clock.now += t.expire_ms


def spread(route: wire.TopicRoute | None) -> list[tuple[str, int]]:
    assert route is not None
    return [(q.broker_name, q.write_queue_nums) for q in route.queue_datas]


def test_a_young_auto_created_topic_routes_to_every_auto_create_broker(table) -> None:
    t, clock = table
    started(t, clock, reg("b1", "h:1"), reg("b2", "h:2", default_queue_nums=8))
    t.register(reg("b1", "h:1", {"t": AUTO}))  # b1 stored the first message
    young = t.route("t")
    assert young is not None and young.partial and not young.auto_create
    assert spread(young) == [("b1", 4), ("b2", 8)]
    assert [b.broker_name for b in young.broker_datas] == ["b1", "b2"]
    clock.now += t.expire_ms - 1
    assert spread(t.route("t")) == [("b1", 4), ("b2", 8)]
    clock.now += 1  # every broker that stored a message has registered it by now
    old = t.route("t")
    assert old is not None and not old.partial and spread(old) == [("b1", 4)]


def test_a_young_topic_every_auto_create_broker_holds_is_complete(table) -> None:
    t, clock = table
    started(t, clock, reg("b1", "h:1"), reg("b2", "h:2"))
    t.register(reg("b1", "h:1", {"t": AUTO}))
    t.register(reg("b2", "h:2", {"t": AUTO}))
    route = t.route("t")
    assert route is not None and not route.partial and spread(route) == [("b1", 4), ("b2", 4)]


def test_an_explicitly_created_topic_is_never_widened(table) -> None:
    t, clock = table
    started(t, clock, reg("b1", "h:1"), reg("b2", "h:2"), reg("b3", "h:3"))
    t.register(reg("b1", "h:1", {"asked": wire.TopicConfig(2, 2)}))
    route = t.route("asked")
    assert route is not None and not route.partial and spread(route) == [("b1", 2)]
    # one broker asked to hold it is enough: the topic was placed on purpose
    t.register(reg("b2", "h:2", {"mixed": AUTO}))
    t.register(reg("b1", "h:1", {"asked": wire.TopicConfig(2, 2), "mixed": wire.TopicConfig()}))
    assert spread(t.route("mixed")) == [("b1", 4), ("b2", 4)]


def test_brokers_that_cannot_create_the_topic_are_not_added(table) -> None:
    t, clock = table
    started(
        t,
        clock,
        reg("b1", "h:1"),
        reg("b2", "h:2", perm=wire.PERM_READ),
        reg("b3", "h:3", auto_create_topics=False),
    )
    t.register(reg("b1", "h:1", {"t": AUTO}))
    route = t.route("t")
    assert route is not None and not route.partial and spread(route) == [("b1", 4)]


def test_topics_of_a_first_registration_are_not_young(table) -> None:
    """After a name-server restart every topic arrives in a first registration, whatever
    its age: an old topic is not spread to brokers that never held it."""
    t, clock = table
    t.register(reg("b2", "h:2"))
    t.register(reg("b1", "h:1", {"t": AUTO}))
    clock.now += t.expire_ms
    assert spread(t.route("t")) == [("b1", 4)]
    t.register(reg("b1", "h:1", {"t": AUTO}))  # a heartbeat: nothing new
    assert spread(t.route("t")) == [("b1", 4)]


def test_young_topics_are_forgotten_when_old_or_gone(table) -> None:
    t, clock = table
    started(t, clock, reg("b1", "h:1"), reg("b2", "h:2"))
    t.register(reg("b1", "h:1", {"gone": AUTO, "aging": AUTO}))
    t.register(reg("b1", "h:1", {"aging": AUTO}))  # no broker registers "gone" any more
    t.expire()
    assert set(t._first_seen) == {"aging"}
    clock.now += t.expire_ms // 2
    t.register(reg("b1", "h:1", {"aging": AUTO, "gone": AUTO}))  # created again: young again
    t.register(reg("b2", "h:2"))
    clock.now += t.expire_ms // 2 + 1
    t.expire()
    assert set(t._first_seen) == {"gone"}
    assert spread(t.route("gone")) == [("b1", 4), ("b2", 4)]
    assert spread(t.route("aging")) == [("b1", 4)]
