"""The broker's Prometheus ``GET /metrics`` on a real cluster: it parses with
prometheus_client's parser and its counters move as messages are stored, fired,
cancelled and consumed."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.helpers import wait_until

from qclient import Consumer, Message, Producer
from qclient.protocol import wire


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


def scrape(addr: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    r = httpx.get(f"http://{addr}{wire.METRICS}", timeout=5.0, trust_env=False)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_move_as_messages_are_stored_fired_and_cancelled(cluster):
    addr = cluster.brokers[0].addr
    before = scrape(addr)
    with Producer(cluster.namesrv) as p:
        soon = p.send_batch([Message("mx", f"s{i}", delay=0.2) for i in range(5)])
        later = [p.send_delayed("mx", f"l{i}", delay=120, msg_id=f"later-{i}") for i in range(3)]
        p.send_delayed("mx", b"again", delay=120, msg_id="later-0")  # a duplicate
        assert p.cancel(later[0]) and p.cancel(later[1])
        p.reschedule("mx", "later-2", delay=240)  # stays scheduled

    def fired():
        s = scrape(addr)
        n = value(s, "qclient_broker_messages_fired_total")
        return s if n - value(before, "qclient_broker_messages_fired_total") >= 5 else None

    after = wait_until(fired, 10, "5 messages to fire")

    def moved(name: str) -> float:
        return value(after, name) - value(before, name)

    assert moved("qclient_broker_messages_stored_total") == 8
    assert moved("qclient_broker_messages_fired_total") == 5
    assert moved("qclient_broker_messages_cancelled_total") == 2
    assert moved("qclient_broker_messages_duplicate_total") == 1
    assert moved("qclient_broker_messages_rescheduled_total") == 1
    assert moved("qclient_broker_scheduled_messages") == 1  # 3 later, 2 of them cancelled
    assert moved("qclient_broker_fire_lateness_seconds_count") == 5
    assert value(after, "qclient_broker_fire_lateness_seconds_bucket", le="+Inf") == value(
        after, "qclient_broker_fire_lateness_seconds_count"
    )
    assert value(after, "qclient_broker_fsync_duration_seconds_count", file="message_log") > 0
    sends = value(
        after,
        "qclient_http_request_duration_seconds_count",
        endpoint=wire.BROKER_SEND,
        method="POST",
        status="200",
    )
    assert sends >= 1
    assert len(soon) == 5


def test_consume_lag_per_group(cluster):
    addr = cluster.brokers[0].addr
    with Producer(cluster.namesrv) as p:
        p.send_batch([Message("lagging", f"a{i}") for i in range(4)])
        with Consumer(cluster.namesrv, "lagging", "lg") as c:
            got: list = []
            wait_until(lambda: got.extend(c.poll(10, timeout=0.2)) or len(got) >= 4, 10, "4")
        # every queue has a committed offset now; 4 more fire past them
        p.send_batch([Message("lagging", f"b{i}") for i in range(4)])
    lag = {"topic": "lagging", "group": "lg"}
    wait_until(
        lambda: value(scrape(addr), "qclient_broker_consume_lag_messages", **lag) == 4,
        10,
        "a consume lag of 4",
    )


def test_unknown_paths_do_not_mint_label_values(cluster):
    addr = cluster.brokers[0].addr
    for i in range(3):
        httpx.get(f"http://{addr}/no/such/path/{i}", trust_env=False)
    s = scrape(addr)
    endpoints = {dict(k[1]).get("endpoint") for k in s if k[0].startswith("qclient_http_")}
    assert "other" in endpoints
    assert not any(e and e.startswith("/no/") for e in endpoints)
    other = {"endpoint": "other", "method": "GET", "status": "404"}
    assert value(s, "qclient_http_request_duration_seconds_count", **other) == 3
