"""Lookup, cancel by id and reschedule: one message, however many brokers hold a copy.

A retried send can leave a copy of a message on a broker whose attempt timed out after it
had stored the message. So each operation asks every broker of the topic's route at once
(retrying a broker that cannot be reached, within ``send_timeout``) and merges the answers:

- ``lookup``: fired if any copy fired (the earliest firing), else scheduled if any copy
  still is (the earliest deliver time), else cancelled; ``MessageInfo.copies`` counts them.
- ``cancel``: True if this call cancelled at least one copy.
- ``reschedule``: every scheduled copy moves to the new time; the result names the first
  broker (by name) that moved one. None moved: ``MessageNotScheduledError`` whose state is
  fired if any copy fired, else cancelled if any was, else None (unknown).

A broker that stays unreachable does not fail the call when another broker holds the id
(a warning names it); when no broker knows the id and one could not be asked, its error
is raised, since "unknown" cannot be claimed. Final refusals (auth, bad input) always raise.
"""

from __future__ import annotations

import logging
import time
from typing import Any, TypeVar

import msgspec

from .._models import MessageInfo, MessageState, SendResult, SendStatus
from .._validation import delay_to_ms, deliver_at_to_ms
from ..errors import (
    AuthError,
    BrokerUnavailableError,
    InvalidMessageError,
    MessageNotScheduledError,
    QClientError,
    SendTimeoutError,
)
from ..protocol import wire
from ..protocol.wire import (
    BROKER_CANCEL,
    BROKER_LOOKUP,
    BROKER_RESCHEDULE,
    CancelRequest,
    CancelResponse,
    LookupRequest,
    LookupResponse,
    RescheduleRequest,
    RescheduleResponse,
    decode,
    encode,
)
from ..transport.errors import (
    Outcome,
    classify_exception,
    error_for_code,
    parse_error_response,
    response_outcome,
)
from ._core import MIN_ATTEMPT, ProducerCore
from ._plan import HttpCall, Plan, Sleep

