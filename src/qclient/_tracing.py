"""OpenTelemetry spans and client metrics of the producer and the consumer (optional).

With ``opentelemetry-api`` installed (the ``otel`` extra) every message sent gets a
PRODUCER span ``send {topic}`` from the globally configured tracer provider, following
OpenTelemetry's messaging semantic conventions, and its W3C trace context travels in the
message's properties (``traceparent``, ``tracestate``) so that the consumer continues the
trace. ``messaging.client.operation.duration`` and ``messaging.client.sent.messages`` go to
the global meter provider. Without opentelemetry every hook is a no-op and nothing is
imported.

The hooks: ``start_send`` / ``end_send`` / ``end_many`` for one message each,
``start_batch`` / ``end_batch`` for one ``send_batch`` request, ``receive`` for a poll and
``process_span`` (public as ``qclient.tracing.process_span``) for handling one message.
A hook returns ``None`` when there is nothing to record (no SDK configured): tracing
that nobody collects costs a provider check and a look at the caller's current span
(whose context, if it has one, is still passed on) per message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .protocol.limits import MAX_PROPERTIES

__all__ = [
    "AVAILABLE",
    "end_batch",
    "end_many",
    "end_send",
    "process_span",
    "receive",
    "start_batch",
    "start_send",
]

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError:  # the otel extra is not installed: every hook is a no-op
    AVAILABLE = False
else:
    AVAILABLE = True

#: the value of ``messaging.system``
SYSTEM = "qclient"
_SCOPE = "qclient"
#: a consumer's receive span links at most this many producer spans (the SDK's default limit)
_MAX_LINKS = 128

Resolve = Callable[[str], "str | None"]


def _version() -> str:
    from . import __version__

    return __version__


class _Send:
    """One send operation in flight: its span (or None) and when it started."""

    __slots__ = ("count", "span", "start_ns", "topic")

    def __init__(self, span: Any, topic: str, count: int) -> None:
        self.span = span
        self.topic = topic
        self.count = count
        self.start_ns = time.perf_counter_ns()


if AVAILABLE:
    from opentelemetry.trace import Link, ProxyTracerProvider, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _tracer = _trace.get_tracer(_SCOPE, _version())
    _GLOBAL_TRACER = _tracer
    _UNSET_TRACERS = (ProxyTracerProvider, _trace.NoOpTracerProvider)
    _meter = _metrics.get_meter(_SCOPE, _version())
    _duration = _meter.create_histogram(
        "messaging.client.operation.duration",
        unit="s",
        description="Duration of a send, from the call to the broker's acknowledgement",
    )
    _sent = _meter.create_counter(
        "messaging.client.sent.messages",
        unit="{message}",
        description="Messages the producer attempted to send",
    )
    _W3C = TraceContextTextMapPropagator()
    _PRODUCER = SpanKind.PRODUCER
    _CONSUMER = SpanKind.CONSUMER
    _ERROR = StatusCode.ERROR
    # Whether a provider has been set globally, read per send: the API's own module
    # globals (what its proxies consult) cost a few ns, its getters ~1 µs (an environ
    # lookup each). An API without them: ask the getters.
    from opentelemetry import context as _context
    from opentelemetry.metrics import _internal as _metrics_state

    _TRACE_STATE = hasattr(_trace, "_TRACER_PROVIDER")
    _METRICS_STATE = hasattr(_metrics_state, "_METER_PROVIDER")

    def _metering() -> bool:
        """A meter provider is configured (else the instruments are no-ops: skip them)."""
        if _METRICS_STATE:
            return _metrics_state._METER_PROVIDER is not None
        return not isinstance(_metrics.get_meter_provider(), _metrics.NoOpMeterProvider)

    def _tracing() -> bool:
        """A tracer provider is configured (else spans would be no-ops: skip them)."""
        if _tracer is not _GLOBAL_TRACER:
            return True
        if _TRACE_STATE:
            return _trace._TRACER_PROVIDER is not None
        return not isinstance(_trace.get_tracer_provider(), _UNSET_TRACERS)

    def _inject(sc: Any, wires: Sequence[Any]) -> None:
        """Put a span context into each message's properties as W3C ``traceparent``
        (and ``tracestate`` when it has entries)."""
        carrier = {"traceparent": f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"}
        if sc.trace_state:
            carrier["tracestate"] = sc.trace_state.to_header()
        for w in wires:
            props = w.properties
            if not props:
                w.properties = dict(carrier)
            elif len(props.keys() | carrier.keys()) <= MAX_PROPERTIES:
                w.properties = {**props, **carrier}
            # else: the caller's properties fill the limit; the message goes untraced
            # rather than refused by the broker

    def _pass_on(wires: Sequence[Any]) -> None:
        """No tracer provider: no span, but the caller's own trace context (one extracted
        from an incoming request, say) still goes with the messages."""
        ctx = _context.get_current()
        if not ctx:  # nothing attached: no span to pass on
            return
        sc = _trace.get_current_span(ctx).get_span_context()
        if sc.is_valid:
            _inject(sc, wires)

    def _start(name: str, wires: Sequence[Any], attributes: dict[str, Any]) -> Any:
        """A PRODUCER span in the caller's context, its trace context put in ``wires``;
        None if it does not record (sampled out)."""
        span = _tracer.start_span(name, kind=_PRODUCER, attributes=attributes)
        sc = span.get_span_context()
        if sc.is_valid:
            _inject(sc, wires)
        return span if span.is_recording() else None

    def start_send(wire: Any) -> _Send | None:
        """Start the PRODUCER span of one message (in the caller's context) and put its
        trace context into the message's properties."""
        topic = wire.topic
        if not _tracing():  # the common case of an untraced program: stay cheap
            _pass_on((wire,))
            return _Send(None, topic, 1) if _metering() else None
        span = _start(
            "send " + topic,
            (wire,),
            {
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": topic,
                "messaging.message.id": wire.msg_id,
            },
        )
        if span is not None or _metering():
            return _Send(span, topic, 1)
        return None

    def start_batch(wires: Sequence[Any]) -> _Send | None:
        """Start the one PRODUCER span of a batch request; every message carries its
        trace context."""
        topics = {w.topic for w in wires}
        topic = next(iter(topics)) if len(topics) == 1 else ""
        if not _tracing():
            _pass_on(wires)
            return _Send(None, topic, len(wires)) if _metering() else None
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.batch.message_count": len(wires),
        }
        if topic:
            attributes["messaging.destination.name"] = topic
        span = _start("send " + topic if topic else "send", wires, attributes)
        if span is not None or _metering():
            return _Send(span, topic, len(wires))
        return None

    def _server(attrs: dict[str, Any], broker: str, resolve: Resolve | None) -> None:
        addr = resolve(broker) if resolve is not None else None
        if not addr:
            attrs["server.address"] = broker
            return
        hostport = addr.split("://", 1)[-1]
        host, sep, port = hostport.rpartition(":")
        if sep and port.isdigit():
            attrs["server.address"] = host
            attrs["server.port"] = int(port)
        else:
            attrs["server.address"] = hostport

    def _finish(op: _Send, outcome: Any, resolve: Resolve | None, *, batch: bool) -> None:
        span = op.span
        attrs: dict[str, Any] = {}  # what the end adds to the span and the metrics
        failed: BaseException | None = None
        if isinstance(outcome, BaseException):
            failed = outcome
        elif batch:
            failed = next((r for r in outcome if isinstance(r, BaseException)), None)
            brokers = {r.broker_name for r in outcome if not isinstance(r, BaseException)}
            if len(brokers) == 1:
                _server(attrs, brokers.pop(), resolve)
        else:
            _server(attrs, outcome.broker_name, resolve)
        if failed is not None:
            attrs["error.type"] = type(failed).__qualname__
        if span is not None:
            if not batch and failed is None:
                attrs["messaging.destination.partition.id"] = str(outcome.queue_id)
            span.set_attributes(attrs)
            if failed is not None:
                span.record_exception(failed)
                span.set_status(Status(_ERROR, " ".join(str(failed).split())[:300]))
            span.end()
        if _metering():
            attrs.pop("messaging.destination.partition.id", None)
            attrs["messaging.system"] = SYSTEM
            attrs["messaging.operation.name"] = "send"
            if op.topic:
                attrs["messaging.destination.name"] = op.topic
            _duration.record((time.perf_counter_ns() - op.start_ns) / 1e9, attrs)
            _sent.add(op.count, attrs)

    def end_send(op: _Send | None, outcome: Any, resolve: Resolve | None = None) -> None:
        """End one message's span with its ``SendResult`` or exception."""
        if op is not None:
            _finish(op, outcome, resolve, batch=False)

    def end_many(ops: Sequence[Any], outcomes: Sequence[Any], resolve: Resolve | None) -> None:
        """``end_send`` for each message of an accumulator batch (``ops`` may hold None)."""
        for op, outcome in zip(ops, outcomes, strict=True):
            if op is not None:
                _finish(op, outcome, resolve, batch=False)

    def end_batch(op: _Send | None, outcome: Any, resolve: Resolve | None = None) -> None:
        """End a batch's span with its list of results (or the exception that ended it)."""
        if op is not None:
            _finish(op, outcome, resolve, batch=True)

    def _context_of(message: Any) -> Any:
        props = message.properties
        if not props or "traceparent" not in props:
            return None
        return _W3C.extract(props)

    def receive(topic: str, group: str, messages: Sequence[Any], start_ns: int) -> None:
        """A CONSUMER span ``receive {topic}`` for one poll that returned messages,
        linked to the producer span of each (up to the SDK's link limit)."""
        if not messages or not _tracing():
            return
        links = []
        for m in messages[:_MAX_LINKS]:
            ctx = _context_of(m)
            if ctx is not None:
                sc = _trace.get_current_span(ctx).get_span_context()
                if sc.is_valid:
                    links.append(Link(sc))
        span = _tracer.start_span(
            "receive " + topic,
            kind=_CONSUMER,
            links=links,
            start_time=start_ns,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "receive",
                "messaging.operation.name": "receive",
                "messaging.destination.name": topic,
                "messaging.consumer.group.name": group,
                "messaging.batch.message_count": len(messages),
            },
        )
        span.end()

    @contextlib.contextmanager
    def process_span(message: Any) -> Iterator[Any]:
        """A CONSUMER span ``process {topic}`` around handling one received message: a
        child of the producer's span (the trace continues) and linked to it; current
        inside the ``with`` block, ERROR if the block raises."""
        ctx = _context_of(message)
        links = None
        if ctx is not None:
            sc = _trace.get_current_span(ctx).get_span_context()
            links = [Link(sc)] if sc.is_valid else None
        with _tracer.start_as_current_span(
            "process " + message.topic,
            context=ctx,
            kind=_CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": message.topic,
                "messaging.message.id": message.msg_id,
                "messaging.destination.partition.id": str(message.queue_id),
            },
        ) as span:
            yield span

else:

    def start_send(wire: Any) -> _Send | None:
        return None

    def start_batch(wires: Sequence[Any]) -> _Send | None:
        return None

    def end_send(op: _Send | None, outcome: Any, resolve: Resolve | None = None) -> None:
        return None

    def end_many(ops: Sequence[Any], outcomes: Sequence[Any], resolve: Resolve | None) -> None:
        return None

    def end_batch(op: _Send | None, outcome: Any, resolve: Resolve | None = None) -> None:
        return None

    def receive(topic: str, group: str, messages: Sequence[Any], start_ns: int) -> None:
        return None

    @contextlib.contextmanager
    def process_span(message: Any) -> Iterator[Any]:
        yield None
