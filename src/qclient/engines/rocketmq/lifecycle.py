"""Lookup, cancel by id and reschedule on Apache RocketMQ 5 (>= 5.3.2, brokers with
``recallMessageEnable=true``), as plans the producers' drivers run (``recall.py`` holds
the requests and how their answers read).

- **lookup**: every master is asked for the id on the real topic and on the timer topic
  (two index queries, one round); ``recall.classify`` reads them: fired, scheduled,
  recalled (= cancelled) or unknown, merged over the masters as on qclient's brokers.
- **cancel**: a lookup, then a recall of each scheduled copy's own slot (the broker's
  ``TIMER_OUT_MS``, so the tombstone lands where the message is: a recall naming another
  slot is answered SUCCESS and cancels nothing). True when a copy found scheduled was
  recalled. A message sent a moment ago may not be in the index yet (the broker builds it
  behind the store), so an id nobody knows is asked again a few times within the timeout
  (by lookup and cancel alike: an unknown id costs about 0.3 s).
- **reschedule** cannot be atomic on RocketMQ: a new copy with the same id is sent for the
  new time first, then the old slot is recalled. A failure in between leaves two copies
  (a consumer drops an id it returned recently), never none. If the old slot has begun
  firing, the new copy is recalled and ``MessageNotScheduledError`` (fired) is raised. A
  later time inside the old copy's slot cannot be had (both copies would share the slot,
  and its tombstone would drop both): ``UnsupportedByEngineError`` names the precision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cachetools import TTLCache

from ..._models import MessageState, SendResult, SendStatus
from ...errors import (
    AuthError,
    InvalidMessageError,
    MessageNotScheduledError,
    QClientError,
    UnsupportedByEngineError,
)
from ...producer._plan import MIN_ATTEMPT, Item, Plan, Sleep
from ...producer.lifecycle import (
    Copy,
    check_id,
    master_addrs_of,
    merge_lookup,
    not_rescheduled,
    partial,
)
from ...protocol import wire
from ...protocol.wire import RescheduleRequest, WireMessage
from ...transport.errors import Outcome
from . import message as msg
from .codes import RequestCode, ResponseCode, error_for
from .connection import RemotingError
from .outcomes import transport_error
from .pull import user_properties
from .recall import (
    TIMER_TOPIC,
    KeyLookup,
    KeyState,
    RecallOutcome,
    RecallRefusal,
    RecallResult,
    classify,
    lookup_requests,
    precision_from_config,
    read_query,
    read_recall,
    recall_handle,
    recall_request,
    timer_slot,
)
from .remoting import RemotingCommand, request
from .sending import PRODUCER_GROUP, single_request

if TYPE_CHECKING:
    from ...producer._core import ProducerCore

__all__ = ["RequestsCall", "RocketMQLifecycle"]

log = logging.getLogger(__name__)

ENGINE = "rocketmq"
#: the index is searched from the epoch: an id does not say when it was sent (a caller
#: may choose it), and a search covers only the index files whose times match
_BEGIN_MS = 0
#: ... up to a day ahead of this clock (the brokers' clocks may run ahead)
_END_AHEAD_MS = 86_400_000
#: rounds of asking again for an id no master knows (it may not be indexed yet)
_UNKNOWN_ROUNDS = 4
_UNKNOWN_PAUSE_S = 0.05
#: a producer's own recalls, remembered until the brokers' indexes surely show them
_RECALLED_KEYS = 65_536
_RECALLED_TTL_S = 600.0


@dataclass(slots=True, eq=False)
class RequestsCall:
    """Requests to one broker, made afresh for each attempt; its answer (from the
    engine's transports) is one ``RemotingCommand`` or ``RemotingError`` per request."""

    broker: str
    addr: str
    timeout: float
    make: Callable[[], list[RemotingCommand]]
    items: list[Item] = field(default_factory=list)
    first_answer_ms: float | None = None  # set by the transports, unused here

    def payload(self) -> list[RemotingCommand]:
        return self.make()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _ask(
    core: ProducerCore,
    addrs: dict[str, str],
    make: Callable[[str], list[RemotingCommand]],
    deadline: float,
) -> Plan:
    """``make(broker)``'s requests to every broker at once, retrying a broker whose
    requests did not all come back within ``deadline``; returns broker -> its answers, or
    the error of a broker that could not be asked."""
    pending = sorted(addrs)
    answers: dict[str, list[RemotingCommand] | QClientError] = {}
    for attempt in range(1, core.cfg.times_total + 1):
        if not pending or deadline - time.monotonic() < MIN_ATTEMPT:
            break
        if attempt > 1:
            yield Sleep(0.01 * attempt)
        timeout = core.attempt_timeout(attempt, deadline)
        calls = [RequestsCall(b, addrs[b], timeout, _bound(make, b)) for b in pending]
        outcomes = yield calls
        pending = []
        for call, res in zip(calls, outcomes, strict=True):
            b = call.broker
            got = res.response
            failed: BaseException | None = res.exc
            if failed is None and got is not None:
                failed = next((a for a in got if isinstance(a, RemotingError)), None)
            if failed is None and got is not None:
                core.record(b, res.latency_ms, Outcome.OK)
                answers[b] = list(got)
                continue
            err = transport_error(failed or RemotingError("no response"), b, timeout)
            core.record(b, res.latency_ms, Outcome.TRANSPORT)
            answers[b] = err
            pending.append(b)
    return answers


def _bound(
    make: Callable[[str], list[RemotingCommand]], broker: str
) -> Callable[[], list[RemotingCommand]]:
    """``make`` bound to ``broker``."""
    return lambda: make(broker)


def _copy(broker: str, kl: KeyLookup) -> Copy | None:
    """The ``Copy`` (state as ``wire.STATE_*``) of one broker's lookup; None if unknown."""
    if kl.state is KeyState.FIRED:
        fired = kl.fired_ms or 0
        deliver = kl.deliver_ms if kl.deliver_ms is not None else fired
        return Copy(broker, wire.STATE_FIRED, deliver, fired, kl.queue_id or 0)
    if kl.state is KeyState.UNKNOWN:
        return None
    state = wire.STATE_SCHEDULED if kl.state is KeyState.SCHEDULED else wire.STATE_CANCELLED
    return Copy(broker, state, kl.deliver_ms or 0, None, kl.queue_id or 0)


def _unsupported(feature: str, res: RecallResult) -> QClientError | None:
    """The typed error of a broker that cannot recall at all (recall off, too old)."""
    if res.reason is RecallRefusal.DISABLED:
        why = "the brokers run with recallMessageEnable=false"
    elif res.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
        why = "the brokers are older than RocketMQ 5.3.2 (no RECALL_MESSAGE)"
    else:
        return None
    return UnsupportedByEngineError(ENGINE, feature, why)


class RocketMQLifecycle:
    """The lifecycle plans of ``RocketMQEngine`` (one per producer: it keeps each
    broker's timer precision)."""

    def __init__(self) -> None:
        self._precision: dict[str, int] = {}
        # (broker, topic, id) -> the slots this producer recalled there: a broker indexes a
        # tombstone asynchronously (ReputMessageService), so a lookup straight after a recall
        # may not show it; this producer's own lookups, cancels and reschedules count these
        self._recalled: TTLCache[tuple[str, str, str], frozenset[int]] = TTLCache(
            _RECALLED_KEYS, _RECALLED_TTL_S
        )
        self._recalled_lock = threading.Lock()

    def _own_recalls(self, broker: str, topic: str, msg_id: str) -> frozenset[int]:
        with self._recalled_lock:
            return self._recalled.get((broker, topic, msg_id), frozenset())

    def _note_recalls(self, broker: str, topic: str, msg_id: str, slots: list[int]) -> None:
        if slots:
            with self._recalled_lock:
                key = (broker, topic, msg_id)
                self._recalled[key] = self._recalled.get(key, frozenset()) | set(slots)

    # --- lookup -------------------------------------------------------------------------

    def _lookups(
        self,
        core: ProducerCore,
        addrs: dict[str, str],
        topic: str,
        msg_id: str,
        deadline: float,
        again_if_unknown: bool,
    ) -> Plan:
        """broker -> its ``KeyLookup`` of the id, or the error that kept it from being
        asked; asked again a few times while no broker knows it, if ``again_if_unknown``."""

        def make(_broker: str) -> list[RemotingCommand]:
            return list(lookup_requests(topic, msg_id, _BEGIN_MS, _now_ms() + _END_AHEAD_MS))

        found: dict[str, KeyLookup | QClientError] = {}
        for rounds in range(_UNKNOWN_ROUNDS):
            if rounds:
                if deadline - time.monotonic() < MIN_ATTEMPT + _UNKNOWN_PAUSE_S:
                    break
                yield Sleep(_UNKNOWN_PAUSE_S * rounds)
            answers = yield from _ask(core, addrs, make, deadline)
            found = {}
            for broker, got in answers.items():
                if isinstance(got, QClientError):
                    found[broker] = got
                    continue
                try:
                    real = read_query(got[0], msg_id, broker=broker, topic=topic)
                    timer = read_query(got[1], msg_id, broker=broker, topic=TIMER_TOPIC)
                except QClientError as exc:
                    found[broker] = exc
                    continue
                mine = self._own_recalls(broker, topic, msg_id)
                found[broker] = classify(topic, msg_id, real, timer, mine)
            known = any(
                isinstance(v, KeyLookup) and v.state is not KeyState.UNKNOWN for v in found.values()
            )
            if known or not again_if_unknown:
                break
        return found

    def plan_lookup(
        self, core: ProducerCore, addrs: dict[str, str], topic: str, msg_id: str
    ) -> Plan:
        check_id(topic, msg_id)
        deadline = time.monotonic() + core.cfg.send_timeout
        # an id acknowledged a moment ago may not be indexed yet: unknown is asked again
        found = yield from self._lookups(
            core, master_addrs_of(addrs, topic), topic, msg_id, deadline, True
        )
        copies, errs = _split(found)
        partial(bool(copies), errs, f"lookup of {msg_id}")
        return merge_lookup(topic, msg_id, copies)

    def plan_lookup_on(
        self, core: ProducerCore, topic: str, msg_id: str, broker: str, addr: str
    ) -> Plan:
        deadline = time.monotonic() + core.cfg.send_timeout
        found = yield from self._lookups(core, {broker: addr}, topic, msg_id, deadline, False)
        got = found[broker]
        if isinstance(got, QClientError):
            raise got
        copy = _copy(broker, got)
        return copy.state if copy is not None else None

    # --- cancel -------------------------------------------------------------------------

    def _recall(
        self,
        core: ProducerCore,
        addrs: dict[str, str],
        topic: str,
        msg_id: str,
        slots: Mapping[str, Sequence[int]],
        deadline: float,
        feature: str,
    ) -> Plan:
        """Recall ``slots[broker]`` on each broker; returns broker -> [RecallResult] in
        slot order (an error for a broker that could not be asked)."""

        def make(broker: str) -> list[RemotingCommand]:
            return [
                recall_request(topic, recall_handle(topic, broker, s, msg_id), PRODUCER_GROUP)
                for s in slots[broker]
            ]

        targets = {b: addrs[b] for b in slots if slots[b]}
        answers = yield from _ask(core, targets, make, deadline)
        out: dict[str, list[RecallResult] | QClientError] = {}
        for broker, got in answers.items():
            if isinstance(got, QClientError):
                out[broker] = got
                continue
            results = [read_recall(a) for a in got]
            for r in results:
                unsupported = _unsupported(feature, r)
                if unsupported is not None:
                    raise unsupported
            # one answer per slot asked, in order
            recalled = zip(slots[broker], results, strict=True)
            done = [s for s, r in recalled if r.outcome is RecallOutcome.RECALLED]
            self._note_recalls(broker, topic, msg_id, done)
            out[broker] = results
        return out

    def plan_cancel_id(
        self,
        core: ProducerCore,
        addrs: dict[str, str],
        topic: str,
        msg_id: str,
        deliver_at_ms: int | None = None,
    ) -> Plan:
        check_id(topic, msg_id)
        addrs = master_addrs_of(addrs, topic)
        deadline = time.monotonic() + core.cfg.send_timeout
        found = yield from self._lookups(
            core, addrs, topic, msg_id, deadline, deliver_at_ms is not None
        )
        copies, errs = _split(found)
        slots = {b: v.live_slots for b, v in found.items() if isinstance(v, KeyLookup)}
        recalled = yield from self._recall(core, addrs, topic, msg_id, slots, deadline, "cancel")
        cancelled = False
        for broker, results in recalled.items():
            if isinstance(results, QClientError):
                errs.append(results)
                continue
            for r in results:
                if r.outcome is RecallOutcome.RECALLED:
                    cancelled = True
                elif r.outcome is RecallOutcome.REFUSED:
                    errs.append(error_for(r.code, r.remark, broker=broker, topic=topic))
        partial(cancelled or bool(copies), errs, f"cancel of {msg_id}")
        return cancelled

    def plan_cancel(self, core: ProducerCore, result: SendResult, addr: str) -> Plan:
        broker = result.broker_name
        cancelled = yield from self.plan_cancel_id(
            core, {broker: addr}, result.topic, result.msg_id, result.deliver_at_ms
        )
        return cancelled

    # --- reschedule ---------------------------------------------------------------------

    def _precision_of(self, core: ProducerCore, addrs: dict[str, str], deadline: float) -> Plan:
        """broker -> its ``timerPrecisionMs`` (asked once per producer)."""
        missing = {b: a for b, a in addrs.items() if b not in self._precision}
        if missing:
            answers = yield from _ask(
                core, missing, lambda _b: [request(RequestCode.GET_BROKER_CONFIG)], deadline
            )
            for broker, got in answers.items():
                if isinstance(got, QClientError):
                    raise got
                answer = got[0]
                if answer.code != ResponseCode.SUCCESS:
                    raise error_for(answer.code, answer.remark, broker=broker, topic="")
                self._precision[broker] = precision_from_config(answer.body)
        return {b: self._precision[b] for b in addrs}

    def plan_reschedule(
        self, core: ProducerCore, addrs: dict[str, str], request: RescheduleRequest
    ) -> Plan:
        req = request
        topic, msg_id = req.topic, req.msg_id
        addrs = master_addrs_of(addrs, topic)
        deadline = time.monotonic() + core.cfg.send_timeout
        found = yield from self._lookups(core, addrs, topic, msg_id, deadline, True)
        copies, errs = _split(found)
        live = {b: kl for b, kl in found.items() if isinstance(kl, KeyLookup) and kl.live_slots}
        partial(bool(live) or bool(copies), errs, f"reschedule of {msg_id}")
        if not live:
            raise not_rescheduled(topic, msg_id, (c.state for c in copies))
        precision = yield from self._precision_of(core, {b: addrs[b] for b in live}, deadline)
        now = _now_ms()
        new_ms = req.deliver_at_ms if req.deliver_at_ms is not None else now + (req.delay_ms or 0)
        moved: list[SendResult] = []
        for broker in sorted(live):
            kl = live[broker]
            res = yield from self._move(
                core, broker, addrs[broker], kl, new_ms, precision[broker], deadline
            )
            moved.append(res)
        return moved[0]

    def _move(
        self,
        core: ProducerCore,
        broker: str,
        addr: str,
        kl: KeyLookup,
        new_ms: int,
        precision: int,
        deadline: float,
    ) -> Plan:
        """Move one broker's scheduled copy: send the new one, then recall the old slots."""
        topic, msg_id = kl.topic, kl.uniq_key
        old_slots = kl.live_slots
        new_slot = timer_slot(new_ms, precision)
        if new_slot in old_slots:
            if new_ms > (kl.deliver_ms or 0):
                raise UnsupportedByEngineError(
                    ENGINE,
                    "reschedule to a later time within the message's timer slot",
                    f"the broker's timerPrecisionMs is {precision}: move it by at least that",
                )
            # an earlier time in the same slot: it fires with the slot, as scheduled
            at = kl.deliver_ms or new_ms
            return SendResult(msg_id, SendStatus.SEND_OK, broker, kl.queue_id or 0, at, topic)
        source = next(
            m
            for m in sorted(kl.scheduled, key=lambda m: -m.store_ms)
            if m.properties.get(msg.TIMER_OUT_MS) in {str(s) for s in old_slots}
        )
        props = source.properties
        queue = int(props.get(msg.REAL_QID, "0") or 0)
        w = WireMessage(
            topic=topic,
            queue_id=queue,
            msg_id=msg_id,
            body=source.body,
            key=props.get(msg.KEYS),
            tags=props.get(msg.TAGS),
            properties=user_properties(props) or None,
        )
        scheduled = new_ms > _now_ms()
        answers = yield from _ask(
            core,
            {broker: addr},
            lambda _b: [single_request(w, broker, new_ms if scheduled else None, _now_ms())],
            deadline,
        )
        got = answers[broker]
        if isinstance(got, QClientError):
            raise got
        if got[0].code != ResponseCode.SUCCESS:
            raise error_for(got[0].code, got[0].remark, broker=broker, topic=topic)
        addrs = {broker: addr}
        recalled = yield from self._recall(
            core, addrs, topic, msg_id, {broker: old_slots}, deadline, "reschedule"
        )
        results = recalled[broker]
        if isinstance(results, QClientError) or any(
            r.outcome is not RecallOutcome.RECALLED for r in results
        ):
            # the old copy fires (or may): take the new one back, never both
            undo = yield from self._recall(
                core, addrs, topic, msg_id, {broker: (new_slot,)}, deadline, "reschedule"
            )
            if not scheduled or isinstance(undo[broker], QClientError):
                log.warning("reschedule of %s: the old and the new copy may both fire", msg_id)
            if isinstance(results, QClientError):
                raise results
            refused = next(r for r in results if r.outcome is not RecallOutcome.RECALLED)
            if refused.outcome is RecallOutcome.REFUSED:
                raise error_for(refused.code, refused.remark, broker=broker, topic=topic)
            raise MessageNotScheduledError(
                f"message {msg_id} already fired: it cannot be rescheduled",
                state=MessageState.FIRED,
            )
        return SendResult(msg_id, SendStatus.SEND_OK, broker, queue, new_ms, topic)


def _split(
    found: dict[str, Any],
) -> tuple[list[Copy], list[QClientError]]:
    """The copies the brokers know of (in broker-name order) and the errors; a broker
    that answered with a refusal that will not change raises it."""
    copies: list[Copy] = []
    errs: list[QClientError] = []
    for broker in sorted(found):
        got = found[broker]
        if isinstance(got, QClientError):
            if isinstance(got, AuthError | InvalidMessageError):
                raise got
            errs.append(got)
            continue
        copy = _copy(broker, got)
        if copy is not None:
            copies.append(copy)
    return copies, errs