__all__ = [
    "cancel_target",
    "check_id",
    "plan_cancel",
    "plan_cancel_id",
    "plan_lookup",
    "plan_lookup_on",
    "plan_reschedule",
    "reschedule_request",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


def check_id(topic: Any, msg_id: Any) -> None:
    """Raise InvalidMessageError unless ``topic`` and ``msg_id`` are well-formed."""
    if not isinstance(topic, str) or not wire.TOPIC_RE.match(topic):
        raise InvalidMessageError(f"invalid topic {topic!r}: must match {wire.TOPIC_PATTERN}")
    if not isinstance(msg_id, str) or not wire.MSG_ID_RE.match(msg_id):
        raise InvalidMessageError(
            f"msg_id must be 1-128 printable ASCII characters without spaces: {msg_id!r}"
        )


def cancel_target(
    result: SendResult | None, topic: str | None, msg_id: str | None
) -> tuple[str, str, int | None]:
    """``(topic, msg_id, deliver time hint)`` of ``cancel(result)`` or ``cancel(topic=,
    msg_id=)``, checked."""
    if result is not None:
        if topic is not None or msg_id is not None:
            raise InvalidMessageError("give either a SendResult or topic and msg_id, not both")
        topic, msg_id, hint = result.topic, result.msg_id, result.deliver_at_ms
    else:
        hint = None
    check_id(topic, msg_id)
    assert topic is not None and msg_id is not None
    return topic, msg_id, hint


def reschedule_request(
    core: ProducerCore, topic: str, msg_id: str, delay: Any, deliver_at: Any
) -> RescheduleRequest:
    """The checked request body of a reschedule (exactly one of delay and deliver_at)."""
    check_id(topic, msg_id)
    if (delay is None) == (deliver_at is None):
        raise InvalidMessageError("give exactly one of delay and deliver_at")
    max_ms = core.cfg.max_delay_ms
    if delay is not None:
        return RescheduleRequest(topic, msg_id, delay_ms=delay_to_ms(delay, max_ms))
    return RescheduleRequest(topic, msg_id, deliver_at_ms=deliver_at_to_ms(deliver_at, max_ms))


def _ask_all(core: ProducerCore, addrs: dict[str, str], path: str, body: bytes, topic: str) -> Plan:
    """POST ``body`` to every broker at once; returns broker -> response or its error."""
    deadline = time.monotonic() + core.cfg.send_timeout
    pending = sorted(addrs)
    answers: dict[str, Any] = {}
    errors: dict[str, QClientError] = {}
    for attempt in range(1, core.cfg.times_total + 1):
        if not pending or deadline - time.monotonic() < MIN_ATTEMPT:
            break
        if attempt > 1:
            yield Sleep(0.01 * attempt)
        timeout = core.attempt_timeout(attempt, deadline)
        calls = [HttpCall(b, addrs[b], path, body, timeout, []) for b in pending]
        outcomes = yield calls
        pending = []
        for call, res in zip(calls, outcomes, strict=True):
            b = call.broker
            if res.exc is not None or res.response is None:
                outcome, err = classify_exception(
                    res.exc or RuntimeError("no response"), broker=b, timeout=timeout
                )
            elif res.response.status == 200:
                core.record(b, res.latency_ms, Outcome.OK)
                answers[b] = res.response
                continue
            else:
                code, message = parse_error_response(res.response)
                outcome = response_outcome(code, res.response.status)
                err = error_for_code(
                    code, message, broker=b, topic=topic, status=res.response.status
                )
            core.record(b, res.latency_ms, outcome)
            errors[b] = err
            if outcome is not Outcome.FINAL:
                pending.append(b)
    for b, err in errors.items():
        if b not in answers:
            answers[b] = err
    return answers


def _split(answers: dict[str, Any], kind: type[T]) -> tuple[list[T], list[QClientError]]:
    """Decoded answers (in broker-name order) and errors; a final refusal is raised."""
    oks: list[T] = []
    errs: list[QClientError] = []
    for broker in sorted(answers):
        a = answers[broker]
        if isinstance(a, QClientError):
            if isinstance(a, AuthError | InvalidMessageError):
                raise a
            errs.append(a)
            continue
        try:
            oks.append(decode(a.content, kind, a.media_type))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            errs.append(
                BrokerUnavailableError(
                    f"broker {broker} sent a bad answer: {exc}", broker_name=broker
                )
            )
    return oks, errs


def _partial(found: bool, errs: list[QClientError], what: str) -> None:
    if not errs:
        return
    if not found:
        raise errs[0]
    for e in errs:
        log.warning("%s: a broker could not be asked, a copy there is unknown: %s", what, e)


def _addrs(addrs: dict[str, str], topic: str) -> dict[str, str]:
    if not addrs:
        raise BrokerUnavailableError(f"topic {topic!r} has no broker with a master address")
    return addrs


def plan_lookup(core: ProducerCore, addrs: dict[str, str], topic: str, msg_id: str) -> Plan:
    """Returns the merged ``MessageInfo`` of every copy, or None if no broker knows it."""
    check_id(topic, msg_id)
    body = encode(LookupRequest(topic, msg_id), core.content_type)
    answers = yield from _ask_all(core, _addrs(addrs, topic), BROKER_LOOKUP, body, topic)
    oks, errs = _split(answers, LookupResponse)
    copies = [r for r in oks if r.found and r.state is not None]
    _partial(bool(copies), errs, f"lookup of {msg_id}")
    if not copies:
        return None
    fired = [c for c in copies if c.state == wire.STATE_FIRED]
    scheduled = [c for c in copies if c.state == wire.STATE_SCHEDULED]
    if fired:
        pick = min(fired, key=lambda c: c.fired_at_ms or 0)
    elif scheduled:
        pick = min(scheduled, key=lambda c: c.deliver_at_ms)
    else:
        pick = copies[0]
    return MessageInfo(
        msg_id=msg_id,
        topic=topic,
        broker_name=pick.broker_name,
        state=MessageState(pick.state or wire.STATE_CANCELLED),
        deliver_at_ms=pick.deliver_at_ms,
        fired_at_ms=pick.fired_at_ms if pick.state == wire.STATE_FIRED else None,
        queue_id=pick.queue_id,
        copies=len(copies),
    )


def plan_cancel_id(
    core: ProducerCore,
    addrs: dict[str, str],
    topic: str,
    msg_id: str,
    deliver_at_ms: int | None = None,
) -> Plan:
    """Returns True if a copy was cancelled by this call."""
    check_id(topic, msg_id)
    body = encode(CancelRequest(topic, msg_id, deliver_at_ms), core.content_type)
    answers = yield from _ask_all(core, _addrs(addrs, topic), BROKER_CANCEL, body, topic)
    oks, errs = _split(answers, CancelResponse)
    found = any(r.cancelled or r.reason != "not_found" for r in oks)
    _partial(found, errs, f"cancel of {msg_id}")
    cancelled = any(r.cancelled for r in oks)
    if not cancelled:
        log.info("cancel of %s: %s", msg_id, sorted({r.reason or "" for r in oks}))
    return cancelled


def plan_reschedule(core: ProducerCore, addrs: dict[str, str], request: RescheduleRequest) -> Plan:
    """Returns the ``SendResult`` of the moved message (see the module doc)."""
    topic, msg_id = request.topic, request.msg_id
    body = encode(request, core.content_type)
    answers = yield from _ask_all(core, _addrs(addrs, topic), BROKER_RESCHEDULE, body, topic)
    oks, errs = _split(answers, RescheduleResponse)
    moved = [r for r in oks if r.rescheduled]
    _partial(bool(moved) or any(r.state for r in oks), errs, f"reschedule of {msg_id}")
    if moved:
        r = moved[0]
        return SendResult(
            msg_id, SendStatus.SEND_OK, r.broker_name, r.queue_id, r.deliver_at_ms, topic
        )
    states = {r.state for r in oks}
    if wire.STATE_FIRED in states:
        raise MessageNotScheduledError(
            f"message {msg_id} already fired: it cannot be rescheduled", state=MessageState.FIRED
        )
    if wire.STATE_CANCELLED in states:
        raise MessageNotScheduledError(
            f"message {msg_id} was cancelled: it cannot be rescheduled",
            state=MessageState.CANCELLED,
        )
    raise MessageNotScheduledError(
        f"message {msg_id} of topic {topic!r} is unknown to every broker"
    )


def plan_cancel(core: ProducerCore, result: SendResult, addr: str) -> Plan:
    """Cancel on the broker that holds the message; retries transport failures there."""
    body = encode(
        CancelRequest(topic=result.topic, msg_id=result.msg_id, deliver_at_ms=result.deliver_at_ms),
        core.content_type,
    )
    broker = result.broker_name
    what = f"cancel of {result.msg_id}"
    resp = yield from _ask_one(core, broker, addr, BROKER_CANCEL, body, result.topic, what)
    answer = decode(resp.content, CancelResponse, resp.media_type)
    if not answer.cancelled:
        log.info("cancel of %s on %s: %s", result.msg_id, broker, answer.reason)
    return answer.cancelled


def plan_lookup_on(core: ProducerCore, topic: str, msg_id: str, broker: str, addr: str) -> Plan:
    """The state of ``broker``'s copy (``wire.STATE_*``), or None if it has none."""
    body = encode(LookupRequest(topic, msg_id), core.content_type)
    resp = yield from _ask_one(
        core, broker, addr, BROKER_LOOKUP, body, topic, f"lookup of {msg_id}"
    )
    answer = decode(resp.content, LookupResponse, resp.media_type)
    return answer.state if answer.found else None


def _ask_one(
    core: ProducerCore, broker: str, addr: str, path: str, body: bytes, topic: str, what: str
) -> Plan:
    """POST ``body`` to one broker, retrying transport failures within ``send_timeout``;
    returns its 200 response or raises its error."""
    deadline = time.monotonic() + core.cfg.send_timeout
    last: QClientError | None = None
    for attempt in range(1, core.cfg.times_total + 1):
        if deadline - time.monotonic() < MIN_ATTEMPT:
            break
        timeout = core.attempt_timeout(attempt, deadline)
        call = HttpCall(broker, addr, path, body, timeout, [])
        (res,) = yield [call]
        if res.exc is not None or res.response is None:
            outcome, last = classify_exception(
                res.exc or RuntimeError("no response"), broker=broker, timeout=timeout
            )
            core.record(broker, res.latency_ms, outcome)
            if outcome is Outcome.FINAL:
                break
            yield Sleep(0.01 * attempt)
            continue
        resp = res.response
        if resp.status == 200:
            core.record(broker, res.latency_ms, Outcome.OK)
            return resp
        code, message = parse_error_response(resp)
        outcome = response_outcome(code, resp.status)
        core.record(broker, res.latency_ms, outcome)
        last = error_for_code(code, message, broker=broker, topic=topic, status=resp.status)
        if outcome is Outcome.FINAL:
            break
    raise last or SendTimeoutError(f"{what} on {broker} timed out")
