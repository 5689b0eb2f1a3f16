"""Observability in a minute: a producer and a consumer traced with OpenTelemetry (spans
printed by the console exporter), then the broker's Prometheus metrics scraped once.

    .venv/bin/python examples/observability.py

Starts its own LocalCluster; needs the ``otel`` extra and ``opentelemetry-sdk``
(``make setup`` installs both). Ends in a few seconds.
"""

from __future__ import annotations

import logging
import sys

import httpx
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from prometheus_client.parser import text_string_to_metric_families

import qclient
from qclient import Consumer, LocalCluster, Message, Producer, tracing

TOPIC = "orders"
#: the broker metrics this example prints (every one is in the scrape)
SHOWN = (
    "qclient_broker_messages_stored_total",
    "qclient_broker_messages_fired_total",
    "qclient_broker_messages_cancelled_total",
    "qclient_broker_scheduled_messages",
    "qclient_broker_fire_lateness_seconds_count",
    "qclient_broker_fire_lateness_seconds_sum",
)


def main() -> int:
    # The application configures logging and tracing; qclient only uses what is set.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("shop")

    with LocalCluster(brokers=1) as cluster:
        with Producer(cluster.namesrv) as producer:
            # the request that schedules the messages: its trace follows them
            with tracer.start_as_current_span("checkout"):
                sent = producer.send_delayed(TOPIC, b"order 1 reminder", delay=0.5)
                later = producer.send_async(Message(TOPIC, b"order 2 reminder", delay=60))
                producer.flush()
            producer.cancel(later.result())
        print(f"sent {sent.msg_id}, traceparent goes with it", file=sys.stderr)

        with Consumer(cluster.namesrv, TOPIC, "mailer") as consumer:
            received: list[qclient.ReceivedMessage] = []
            for _ in range(40):  # up to ~10 s
                received += consumer.poll(10, timeout=0.25)
                if received:
                    break
            for msg in received:
                # the consumer continues the producer's trace
                with tracing.process_span(msg):
                    print(
                        f"handled {msg.body.decode()!r}, traceparent "
                        f"{msg.properties.get('traceparent')}",
                        file=sys.stderr,
                    )
        if not received:
            print("no message arrived", file=sys.stderr)
            return 1

        addr = cluster.brokers[0].addr
        text = httpx.get(f"http://{addr}/metrics", timeout=5.0, trust_env=False).text
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if not s.labels or "le" not in s.labels
        }
        print(f"\nGET http://{addr}/metrics (excerpt):")
        for name in SHOWN:
            print(f"  {name} {samples.get(name, 0.0):g}")
    provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
