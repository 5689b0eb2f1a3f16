"""Drivers of a send plan: perform its calls, blocking (threads) or with asyncio.

A transport is the engine's (``engines.base.SyncTransport`` / ``AsyncTransport``): it
performs one call of a round (an HTTP POST, or pipelined remoting requests) and returns
the engine's answer, which the plan reads through its engine.

``slots`` bound the requests in flight per broker (shared by every plan of a producer);
the wait for a slot is client-side queueing, so it is not charged to the attempt's
timeout (and the plan extends its deadline by it): a big batch queues at the client
instead of timing out on a busy broker and getting that healthy broker isolated.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from ..engines.base import AsyncTransport, Call, SyncTransport
from ._plan import CallResult, Item, Plan, Sleep

if TYPE_CHECKING:
    from ._core import ProducerCore

__all__ = [
    "AsyncSlots",
    "SyncSlots",
    "call_async",
    "call_sync",
    "run_async",
    "run_sync",
    "send_chunk_sync",
]


class SyncSlots:
    """Per-broker limit of concurrent requests, for threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._sems: dict[str, threading.Semaphore] = {}
        self._lock = threading.Lock()

    def get(self, broker: str) -> threading.Semaphore:
        sem = self._sems.get(broker)
        if sem is None:
            with self._lock:
                sem = self._sems.setdefault(broker, threading.Semaphore(self.limit))
        return sem


class AsyncSlots:
    """Per-broker limit of concurrent requests, for one event loop."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._sems: dict[str, asyncio.Semaphore] = {}

    def get(self, broker: str) -> asyncio.Semaphore:
        sem = self._sems.get(broker)
        if sem is None:
            sem = self._sems[broker] = asyncio.Semaphore(self.limit)
        return sem


def _call_sync(
    http: SyncTransport, call: Call, on_write: Callable[[], None] | None = None
) -> CallResult:
    start = time.perf_counter()
    try:
        resp = http.perform(call, on_write)
    except Exception as exc:
        return CallResult(exc=exc, latency_ms=(time.perf_counter() - start) * 1000)
    return CallResult(response=resp, latency_ms=(time.perf_counter() - start) * 1000)


def call_sync(
    http: SyncTransport,
    call: Call,
    slots: SyncSlots | None = None,
    on_write: Callable[[], None] | None = None,
) -> CallResult:
    if slots is None:
        return _call_sync(http, call, on_write)
    queued = time.perf_counter()
    with slots.get(call.broker):
        waited = time.perf_counter() - queued
        res = _call_sync(http, call, on_write)
    res.queued_s = waited
    return res


def run_sync(
    plan: Plan,
    http: SyncTransport,
    executor: Callable[[], Executor] | None = None,
    slots: SyncSlots | None = None,
    on_write: Callable[[], None] | None = None,
) -> Any:
    """Run a plan to completion in this thread; a round's calls run concurrently on
    ``executor()`` when there are several (one per broker chunk). ``on_write`` is called
    once a request is written (or before it may wait to connect)."""
    answer: Any = None
    try:
        while True:
            step = plan.send(answer)
            if isinstance(step, Sleep):
                time.sleep(step)
                answer = None
            elif len(step) == 1 or executor is None:
                answer = [call_sync(http, c, slots, on_write) for c in step]
            else:
                answer = list(executor().map(lambda c: call_sync(http, c, slots, on_write), step))
    except StopIteration as stop:
        return stop.value
    finally:
        plan.close()


def send_chunk_sync(
    core: ProducerCore,
    items: list[Item],
    deadline: float,
    http: SyncTransport,
    executor: Callable[[], Executor] | None = None,
    on_write: Callable[[], None] | None = None,
) -> Any:
    """``plan_send(items, deadline=deadline, one_chunk=True)``, its first call performed
    here rather than through the plan's first step: a lone message costs one call and one
    answer read, and a plan only for what its first attempt left (retries)."""
    if len(items) > core.max_chunk:
        plan = core.plan_send(items, deadline=deadline, one_chunk=True)
        return run_sync(plan, http, executor, on_write=on_write)
    first_attempt = time.monotonic()
    call = core.chunk_call(items, deadline)
    outcomes = [_call_sync(http, call, on_write)]
    plan = core.plan_after(items, [call], outcomes, deadline, first_attempt)
    return run_sync(plan, http, executor, on_write=on_write)


async def _call_async(http: AsyncTransport, call: Call) -> CallResult:
    start = time.perf_counter()
    try:
        # a hard cap on the whole exchange, not only per phase as httpx's timeout is
        async with asyncio.timeout(call.timeout + 0.05):
            resp = await http.perform(call)
    except TimeoutError:
        exc: Exception = TimeoutError(f"no answer within {call.timeout:.3f}s")
        return CallResult(exc=exc, latency_ms=(time.perf_counter() - start) * 1000)
    except Exception as e:
        return CallResult(exc=e, latency_ms=(time.perf_counter() - start) * 1000)
    return CallResult(response=resp, latency_ms=(time.perf_counter() - start) * 1000)


async def call_async(
    http: AsyncTransport, call: Call, slots: AsyncSlots | None = None
) -> CallResult:
    if slots is None:
        return await _call_async(http, call)
    queued = time.perf_counter()
    async with slots.get(call.broker):
        waited = time.perf_counter() - queued
        res = await _call_async(http, call)
    res.queued_s = waited
    return res


async def run_async(plan: Plan, http: AsyncTransport, slots: AsyncSlots | None = None) -> Any:
    """Run a plan on the running event loop; a round's calls run concurrently."""
    answer: Any = None
    try:
        while True:
            step = plan.send(answer)
            if isinstance(step, Sleep):
                await asyncio.sleep(step)
                answer = None
            elif len(step) == 1:
                answer = [await call_async(http, step[0], slots)]
            else:
                answer = list(await asyncio.gather(*(call_async(http, c, slots) for c in step)))
    except StopIteration as stop:
        return stop.value
    finally:
        plan.close()
