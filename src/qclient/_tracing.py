"""OpenTelemetry spans and client metrics of the producer and the consumer (optional).

With ``opentelemetry-api`` installed (the ``otel`` extra) every message sent gets a
PRODUCER span ``send {topic}`` from the global tracer provider (OpenTelemetry's messaging
semantic conventions); its W3C trace context travels in the message's properties
(``traceparent``, ``tracestate``) so that the consumer continues the trace. The client
metrics go to the global meter provider. Without opentelemetry every hook is a no-op and
nothing is imported.

The hooks: ``start_send`` / ``end_send`` for one message sent at once, ``defer_send`` /
``start_many`` / ``end_many`` for ``send_async`` (the span starts when the message's
request does), ``start_batch`` / ``end_batch`` for a ``send_batch``, ``receive`` for a
poll, ``process_span`` (public in ``qclient.tracing``) for handling one message. With no
SDK configured a hook returns ``None``: a provider check, and the caller's context (if
one is attached) passed on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .protocol.limits import MAX_PROPERTIES

__all__ = [
    "AVAILABLE",
    "defer_send",
    "end_batch",
    "end_many",
    "end_send",
    "process_span",
    "receive",
    "start_batch",
    "start_many",
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
    """One send operation in flight: its span (None if it does not record), when the
    call was made, and, while its span is deferred, what the span starts with."""

    __slots__ = (
        "broker",
        "count",
        "ctx",
        "queue_id",
        "span",
        "start_ns",
        "start_time",
        "topic",
        "wire",
    )

    def __init__(self, span: Any, topic: str, count: int) -> None:
        self.span = span
        self.topic = topic
        self.count = count
        self.start_ns = time.perf_counter_ns()
        #: a deferred span: the message (None once started), the caller's context, the call's time
        self.wire: Any = None
        self.ctx: Any = None
        self.start_time = 0
        #: the broker and queue the span's attributes name (None: none named yet)
        self.broker: str | None = None
        self.queue_id = -1


#: cached span attributes per (topic, broker, address, queue) and per address; a
#: producer sees a handful of each, the bound only guards against unbounded topic names
_CACHE_MAX = 4096
#: a byte as two hex digits (the W3C trace flags)
_HEX_BYTE = [f"{i:02x}" for i in range(256)]


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
        description="Duration of a send request, from the call to the broker's answer",
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
        # bytes.hex() and a table: half the CPU of the same f-string (128-bit int formats)
        parent = (
            f"00-{sc.trace_id.to_bytes(16, 'big').hex()}-{sc.span_id.to_bytes(8, 'big').hex()}"
            f"-{_HEX_BYTE[sc.trace_flags]}"
        )
        state = sc.trace_state.to_header() if sc.trace_state else None
        for w in wires:
            props = w.properties
            carrier = {**props, "traceparent": parent} if props else {"traceparent": parent}
            if state:
                carrier["tracestate"] = state
            # over the limit with the caller's properties: the message goes untraced
            # rather than refused by the broker
            if len(carrier) <= MAX_PROPERTIES:
                w.properties = carrier

    def _pass_on(wires: Sequence[Any]) -> None:
        """No tracer provider: no span, but the caller's own trace context (one extracted
        from an incoming request, say) still goes with the messages."""
        ctx = _context.get_current()
        if not ctx:  # nothing attached: no span to pass on
            return
        sc = _trace.get_current_span(ctx).get_span_context()
        if sc.is_valid:
            _inject(sc, wires)

    def _untraced(wires: Sequence[Any], topic: str, count: int) -> _Send | None:
        """No tracer provider: the caller's context passed on, metrics if metered."""
        _pass_on(wires)
        return _Send(None, topic, count) if _metering() else None

    _addresses: dict[str, dict[str, Any]] = {}
    _bases: dict[tuple[str, str | None, str | None, int], tuple[str, dict[str, Any]]] = {}

    def _server(broker: str, resolve: Resolve | None) -> dict[str, Any]:
        """``server.address`` (and ``server.port``) of a broker: its address if known,
        else its name."""
        addr = resolve(broker) if resolve is not None else None
        if not addr:
            return {"server.address": broker}
        attrs = _addresses.get(addr)
        if attrs is None:
            hostport = addr.split("://", 1)[-1]
            host, sep, port = hostport.rpartition(":")
            if sep and port.isdigit():
                attrs = {"server.address": host, "server.port": int(port)}
            else:
                attrs = {"server.address": hostport}
            if len(_addresses) >= _CACHE_MAX:
                _addresses.clear()
            _addresses[addr] = attrs
        return attrs

    def _base(
        topic: str, broker: str | None, queue_id: int, resolve: Resolve | None
    ) -> tuple[str, dict[str, Any]]:
        """The name and the attributes of a message's span but its id, built once per
        topic and queue: the SDK checks each attribute anyway, we need not build them."""
        addr = resolve(broker) if resolve is not None and broker is not None else None
        key = (topic, broker, addr, queue_id)
        base = _bases.get(key)
        if base is None:
            attrs: dict[str, Any] = {
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": topic,
            }
            if broker is not None:
                attrs.update(_server(broker, resolve))
                attrs["messaging.destination.partition.id"] = str(queue_id)
            base = ("send " + topic, attrs)
            if len(_bases) >= _CACHE_MAX:
                _bases.clear()
            _bases[key] = base
        return base

    def _start(
        name: str,
        wires: Sequence[Any],
        attributes: dict[str, Any],
        ctx: Any = None,
        start_time: int | None = None,
    ) -> Any:
        """A PRODUCER span in ``ctx`` (None: the caller's), its trace context put in
        ``wires``; None if it does not record (sampled out)."""
        span = _tracer.start_span(
            name, ctx, kind=_PRODUCER, attributes=attributes, start_time=start_time
        )
        sc = span.get_span_context()
        if sc.is_valid:
            _inject(sc, wires)
        return span if span.is_recording() else None

    def _begin(op: _Send, broker: str | None, queue_id: int, resolve: Resolve | None) -> None:
        """Start a deferred span, naming the broker and queue the message goes to."""
        wire = op.wire
        name, base = _base(wire.topic, broker, queue_id, resolve)
        attrs = dict(base)
        attrs["messaging.message.id"] = wire.msg_id
        op.span = _start(name, (wire,), attrs, op.ctx, op.start_time)
        op.wire = op.ctx = None
        if broker is not None:
            op.broker, op.queue_id = broker, queue_id

    def start_send(wire: Any) -> _Send | None:
        """Start the PRODUCER span of one message (in the caller's context) and put its
        trace context into the message's properties."""
        topic = wire.topic
        if not _tracing():  # the common case of an untraced program: stay cheap
            return _untraced((wire,), topic, 1)
        name, base = _base(topic, None, -1, None)
        attrs = dict(base)
        attrs["messaging.message.id"] = wire.msg_id
        span = _start(name, (wire,), attrs)
        if span is not None or _metering():
            return _Send(span, topic, 1)
        return None

    def defer_send(wire: Any) -> _Send | None:
        """``start_send`` for a message that waits in a buffer: the span keeps the
        caller's context and the time of the call but starts with ``start_many`` just
        before the message's request (knowing its broker; the SDK's span objects live
        for the request, not for the time in the buffer)."""
        if not _tracing():
            return _untraced((wire,), wire.topic, 1)
        op = _Send(None, wire.topic, 1)
        op.wire = wire
        op.ctx = _context.get_current() or None  # an empty context: none
        op.start_time = time.time_ns()
        return op

    def start_many(items: Sequence[Any], resolve: Resolve | None) -> None:
        """Start the deferred spans of the messages of a request (``Item``s, each with
        its queue) and put their trace context into the messages."""
        for it in items:
            op = it.trace
            if op is not None and op.wire is not None:
                q = it.queue  # send_async gives each message its queue
                _begin(op, q.broker_name, q.queue_id, resolve)

    def start_batch(wires: Sequence[Any]) -> _Send | None:
        """Start the one PRODUCER span of a batch request; every message carries its
        trace context."""
        topics = {w.topic for w in wires}
        topic = next(iter(topics)) if len(topics) == 1 else ""
        if not _tracing():
            return _untraced(wires, topic, len(wires))
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

    def _failure(outcome: Any, batch: bool) -> BaseException | None:
        if isinstance(outcome, BaseException):
            return outcome
        if batch:
            return next((r for r in outcome if isinstance(r, BaseException)), None)
        return None

    def _end_span(op: _Send, outcome: Any, resolve: Resolve | None, batch: bool) -> None:
        """End an operation's span with its outcome: where the message went if the span
        does not say so yet (or named another broker), or the error."""
        if op.wire is not None:  # deferred and never sent: it fails before its request
            _begin(op, None, -1, resolve)
        span = op.span
        if span is None:
            return
        failed = _failure(outcome, batch)
        attrs: dict[str, Any] = {}
        if batch:
            broker = _broker_of(outcome, True)
            if broker is not None:
                attrs.update(_server(broker, resolve))
        elif failed is None and (
            outcome.broker_name != op.broker or outcome.queue_id != op.queue_id
        ):
            attrs.update(_server(outcome.broker_name, resolve))
            attrs["messaging.destination.partition.id"] = str(outcome.queue_id)
        if failed is not None:
            attrs["error.type"] = type(failed).__qualname__
        if attrs:
            span.set_attributes(attrs)
        if failed is not None:
            span.record_exception(failed)
            span.set_status(Status(_ERROR, " ".join(str(failed).split())[:300]))
        span.end()

    _Key = tuple[str, "str | None", "type | None"]  # topic, broker, error type

    def _measure(key: _Key, count: int, start_ns: int, resolve: Resolve | None) -> None:
        """One request's duration and its message count, to the meter provider."""
        topic, broker, error = key
        attrs: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.operation.name": "send"}
        if topic:
            attrs["messaging.destination.name"] = topic
        if broker is not None:
            attrs.update(_server(broker, resolve))
        if error is not None:
            attrs["error.type"] = error.__qualname__
        _duration.record((time.perf_counter_ns() - start_ns) / 1e9, attrs)
        _sent.add(count, attrs)

    def _broker_of(outcome: Any, batch: bool) -> str | None:
        if isinstance(outcome, BaseException):
            return None
        if not batch:
            return outcome.broker_name
        brokers = {r.broker_name for r in outcome if not isinstance(r, BaseException)}
        return brokers.pop() if len(brokers) == 1 else None

    def _finish(op: _Send, outcome: Any, resolve: Resolve | None, *, batch: bool) -> None:
        _end_span(op, outcome, resolve, batch)
        if _metering():
            failed = _failure(outcome, batch)
            error = None if failed is None else type(failed)
            _measure((op.topic, _broker_of(outcome, batch), error), op.count, op.start_ns, resolve)

    def end_send(op: _Send | None, outcome: Any, resolve: Resolve | None = None) -> None:
        """End one message's span with its ``SendResult`` or exception."""
        if op is not None:
            _finish(op, outcome, resolve, batch=False)

    def end_many(ops: Sequence[Any], outcomes: Sequence[Any], resolve: Resolve | None) -> None:
        """``end_send`` for each message of an accumulator batch (``ops`` may hold None).
        The batch went as one request: the metrics count it once, its duration from
        the oldest message's call."""
        groups: dict[_Key, list[int]] = {}
        metering = _metering()
        for op, outcome in zip(ops, outcomes, strict=True):
            if op is None:
                continue
            _end_span(op, outcome, resolve, False)
            if metering:
                key: _Key = (
                    (op.topic, None, type(outcome))
                    if isinstance(outcome, BaseException)
                    else (op.topic, outcome.broker_name, None)
                )
                group = groups.setdefault(key, [0, op.start_ns])
                group[0] += 1
                group[1] = min(group[1], op.start_ns)
        for key, (count, start_ns) in groups.items():
            _measure(key, count, start_ns, resolve)

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

    def defer_send(wire: Any) -> _Send | None:
        return None

    def start_many(items: Sequence[Any], resolve: Resolve | None) -> None:
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
