"""Route cache: TTL expiry, last good route, TopicPublishInfo."""

from __future__ import annotations

import time

import msgspec
from tests.producer.conftest import BROKERS, route
from tests.producer.fakes import fake_cluster, wait_until

from qclient import Producer
from qclient.fault import ThreadLocalIndex
from qclient.protocol.wire import BrokerData, QueueData, TopicRoute
from qclient.routing import RouteCache, TopicPublishInfo


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_publish_info_writable_masters_sorted() -> None:
    r = TopicRoute(
        topic="t",
        queue_datas=[
            QueueData(broker_name="c", read_queue_nums=2, write_queue_nums=2, perm=6),
            QueueData(broker_name="a", read_queue_nums=3, write_queue_nums=3, perm=6),
            QueueData(broker_name="ro", read_queue_nums=4, write_queue_nums=4, perm=4),
            QueueData(broker_name="slave-only", read_queue_nums=4, write_queue_nums=4, perm=6),
            QueueData(broker_name="gone", read_queue_nums=4, write_queue_nums=4, perm=6),
        ],
        broker_datas=[
            BrokerData(broker_name="a", addrs={0: "h:1"}),
            BrokerData(broker_name="c", addrs={0: "h:3", 1: "h:4"}),
            BrokerData(broker_name="ro", addrs={0: "h:5"}),
            BrokerData(broker_name="slave-only", addrs={1: "h:6"}),
        ],
    )
    info = TopicPublishInfo.from_route("t", r)
    assert [(q.broker_name, q.queue_id) for q in info.queues] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("c", 0),
        ("c", 1),
    ]
    assert info.broker_addrs == {"a": "h:1", "c": "h:3"}


def test_ttl_expiry_and_last_good() -> None:
    clock = Clock()
    cache = RouteCache(30.0, ThreadLocalIndex, timer=clock)
    stale_calls: list[str] = []
    cache.set_on_stale(stale_calls.append)
    assert cache.get("t") == (None, False)
    info = cache.put("t", route())
    assert cache.get("t") == (info, True)
    assert cache.stale_topics() == []
    clock.now += 30.1
    got, fresh = cache.get("t")
    assert got is info and not fresh  # last good, served while a refresh is due
    assert stale_calls == ["t"]
    assert cache.stale_topics() == ["t"]
    new = cache.put("t", route(brokers={"broker-a": "127.0.0.1:1"}))
    assert new.index is info.index  # the round robin continues across refreshes
    assert cache.get("t") == (new, True)
    assert cache.resolve("broker-b") is None  # left the route
    assert cache.last_addr("broker-b") == BROKERS["broker-b"]  # where it may come back
    assert cache.last_addr("broker-x") is None
    cache.mark_stale("t")  # after a send failure
    assert cache.stale_topics() == ["t"]


def test_refresh_on_timer_and_last_good_when_name_server_down() -> None:
    # the default name server timeout: a first route asked of a loaded host may take
    # longer than a short one, and once the name server is gone its port refuses at once
    with (
        fake_cluster() as (ns, _brokers),
        Producer(ns.addr, route_refresh_interval=0.2, start_detector_enable=False) as p,
    ):
        p.send("t", b"x")
        asked = ns.calls
        assert asked >= 1  # the first send asked for the route (a refresh may follow soon)
        assert wait_until(lambda: ns.calls >= asked + 2, 30.0)  # refreshed in the background
        ns.stop()  # every name server gone
        time.sleep(0.5)  # the route expires meanwhile: the last good one stays in use
        for _ in range(20):
            assert p.send("t", b"y").broker_name in {"broker-a", "broker-b"}
        assert p.stats()["failed"] == 0


def test_route_that_lost_a_broker_is_rechecked_soon() -> None:
    clock = Clock()
    cache = RouteCache(30.0, ThreadLocalIndex, timer=clock, recheck_interval=5.0)
    cache.put("t", route())
    cache.put("t", route(brokers={"broker-a": "127.0.0.1:10911"}))  # broker-b expired
    clock.now += 5.1
    assert cache.stale_topics() == ["t"]  # not 30 s: a returning broker is noticed soon
    cache.put("t", route())  # it is back
    clock.now += 5.1
    assert cache.stale_topics() == []
    assert cache.get("t")[0].lost == {}


