"""Lookup, cancel by id and reschedule on qclient's brokers (HTTP): each operation asks
every broker of the topic's route at once, retrying a broker that cannot be reached within
``send_timeout``, and merges the answers by the rules of ``producer/lifecycle.py``. A
broker finds every copy of an id through its id index, and moves a scheduled one to a new
time atomically.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from ..._models import SendResult, SendStatus
from ...errors import (
    AuthError,
    BrokerUnavailableError,
    InvalidMessageError,
    QClientError,
    SendTimeoutError,
)
from ...producer._ambiguous import is_ambiguous
from ...producer._plan import MIN_ATTEMPT, HttpCall, Plan, Sleep
from ...producer.lifecycle import (
    check_id,
    master_addrs_of,
    merge_lookup,
    not_rescheduled,
    partial,
)
from ...protocol.wire import (
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
from ...transport.errors import (
    Outcome,
    classify_exception,
    error_for_code,
    parse_error_response,
    response_outcome,
)

if TYPE_CHECKING:
    from ...producer._core import ProducerCore

__all__ = [
    "plan_cancel",
    "plan_cancel_id",
    "plan_lookup",
    "plan_lookup_on",
    "plan_reschedule",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _ask_all(
    core: ProducerCore,
    addrs: dict[str, str],
    path: str,
    body: bytes,
    topic: str,
    reached: set[str] | None = None,
) -> Plan:
    """POST ``body`` to every broker at once; returns broker -> response or its error.
    ``reached`` gets the brokers a failed attempt may have reached (``is_ambiguous``): a
    retry there may find the request's work done."""
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
                if reached is not None and is_ambiguous(res.exc):
                    reached.add(b)
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


def _split(answers: dict[str, Any], kind: type[T]) -> tuple[dict[str, T], list[QClientError]]:
    """Broker -> decoded answer (in broker-name order) and the errors; a final refusal is
    raised."""
    oks: dict[str, T] = {}
    errs: list[QClientError] = []
    for broker in sorted(answers):
        a = answers[broker]
        if isinstance(a, QClientError):
            if isinstance(a, AuthError | InvalidMessageError):
                raise a
            errs.append(a)
            continue
        try:
            oks[broker] = decode(a.content, kind, a.media_type)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            errs.append(
                BrokerUnavailableError(
                    f"broker {broker} sent a bad answer: {exc}", broker_name=broker
                )
            )
    return oks, errs


def plan_lookup(core: ProducerCore, addrs: dict[str, str], topic: str, msg_id: str) -> Plan:
    """Returns the merged ``MessageInfo`` of every copy, or None if no broker knows it."""
    check_id(topic, msg_id)
    body = encode(LookupRequest(topic, msg_id), core.content_type)
    answers = yield from _ask_all(core, master_addrs_of(addrs, topic), BROKER_LOOKUP, body, topic)
    oks, errs = _split(answers, LookupResponse)
    copies = [r for r in oks.values() if r.found and r.state is not None]
    partial(bool(copies), errs, f"lookup of {msg_id}")
    return merge_lookup(topic, msg_id, copies)


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
    reached: set[str] = set()
    masters = master_addrs_of(addrs, topic)
    answers = yield from _ask_all(core, masters, BROKER_CANCEL, body, topic, reached)
    oks, errs = _split(answers, CancelResponse)
    found = any(r.cancelled or r.reason != "not_found" for r in oks.values())
    partial(found, errs, f"cancel of {msg_id}")
    cancelled = any(_cancelled(r, b in reached) for b, r in oks.items())
    if not cancelled:
        log.info("cancel of %s: %s", msg_id, sorted({r.reason or "" for r in oks.values()}))
    return cancelled


def plan_reschedule(core: ProducerCore, addrs: dict[str, str], request: RescheduleRequest) -> Plan:
    """Returns the ``SendResult`` of the moved message (see the module doc)."""
    topic, msg_id = request.topic, request.msg_id
    body = encode(request, core.content_type)
    answers = yield from _ask_all(
        core, master_addrs_of(addrs, topic), BROKER_RESCHEDULE, body, topic
    )
    oks, errs = _split(answers, RescheduleResponse)
    moved = [r for r in oks.values() if r.rescheduled]
    partial(bool(moved) or any(r.state for r in oks.values()), errs, f"reschedule of {msg_id}")
    if moved:
        r = moved[0]
        return SendResult(
            msg_id, SendStatus.SEND_OK, r.broker_name, r.queue_id, r.deliver_at_ms, topic
        )
    raise not_rescheduled(topic, msg_id, (r.state for r in oks.values()))


def plan_cancel(core: ProducerCore, result: SendResult, addr: str) -> Plan:
    """Cancel on the broker that holds the message; retries transport failures there."""
    body = encode(
        CancelRequest(topic=result.topic, msg_id=result.msg_id, deliver_at_ms=result.deliver_at_ms),
        core.content_type,
    )
    broker = result.broker_name
    what = f"cancel of {result.msg_id}"
    reached: set[str] = set()
    resp = yield from _ask_one(core, broker, addr, BROKER_CANCEL, body, result.topic, what, reached)
    answer = decode(resp.content, CancelResponse, resp.media_type)
    if not answer.cancelled:
        log.info("cancel of %s on %s: %s", result.msg_id, broker, answer.reason)
    return _cancelled(answer, broker in reached)


def _cancelled(answer: CancelResponse, retried_after_reaching: bool) -> bool:
    """Whether a broker's answer means this call cancelled its copy. A retry after an
    attempt that may have reached the broker (it timed out, or lost its connection) finds
    the copy "already_cancelled" when that attempt did cancel it: the call did."""
    return answer.cancelled or (retried_after_reaching and answer.reason == "already_cancelled")


def plan_lookup_on(core: ProducerCore, topic: str, msg_id: str, broker: str, addr: str) -> Plan:
    """The state of ``broker``'s copy (``wire.STATE_*``), or None if it has none."""
    body = encode(LookupRequest(topic, msg_id), core.content_type)
    resp = yield from _ask_one(
        core, broker, addr, BROKER_LOOKUP, body, topic, f"lookup of {msg_id}"
    )
    answer = decode(resp.content, LookupResponse, resp.media_type)
    return answer.state if answer.found else None


def _ask_one(
    core: ProducerCore,
    broker: str,
    addr: str,
    path: str,
    body: bytes,
    topic: str,
    what: str,
    reached: set[str] | None = None,
) -> Plan:
    """POST ``body`` to one broker, retrying transport failures within ``send_timeout``;
    returns its 200 response or raises its error. ``reached`` gets ``broker`` when a failed
    attempt may have reached it (see ``_ask_all``)."""
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
            if reached is not None and is_ambiguous(res.exc):
                reached.add(broker)
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
