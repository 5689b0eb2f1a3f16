"""The producer's logic without I/O, shared by ``Producer``, ``AsyncProducer`` and the sender.

A send is a *plan* (its vocabulary is in ``_plan.py``): a generator that yields the
calls of one round (the engine's ``Call``s, answered with ``list[CallResult]`` in the same
order) or a pause (``Sleep``), and returns the per-message results. The plan does the
queue selection, the chunking per broker, the per-attempt timeouts, the fault-table
updates and the retry policy (tenacity); the drivers in ``_drivers.py`` only perform
the calls, blocking or with asyncio.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

import tenacity

from .._config import ProducerConfig
from .._models import Message, MessageBatch, SendResult
from .._validation import WireBuilder, to_wire
from ..engines import create_engine
from ..engines.base import Call
from ..errors import (
    BrokerUnavailableError,
    QClientError,
    SendTimeoutError,
)
from ..fault.latency import FaultItemSnapshot
from ..fault.strategy import MQFaultStrategy, id_order
from ..protocol.wire import ENCODINGS, TopicRoute, WireMessage
from ..routing.publish_info import MessageQueue, TopicPublishInfo, master_addrs
from ..routing.route_cache import RouteCache
from ..transport.errors import Outcome
from ._ambiguous import Unsettled
from ._plan import (
    MIN_ATTEMPT,
    PER_MESSAGE_OVERHEAD,
    CallResult,
    Item,
    Plan,
    Sleep,
    Step,
    queued_seconds,
)
from ._stats import Stats

__all__ = ["MIN_ATTEMPT", "ProducerCore", "carry_remaining_delay"]

log = logging.getLogger(__name__)


class _Round(Exception):
    """Some messages of a round must be retried (drives tenacity)."""


class _StopAtDeadline(tenacity.stop.stop_base):
    """Stop when the send's budget (``kwargs["deadline"]``) has no attempt left in it."""

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return time.monotonic() + MIN_ATTEMPT >= retry_state.kwargs["deadline"]


def _no_sleep(_seconds: float) -> None:  # the drivers sleep, not tenacity
    return None


def carry_remaining_delay(items: list[Item], first_attempt: float) -> None:
    """A retry asks for the delay less the time since the first attempt (monotonic), so a
    copy stored by a timed-out attempt and the acknowledged one share a deliver time to a
    few ms; the broker still turns it into a time by its own clock, so client clock skew
    does not matter."""
    spent = int((time.monotonic() - first_attempt) * 1000)
    for it in items:
        if it.first_delay_ms is None:
            if not it.wire.delay_ms:
                continue  # absolute or immediate: nothing to carry
            it.first_delay_ms = it.wire.delay_ms
        it.wire.delay_ms = max(0, it.first_delay_ms - spent)


