"""Tracing helpers for consumers (OpenTelemetry; no-ops without ``opentelemetry-api``).

The producer traces by itself, through the global tracer provider. A consumer wraps the
handling of each message in ``process_span`` to continue the producer's trace::

    for msg in consumer.poll():
        with qclient.tracing.process_span(msg):
            handle(msg)
"""

from __future__ import annotations

from ._tracing import AVAILABLE, process_span

__all__ = ["AVAILABLE", "process_span"]
