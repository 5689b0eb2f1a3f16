"""Drivers of a send plan: perform its HTTP calls, blocking (threads) or with asyncio."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import httpx

from ..transport.http import AsyncHttp, SyncHttp
from ._core import CallResult, HttpCall, Plan, Sleep

__all__ = ["call_async", "call_sync", "run_async", "run_sync"]


def call_sync(http: SyncHttp, call: HttpCall) -> CallResult:
    start = time.perf_counter()
    try:
        resp = http.request("POST", call.addr, call.path, call.body, timeout=call.timeout)
    except Exception as exc:
        return CallResult(exc=exc, latency_ms=(time.perf_counter() - start) * 1000)
    return CallResult(response=resp, latency_ms=(time.perf_counter() - start) * 1000)


def run_sync(plan: Plan, http: SyncHttp, executor: Callable[[], Executor] | None = None) -> Any:
    """Run a plan to completion in this thread; a round's calls run concurrently on
    ``executor()`` when there are several (one per broker chunk)."""
    answer: Any = None
    try:
        while True:
            step = plan.send(answer)
            if isinstance(step, Sleep):
                time.sleep(step)
                answer = None
            elif len(step) == 1 or executor is None:
                answer = [call_sync(http, c) for c in step]
            else:
                answer = list(executor().map(lambda c: call_sync(http, c), step))
    except StopIteration as stop:
        return stop.value
    finally:
        plan.close()


async def call_async(http: AsyncHttp, call: HttpCall) -> CallResult:
    start = time.perf_counter()
    try:
        # a hard cap on the whole exchange, not only per phase as httpx's timeout is
        async with asyncio.timeout(call.timeout + 0.05):
            resp = await http.request("POST", call.addr, call.path, call.body,
                                      timeout=call.timeout)
    except TimeoutError:
        exc: Exception = httpx.TimeoutException(f"no answer within {call.timeout:.3f}s")
        return CallResult(exc=exc, latency_ms=(time.perf_counter() - start) * 1000)
    except Exception as e:
        return CallResult(exc=e, latency_ms=(time.perf_counter() - start) * 1000)
    return CallResult(response=resp, latency_ms=(time.perf_counter() - start) * 1000)


async def run_async(plan: Plan, http: AsyncHttp) -> Any:
    """Run a plan on the running event loop; a round's calls run concurrently."""
    answer: Any = None
    try:
        while True:
            step = plan.send(answer)
            if isinstance(step, Sleep):
                await asyncio.sleep(step)
                answer = None
            elif len(step) == 1:
                answer = [await call_async(http, step[0])]
            else:
                answer = list(await asyncio.gather(*(call_async(http, c) for c in step)))
    except StopIteration as stop:
        return stop.value
    finally:
        plan.close()