class ProducerCore:
    """Routing, fault tolerance, retries and results of one producer (no I/O)."""

    def __init__(self, cfg: ProducerConfig, index_factory: Callable[[], Any]) -> None:
        self.cfg = cfg
        self.strategy = MQFaultStrategy(
            send_latency_fault_enable=cfg.send_latency_fault_enable,
            start_detector_enable=cfg.start_detector_enable,
            latency_max_ms=cfg.latency_max_ms,
            not_available_ms=cfg.not_available_ms,
            isolation_latency_ms=cfg.isolation_latency_ms,
            policy=cfg.fault_policy,
        )
        self.routes = RouteCache(cfg.route_refresh_interval, index_factory)
        self.stats = Stats()
        self.content_type = ENCODINGS[cfg.encoding]
        #: turns the plan's calls into requests on the engine's wire, and answers back
        self.engine = create_engine(cfg.engine, cfg.encoding)
        #: messages in one call: the caller's batch size, or less if the engine needs it
        self.max_chunk = min(cfg.batch_max_messages, self.engine.max_call_messages)
        # The retry policy: 1 + retry_times attempts inside one send_timeout budget,
        # jittered exponential pauses (a few ms: the next attempt goes to another broker).
        self.retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(cfg.times_total) | _StopAtDeadline(),
            wait=tenacity.wait_random_exponential(multiplier=0.005, max=0.1),
            retry=tenacity.retry_if_exception_type(_Round),
            reraise=True,
            sleep=_no_sleep,
        )
        self.on_route_failure: Callable[[str], None] | None = None
        #: told of a message that other brokers may hold too: acknowledged after ambiguous
        #: attempts on them, or (a caller-chosen id) by a broker after others in the id's
        #: order of brokers (``id_order``: they were down, or failed this send)
        self.on_ambiguous: Callable[[SendResult, tuple[str, ...], tuple[str, ...]], None] | None = (
            None
        )
        #: caller-chosen ids that failed after ambiguous attempts: a re-send inherits them
        self.unsettled = Unsettled()
        #: Message -> WireMessage with this config's limits (validation included)
        self.builder = WireBuilder(cfg)

    def after_fork_in_child(self) -> None:
        """Fresh locks and counters in a forked child (see ``ProducerBase``)."""
        self.stats = Stats()
        self.routes.after_fork_in_child()
        self.strategy.latency_fault_tolerance.after_fork_in_child()

    # --- messages --------------------------------------------------------------------

    def wire(
        self,
        topic: str,
        body: Any,
        key: str | None,
        tags: str | None,
        properties: dict[str, str] | None,
        delay: Any,
        deliver_at: Any,
        msg_id: str | None,
    ) -> WireMessage:
        return to_wire(self.cfg, topic, body, key, tags, properties, delay, deliver_at, msg_id)

    def prepare(
        self, messages: Iterable[Message] | MessageBatch
    ) -> tuple[list[WireMessage], list[bool]]:
        """Validate a batch (the first bad message fails the call, before any network):
        the wire messages, and for each whether the caller chose its id (``Item.pinned``)."""
        if isinstance(messages, MessageBatch):
            wires = self.builder.columns(messages)
            ids = messages.msg_ids
            return wires, [False] * len(wires) if ids is None else [i is not None for i in ids]
        msgs = messages if isinstance(messages, list) else list(messages)
        wires = self.builder.messages(msgs)  # every item is a Message once this returns
        return wires, [m.msg_id is not None for m in msgs]

    # --- routes ----------------------------------------------------------------------

    def cached_route(self, topic: str) -> TopicPublishInfo | None:
        info, _fresh = self.routes.get(topic)
        return info

    def store_route(self, topic: str, route: TopicRoute) -> TopicPublishInfo:
        return self.routes.put(topic, route)

    def id_addrs(self, info: TopicPublishInfo) -> dict[str, str]:
        """The brokers a call by id (cancel, lookup, reschedule) asks: each master of the
        topic's route, and each broker the route lost lately at its last address: a broker
        paused or restarting past the name server's expiry leaves the route while it still
        holds its copies, which would fire though cancelled."""
        addrs = master_addrs(info.route)
        for broker in info.lost:
            addr = self.routes.last_addr(broker)
            if broker not in addrs and addr is not None:
                addrs[broker] = addr
        return addrs

    @staticmethod
    def check_route(info: TopicPublishInfo) -> TopicPublishInfo:
        if not info.queues:
            raise BrokerUnavailableError(
                f"topic {info.topic!r} has no writable queue on any broker with a master"
            )
        return info

    # --- the fault table -------------------------------------------------------------

    def record(self, broker: str, latency_ms: float, outcome: Outcome) -> None:
        """Apply the fault policy to the attempt's outcome, and count the request."""
        self.strategy.record(broker, latency_ms, outcome)
        self.stats.request(broker, latency_ms, outcome in (Outcome.OK, Outcome.FINAL))

    def fault_items(self) -> list[FaultItemSnapshot]:
        return self.strategy.latency_fault_tolerance.snapshot()

    # --- the send plan ---------------------------------------------------------------

    def select(
        self,
        info: TopicPublishInfo,
        last_broker: str | None = None,
        reset_index: bool = False,
        msg_id: str | None = None,
    ) -> MessageQueue:
        """Round robin, or the id's own broker when ``msg_id`` (chosen by the caller)."""
        if msg_id is not None:
            return self.strategy.select_for_id(info, msg_id, last_broker)
        return self.strategy.select_one_message_queue(info, last_broker, reset_index)

    def plan_send(
        self, items: list[Item], *, deadline: float | None = None, one_chunk: bool = False
    ) -> Plan:
        """Send ``items``; returns results in input order (a ``QClientError`` per failure).

        ``one_chunk``: the items are one broker's batch within ``batch_max_bytes``, queues
        assigned (the accumulator's batches): the first round sends them as they are, in
        calls of at most ``max_chunk`` (what ``_calls`` would make of them, without
        choosing queues again).
        """
        if deadline is None:
            deadline = time.monotonic() + self.cfg.send_timeout
        # The first attempt runs without the retry machinery: most sends need no retry.
        first_attempt = time.monotonic()
        if one_chunk:
            m = self.max_chunk
            calls = [self.chunk_call(items[i : i + m], deadline) for i in range(0, len(items), m)]
        else:
            calls = self._calls(items, 1, deadline)
        outcomes: list[CallResult] = yield calls
        return (yield from self.plan_after(items, calls, outcomes, deadline, first_attempt))

    def chunk_call(self, items: list[Item], deadline: float) -> Call:
        """The first attempt's one call of ``items``: one chunk for one broker, queues
        assigned (``plan_send(one_chunk=True)``; a driver may perform it itself and hand
        the answer to ``plan_after``, which is the same send without a plan's first step)."""
        first = items[0].queue
        assert first is not None
        broker = first.broker_name
        addr = items[0].info.broker_addrs[broker]
        return self.engine.send_call(broker, addr, items, self.attempt_timeout(1, deadline))

    def plan_after(
        self,
        items: list[Item],
        calls: list[Call],
        outcomes: list[CallResult],
        deadline: float,
        first_attempt: float,
    ) -> Plan:
        """The rest of ``plan_send`` once its first round (``calls``) was answered
        (``outcomes``): the results, the retries, the counts."""
        results: list[SendResult | QClientError | None] = [None] * len(items)
        deadline += queued_seconds(outcomes)
        pending = self._absorb(calls, outcomes, results)
        attempts = 1
        if pending:
            pending, attempts = yield from self._retries(pending, deadline, results, first_attempt)
        for it in pending:  # a pending item's entry holds its last error, if any
            results[it.index] = results[it.index] or SendTimeoutError(
                f"message {it.wire.msg_id} not acknowledged within "
                f"send_timeout={self.cfg.send_timeout}s"
            )
        failed = len(results) - list(map(type, results)).count(SendResult)
        self.stats.done(len(results) - failed, failed)
        if failed and self.on_ambiguous is not None:
            self._remember_unsettled(items, results)
        if failed and log.isEnabledFor(logging.WARNING):
            first_error = next(r for r in results if isinstance(r, QClientError))
            log.warning(
                "%d of %d message(s) failed after %d attempt(s): %s",
                failed,
                len(results),
                attempts,
                first_error,
            )
        return results

    def _retries(
        self,
        pending: list[Item],
        deadline: float,
        results: list[SendResult | QClientError | None],
        first_attempt: float,
    ) -> Generator[Step, Any, tuple[list[Item], int]]:
        """Attempts 2.. of a send whose first attempt left ``pending`` unacknowledged, by
        the retry policy (tenacity); returns what is still pending and the attempts made."""
        retrying = self.retrying
        retrying.begin()  # tenacity's per-thread statistics; the state below is ours alone
        state = tenacity.RetryCallState(retrying, None, (), {"deadline": deadline})
        state.set_exception((_Round, _Round(), None))  # how the first attempt ended
        while True:
            try:
                do = retrying.iter(state)
            except _Round:
                break  # out of attempts or of time: pending keep their last error
            if isinstance(do, tenacity.DoAttempt):
                attempt = state.attempt_number
                self.stats.retry(len(pending))
                carry_remaining_delay(pending, first_attempt)
                calls = self._calls(pending, attempt, deadline)
                outcomes: list[CallResult] = yield calls
                queued = queued_seconds(outcomes)
                if queued > 0:
                    deadline += queued
                    state.kwargs["deadline"] = deadline
                pending = self._absorb(calls, outcomes, results)
                if pending:
                    state.set_exception((_Round, _Round(), None))
                else:
                    state.set_result(None)
            elif isinstance(do, tenacity.DoSleep):
                state.prepare_for_next_attempt()
                pause = min(float(do), deadline - time.monotonic() - MIN_ATTEMPT)
                if pause > 0:
                    yield Sleep(pause)
            else:
                break
        return pending, state.attempt_number

    def attempt_timeout(self, attempt: int, deadline: float) -> float:
        """This attempt's share of what is left of the budget: one hung broker cannot eat
        it all, and the last attempt gets whatever remains."""
        remaining = deadline - time.monotonic()
        left = self.cfg.times_total - attempt + 1
        share = remaining / left if left > 1 else remaining
        return max(share, MIN_ATTEMPT)

    def _calls(self, pending: list[Item], attempt: int, deadline: float) -> list[Call]:
        timeout = self.attempt_timeout(attempt, deadline)
        if attempt == 1:
            self._preselect(pending)
        groups: dict[str, list[Item]] = {}
        select = self.strategy.select_one_message_queue
        select_for_id = self.strategy.select_for_id
        # A caller-chosen id whose last attempt may have been stored is retried on that
        # queue (``Item.stay``), but for the send's last attempt: a copy on a second broker
        # can fire before the clean-up reaches it (a row due within a second), a retry
        # there cannot add one; the last attempt goes to the id's next broker, so a hung
        # broker still costs a send no more than its budget.
        stay = 1 < attempt < self.cfg.times_total
        for it in pending:
            q = it.queue
            if q is None or (attempt > 1 and not (stay and it.stay and it.pinned)):
                # a retry re-randomises the counter and avoids the broker that just failed
                if it.pinned:
                    q = select_for_id(it.info, it.wire.msg_id, it.last_broker)
                else:
                    q = select(it.info, it.last_broker, attempt > 1, it.failed)
                it.queue = q
            it.wire.queue_id = q.queue_id
            group = groups.get(q.broker_name)
            if group is None:
                groups[q.broker_name] = [it]
            else:
                group.append(it)
        calls = []
        max_n, max_bytes = self.max_chunk, self.cfg.batch_max_bytes
        for broker, group in groups.items():
            addr = group[0].info.broker_addrs[broker]
            chunk: list[Item] = []
            size = 0
            for it in group:
                s = len(it.wire.body) + len(it.wire.topic) + PER_MESSAGE_OVERHEAD  # it.size
                if chunk and (len(chunk) >= max_n or size + s > max_bytes):
                    calls.append(self._call(broker, addr, chunk, timeout))
                    chunk, size = [], 0
                chunk.append(it)
                size += s
            if chunk:
                calls.append(self._call(broker, addr, chunk, timeout))
        return calls

    def _preselect(self, pending: list[Item]) -> None:
        """First-attempt queues of the items without one, per topic in one step
        (``select_many`` / ``select_for_ids``: the same queues as one ``select`` per item)."""
        fresh = [it for it in pending if it.queue is None]
        if len(fresh) < 2:
            return
        # (info, pinned) -> items; pinned ones (caller-chosen ids) go by select_for_id
        groups: dict[tuple[int, bool], list[Item]] = {}
        for it in fresh:
            k = (id(it.info), it.pinned)
            group = groups.get(k)
            if group is None:
                groups[k] = [it]
            else:
                group.append(it)
        strategy = self.strategy
        for (_info, pinned), group in groups.items():
            info = group[0].info
            queues = (
                strategy.select_for_ids(info, [it.wire.msg_id for it in group])
                if pinned
                else strategy.select_many(info, len(group))
            )
            for it, q in zip(group, queues, strict=True):
                it.queue = q

    def _call(self, broker: str, addr: str, chunk: list[Item], timeout: float) -> Call:
        return self.engine.send_call(broker, addr, chunk, timeout)

    def _absorb(
        self,
        calls: list[Call],
        outcomes: list[CallResult],
        results: list[SendResult | QClientError | None],
    ) -> list[Item]:
        """Turn a round's answers (read by the engine) into results; returns the items to
        retry."""
        retry: list[Item] = []
        # a caller-chosen id goes elsewhere than its own broker only when one is unhealthy,
        # missing from the route, or failed this send: checked then, not on every ack
        off = not self.strategy.latency_fault_tolerance.all_healthy()
        read = self.engine.read_send
        for call, res in zip(calls, outcomes, strict=True):
            broker = call.broker
            items = call.items
            verdict = read(call, res)
            latency = res.latency_ms if verdict.latency_ms is None else verdict.latency_ms
            self.record(broker, latency, verdict.outcome)
            answers = verdict.answers
            ambiguous = verdict.ambiguous
            if answers is None:
                for it in items:
                    it.stay = bool(ambiguous)
                    if ambiguous:
                        it.ambiguous += (broker,)
                assert verdict.error is not None
                retryable = verdict.outcome is not Outcome.FINAL
                self._fail(items, verdict.error, broker, retryable, results, retry)
                continue
            for i, (it, r) in enumerate(zip(items, answers, strict=True)):
                if isinstance(r, SendResult):
                    results[it.index] = r
                    if it.pinned and self.unsettled:
                        it.ambiguous += self.unsettled.take(it.wire.topic, it.wire.msg_id)
                    if it.ambiguous or (it.pinned and (off or it.last_broker or it.info.lost)):
                        self._note_copies(r, it)
                    continue
                it.stay = isinstance(ambiguous, frozenset) and i in ambiguous
                if it.stay:
                    it.ambiguous += (broker,)
                results[it.index] = r  # the result, or the last error of a retried one
                if i in verdict.retry:
                    it.failed_on(broker)
                    retry.append(it)
        if retry and self.on_route_failure is not None:
            for topic in {it.wire.topic for it in retry}:
                self.on_route_failure(topic)
        return retry

    def _note_copies(self, sr: SendResult, it: Item) -> None:
        """Tell ``on_ambiguous`` of the other brokers that may hold ``sr``'s message."""
        if self.on_ambiguous is None:
            return
        above: tuple[str, ...] = ()
        if it.pinned:
            info = it.info
            order = id_order(sr.msg_id, info.by_broker.keys() | info.lost.keys())
            if sr.broker_name in order:
                above = tuple(order[: order.index(sr.broker_name)])
        if it.ambiguous or above:
            self.on_ambiguous(sr, it.ambiguous, above)

    def _remember_unsettled(
        self, items: list[Item], results: list[SendResult | QClientError | None]
    ) -> None:
        """Keep the ambiguous brokers of failed caller-chosen ids for their re-send."""
        now_ms = time.time() * 1000
        for it in items:
            if it.pinned and it.ambiguous and not isinstance(results[it.index], SendResult):
                w = it.wire
                # the first attempt's delay bounds when its copy fires (carry_remaining_delay)
                due_ms = (
                    w.deliver_at_ms - now_ms
                    if w.deliver_at_ms is not None
                    else it.first_delay_ms or w.delay_ms or 0
                )
                self.unsettled.remember(w.topic, w.msg_id, it.ambiguous, due_ms / 1000)

    @staticmethod
    def _fail(
        items: list[Item],
        err: QClientError,
        broker: str,
        retryable: bool,
        results: list[SendResult | QClientError | None],
        retry: list[Item],
    ) -> None:
        for it in items:
            results[it.index] = err  # a retried item's last error
            if retryable:
                it.failed_on(broker)
                retry.append(it)

    # --- cancel ----------------------------------------------------------------------
