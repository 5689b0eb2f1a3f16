"""``Producer``: the blocking SDK entry point."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from .. import _tracing
from .._config import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_DETECT_INTERVAL,
    DEFAULT_DETECT_TIMEOUT,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_BUFFERED_MESSAGES,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_RETRY_TIMES,
    DEFAULT_ROUTE_REFRESH_INTERVAL,
    DEFAULT_SEND_LATENCY_FAULT_ENABLE,
    DEFAULT_SEND_TIMEOUT,
    DEFAULT_START_DETECTOR_ENABLE,
)
from .._models import Message, MessageBatch, MessageInfo, SendResult
from ..errors import BrokerUnavailableError, InvalidMessageError, QClientError
from ..fault.index import ThreadLocalIndex
from ..routing.publish_info import TopicPublishInfo
from . import lifecycle
from ._ambiguous import AmbiguousCopies, settle_budget
from ._background import Background
from ._base import ProducerBase, batch_outcome
from ._drivers import SyncSlots, run_sync, send_chunk_sync
from ._future import SendFuture
from ._plan import Item
from .coalescer import SyncCoalescer
from .sender import Sender

__all__ = ["Producer"]

log = logging.getLogger(__name__)


class Producer(ProducerBase):
    """Sends (delayed) messages; thread-safe; a context manager."""

    def __init__(
        self,
        namesrv: str | Sequence[str],
        *,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        retry_times: int = DEFAULT_RETRY_TIMES,
        send_latency_fault_enable: bool = DEFAULT_SEND_LATENCY_FAULT_ENABLE,
        start_detector_enable: bool = DEFAULT_START_DETECTOR_ENABLE,
        detect_interval: float = DEFAULT_DETECT_INTERVAL,
        detect_timeout: float = DEFAULT_DETECT_TIMEOUT,
        route_refresh_interval: float = DEFAULT_ROUTE_REFRESH_INTERVAL,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        linger_ms: float = DEFAULT_LINGER_MS,
        batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
        max_buffered_messages: int = DEFAULT_MAX_BUFFERED_MESSAGES,
        access_key: str | None = None,
        secret_key: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            namesrv,
            ThreadLocalIndex,
            dict(
                send_timeout=send_timeout,
                retry_times=retry_times,
                send_latency_fault_enable=send_latency_fault_enable,
                start_detector_enable=start_detector_enable,
                detect_interval=detect_interval,
                detect_timeout=detect_timeout,
                route_refresh_interval=route_refresh_interval,
                max_message_size=max_message_size,
                linger_ms=linger_ms,
                batch_max_messages=batch_max_messages,
                batch_max_bytes=batch_max_bytes,
                max_buffered_messages=max_buffered_messages,
                access_key=access_key,
                secret_key=secret_key,
                **options,
            ),
        )
        cfg = self._cfg
        self._http = self._core.engine.sync_transport(cfg, self._credentials)
        self._bg = Background(self._core, cfg)
        self._ns = self._bg.ns  # the same settings; closed by the background's close()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._sender: Sender | None = None
        self._slots = SyncSlots(cfg.max_in_flight_per_broker)
        #: concurrent single sends share requests (a lone one leaves at once, in its thread)
        self._coalescer = SyncCoalescer(self._core, self._send_chunk, cfg.max_in_flight_per_broker)
        self._watch_ambiguous()

    def _watch_ambiguous(self) -> None:
        """Cancel the copies that ambiguous attempts may have left (see _ambiguous)."""
        self._ambiguous = AmbiguousCopies(self._cancel_copy, self._lookup_copy)
        if self._core.engine.lifecycle:
            self._core.on_ambiguous = self._ambiguous.note

    # the copies' own calls: they go on while ``close`` settles them (it closes the
    # connections only after the copies' thread stopped)
    def _cancel_copy(self, result: SendResult) -> bool:
        return self._cancel_on(result)

    def _lookup_copy(self, topic: str, msg_id: str, broker: str) -> str | None:
        addr = self._addr_of(broker)
        plan = self._core.engine.plan_lookup_on(self._core, topic, msg_id, broker, addr)
        state: str | None = run_sync(plan, self._http)
        return state

    # --- fork safety ----------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        super()._after_fork_in_child()
        cfg = self._cfg
        self._lock = threading.Lock()
        self._pool = None  # its threads stayed in the parent
        self._sender = None  # so did the send_async thread and what it had buffered
        self._slots = SyncSlots(cfg.max_in_flight_per_broker)
        self._coalescer = SyncCoalescer(self._core, self._send_chunk, cfg.max_in_flight_per_broker)
        self._watch_ambiguous()  # its thread stayed in the parent

    def _forked(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            # the detector and route-refresh thread: a new one for this process
            self._bg = Background(self._core, self._cfg)
            self._ns = self._bg.ns
            super()._forked()
        log.debug("producer used in forked child %d: background thread restarted", self._pid)

    # --- routes --------------------------------------------------------------------

    def _info(self, topic: str) -> TopicPublishInfo:
        info = self._core.cached_route(topic)
        if info is None:
            # first send to this topic: the only time a send waits for a name server
            info = self._core.store_route(topic, self._ns.get_route(topic))
        return self._core.check_route(info)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self._cfg.max_concurrency, thread_name_prefix="qclient-batch"
                    )
        return self._pool

    def _send_chunk(
        self, items: list[Item], deadline: float, one_chunk: bool, on_write: Callable[[], None]
    ) -> Any:
        """The coalescer's sends: one chunk sent directly, or a plan that chooses again."""
        if one_chunk:
            core, http = self._core, self._http
            return send_chunk_sync(core, items, deadline, http, self._executor, on_write)
        plan = self._core.plan_send(items, deadline=deadline)
        return run_sync(plan, self._http, self._executor, on_write=on_write)

    def _send_one(
        self,
        topic: str,
        body: bytes | str,
        key: str | None,
        tags: str | None,
        properties: dict[str, str] | None,
        delay: Any,
        deliver_at: Any,
        msg_id: str | None,
    ) -> SendResult:
        self._check_open()
        core = self._core
        deadline = time.monotonic() + self._cfg.send_timeout
        wire = core.wire(topic, body, key, tags, properties, delay, deliver_at, msg_id)
        op = _tracing.start_send(wire)
        try:
            info = self._info(topic)
            queue = core.select(info, msg_id=msg_id)
            wire.queue_id = queue.queue_id
            result = self._coalescer.send(Item(0, wire, info, queue, msg_id is not None), deadline)
        except BaseException as exc:
            _tracing.end_send(op, exc)
            raise
        _tracing.end_send(op, result, core.routes.resolve)
        if isinstance(result, QClientError):
            raise result
        return result

    # --- the API -------------------------------------------------------------------

    def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        msg_id: str | None = None,
    ) -> SendResult:
        """Send for immediate delivery; returns once the broker made it durable."""
        return self._send_one(topic, body, key, tags, properties, None, None, msg_id)

    def send_delayed(
        self,
        topic: str,
        body: bytes | str,
        *,
        delay: float | timedelta | None = None,
        deliver_at: datetime | float | None = None,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        msg_id: str | None = None,
    ) -> SendResult:
        """Send for delivery after ``delay`` or at ``deliver_at`` (exactly one)."""
        if (delay is None) == (deliver_at is None):
            raise InvalidMessageError("send_delayed needs exactly one of delay and deliver_at")
        return self._send_one(topic, body, key, tags, properties, delay, deliver_at, msg_id)

    def send_batch(self, messages: Iterable[Message] | MessageBatch) -> list[SendResult]:
        """Send many messages (``Message`` objects, or the columns of a ``MessageBatch``):
        one request per target broker per chunk, chunks to different brokers
        concurrently; results in input order. If any message is not acknowledged, raises
        ``BatchSendError`` whose ``.results`` say which were."""
        self._check_open()
        wires, pinned = self._core.prepare(messages)
        if not wires:
            return []
        op = _tracing.start_batch(wires)
        try:
            infos: dict[str, TopicPublishInfo] = {}
            for w in wires:
                if w.topic not in infos:
                    infos[w.topic] = self._info(w.topic)
            items = [
                Item(i, w, infos[w.topic], None, p)
                for i, (w, p) in enumerate(zip(wires, pinned, strict=True))
            ]
            results = run_sync(self._core.plan_send(items), self._http, self._executor, self._slots)
        except BaseException as exc:
            _tracing.end_batch(op, exc)
            raise
        _tracing.end_batch(op, results, self._core.routes.resolve)
        return batch_outcome(results)

    def send_async(self, message: Message) -> Future[SendResult]:
        """Queue a message for the background sender; the future completes with its
        ``SendResult`` or exception. Blocks up to ``send_timeout`` while
        ``max_buffered_messages`` are buffered, then raises ``BufferFullError``."""
        self._check_open()
        wire = self._core.builder.message(message)
        op = _tracing.defer_send(wire)
        try:
            info = self._info(wire.topic)
            pinned = message.msg_id is not None
            queue = self._core.select(info, msg_id=wire.msg_id if pinned else None)
            sender = self._sender
            if sender is None:
                with self._lock:
                    self._check_open()
                    if self._sender is None:
                        self._sender = Sender(self._core, self._cfg, self._credentials)
                    sender = self._sender
            future: Future[SendResult] = SendFuture(sender.condition)
            wire.queue_id = queue.queue_id
            item = Item(0, wire, info, queue, pinned, trace=op)
            sender.accumulator.append(item, future, queue.broker_name, self._cfg.send_timeout)
        except BaseException as exc:
            _tracing.end_send(op, exc)
            raise
        return future

    def cancel(
        self,
        result: SendResult | None = None,
        *,
        topic: str | None = None,
        msg_id: str | None = None,
    ) -> bool:
        """Cancel a scheduled message (``result``, or ``topic`` + ``msg_id``) on every
        broker holding a copy; True if a copy was cancelled before it fired."""
        self._lifecycle("cancel")
        if result is not None and not result.topic:
            return self._cancel_on(result)
        topic, msg_id, hint = lifecycle.cancel_target(result, topic, msg_id)
        plan = self._core.engine.plan_cancel_id(self._core, self._addrs(topic), topic, msg_id, hint)
        return bool(run_sync(plan, self._http, self._executor))

    def lookup(self, topic: str, msg_id: str) -> MessageInfo | None:
        """The state and times of a message any producer sent; None if no broker knows it."""
        self._lifecycle("lookup")
        lifecycle.check_id(topic, msg_id)
        plan = self._core.engine.plan_lookup(self._core, self._addrs(topic), topic, msg_id)
        info: MessageInfo | None = run_sync(plan, self._http, self._executor)
        return info

    def reschedule(
        self,
        topic: str,
        msg_id: str,
        *,
        delay: float | timedelta | None = None,
        deliver_at: datetime | float | None = None,
    ) -> SendResult:
        """Move a scheduled message to a new time, atomically on each broker (it fires
        once, at the new time); ``MessageNotScheduledError`` if it is not scheduled."""
        self._lifecycle("reschedule")
        request = lifecycle.reschedule_request(self._core, topic, msg_id, delay, deliver_at)
        plan = self._core.engine.plan_reschedule(self._core, self._addrs(topic), request)
        result: SendResult = run_sync(plan, self._http, self._executor)
        return result

    def _addrs(self, topic: str) -> dict[str, str]:
        info = self._core.cached_route(topic)
        if info is None:
            info = self._core.store_route(topic, self._ns.get_route(topic))
        return self._core.id_addrs(info)

    def _addr_of(self, broker: str) -> str:
        addr = self._core.routes.last_addr(broker)
        if addr is None:
            raise BrokerUnavailableError(
                f"broker {broker} is in no known route", broker_name=broker
            )
        return addr

    def _cancel_on(self, result: SendResult) -> bool:
        addr = self._addr_of(result.broker_name)
        plan = self._core.engine.plan_cancel(self._core, result, addr)
        return bool(run_sync(plan, self._http))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every ``send_async`` so far has completed (``SendTimeoutError``
        if ``timeout`` passes first)."""
        sender = self._sender
        if sender is not None:
            self._not_from_callback("flush")
            sender.accumulator.flush(timeout)

    def settle(self, timeout: float | None = None) -> int:
        """Wait until the extra copies that ambiguous attempts may have left so far are
        cancelled (or found gone), or every one left is on a broker that stopped
        answering, for up to ``send_timeout`` (or ``timeout``). Returns how many are left.

        A process about to end without ``close`` (a Spark Python worker exits with
        ``os._exit``, skipping ``atexit``) calls this first: the clean-ups run on this
        producer's threads and end with the process."""
        limit = self._cfg.send_timeout if timeout is None else timeout
        return self._ambiguous.settle(max(0.0, limit))

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the background threads, close connections. Idempotent; every
        ``send_async`` future is completed (result or exception) when it returns. Extra
        copies that ambiguous attempts may have left are cancelled first, for up to
        ``send_timeout`` (or what is left of ``timeout``); one still pending then may
        fire twice (logged)."""
        if self._sender is not None:
            self._not_from_callback("close")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sender = self._sender
        start = time.monotonic()
        if sender is not None:
            sender.stop(timeout)
        self._ambiguous.settle(settle_budget(self._cfg.send_timeout, timeout, start))
        self._bg.close()
        self._ambiguous.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._http.close()

    @staticmethod
    def _not_from_callback(what: str) -> None:
        # callbacks run on the completion thread, which is what flush/close wait for
        if threading.current_thread().name.startswith("qclient-callback"):
            raise RuntimeError(f"{what}() cannot be called from a send_async callback")

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # best effort for producers never closed: stop the daemon threads
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self._bg.detector.stop(timeout=0)
