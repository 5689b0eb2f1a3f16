"""Prometheus ``GET /metrics`` of the broker and the name server (prometheus_client).

Counters and gauges of the store are read from its stats at scrape time (a custom
collector), so the hot paths pay nothing for them; the histograms the store fills per
batch (fire lateness, fsync durations) are exposed from their snapshots. Request
durations per endpoint, method and status come from a middleware. Names follow the
Prometheus conventions: base units (seconds), ``_total`` counters, a ``qclient_``
prefix. Labels carry topic and group names at most: no message content, no credentials.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..protocol import wire
from ._http import text_reply
from .store.due import DUE_BOUNDS_S
from .store.histogram import Histogram

__all__ = [
    "CONTENT_TYPE",
    "BrokerCollector",
    "NameServerMetrics",
    "RequestMetrics",
    "metrics_handler",
    "request_metrics_middleware",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: request durations, seconds: a send is a few ms, a long poll up to its wait
_REQUEST_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
#: the ``within`` labels of the due gauge: the store's DUE_BOUNDS_S, then every message
DUE_LABELS = ("5s", "1m", "5m", "15m", "1h", "4h", "8h", "24h", "+Inf")
assert len(DUE_LABELS) == len(DUE_BOUNDS_S) + 1
#: a method label is one of these or "other" (a client must not mint label values)
_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})


def metrics_handler(registry: CollectorRegistry) -> Any:
    """The ``GET /metrics`` handler: the registry in the Prometheus text format."""

    async def metrics(request: Any) -> Any:
        return text_reply(request, generate_latest(registry), CONTENT_TYPE)

    return metrics


class _Endpoints:
    """Maps a request path to the route it matched (``/v1/routes/{topic}``), or
    ``other``: label values stay a small fixed set whatever clients send."""

    def __init__(self, routes: Iterable[str]) -> None:
        self._exact = {r for r in routes if "{" not in r}
        self._prefixes = [(r[: r.index("{")], r) for r in routes if "{" in r]

    def __call__(self, path: str) -> str:
        if path in self._exact:
            return path
        for prefix, route in self._prefixes:
            if path.startswith(prefix) and "/" not in path[len(prefix) :]:
                return route
        return "other"


def _protocol_routes() -> list[str]:
    """Every endpoint path the protocol defines (``wire``'s path constants)."""
    return [v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and v[:1] == "/"]


class _RequestDurations:
    """``qclient_http_request_duration_seconds{endpoint, method, status}``: one
    :class:`Histogram` per label set, turned into a metric family at scrape time (a
    prometheus_client ``Histogram`` takes a lock per bucket passed and per label lookup on
    every observation: a tenth of a small request's cost)."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str, int], Histogram] = {}

    def observe(self, key: tuple[str, str, int], seconds: float) -> None:
        h = self._series.get(key)
        if h is None:
            h = self._series.setdefault(key, Histogram(_REQUEST_BOUNDS))
        h.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "qclient_http_request_duration_seconds",
            "HTTP request duration by endpoint, method and status",
            labels=["endpoint", "method", "status"],
        )
        for (endpoint, method, status), h in sorted(list(self._series.items())):
            cumulative, total = h.snapshot()
            labels = {"endpoint": endpoint, "method": method, "status": str(status)}
            _histogram("", "", h.bounds, cumulative, total, labels=labels, family=family)
        yield family


class RequestMetrics:
    """``qclient_http_request_duration_seconds{endpoint, method, status}``: observed by
    :attr:`middleware` for routed requests, and by :meth:`observe` for those answered
    by a direct handler (which runs no middleware). A path the protocol does not define
    is counted as endpoint ``other``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._durations = _RequestDurations()
        registry.register(self._durations)
        self._endpoint = _Endpoints(_protocol_routes())
        observe = self.observe

        async def middleware(request: Any, handler: Any) -> Any:
            """Errors raised by inner handlers count with their status (500 if none)."""
            start = time.perf_counter()
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except asyncio.CancelledError:  # the client went away: no status to count
                status = 0
                raise
            except Exception as exc:
                status = getattr(exc, "status", 500)
                raise
            finally:
                if status:
                    observe(request.path, request.method, status, time.perf_counter() - start)

        self.middleware = middleware

    def observe(self, path: str, method: str, status: int, seconds: float) -> None:
        """Count one request answered outside the middleware."""
        method = method if method in _METHODS else "other"
        self._durations.observe((self._endpoint(path), method, status), seconds)


def request_metrics_middleware(registry: CollectorRegistry) -> Any:
    """:class:`RequestMetrics`' middleware (for a server without direct handlers)."""
    return RequestMetrics(registry).middleware


def _histogram(
    name: str,
    doc: str,
    bounds: Sequence[float],
    cumulative: list[int],
    total: float,
    scale: float = 1.0,
    labels: dict[str, str] | None = None,
    family: HistogramMetricFamily | None = None,
) -> HistogramMetricFamily:
    """A store ``Histogram`` snapshot as a metric family (``scale`` converts its unit to
    seconds); with ``family``, adds one labelled series to it."""
    buckets = [(repr(float(b * scale)), c) for b, c in zip(bounds, cumulative, strict=False)]
    buckets.append(("+Inf", cumulative[-1]))
    if family is None:
        family = HistogramMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), buckets, total * scale)
    return family


