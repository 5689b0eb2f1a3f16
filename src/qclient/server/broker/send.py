"""The broker's send handlers: check a send request, store its messages, answer it.

The routed handler (:meth:`SendHandlers.send`) and the direct one
(:meth:`SendHandlers.send_direct`: no Request, task or middleware) share the checks
(``_take``), the store error mapping (``_store_failed``) and the answer (``_answer``), so
both answer alike.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from operator import attrgetter
from typing import Any

from ...protocol import wire
from ...protocol.deadline import expired, refuse_after_ms
from ...protocol.wire import ErrorCode
from .._http import (
    ApiError,
    Request,
    Response,
    decode_body,
    encoded_reply,
    error_answer,
    read_body,
    reply,
)
from ..metrics import RequestMetrics
from ..store import (
    DeadlineExceededError,
    DiskFullError,
    InvalidRecordError,
    StoreBusyError,
    StoreError,
    StoreResult,
    accept_clock_ms,
)
from .checks import MessageChecks
from .commit import LoopCommitter, Outcome
from .config import BrokerConfig
from .disk import DiskGuard
from .heartbeat import Heartbeat
from .topics import TopicRegistry

__all__ = ["SendHandlers"]

log = logging.getLogger(__name__)

_TOPIC = attrgetter("topic")
_QUEUE_ID = attrgetter("queue_id")
_DUPLICATE = attrgetter("duplicate")
_SYSTEM_PREFIXES = (wire.RETRY_TOPIC_PREFIX, wire.DLQ_TOPIC_PREFIX)


class _Send:
    """A checked send request: what to store and how to answer it."""

    __slots__ = ("deliver", "index", "refuse_after", "slots", "system", "to_store", "topics")

    def __init__(
        self,
        to_store: list[wire.WireMessage],
        deliver: list[int],
        topics: dict[str, None] | None,
        refuse_after: int | None,
        index: list[int] | None,
        slots: list[wire.MessageResult | None],
    ) -> None:
        self.to_store = to_store
        self.deliver = deliver  # the deliver time of each of to_store
        self.topics = topics  # the distinct topics of to_store, if known
        self.refuse_after = refuse_after
        self.index = index  # positions in the request of to_store; None: all of them
        self.slots = slots  # answers by position, when some messages are refused
        #: some topic is a group's retry or dead-letter topic (counted per group)
        self.system = False


class SendHandlers:
    """The send handlers of :class:`~qclient.server.broker.app.Broker` (its base class)."""

    config: BrokerConfig
    checks: MessageChecks
    disk: DiskGuard
    authorizer: Any
    committer: LoopCommitter
    request_metrics: RequestMetrics | None
    counters: dict[str, int]
    topics: TopicRegistry
    heartbeat: Heartbeat | None
    #: messages stored into ``%RETRY%<group>`` / ``%DLQ%<group>``, by group
    retries: Counter[str]
    dead_lettered: Counter[str]

    def ensure_topic(self, topic: str) -> wire.TopicConfig | None:
        """The topic's config; a topic that does not exist is created when the broker
        auto-creates topics, and a group's retry and dead-letter topics always (a
        consumer's retry must not depend on an administrator), unless read-only."""
        cfg = self.topics.get(topic)
        if (
            cfg is None
            and not self.config.read_only
            and (self.config.auto_create_topics or topic.startswith(_SYSTEM_PREFIXES))
        ):
            cfg, changed = self.topics.put(
                topic, self.config.default_queue_nums, wire.PERM_READ_WRITE, auto_created=True
            )
            if changed and self.heartbeat is not None:
                self.heartbeat.kick()
        return cfg

    async def send(self, request: Request) -> Response:
        send = self._take(await read_body(request, wire.SendRequest), request)
        stored: list[StoreResult] = []
        if send.to_store:
            try:
                # the last request of its loop iteration: nothing could join its group
                alone = not request.app.pending_handlers
                committer = self.committer
                now_stored = (
                    committer.store_now(send.to_store, send.topics, send.refuse_after, send.deliver)
                    if alone
                    else None
                )
                stored = (
                    now_stored
                    if now_stored is not None
                    else await committer.submit(
                        send.to_store, send.topics, send.refuse_after, send.deliver
                    )
                )
            except StoreError as exc:
                raise self._store_failed(exc) from None
        return reply(request, self._answer(send, stored))

    def send_direct(
        self, data: bytes, content_type: str, answer: Callable[[Response], None]
    ) -> Response | None:
        """:meth:`send` as the server's direct handler (no Request, task or middleware):
        the same answers, counters and request metrics. Only for a broker without an
        authorizer (its check needs the request)."""
        start = time.perf_counter()
        try:
            send = self._take(decode_body(data, content_type, wire.SendRequest), None)
            if send.to_store:
                self.committer.store_soon(
                    send.to_store,
                    send.topics,
                    send.refuse_after,
                    partial(self._direct_stored, send, content_type, start, answer),
                    send.deliver,
                )
                return None
            response = encoded_reply(wire.media_type(content_type), self._answer(send, []))
        except Exception as exc:
            response = error_answer(exc, "POST", wire.BROKER_SEND, wire.media_type(content_type))
        self._observe(response, start)
        return response

    def _direct_stored(
        self,
        send: _Send,
        content_type: str,
        start: float,
        answer: Callable[[Response], None],
        outcome: Outcome,
    ) -> None:
        answer_type = wire.media_type(content_type)
        try:
            if isinstance(outcome, BaseException):
                raise self._store_failed(outcome)
            response = encoded_reply(answer_type, self._answer(send, outcome))
        except Exception as exc:
            response = error_answer(exc, "POST", wire.BROKER_SEND, answer_type)
        self._observe(response, start)
        answer(response)

    def _observe(self, response: Response, start: float) -> None:
        if self.request_metrics is not None:
            self.request_metrics.observe(
                wire.BROKER_SEND, "POST", response.status, time.perf_counter() - start
            )

    def _take(self, body: wire.SendRequest, request: Request | None) -> _Send:
        """Check a send request and build what to store (raises ApiError); ``request``:
        for the authorizer (None only without one)."""
        msgs = body.messages
        count = len(msgs)
        if count == 0:
            raise ApiError(400, ErrorCode.INVALID_REQUEST, "messages is empty")
        if count > self.config.max_batch_messages:
            raise ApiError(
                413,
                ErrorCode.BATCH_TOO_LARGE,
                f"{count} messages in one request, the limit is {self.config.max_batch_messages}",
            )
        now = accept_clock_ms()
        deadline = body.deadline_ms
        if expired(deadline, now):
            self.counters["deadline_refusals"] += 1
            raise ApiError(
                504,
                ErrorCode.DEADLINE_EXCEEDED,
                f"the sender's deadline had passed {now - (deadline or now)} ms ago when the "
                f"request was read; nothing stored",
            )
        refuse_after = None if deadline is None else refuse_after_ms(deadline)
        if count == 1:  # the one-call path: the row checker itself is the cheaper check
            m = msgs[0]
            topic_names = {m.topic: None}
            max_queue = m.queue_id
            deliver = [self.checks.message(0, m, now)]
        else:
            topic_names = dict.fromkeys(map(_TOPIC, msgs))  # first-appearance order
            max_queue = max(map(_QUEUE_ID, msgs))
            found = self.checks.batch(msgs, now, topic_names, max_queue)
            if found is None:
                found = [self.checks.message(i, m, now) for i, m in enumerate(msgs)]
            deliver = found
        if self.authorizer is not None:
            assert request is not None, "a broker with an authorizer has no direct send"
            self.authorizer.check_topics(request, set(topic_names))
        if self.config.read_only:
            raise ApiError(403, ErrorCode.NOT_WRITABLE, f"broker {self.config.name} is read-only")
        self.disk.check()
        configs = {t: self.ensure_topic(t) for t in topic_names}
        slots: list[wire.MessageResult | None] = []  # by message, when some are refused
        index: list[int] | None = None  # positions in msgs of to_store; None: all of them
        if not (len(configs) == 1 and self._writable(next(iter(configs.values())), max_queue)):
            slots = [None] * count
            index = []
            for i, m in enumerate(msgs):
                cfg = configs[m.topic]
                if cfg is None:
                    slots[i] = wire.MessageResult(
                        m.msg_id,
                        ErrorCode.TOPIC_NOT_FOUND,
                        m.queue_id,
                        error=f"topic {m.topic!r} does not exist on broker {self.config.name}",
                    )
                    continue
                if not self._writable(cfg, m.queue_id):
                    slots[i] = wire.MessageResult(
                        m.msg_id,
                        ErrorCode.NOT_WRITABLE,
                        m.queue_id,
                        error=f"queue {m.queue_id} of topic {m.topic!r} is not writable on "
                        f"broker {self.config.name}",
                    )
                    continue
                index.append(i)
        # the wire messages themselves with their deliver times (no store message object
        # per message); validated: the message checks did (more strictly) what the
        # store's own input checks would do again; topics: those of to_store when it is
        # all of msgs (then the store need not collect them again)
        if index is None:
            send = _Send(msgs, deliver, topic_names, refuse_after, None, slots)
        else:
            to_store = [msgs[i] for i in index]
            send = _Send(to_store, [deliver[i] for i in index], None, refuse_after, index, slots)
        send.system = any(t.startswith(_SYSTEM_PREFIXES) for t in topic_names)
        return send

    def _store_failed(self, exc: BaseException) -> BaseException:
        """The HTTP error of a store error (other exceptions: themselves, a bug)."""
        if isinstance(exc, StoreBusyError):
            return ApiError(503, ErrorCode.BROKER_BUSY, f"broker busy: {exc}")
        if isinstance(exc, DeadlineExceededError):
            self.counters["deadline_refusals"] += 1
            return ApiError(504, ErrorCode.DEADLINE_EXCEEDED, f"{exc}; nothing stored")
        if isinstance(exc, DiskFullError):
            return ApiError(507, ErrorCode.DISK_FULL, f"disk full: {exc}")
        if isinstance(exc, InvalidRecordError):  # bad input, not a store failure
            return ApiError(400, ErrorCode.INVALID_MESSAGE, str(exc))
        if isinstance(exc, StoreError):
            log.error("store error: %s", exc)
            return ApiError(500, ErrorCode.STORE_ERROR, f"store error: {exc}")
        return exc

    def _answer(self, send: _Send, stored: list[StoreResult]) -> wire.SendResponse:
        """The answer of a send whose messages are stored (``stored``: their results)."""
        results: list[wire.MessageResult]
        if send.to_store:
            ok = wire.SEND_OK
            index = send.index
            if index is None:
                results = [
                    wire.MessageResult(r.msg_id, ok, r.queue_id, r.deliver_at_ms) for r in stored
                ]
            else:
                slots = send.slots
                for i, r in zip(index, stored, strict=True):
                    slots[i] = wire.MessageResult(r.msg_id, ok, r.queue_id, r.deliver_at_ms)
            duplicates = sum(map(_DUPLICATE, stored))
            if duplicates:
                self.counters["duplicates"] += duplicates
            if len(stored) > duplicates:
                self.counters["stored"] += len(stored) - duplicates
            if send.system:
                self._count_system(send.to_store, stored)
        self.counters["send_requests"] += 1
        if send.index is not None:
            results = [r for r in send.slots if r is not None]
        return wire.SendResponse(self.config.name, results)

    def _count_system(self, msgs: list[wire.WireMessage], stored: list[StoreResult]) -> None:
        """Count the retries and dead-lettered messages stored (not duplicates) by group."""
        for m, r in zip(msgs, stored, strict=True):
            if r.duplicate:
                continue
            if m.topic.startswith(wire.RETRY_TOPIC_PREFIX):
                self.retries[m.topic[len(wire.RETRY_TOPIC_PREFIX) :]] += 1
            elif m.topic.startswith(wire.DLQ_TOPIC_PREFIX):
                self.dead_lettered[m.topic[len(wire.DLQ_TOPIC_PREFIX) :]] += 1

    @staticmethod
    def _writable(cfg: wire.TopicConfig | None, queue_id: int) -> bool:
        return (
            cfg is not None and bool(cfg.perm & wire.PERM_WRITE) and queue_id < cfg.write_queue_nums
        )
