"""HTTP plumbing shared by the name server and the broker (aiohttp).

Every error leaves as ``{"error": {"code", "message"}}`` with a 4xx/5xx status and a
one-line message; unknown paths and methods too. Bodies are negotiated between JSON and
MessagePack by ``Content-Type`` (the response mirrors the request).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from ..protocol import wire
from ..protocol.wire import ErrorCode

log = logging.getLogger(__name__)

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """Raised by handlers; rendered as an error response."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_response(
    status: int, code: str, message: str, content_type: str = wire.JSON
) -> web.Response:
    body = wire.ErrorResponse(wire.ErrorBody(code=code, message=_one_line(message)))
    ct = wire.media_type(content_type)
    return web.Response(status=status, body=wire.encode(body, ct), content_type=ct)


def response_type(request: web.Request) -> str:
    return wire.media_type(request.content_type)


def reply(request: web.Request, obj: Any, status: int = 200) -> web.Response:
    ct = response_type(request)
    return web.Response(status=status, body=wire.encode(obj, ct), content_type=ct)


def text_reply(request: web.Request, body: bytes, content_type: str) -> web.Response:
    """A 200 with a body that is not a protocol message (``/metrics``' text format)."""
    return web.Response(body=body, headers={"Content-Type": content_type})


async def read_body(request: web.Request, typ: type[T]) -> T:
    """Read and schema-check a JSON or MessagePack body."""
    ct = request.content_type
    if ct not in wire.MEDIA_TYPES:
        raise ApiError(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type must be {' or '.join(wire.MEDIA_TYPES)}, got {ct!r}",
        )
    data = await request.read()
    if not data:
        raise ApiError(400, ErrorCode.INVALID_REQUEST, "empty request body")
    try:
        return wire.decode(data, typ, ct)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ApiError(400, ErrorCode.INVALID_REQUEST, f"malformed request body: {exc}") from None


_STATUS_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    ct = response_type(request)
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, exc.message, ct)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _STATUS_CODES.get(exc.status, ErrorCode.INVALID_REQUEST)
        message = exc.reason
        if exc.status == 404:
            message = f"no such endpoint: {request.method} {request.path}"
        elif exc.status == 405:
            message = f"method {request.method} not allowed on {request.path}"
        elif exc.status == 413:
            message = f"request body larger than {request.app['max_request_bytes']} bytes"
        return error_response(exc.status, code, message, ct)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug: say so in one line, keep serving
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(500, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}", ct)


def make_app(max_request_bytes: int, middlewares: list[Any] | None = None) -> web.Application:
    app = web.Application(
        client_max_size=max_request_bytes,
        middlewares=[error_middleware, *(middlewares or [])],
        handler_args={"max_field_size": 16 * 1024, "max_line_size": 16 * 1024},
    )
    app["max_request_bytes"] = max_request_bytes
    return app


def ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    ssl_ctx: ssl.SSLContext | None = None,
    ready_file: str | None = None,
    on_ready: Callable[[str], Awaitable[None]] | None = None,
    exit_with_parent: int | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Announces the bound address (port 0 = a free one)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_ctx, backlog=1024, reuse_address=True)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound_port = sockets[0].getsockname()[1] if sockets else port
    addr = f"{host}:{bound_port}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
        await runner.cleanup()


async def _watch_parent(pid: int, stop: asyncio.Event) -> None:
    # Children of LocalCluster end with the process that started them, even on kill -9.
    while True:
        await asyncio.sleep(0.5)
        if os.getppid() != pid:
            log.warning("parent %d is gone, shutting down", pid)
            stop.set()
            return
