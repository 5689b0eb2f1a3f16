"""Broker handlers of a message's lifecycle: lookup, cancel (by id) and reschedule.

Each finds the message by id in the store's on-disk id index, so a client needs nothing
but the topic and the id. The store calls block on small reads (and, for cancel and
reschedule, on the tombstone's or the moved copy's group commit), so they run in a worker
thread, never on the event loop. Access control: the account must be allowed the topic.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...protocol import wire
from ...protocol.wire import ErrorCode
from .._http import ApiError, read_body, reply
from ..store import InvalidRecordError, StoreError, accept_clock_ms

__all__ = ["cancel", "lookup", "reschedule"]


def _target(request: Any, topic: str, msg_id: str) -> Any:
    if not wire.valid_topic(topic):
        raise ApiError(400, ErrorCode.INVALID_TOPIC, f"invalid topic name {topic[:140]!r}")
    if not wire.MSG_ID_RE.match(msg_id):
        raise ApiError(400, ErrorCode.INVALID_MESSAGE, "msg_id must be 1-128 printable ASCII")
    broker = request.app["broker"]
    broker.authorize(request, {topic})
    return broker


async def _call(fn: Any, *args: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args)
    except InvalidRecordError as exc:
        raise ApiError(400, ErrorCode.INVALID_REQUEST, str(exc)) from None
    except StoreError as exc:
        raise ApiError(500, ErrorCode.STORE_ERROR, f"store error: {exc}") from None


async def lookup(request: Any) -> Any:
    body = await read_body(request, wire.LookupRequest)
    broker = _target(request, body.topic, body.msg_id)
    found = await _call(broker.store.lookup, body.topic, body.msg_id)
    name = broker.config.name
    if found is None:
        return reply(request, wire.LookupResponse(name, False))
    return reply(
        request,
        wire.LookupResponse(
            name, True, found.state, found.queue_id, found.deliver_at_ms, found.fired_at_ms
        ),
    )


async def cancel(request: Any) -> Any:
    body = await read_body(request, wire.CancelRequest)
    hint = body.deliver_at_ms
    if hint is not None and not 0 <= hint < 2**63:
        raise ApiError(400, ErrorCode.INVALID_DELAY, "deliver_at_ms must be 0..2**63-1")
    broker = _target(request, body.topic, body.msg_id)
    outcome = await _call(broker.store.cancel_id, body.topic, body.msg_id, hint)
    broker.counters["cancelled" if outcome.cancelled else "cancel_misses"] += 1
    return reply(request, wire.CancelResponse(outcome.cancelled, outcome.reason))


async def reschedule(request: Any) -> Any:
    body = await read_body(request, wire.RescheduleRequest)
    broker = _target(request, body.topic, body.msg_id)
    now = accept_clock_ms()
    max_delay = broker.config.max_delay_ms
    if (body.delay_ms is None) == (body.deliver_at_ms is None):
        raise ApiError(
            400, ErrorCode.INVALID_DELAY, "give exactly one of delay_ms and deliver_at_ms"
        )
    if body.delay_ms is not None:
        if not 0 <= body.delay_ms <= max_delay:
            raise ApiError(
                400,
                ErrorCode.INVALID_DELAY,
                f"delay_ms must be 0..{max_delay}, got {body.delay_ms}",
            )
        deliver_at = now + body.delay_ms
    else:
        deliver_at = body.deliver_at_ms or 0
        if not 0 <= deliver_at <= now + max_delay:
            raise ApiError(
                400,
                ErrorCode.INVALID_DELAY,
                f"deliver_at_ms is more than {max_delay} ms ahead (the broker's maximum delay) "
                "or negative",
            )
    out = await _call(broker.store.reschedule, body.topic, body.msg_id, deliver_at)
    broker.counters["rescheduled" if out.rescheduled else "reschedule_misses"] += 1
    return reply(
        request,
        wire.RescheduleResponse(
            broker.config.name, out.rescheduled, out.state, out.queue_id, out.deliver_at_ms
        ),
    )
