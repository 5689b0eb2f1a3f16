"""``AsyncProducer``: the asyncio SDK entry point, on the lean asyncio transport.

Routing, fault tolerance and retries are the same ``ProducerCore`` plans that
``Producer`` runs; only the driver differs. The round-robin counter is per asyncio
task (``ContextIndex``), not per thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

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
from ..errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    ProducerClosedError,
    QClientError,
)
from ..fault.index import ContextIndex
from ..routing.publish_info import TopicPublishInfo
from . import lifecycle
from ._ambiguous import AmbiguousCopies, settle_budget
from ._background import Background
from ._base import ProducerBase, batch_outcome
from ._drivers import AsyncSlots, run_async
from ._plan import Item

__all__ = ["AsyncProducer"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class _Coalescer:
    """Group commit for concurrent sends: while a broker has ``limit`` requests in flight,
    further sends bound for it wait and then leave together in one request (up to the
    batch limits). A lone send goes at once; a ``gather`` of thousands becomes a few
    batched requests instead of thousands of small ones competing for the broker."""

    def __init__(self, producer: AsyncProducer, limit: int) -> None:
        self._p = producer
        self._limit = limit
        self._pending: dict[str, deque[tuple[Item, asyncio.Future[Any]]]] = {}
        self._in_flight: dict[str, int] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def send(self, item: Item) -> SendResult | QClientError:
        assert item.queue is not None
        broker = item.queue.broker_name
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pending = self._pending.get(broker)
        if pending is None:
            pending = self._pending[broker] = deque()
        pending.append((item, fut))
        self._kick(broker)
        result: SendResult | QClientError = await fut
        return result

    def _kick(self, broker: str) -> None:
        cfg = self._p._cfg
        pending = self._pending.get(broker)
        while pending and self._in_flight.get(broker, 0) < self._limit:
            batch: list[tuple[Item, asyncio.Future[Any]]] = []
            size = 0
            while pending and len(batch) < cfg.batch_max_messages:
                s = pending[0][0].size
                if batch and size + s > cfg.batch_max_bytes:
                    break
                batch.append(pending.popleft())
                size += s
            self._in_flight[broker] = self._in_flight.get(broker, 0) + 1
            task = asyncio.create_task(self._run(broker, batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run(self, broker: str, batch: list[tuple[Item, asyncio.Future[Any]]]) -> None:
        items = [it for it, _ in batch]
        for i, it in enumerate(items):
            it.index = i
        results: list[Any]
        try:
            # one broker, at most the batch limits, queues chosen: one chunk as it is
            results = await run_async(
                self._p._core.plan_send(items, one_chunk=True), self._p._http, self._p._slots
            )
        except asyncio.CancelledError:
            results = [ProducerClosedError("producer closed while sending")] * len(batch)
        except Exception as exc:  # a bug must still answer every caller
            log.exception("sending %d message(s) to %s failed", len(batch), broker)
            results = [exc] * len(batch)
        finally:
            self._in_flight[broker] -= 1
        for (_, fut), res in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(res)
        self._kick(broker)


class AsyncProducer(ProducerBase):
    """The asyncio producer; an async context manager. Same options as ``Producer``.

    Create it inside a running event loop and use it from that loop only.
    """

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
            ContextIndex,
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
        engine = self._core.engine
        self._http = engine.async_transport(cfg, self._credentials)
        self._ns = engine.async_name_server(cfg)
        # probes and route refreshes: the same background thread as Producer's
        self._bg = Background(self._core, cfg)
        self._route_locks: dict[str, asyncio.Lock] = {}
        self._coalescer = _Coalescer(self, cfg.max_in_flight_per_broker)
        self._slots = AsyncSlots(cfg.max_in_flight_per_broker)
        # copies ambiguous attempts may have left: cancelled from a thread, on this loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ambiguous = AmbiguousCopies(self._cancel_copy, self._lookup_copy)
        if self._core.engine.lifecycle:
            self._core.on_ambiguous = self._note_ambiguous

    def _note_ambiguous(
        self, result: SendResult, brokers: tuple[str, ...], away_from: tuple[str, ...]
    ) -> None:
        self._loop = asyncio.get_running_loop()  # called by a send, on the producer's loop
        self._ambiguous.note(result, brokers, away_from)

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the producer's loop from the copies' thread, and wait (also
        while ``close`` settles the copies: it closes the connections after)."""
        loop = self._loop
        if loop is None or self._ambiguous.closed:
            coro.close()
            raise ProducerClosedError("producer is closed")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(self._cfg.send_timeout + 1)

    def _cancel_copy(self, result: SendResult) -> bool:
        return self._on_loop(self._cancel_on(result))

    def _lookup_copy(self, topic: str, msg_id: str, broker: str) -> str | None:
        addr = self._addr_of(broker)
        plan = self._core.engine.plan_lookup_on(self._core, topic, msg_id, broker, addr)
        state: str | None = self._on_loop(run_async(plan, self._http))
        return state

    def _forked(self) -> None:
        # an event loop and its connections do not survive a fork: say how to do it right
        raise ProducerClosedError(
            f"this AsyncProducer was created in process {self._pid}, before os.fork(); "
            "create a new AsyncProducer in the child process (e.g. in a post-fork hook)"
        )

    async def _info(self, topic: str) -> TopicPublishInfo:
        info = self._core.cached_route(topic)
        if info is None:
            # one fetch per topic even when a gather of many sends starts cold
            lock = self._route_locks.setdefault(topic, asyncio.Lock())
            async with lock:
                info = self._core.cached_route(topic)
                if info is None:
                    info = self._core.store_route(topic, await self._ns.get_route(topic))
        return self._core.check_route(info)

    async def _send_one(
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
        wire = self._core.wire(topic, body, key, tags, properties, delay, deliver_at, msg_id)
        op = _tracing.start_send(wire)
        try:
            info = await self._info(topic)
            queue = self._core.select(info, msg_id=msg_id)
            wire.queue_id = queue.queue_id
            result = await self._coalescer.send(Item(0, wire, info, queue, msg_id is not None))
        except BaseException as exc:
            _tracing.end_send(op, exc)
            raise
        _tracing.end_send(op, result, self._core.routes.resolve)
        if isinstance(result, QClientError):
            raise result
        return result

    async def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        msg_id: str | None = None,
    ) -> SendResult:
        """Send for immediate delivery."""
        return await self._send_one(topic, body, key, tags, properties, None, None, msg_id)

    async def send_delayed(
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
        return await self._send_one(topic, body, key, tags, properties, delay, deliver_at, msg_id)

    async def send_batch(self, messages: Iterable[Message] | MessageBatch) -> list[SendResult]:
        """As ``Producer.send_batch``: results in input order, ``BatchSendError`` if any
        message is not acknowledged."""
        self._check_open()
        wires, pinned = self._core.prepare(messages)
        if not wires:
            return []
        op = _tracing.start_batch(wires)
        try:
            infos: dict[str, TopicPublishInfo] = {}
            for w in wires:
                if w.topic not in infos:
                    infos[w.topic] = await self._info(w.topic)
            items = [
                Item(i, w, infos[w.topic], pinned=p)
                for i, (w, p) in enumerate(zip(wires, pinned, strict=True))
            ]
            results = await run_async(self._core.plan_send(items), self._http, self._slots)
        except BaseException as exc:
            _tracing.end_batch(op, exc)
            raise
        _tracing.end_batch(op, results, self._core.routes.resolve)
        return batch_outcome(results)

    async def cancel(
        self,
        result: SendResult | None = None,
        *,
        topic: str | None = None,
        msg_id: str | None = None,
    ) -> bool:
        """As ``Producer.cancel``: by ``result`` or by ``topic`` + ``msg_id``."""
        self._lifecycle("cancel")
        if result is not None and not result.topic:
            return await self._cancel_on(result)
        topic, msg_id, hint = lifecycle.cancel_target(result, topic, msg_id)
        addrs = await self._addrs(topic)
        plan = self._core.engine.plan_cancel_id(self._core, addrs, topic, msg_id, hint)
        return bool(await run_async(plan, self._http))

    async def lookup(self, topic: str, msg_id: str) -> MessageInfo | None:
        """As ``Producer.lookup``."""
        self._lifecycle("lookup")
        lifecycle.check_id(topic, msg_id)
        plan = self._core.engine.plan_lookup(self._core, await self._addrs(topic), topic, msg_id)
        info: MessageInfo | None = await run_async(plan, self._http)
        return info

    async def reschedule(
        self,
        topic: str,
        msg_id: str,
        *,
        delay: float | timedelta | None = None,
        deliver_at: datetime | float | None = None,
    ) -> SendResult:
        """As ``Producer.reschedule``."""
        self._lifecycle("reschedule")
        request = lifecycle.reschedule_request(self._core, topic, msg_id, delay, deliver_at)
        plan = self._core.engine.plan_reschedule(self._core, await self._addrs(topic), request)
        result: SendResult = await run_async(plan, self._http)
        return result

    async def _addrs(self, topic: str) -> dict[str, str]:
        info = self._core.cached_route(topic)
        if info is None:
            info = self._core.store_route(topic, await self._ns.get_route(topic))
        return self._core.id_addrs(info)

    def _addr_of(self, broker: str) -> str:
        addr = self._core.routes.last_addr(broker)
        if addr is None:
            raise BrokerUnavailableError(
                f"broker {broker} is in no known route", broker_name=broker
            )
        return addr

    async def _cancel_on(self, result: SendResult) -> bool:
        addr = self._addr_of(result.broker_name)
        plan = self._core.engine.plan_cancel(self._core, result, addr)
        return bool(await run_async(plan, self._http))

    async def close(self, timeout: float | None = None) -> None:
        """Stop the background thread and close connections; idempotent. Sends in flight
        finish first, then extra copies that ambiguous attempts may have left are
        cancelled, for up to ``send_timeout`` (or what is left of ``timeout``)."""
        if self._closed:
            return
        self._closed = True
        start = time.monotonic()
        if self._coalescer.tasks:  # sends in flight finish (each within send_timeout)
            await asyncio.wait(list(self._coalescer.tasks), timeout=timeout)
        budget = settle_budget(self._cfg.send_timeout, timeout, start)
        await asyncio.to_thread(self._ambiguous.settle, budget)
        await asyncio.to_thread(self._bg.close)
        await asyncio.to_thread(self._ambiguous.close)
        await self._http.aclose()
        await self._ns.aclose()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
