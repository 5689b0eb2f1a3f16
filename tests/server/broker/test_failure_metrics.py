"""The broker's backlog by due time and its failure counters on ``GET /metrics``, parsed
with prometheus_client's parser: ``qclient_broker_scheduled_messages_due{within}`` is
cumulative and moves as messages come due and fire; a consumer's retries and
dead letters are counted by group."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.helpers import wait_until

from qclient import Consumer, LocalCluster, Message, Producer
from qclient.protocol import wire

pytestmark = pytest.mark.timeout(120)

DUE = "qclient_broker_scheduled_messages_due"
WITHIN = ("5s", "1m", "5m", "15m", "1h", "4h", "8h", "24h", "+Inf")


@pytest.fixture
def cluster():
    # a broker of each test's own: the gauge counts every topic's scheduled messages
    with LocalCluster(brokers=1) as c:
        yield c


def scrape(addr: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> labels -> value, for every sample of ``/metrics``."""
    r = httpx.get(f"http://{addr}{wire.METRICS}", timeout=5.0, trust_env=False)
    assert r.status_code == 200
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def due(samples) -> list[float]:
    return [samples[DUE][(("within", w),)] for w in WITHIN]


def test_scheduled_messages_due_is_cumulative_and_moves_as_messages_come_due(cluster):
    addr = cluster.brokers[0].addr
    empty = due(scrape(addr))
    assert empty == [0.0] * len(WITHIN)  # a new broker: nothing scheduled
    delays = [12, 12, 12, 40, 40, 240, 600, 3000, 3 * 3600, 6 * 3600, 20 * 3600, 30 * 3600]
    with Producer(cluster.namesrv) as p:
        p.send_batch([Message("due", f"m{i}", delay=d) for i, d in enumerate(delays)])
    assert due(scrape(addr)) == [0, 5, 6, 7, 8, 9, 10, 11, 12]
    # the 12 s ones come within 5 s of now, then fire
    wait_until(lambda: due(scrape(addr))[0] == 3, 20, "3 messages due within 5 s")
    assert due(scrape(addr))[1:] == [5, 6, 7, 8, 9, 10, 11, 12]
    wait_until(lambda: due(scrape(addr))[-1] == 9, 20, "the 12 s messages to fire")
    assert due(scrape(addr)) == [0, 2, 3, 4, 5, 6, 7, 8, 9]


def test_retries_and_dead_letters_are_counted_by_group(cluster):
    addr = cluster.brokers[0].addr
    cluster.create_topic("fail", 2)
    with Producer(cluster.namesrv) as p:
        p.send_batch([Message("fail", f"m{i}") for i in range(3)])
    handled = 0
    with Consumer(cluster.namesrv, "fail", "billing", retry_delays=[30]) as c:
        deadline = time.monotonic() + 20
        while handled < 3 and time.monotonic() < deadline:
            for m in c.poll(8, timeout=0.5):
                if handled < 2:
                    c.retry_later(m)  # due in 30 s: in the backlog's "1m"
                else:
                    c.dead_letter(m, "unparseable")
                handled += 1
    assert handled == 3
    s = scrape(addr)
    assert s["qclient_broker_retries_total"][(("group", "billing"),)] == 2
    assert s["qclient_broker_dead_lettered_total"][(("group", "billing"),)] == 1
    assert due(s) == [0, 2, 2, 2, 2, 2, 2, 2, 2]  # the retries, due in 30 s