def test_partial_route_keeps_the_brokers_it_lacks() -> None:
    """A name server that just started lists only the brokers that registered again so
    far: the missing ones stay (until a complete route), and it is asked again soon."""
    clock = Clock()
    cache = RouteCache(30.0, ThreadLocalIndex, timer=clock, recheck_interval=5.0)
    cache.put("t", route())
    only_a = route(brokers={"broker-a": BROKERS["broker-a"]})
    info = cache.put("t", msgspec.structs.replace(only_a, partial=True))
    assert sorted(info.by_broker) == ["broker-a", "broker-b"] and info.lost == {}
    assert info.broker_addrs == BROKERS
    clock.now += 5.1
    assert cache.stale_topics() == ["t"]
    info = cache.put("t", only_a)  # complete: broker-b is gone
    assert sorted(info.by_broker) == ["broker-a"] and "broker-b" in info.lost


def test_first_route_of_a_created_topic_keeps_the_auto_create_brokers() -> None:
    """Right after a topic's first sends the name server may list only the brokers that
    registered it so far: the others of the auto-create route stay until a complete
    route, which is asked for soon (else a broker dying then would leave no other)."""
    clock = Clock()
    cache = RouteCache(30.0, ThreadLocalIndex, timer=clock, recheck_interval=5.0)
    cache.put("t", msgspec.structs.replace(route(), auto_create=True))
    only_a = route(brokers={"broker-a": BROKERS["broker-a"]})
    info = cache.put("t", only_a)
    assert sorted(info.by_broker) == ["broker-a", "broker-b"] and info.lost == {}
    clock.now += 5.1
    assert cache.stale_topics() == ["t"]
    info = cache.put("t", only_a)  # complete and no longer the auto-create route: b is gone
    assert sorted(info.by_broker) == ["broker-a"] and "broker-b" in info.lost


def _headless(name: str, slave: str) -> TopicRoute:
    """``route()`` with broker group ``name`` listed by its slave only (no broker id 0)."""
    r = route()
    datas = [
        BrokerData(b.broker_name, {1: slave}) if b.broker_name == name else b
        for b in r.broker_datas
    ]
    return msgspec.structs.replace(r, broker_datas=datas)


def test_group_listed_without_a_master_keeps_its_last_master() -> None:
    """A name server that restarted may hear from a group's slave before its master, and
    a group lists no master while its replicas elect one: the group keeps its last master
    address (asked again soon) rather than leaving the route, for at most 300 s."""
    clock = Clock()
    cache = RouteCache(30.0, ThreadLocalIndex, timer=clock, recheck_interval=5.0)
    cache.put("t", route())
    info = cache.put("t", _headless("broker-a", "127.0.0.1:20911"))
    assert info.broker_addrs == BROKERS and sorted(info.by_broker) == ["broker-a", "broker-b"]
    assert info.headless == {"broker-a": 100.0} and info.route.partial
    clock.now += 5.1
    assert cache.stale_topics() == ["t"]  # asked again soon
    info = cache.put("t", _headless("broker-a", "127.0.0.1:20911"))
    assert info.headless == {"broker-a": 100.0}  # since the first such route
    assert info.broker_addrs["broker-a"] == BROKERS["broker-a"]
    new = {"broker-a": "127.0.0.1:20911", "broker-b": BROKERS["broker-b"]}
    info = cache.put("t", route(brokers=new))  # the slave was elected
    assert info.broker_addrs == new and info.headless == {}


def test_group_without_a_master_for_300_s_leaves_the_route() -> None:
    clock = Clock()
    cache = RouteCache(30.0, ThreadLocalIndex, timer=clock, recheck_interval=5.0)
    cache.put("t", route())
    cache.put("t", _headless("broker-a", "127.0.0.1:20911"))
    clock.now += 300.1
    info = cache.put("t", _headless("broker-a", "127.0.0.1:20911"))
    assert sorted(info.by_broker) == ["broker-b"] and info.headless == {}
    assert "broker-a" in info.lost