class BrokerCollector:
    """The broker's store and topics, read at scrape time."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        store = broker.store
        s = store.stats()
        for key, name, doc in (
            ("stored", "messages_stored", "Messages made durable (duplicates excluded)"),
            ("fired", "messages_fired", "Messages fired into their consume queues"),
            ("cancelled", "messages_cancelled", "Scheduled messages cancelled before firing"),
            ("duplicates", "messages_duplicate", "Sends of an id stored already (not stored)"),
            ("rescheduled", "messages_rescheduled", "Scheduled messages moved to a new time"),
            ("busy_rejections", "busy_rejections", "Sends refused with BROKER_BUSY"),
            ("fsyncs", "message_log_fsyncs", "Group commits of the message log"),
        ):
            yield CounterMetricFamily(f"qclient_broker_{name}_total", doc, value=s.get(key, 0))
        yield GaugeMetricFamily(
            "qclient_broker_scheduled_messages",
            "Messages stored and not yet fired or cancelled",
            value=s.get("scheduled", 0),
        )
        yield GaugeMetricFamily(
            "qclient_broker_pending_messages",
            "Messages accepted and waiting for the group commit",
            value=s.get("pending", 0),
        )
        yield GaugeMetricFamily(
            "qclient_broker_message_log_bytes",
            "Size of the message log",
            value=s.get("log_bytes", 0),
        )
        yield GaugeMetricFamily(
            "qclient_broker_topics", "Topics on this broker", value=len(broker.topics.all())
        )
        due = GaugeMetricFamily(
            "qclient_broker_scheduled_messages_due",
            "Scheduled messages due within the given time from now (cumulative, by the "
            "second; overdue ones in every bound)",
            labels=["within"],
        )
        for label, count in zip(DUE_LABELS, store.due_within(), strict=True):
            due.add_metric([label], count)
        yield due
        for attr, name, doc in (
            ("retries", "retries", "Messages stored into a group's retry topic, by group"),
            ("dead_lettered", "dead_lettered", "Messages stored into a group's DLQ, by group"),
        ):
            family = CounterMetricFamily(f"qclient_broker_{name}_total", doc, labels=["group"])
            for group, n in sorted(dict(getattr(broker, attr)).items()):
                family.add_metric([group], n)
            yield family
        lag = GaugeMetricFamily(
            "qclient_broker_consume_lag_messages",
            "Fired messages past a group's committed offsets",
            labels=["topic", "group"],
        )
        for (topic, group), behind in sorted(store.consume_lag().items()):
            lag.add_metric([topic, group], behind)
        yield lag
        hists = store.histograms()
        late = hists["lateness_ms"]
        cumulative, total = late.snapshot()
        yield _histogram(
            "qclient_broker_fire_lateness_seconds",
            "fired_at - deliver_at of fired messages (0 if fired ahead of it)",
            late.bounds,
            cumulative,
            total,
            scale=0.001,
        )
        fsync: HistogramMetricFamily | None = None
        for key, h in hists.items():
            if key.startswith("fsync_"):
                cumulative, total = h.snapshot()
                fsync = _histogram(
                    "qclient_broker_fsync_duration_seconds",
                    "Duration of the fsyncs that make messages durable, per file kind",
                    h.bounds,
                    cumulative,
                    total,
                    labels={"file": key.removeprefix("fsync_")},
                    family=fsync,
                )
        if fsync is not None:
            yield fsync


class NameServerMetrics:
    """The name server's registered brokers (read at scrape time) and route lookups."""

    def __init__(self, registry: CollectorRegistry, table: Any) -> None:
        self._table = table
        self._lookups = Counter(
            "qclient_namesrv_route_lookups",
            "Route lookups by result (found, not_found)",
            ["result"],
            registry=registry,
        )
        self._found = self._lookups.labels("found")
        self._not_found = self._lookups.labels("not_found")
        registry.register(self)

    def route_lookup(self, found: bool) -> None:
        (self._found if found else self._not_found).inc()

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "qclient_namesrv_brokers",
            "Brokers registered and alive",
            value=len(self._table.brokers().brokers),
        )
