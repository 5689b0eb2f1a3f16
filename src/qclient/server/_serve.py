"""The HTTP/1.1 server under :mod:`._http`: an :class:`asyncio.Protocol` with the
``httptools`` parser (llhttp, in C).

It does only what the two servers need -- keep-alive, HTTP/1.0 and ``Connection: close``,
pipelined requests answered in order, chunked request bodies, a request size limit
answered before the body is read, header limits, an idle timeout, a graceful stop -- and
so costs a fraction of aiohttp's web stack per request (measured:
docs/decisions/0005-servers-http-layer-httptools.md).
Handlers run as tasks, one at a time per connection; a handler that waits (a long poll)
holds up only its own connection. A route with a direct handler
(:meth:`Application.add_direct`) is answered without a Request object, a task or the
middlewares when its connection has nothing else in flight: the handler is called as the
request is parsed and answers at once or through a callback. This module listens and
stops; :mod:`._connection` is one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from ._connection import KEEPALIVE_TIMEOUT_S, SHUTDOWN_GRACE_S, Connection
from ._http import Application

__all__ = ["serve", "start_server"]

log = logging.getLogger(__name__)


class ServerState:
    """The listening server's state: its app, loop and open connections."""

    def __init__(self, app: Application, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop
        self.connections: set[Connection] = set()
        self.in_flight = 0
        self.stopping = False

    def protocol(self) -> Connection:
        return Connection(self)

    async def sweep(self) -> None:
        """Close connections idle (or stalled mid-request) for longer than the timeout."""
        while True:
            await asyncio.sleep(KEEPALIVE_TIMEOUT_S / 5)
            now = time.monotonic()
            for conn in list(self.connections):
                if conn.idle_for(now) > KEEPALIVE_TIMEOUT_S:
                    conn.close()

    async def drain(self) -> None:
        """Stop: close idle connections, let requests in flight finish, then close all."""
        self.stopping = True
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while True:
            for conn in list(self.connections):
                if conn._task is None and not conn._pending:
                    conn.close()
            if not self.in_flight or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn._task is not None:
                conn._task.cancel()
        await asyncio.sleep(0)
        for conn in list(self.connections):
            conn.close()


async def start_server(
    app: Application, host: str, port: int, *, ssl_ctx: ssl.SSLContext | None = None
) -> tuple[asyncio.Server, ServerState]:
    """Listen (port 0: a free one) and serve ``app``; :func:`serve` wraps this."""
    loop = asyncio.get_running_loop()
    state = ServerState(app, loop)
    server = await loop.create_server(
        state.protocol, host, port, ssl=ssl_ctx, backlog=1024, reuse_address=True
    )
    return server, state


async def serve(
    app: Application,
    host: str,
    port: int,
    *,
    ssl_ctx: ssl.SSLContext | None = None,
    ready_file: str | None = None,
    on_ready: Callable[[str], Awaitable[None]] | None = None,
    exit_with_parent: int | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Announces the bound address (port 0 = a free one)."""
    contexts = [ctx(app) for ctx in app.cleanup_ctx]
    started: list[AsyncIterator[None]] = []
    try:
        for ctx in contexts:
            await anext(ctx)
            started.append(ctx)
        server, state = await start_server(app, host, port, ssl_ctx=ssl_ctx)
        bound_port = server.sockets[0].getsockname()[1] if server.sockets else port
        addr = f"{host}:{bound_port}"
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        sweeper = asyncio.create_task(state.sweep())
        if on_ready is not None:
            await on_ready(addr)
        if ready_file:
            tmp = Path(ready_file + ".tmp")
            tmp.write_text(addr)
            os.replace(tmp, ready_file)
        print(f"listening on {addr}", flush=True)
        watchdog = None
        if exit_with_parent:
            watchdog = asyncio.create_task(_watch_parent(exit_with_parent, stop))
        try:
            await stop.wait()
        finally:
            if watchdog:
                watchdog.cancel()
            sweeper.cancel()
            server.close()
            await state.drain()
    finally:
        for ctx in reversed(started):
            with contextlib.suppress(StopAsyncIteration):
                await anext(ctx)


async def _watch_parent(pid: int, stop: asyncio.Event) -> None:
    # Children of LocalCluster end with the process that started them, even on kill -9.
    while True:
        await asyncio.sleep(0.5)
        if os.getppid() != pid:
            log.warning("parent %d is gone, shutting down", pid)
            stop.set()
            return
