"""Lookup, cancel by id and reschedule, the rules every engine shares: checking the
arguments, and merging what the brokers of a topic said about one id.

A retried send can leave a copy of a message on a broker whose attempt timed out after it
had stored the message, so each engine asks every broker of the topic's route and this
module merges the answers:

- ``lookup``: fired if any copy fired (the earliest firing), else scheduled if any copy
  still is (the earliest deliver time), else cancelled; ``MessageInfo.copies`` counts them.
- ``cancel``: True if this call cancelled at least one copy.
- ``reschedule``: every scheduled copy moves to the new time; none moved raises
  ``MessageNotScheduledError`` whose state is fired if any copy fired, else cancelled if
  any was, else None (unknown).

A broker that stays unreachable does not fail the call when another broker holds the id
(a warning names it); when no broker knows the id and one could not be asked, its error
is raised, since "unknown" cannot be claimed. The engines' plans (``engines/*/lifecycle``)
do the asking.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from .._delays import delay_to_ms, deliver_at_to_ms
from .._models import MessageInfo, MessageState, SendResult
from ..errors import BrokerUnavailableError, InvalidMessageError, MessageNotScheduledError
from ..protocol import wire
from ..protocol.wire import RescheduleRequest

if TYPE_CHECKING:
    from ..errors import QClientError
    from ._core import ProducerCore

__all__ = [
    "Copy",
    "cancel_target",
    "check_id",
    "master_addrs_of",
    "merge_lookup",
    "not_rescheduled",
    "partial",
    "reschedule_request",
]

log = logging.getLogger(__name__)


class Copy(NamedTuple):
    """One broker's copy of a message id (``state``: a ``wire.STATE_*``)."""

    broker_name: str
    state: str
    deliver_at_ms: int
    fired_at_ms: int | None = None
    queue_id: int = 0


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
    """The checked reschedule (exactly one of delay and deliver_at, within the engine's
    longest delay)."""
    check_id(topic, msg_id)
    if (delay is None) == (deliver_at is None):
        raise InvalidMessageError("give exactly one of delay and deliver_at")
    max_ms = core.cfg.max_delay_ms
    if delay is not None:
        return RescheduleRequest(topic, msg_id, delay_ms=delay_to_ms(delay, max_ms))
    return RescheduleRequest(topic, msg_id, deliver_at_ms=deliver_at_to_ms(deliver_at, max_ms))


def master_addrs_of(addrs: dict[str, str], topic: str) -> dict[str, str]:
    """``addrs`` (broker name -> master address), or BrokerUnavailableError when empty."""
    if not addrs:
        raise BrokerUnavailableError(f"topic {topic!r} has no broker with a master address")
    return addrs


def partial(found: bool, errs: list[QClientError], what: str) -> None:
    """Raise the first error when nothing was found and a broker could not be asked;
    otherwise warn about each broker that could not be."""
    if not errs:
        return
    if not found:
        raise errs[0]
    for e in errs:
        log.warning("%s: a broker could not be asked, a copy there is unknown: %s", what, e)


def merge_lookup(topic: str, msg_id: str, copies: Iterable[Any]) -> MessageInfo | None:
    """The ``MessageInfo`` of every broker's copy (``Copy``-like: ``broker_name``,
    ``state``, ``deliver_at_ms``, ``fired_at_ms``, ``queue_id``); None for no copy."""
    found = [c for c in copies if c.state]
    if not found:
        return None
    fired = [c for c in found if c.state == wire.STATE_FIRED]
    scheduled = [c for c in found if c.state == wire.STATE_SCHEDULED]
    if fired:
        pick = min(fired, key=lambda c: c.fired_at_ms or 0)
    elif scheduled:
        pick = min(scheduled, key=lambda c: c.deliver_at_ms)
    else:
        pick = found[0]
    return MessageInfo(
        msg_id=msg_id,
        topic=topic,
        broker_name=pick.broker_name,
        state=MessageState(pick.state),
        deliver_at_ms=pick.deliver_at_ms,
        fired_at_ms=pick.fired_at_ms if pick.state == wire.STATE_FIRED else None,
        queue_id=pick.queue_id,
        copies=len(found),
    )


def not_rescheduled(topic: str, msg_id: str, states: Iterable[str | None]) -> Exception:
    """The ``MessageNotScheduledError`` of a reschedule that moved no copy."""
    seen = set(states)
    if wire.STATE_FIRED in seen:
        return MessageNotScheduledError(
            f"message {msg_id} already fired: it cannot be rescheduled", state=MessageState.FIRED
        )
    if wire.STATE_CANCELLED in seen:
        return MessageNotScheduledError(
            f"message {msg_id} was cancelled: it cannot be rescheduled",
            state=MessageState.CANCELLED,
        )
    return MessageNotScheduledError(
        f"message {msg_id} of topic {topic!r} is unknown to every broker"
    )
