"""OpenTelemetry spans and client metrics of the producer and consumer, on a real cluster.

Spans go to the SDK's in-memory exporter through a tracer that replaces the global one
for the test (the global provider can be set once per process; one subprocess test
covers that path), so other tests of the session never record spans.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_trace_id
from tests.integration.helpers import wait_until

from qclient import AsyncProducer, Message, Producer, _tracing, tracing
from qclient.errors import QClientError, SendTimeoutError


@pytest.fixture
def cluster(shared_cluster):
    return shared_cluster


@pytest.fixture
def spans(monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_tracing, "_tracer", provider.get_tracer("qclient"))
    yield exporter
    provider.shutdown()


def _sends(exporter):
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER]


def _broker_port(cluster) -> int:
    return int(cluster.brokers[0].addr.rpartition(":")[2])


def _check_ok(span, topic, msg_id, cluster):
    assert span.name == f"send {topic}"
    assert span.kind is SpanKind.PRODUCER
    a = span.attributes
    assert a["messaging.system"] == "qclient"
    assert a["messaging.operation.type"] == "send"
    assert a["messaging.destination.name"] == topic
    assert a["messaging.message.id"] == msg_id
    assert a["server.address"] == "127.0.0.1"
    assert a["server.port"] == _broker_port(cluster)
    assert "error.type" not in a
    assert span.status.status_code is StatusCode.UNSET


def test_send_and_send_async_one_span_per_message(cluster, spans):
    with Producer(cluster.namesrv) as p:
        one = p.send_delayed("tr-one", b"x", delay=0.1)
        futures = [p.send_async(Message("tr-async", f"m{i}", delay=0.1)) for i in range(20)]
        p.flush(10)
        results = [f.result() for f in futures]
    sent = _sends(spans)
    assert len(sent) == 21
    by_id = {s.attributes["messaging.message.id"]: s for s in sent}
    _check_ok(by_id[one.msg_id], "tr-one", one.msg_id, cluster)
    for r in results:
        _check_ok(by_id[r.msg_id], "tr-async", r.msg_id, cluster)
    assert len({s.context.span_id for s in sent}) == 21


def test_send_async_span_has_the_callers_parent_and_time(cluster, spans):
    """The span of a buffered message starts with its request, yet keeps the caller's
    context and the time of the call."""
    tracer = _tracing._tracer
    with Producer(cluster.namesrv, linger_ms=50) as p:
        with tracer.start_as_current_span("request") as parent:
            before = time.time_ns()
            fut = p.send_async(Message("tr-defer", b"x"))
        r = fut.result(10)
    (span,) = _sends(spans)
    _check_ok(span, "tr-defer", r.msg_id, cluster)
    assert span.parent.span_id == parent.get_span_context().span_id
    assert before <= span.start_time <= span.end_time
    assert span.attributes["messaging.destination.partition.id"] == str(r.queue_id)


def test_send_batch_is_one_span_with_the_count(cluster, spans):
    with Producer(cluster.namesrv) as p:
        p.send_batch([Message("tr-batch", f"m{i}", delay=0.1) for i in range(30)])
    (span,) = _sends(spans)
    assert span.name == "send tr-batch"
    assert span.attributes["messaging.batch.message_count"] == 30
    assert span.attributes["messaging.destination.name"] == "tr-batch"
    assert span.status.status_code is StatusCode.UNSET


def test_async_producer_spans(cluster, spans):
    async def main():
        async with AsyncProducer(cluster.namesrv) as p:
            rs = await asyncio.gather(*(p.send("tr-aio", f"m{i}") for i in range(5)))
            await p.send_batch([Message("tr-aio", b"b"), Message("tr-aio2", b"c")])
        return rs

    results = asyncio.run(main())
    sent = _sends(spans)
    singles = [s for s in sent if "messaging.batch.message_count" not in s.attributes]
    assert sorted(s.attributes["messaging.message.id"] for s in singles) == sorted(
        r.msg_id for r in results
    )
    (batch,) = [s for s in sent if "messaging.batch.message_count" in s.attributes]
    assert batch.name == "send"  # two topics: no single destination
    assert batch.attributes["messaging.batch.message_count"] == 2


def test_failure_before_any_request_ends_the_span_with_error(spans):
    with (
        Producer("127.0.0.1:1", send_timeout=0.5, start_detector_enable=False) as p,
        pytest.raises(QClientError) as err,
    ):
        p.send("tr-noroute", b"x")
    with (
        Producer("127.0.0.1:1", send_timeout=0.5, start_detector_enable=False) as p,
        pytest.raises(QClientError),
    ):
        p.send_async(Message("tr-noroute", b"y"))
    assert len(_sends(spans)) == 2
    for span in _sends(spans):
        assert span.name == "send tr-noroute"
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == type(err.value).__qualname__
        assert any(e.name == "exception" for e in span.events)


def test_send_async_timeout_ends_the_span_with_error(cluster, spans):
    broker = cluster.brokers[0]
    # 2 s: the warm-up send must not time out on a loaded host; the paused one costs it
    with Producer(cluster.namesrv, send_timeout=2.0, retry_times=0) as p:
        p.send("tr-timeout", b"warm")  # the route is known: the failure is the broker's
        broker.pause()
        try:
            fut = p.send_async(Message("tr-timeout", b"x"))
            with pytest.raises(SendTimeoutError):
                fut.result(10)
        finally:
            broker.resume()
    failed = [s for s in _sends(spans) if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 1
    assert failed[0].attributes["error.type"] == "SendTimeoutError"
    assert failed[0].name == "send tr-timeout"


def test_consumer_continues_the_producer_trace(cluster, spans):
    from qclient import Consumer

    tracer = _tracing._tracer
    with tracer.start_as_current_span("request") as parent, Producer(cluster.namesrv) as p:
        r = p.send_delayed("tr-chain", b"x", delay=0.05)
    (send,) = _sends(spans)
    assert send.parent.span_id == parent.get_span_context().span_id
    trace_id = format_trace_id(send.context.trace_id)
    with Consumer(cluster.namesrv, "tr-chain", "g") as c:
        got = wait_until(lambda: c.poll(10, timeout=0.5), 10, "the message to fire")
        (msg,) = got
        assert msg.msg_id == r.msg_id
        assert msg.properties["traceparent"].split("-")[1] == trace_id
        with tracing.process_span(msg):
            pass
    finished = spans.get_finished_spans()
    (receive,) = [s for s in finished if s.name == "receive tr-chain"]
    assert receive.kind is SpanKind.CONSUMER
    assert receive.attributes["messaging.consumer.group.name"] == "g"
    assert [link.context.span_id for link in receive.links] == [send.context.span_id]
    (process,) = [s for s in finished if s.name == "process tr-chain"]
    assert process.context.trace_id == send.context.trace_id
    assert process.parent.span_id == send.context.span_id


def test_client_metrics(cluster, monkeypatch):
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("qclient")
    monkeypatch.setattr(_tracing, "_duration", meter.create_histogram("d", unit="s"))
    monkeypatch.setattr(_tracing, "_sent", meter.create_counter("n"))
    monkeypatch.setattr(_tracing, "_metering", lambda: True)
    with Producer(cluster.namesrv) as p:
        for i in range(3):
            p.send("tr-metrics", f"m{i}")
        p.send_batch([Message("tr-metrics", b"b")] * 4)
        futures = [p.send_async(Message("tr-metrics", b"a")) for _ in range(5)]
        p.flush(10)
    assert all(f.exception() is None for f in futures)
    data = reader.get_metrics_data()
    points = {
        m.name: m.data.data_points
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert sum(dp.value for dp in points["n"]) == 12
    # one duration per request: each send, the batch, and the requests of send_async
    assert 4 + 1 <= sum(dp.count for dp in points["d"]) <= 4 + 5
    attrs = points["n"][0].attributes
    assert attrs["messaging.destination.name"] == "tr-metrics"
    assert attrs["server.address"] == "127.0.0.1"


def _run(code: str, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_without_opentelemetry_sending_works_and_nothing_is_imported(cluster):
    out = _run(
        """
        import sys

        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(f"hidden: {name}")

        sys.meta_path.insert(0, Hide())
        from qclient import Message, Producer, tracing

        with Producer(sys.argv[1] if len(sys.argv) > 1 else NS) as p:
            p.send("tr-hidden", b"x")
            p.send_batch([Message("tr-hidden", b"y")])
            p.send_async(Message("tr-hidden", b"z")).result(10)
        with tracing.process_span(None):
            pass
        assert not tracing.AVAILABLE
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """.replace("NS", repr(cluster.namesrv))
    )
    assert out.strip() == "[]"


def test_global_tracer_provider(cluster):
    """A producer created before the global provider is set uses it once it is set."""
    out = _run(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
        from qclient import Message, Producer

        with Producer(NS) as p:
            m = Message("tr-global", b"x")
            p.send_async(m).result(10)
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            r = p.send("tr-global", b"y")
        (span,) = exporter.get_finished_spans()
        assert span.attributes["messaging.message.id"] == r.msg_id
        print(span.name)
        """.replace("NS", repr(cluster.namesrv))
    )
    assert out.strip() == "send tr-global"


def test_full_properties_go_untraced_rather_than_refused(spans):
    from qclient.protocol.limits import MAX_PROPERTIES
    from qclient.protocol.wire import WireMessage

    full = {f"k{i}": "v" for i in range(MAX_PROPERTIES)}
    wire = WireMessage(topic="t", queue_id=0, msg_id="m1", body=b"x", properties=dict(full))
    roomy = WireMessage(topic="t", queue_id=0, msg_id="m2", body=b"x", properties={"a": "b"})
    ops = [_tracing.start_send(wire), _tracing.start_send(roomy)]
    assert wire.properties == full  # at the limit: nothing added
    assert set(roomy.properties) == {"a", "traceparent"}
    _tracing.end_many(ops, [QClientError("x")] * 2, None)
    assert len(_sends(spans)) == 2  # both sends still have their span
