"""Straight-to-broker HTTP for the benchmarks: concurrent msgpack sends, the store stats."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

import httpx

from qclient.protocol import wire

__all__ = ["post_bodies", "store_stats"]


async def post_bodies(
    addr: str,
    bodies: Iterable[bytes],
    concurrency: int,
    deadline: float | None = None,
    timeout: float = 30.0,
) -> tuple[int, float]:
    """POST each msgpack ``SendRequest`` body to ``/v1/send`` once, over ``concurrency``
    connections, until all are sent or the ``time.monotonic()`` ``deadline`` passes.

    Returns (messages acknowledged SEND_OK, seconds the sending took).
    """
    pending = iter(bodies)  # shared: each body is taken by one worker
    acked = 0
    headers = {"content-type": wire.MSGPACK}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=f"http://{addr}", limits=limits, timeout=timeout, trust_env=False
    ) as client:

        async def worker() -> None:
            nonlocal acked
            for body in pending:
                if deadline is not None and time.monotonic() >= deadline:
                    return
                r = await client.post(wire.BROKER_SEND, content=body, headers=headers)
                r.raise_for_status()
                resp = wire.decode(r.content, wire.SendResponse, wire.MSGPACK)
                acked += sum(1 for x in resp.results if x.status == wire.SEND_OK)

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return acked, time.monotonic() - t0


def store_stats(addr: str) -> dict[str, Any]:
    """The ``store`` part of a broker's ``GET /v1/stats``."""
    r = httpx.get(f"http://{addr}{wire.BROKER_STATS}", timeout=30, trust_env=False)
    r.raise_for_status()
    store: dict[str, Any] = r.json()["store"]
    return store
