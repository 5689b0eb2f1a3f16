"""The name server's Prometheus ``GET /metrics``: registered brokers and route lookups."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from qclient import Producer
from qclient.protocol import wire


def _samples(addr: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(f"http://{addr}{wire.METRICS}", timeout=5.0, trust_env=False)
    assert r.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_broker_count_and_route_lookups(shared_cluster):
    c = shared_cluster
    s = _samples(c.namesrv)
    assert s[("qclient_namesrv_brokers", ())] == 1
    found = s.get(("qclient_namesrv_route_lookups_total", (("result", "found"),)), 0.0)
    with Producer(c.namesrv, start_detector_enable=False) as p:
        p.send("ns-metrics", b"x")  # one route lookup
    key = (
        "qclient_http_request_duration_seconds_count",
        (("endpoint", wire.NAMESRV_ROUTE), ("method", "GET"), ("status", "400")),
    )
    bad = s.get(key, 0.0)
    r = httpx.get(f"http://{c.namesrv}/v1/routes/bad%20topic", trust_env=False)
    assert r.status_code == 400
    s = _samples(c.namesrv)
    assert s[("qclient_namesrv_route_lookups_total", (("result", "found"),))] == found + 1
    assert s[key] == bad + 1
