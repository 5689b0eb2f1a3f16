"""A young topic's route on a real cluster: a producer whose first lookup comes after one
broker registered the topic still spreads over every broker that will create it."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from tests.integration.helpers import wait_until

from qclient import LocalCluster, Producer
from qclient.protocol import wire

SENDS = 40


@pytest.fixture(scope="module")
def cluster():
    # an expiry well above the test's length: the topics stay young while it runs,
    # however slowly a loaded machine starts the second producer
    with LocalCluster(brokers=2, broker_expire=20.0) as c:
        yield c


def holders(namesrv: str, topic: str) -> set[str]:
    """Brokers that registered ``topic`` with the name server."""
    resp = httpx.get(f"http://{namesrv}{wire.NAMESRV_BROKERS}")
    resp.raise_for_status()
    brokers = wire.decode(resp.content, wire.BrokerList).brokers
    return {b.broker_name for b in brokers if topic in b.topics}


def route(namesrv: str, topic: str) -> wire.TopicRoute:
    resp = httpx.get(f"http://{namesrv}/v1/routes/{topic}")
    resp.raise_for_status()
    return wire.decode(resp.content, wire.TopicRoute)


def test_a_new_producer_spreads_a_young_auto_created_topic_over_every_broker(cluster) -> None:
    with Producer(cluster.namesrv) as p1:
        first = p1.send("young", b"first").broker_name
    wait_until(lambda: holders(cluster.namesrv, "young") == {first}, 10, "the first registration")
    young = route(cluster.namesrv, "young")
    assert young.partial and not young.auto_create
    assert {q.broker_name for q in young.queue_datas} == {"broker-a", "broker-b"}
    with Producer(cluster.namesrv) as p2:  # its first lookup: one broker has the topic
        results = [p2.send("young", f"m{i}".encode()) for i in range(SENDS)]
    spread = Counter(r.broker_name for r in results)
    assert set(spread) == {"broker-a", "broker-b"}, spread


def test_an_explicitly_created_topic_stays_on_its_broker(cluster) -> None:
    only = cluster.brokers[0]
    resp = httpx.post(f"http://{only.addr}{wire.BROKER_TOPICS}", json={"topic": "placed"})
    assert resp.status_code == 200, resp.text
    wait_until(lambda: holders(cluster.namesrv, "placed") == {only.name}, 10, "the registration")
    placed = route(cluster.namesrv, "placed")
    assert [q.broker_name for q in placed.queue_datas] == [only.name]
    with Producer(cluster.namesrv) as p:
        results = [p.send("placed", f"m{i}".encode()) for i in range(10)]
    assert {r.broker_name for r in results} == {only.name}
