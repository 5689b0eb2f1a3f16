"""HTTP plumbing shared by the name server and the broker: a lean HTTP/1.1 server.

An :class:`asyncio.Protocol` with the ``httptools`` parser (llhttp, in C) and a small
aiohttp-like surface: ``async def handler(request) -> Response``, middlewares
``async def mw(request, handler)``, routes with ``{name}`` path parameters. It does only
what the two servers need -- keep-alive, HTTP/1.0 and ``Connection: close``, pipelined
requests answered in order, chunked request bodies, a request size limit -- and so costs
a fraction of aiohttp's web stack per request (measured: docs/DECISIONS.md).

Every error leaves as ``{"error": {"code", "message"}}`` with a 4xx/5xx status and a
one-line message; unknown paths and methods too. Bodies are negotiated between JSON and
MessagePack by ``Content-Type`` (the response mirrors the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote

import httptools
import msgspec
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

from ..protocol import wire
from ..protocol.wire import ErrorCode

__all__ = [
    "ApiError",
    "Application",
    "Handler",
    "Middleware",
    "Request",
    "Response",
    "error_middleware",
    "error_response",
    "make_app",
    "read_body",
    "reply",
    "response_type",
    "serve",
    "ssl_context",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the longest request line and the longest header block (name, value, all of them)
MAX_LINE_BYTES = 16 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 128
#: idle keep-alive connections (and stalled half-sent requests) are closed after this
KEEPALIVE_TIMEOUT_S = 75.0
#: pipelined requests parsed ahead of the one being answered before reading pauses
MAX_PIPELINED = 16
#: on stop, requests in flight get this long to finish before they are cancelled
SHUTDOWN_GRACE_S = 5.0
#: after an early 413, what the client still sends is read and dropped this long (so the
#: answer is not lost to a reset) before the connection is closed
LINGER_S = 5.0
DEFAULT_CONTENT_TYPE = "application/octet-stream"


class ApiError(Exception):
    """Raised by handlers; rendered as an error response."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# --- request / response ---------------------------------------------------------------


class Request(MutableMapping[str, Any]):
    """One parsed request; also a per-request dict (``request["k"]``) for middlewares."""

    __slots__ = (
        "_body",
        "_query",
        "_state",
        "app",
        "headers",
        "match_info",
        "method",
        "path",
        "query_string",
        "raw_path",
        "remote",
        "version",
    )

    def __init__(
        self,
        method: str,
        raw_path: str,
        query_string: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        app: Application,
        *,
        version: str = "1.1",
        remote: str | None = None,
    ) -> None:
        self.method = method
        self.raw_path = raw_path
        self.path = unquote(raw_path) if "%" in raw_path else raw_path
        self.query_string = query_string
        self.headers = headers
        self.version = version
        self.remote = remote
        self.app = app
        self.match_info: dict[str, str] = {}
        self._body = body
        self._state: dict[str, Any] = {}
        self._query: MultiDictProxy[str] | None = None

    @property
    def content_type(self) -> str:
        """The media type of ``Content-Type`` (lower case, no parameters)."""
        value = self.headers.get("Content-Type")
        if not value:
            return DEFAULT_CONTENT_TYPE
        return value.partition(";")[0].strip().lower()

    @property
    def content_length(self) -> int:
        return len(self._body)

    @property
    def query(self) -> MultiDictProxy[str]:
        if self._query is None:
            self._query = MultiDictProxy(
                MultiDict(parse_qsl(self.query_string, keep_blank_values=True))
            )
        return self._query

    async def read(self) -> bytes:
        """The whole body (already received and bounded by the app's size limit)."""
        return self._body

    def __getitem__(self, key: str) -> Any:
        return self._state[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._state[key] = value

    def __delitem__(self, key: str) -> None:
        del self._state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.path}>"

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


class Response:
    """A complete response: status, body and content type (plus optional headers)."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"",
        text: str | None = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if text is not None:
            body = text.encode()
            content_type = content_type or "text/plain; charset=utf-8"
        self.status = status
        self.body = body
        self.content_type = content_type or DEFAULT_CONTENT_TYPE
        self.headers = headers

    def __repr__(self) -> str:
        return f"<Response {self.status} {len(self.body)} bytes>"


Handler = Callable[[Request], Awaitable[Response]]
Middleware = Callable[[Request, Handler], Awaitable[Response]]


# --- application and routing ----------------------------------------------------------


class Router:
    """Static paths by dict lookup; ``/a/{name}`` paths by segment (one segment each)."""

    def __init__(self, app: Application) -> None:
        self._app = app
        self._static: dict[str, dict[str, Handler]] = {}
        self._dynamic: list[tuple[tuple[str | None, ...], tuple[str, ...], dict[str, Handler]]] = []

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        wrapped = self._app._wrap(handler)
        if "{" not in path:
            self._static.setdefault(path, {})[method] = wrapped
            return
        parts: list[str | None] = []
        names: list[str] = []
        for seg in path.split("/"):
            if seg.startswith("{") and seg.endswith("}"):
                parts.append(None)
                names.append(seg[1:-1])
            else:
                parts.append(seg)
        key = tuple(parts)
        for p, _n, methods in self._dynamic:
            if p == key:
                methods[method] = wrapped
                return
        self._dynamic.append((key, tuple(names), {method: wrapped}))

    def add_get(self, path: str, handler: Handler) -> None:
        """GET (and HEAD: the same answer without its body)."""
        self.add_route("GET", path, handler)
        self.add_route("HEAD", path, handler)

    def add_post(self, path: str, handler: Handler) -> None:
        self.add_route("POST", path, handler)

    def resolve(self, request: Request) -> Handler:
        """The (middleware-wrapped) handler of ``request``; fills ``match_info``."""
        methods = self._static.get(request.path)
        if methods is None:
            segs = request.raw_path.split("/")
            for parts, names, candidate in self._dynamic:
                if len(parts) != len(segs):
                    continue
                values: list[str] = []
                for want, seg in zip(parts, segs, strict=True):
                    if want is None:
                        if not seg:
                            break
                        values.append(unquote(seg))
                    elif unquote(want) != unquote(seg):
                        break
                else:
                    request.match_info = dict(zip(names, values, strict=True))
                    methods = candidate
                    break
        if methods is None:
            return self._app._not_found
        handler = methods.get(request.method)
        return self._app._not_allowed if handler is None else handler


class Application(MutableMapping[str, Any]):
    """Routes, middlewares, shared state (``app["k"]``) and startup/cleanup hooks."""

    def __init__(
        self, *, max_request_bytes: int, middlewares: list[Middleware] | None = None
    ) -> None:
        self.max_request_bytes = max_request_bytes
        self.middlewares: tuple[Middleware, ...] = tuple(middlewares or ())
        self.router = Router(self)
        #: ``async def ctx(app)`` generators: code before ``yield`` runs at startup,
        #: after it at cleanup (in reverse order)
        self.cleanup_ctx: list[Callable[[Application], AsyncIterator[None]]] = []
        self._state: dict[str, Any] = {}
        self._not_found = self._wrap(_not_found)
        self._not_allowed = self._wrap(_not_allowed)

    def _wrap(self, handler: Handler) -> Handler:
        for mw in reversed(self.middlewares):
            handler = _bind(mw, handler)
        return handler

    def __getitem__(self, key: str) -> Any:
        return self._state[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._state[key] = value

    def __delitem__(self, key: str) -> None:
        del self._state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def __repr__(self) -> str:
        return f"<Application {len(self.router._static)} static path(s)>"

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


def _bind(mw: Middleware, handler: Handler) -> Handler:
    async def bound(request: Request) -> Response:
        return await mw(request, handler)

    return bound


async def _not_found(request: Request) -> Response:
    raise ApiError(404, ErrorCode.NOT_FOUND, f"no such endpoint: {request.method} {request.path}")


async def _not_allowed(request: Request) -> Response:
    raise ApiError(
        405, ErrorCode.METHOD_NOT_ALLOWED, f"method {request.method} not allowed on {request.path}"
    )


# --- errors and bodies ----------------------------------------------------------------


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_response(status: int, code: str, message: str, content_type: str = wire.JSON) -> Response:
    body = wire.ErrorResponse(wire.ErrorBody(code=code, message=_one_line(message)))
    ct = wire.media_type(content_type)
    return Response(status=status, body=wire.encode(body, ct), content_type=ct)


def response_type(request: Request) -> str:
    return wire.media_type(request.content_type)


def reply(request: Request, obj: Any, status: int = 200) -> Response:
    ct = response_type(request)
    return Response(status=status, body=wire.encode(obj, ct), content_type=ct)


def text_reply(request: Request, body: bytes, content_type: str) -> Response:
    """A 200 with a body that is not a protocol message (``/metrics``' text format)."""
    return Response(body=body, content_type=content_type)


async def read_body(request: Request, typ: type[T]) -> T:
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


async def error_middleware(request: Request, handler: Handler) -> Response:
    """Every exception of a handler becomes a one-line error response (a bug: 500)."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, exc.message, response_type(request))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug: say so in one line, keep serving
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(
            500, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}", response_type(request)
        )


def make_app(max_request_bytes: int, middlewares: list[Any] | None = None) -> Application:
    app = Application(
        max_request_bytes=max_request_bytes, middlewares=[error_middleware, *(middlewares or [])]
    )
    app["max_request_bytes"] = max_request_bytes
    return app


def ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


# --- the wire -------------------------------------------------------------------------

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_date_cache: list[Any] = [0, b""]


def _date_header() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
    return bytes(_date_cache[1])


def _render(resp: Response, keep_alive: bool, head: bool) -> bytes:
    status = resp.status
    body = resp.body
    parts = [
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
        % (status, _REASONS.get(status, b"Unknown"), resp.content_type.encode(), len(body)),
        _date_header(),
    ]
    if resp.headers:
        for k, v in resp.headers.items():
            parts.append(f"{k}: {v}\r\n".encode("latin-1"))
    if not keep_alive:
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    if not head:
        parts.append(body)
    return b"".join(parts)


class _HttpError(Exception):
    """A request the server answers itself (bad framing, too large) before any handler."""

    def __init__(self, status: int, code: str, message: str, content_type: str) -> None:
        super().__init__(message)
        self.response = error_response(status, code, message, content_type)


class _Connection(asyncio.Protocol):
    """One client connection: parse, answer requests one at a time, in order."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._app = server.app
        self._loop = server.loop
        self._max_body = server.app.max_request_bytes
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._remote: str | None = None
        #: parsed requests waiting for the one in flight; a Response: an error to send
        #: (in its turn) before closing
        self._pending: deque[tuple[Request, bool] | Response] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._write_paused = False
        self._read_paused = False
        self._linger: asyncio.TimerHandle | None = None
        self.last_active = time.monotonic()
        self._seq = 0
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._head_done = False
        self._body: list[bytes] = []
        self._body_size = 0
        self._oversized = False

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # (uvloop's is no subclass)
        peer = transport.get_extra_info("peername")
        self._remote = peer[0] if isinstance(peer, tuple) else None
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._closing = True
        self._pending.clear()
        if self._linger is not None:
            self._linger.cancel()
        # A handler in flight finishes (its effects stay); its answer has nowhere to go.

    def eof_received(self) -> bool | None:
        # Requests already parsed are still answered; then the connection closes.
        if self._task is None and not self._pending:
            return None  # close now
        self._closing = True
        return True

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._next()

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:
            return  # an early error was sent: drop the rest of that request
        self.last_active = time.monotonic()
        seq = self._seq
        try:
            self._parser.feed_data(data)
            if not self._head_done and self._seq == seq and self._url:
                # a head still incomplete after more data: bound what the parser buffers
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES + MAX_LINE_BYTES:
                    raise self._error(400, "request head larger than the limit")
        except _HttpError as exc:
            self._fail(exc.response)
        except httptools.HttpParserUpgrade:
            self._fail(self._error(400, "protocol upgrades are not supported").response)
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _HttpError):
                self._fail(cause.response)
            else:
                self._fail(self._error(400, f"malformed HTTP request: {exc}").response)

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        self._reset()
        self._seq += 1

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE_BYTES:
            raise self._error(400, f"request line longer than {MAX_LINE_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self._headers
        if len(headers) >= MAX_HEADERS:
            raise self._error(400, f"more than {MAX_HEADERS} header fields")
        if len(name) + len(value) > MAX_LINE_BYTES:
            raise self._error(400, f"a header field longer than {MAX_LINE_BYTES} bytes")
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise self._error(400, f"request headers larger than {MAX_HEAD_BYTES} bytes")
        headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._head_done = True
        length = -1
        expect = False
        for name, value in self._headers:
            lname = name.lower()
            if lname == "content-length":
                with contextlib.suppress(ValueError):
                    length = int(value)
            elif lname == "expect" and value.lower() == "100-continue":
                expect = True
        if length > self._max_body:
            self._oversized = True
            raise self._too_large()
        if expect and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self._body_size += len(chunk)
        if self._body_size > self._max_body:
            self._oversized = True
            raise self._too_large()
        self._body.append(chunk)

    def on_message_complete(self) -> None:
        parser = self._parser
        url = self._url
        if url[:1] == b"/":
            raw_path, _, query = url.partition(b"?")
        else:  # absolute form (or "*")
            try:
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                raise self._error(400, "malformed request target") from None
            raw_path, query = parsed.path or b"/", parsed.query or b""
        body = self._body
        request = Request(
            parser.get_method().decode("latin-1"),
            raw_path.decode("latin-1"),
            query.decode("latin-1"),
            CIMultiDictProxy(CIMultiDict(self._headers)),
            body[0] if len(body) == 1 else b"".join(body),
            self._app,
            version=parser.get_http_version(),
            remote=self._remote,
        )
        keep_alive = parser.should_keep_alive()
        self._reset()
        if self._task is None and not self._pending and not self._write_paused:
            self._start(request, keep_alive)
        else:
            self._pending.append((request, keep_alive))
            if len(self._pending) >= MAX_PIPELINED and not self._read_paused:
                self._read_paused = True
                assert self._transport is not None
                self._transport.pause_reading()

    # --- answering ---

    def _error(self, status: int, message: str) -> _HttpError:
        code = {413: ErrorCode.PAYLOAD_TOO_LARGE}.get(status, ErrorCode.INVALID_REQUEST)
        return _HttpError(status, code, message, self._content_type())

    def _too_large(self) -> _HttpError:
        return self._error(413, f"request body larger than {self._max_body} bytes")

    def _content_type(self) -> str:
        for name, value in self._headers:
            if name.lower() == "content-type":
                ct = value.partition(";")[0].strip().lower()
                return wire.MSGPACK if ct == wire.MSGPACK else wire.JSON
        return wire.JSON

    def _start(self, request: Request, keep_alive: bool) -> None:
        self._task = self._loop.create_task(self._handle(request, keep_alive))

    async def _handle(self, request: Request, keep_alive: bool) -> None:
        self._server.in_flight += 1
        try:
            handler = self._app.router.resolve(request)
            response = await handler(request)
        except asyncio.CancelledError:
            keep_alive = False
            response = error_response(503, ErrorCode.BROKER_BUSY, "server is shutting down")
        except BaseException as exc:  # outside error_middleware: still one line
            log.exception("internal error on %s %s", request.method, request.path)
            keep_alive = False
            response = error_response(500, ErrorCode.INTERNAL, f"internal error: {exc!r}")
            if not isinstance(exc, Exception):
                raise
        finally:
            self._server.in_flight -= 1
            self._task = None
        if self._server.stopping:
            keep_alive = False
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(_render(response, keep_alive, request.method == "HEAD"))
        self.last_active = time.monotonic()
        if not keep_alive:
            self._closing = True
            self._pending.clear()
            transport.close()
            return
        self._next()

    def _next(self) -> None:
        if self._task is not None or self._write_paused:
            return
        transport = self._transport
        if self._pending:
            item = self._pending.popleft()
            if isinstance(item, Response):
                self._send_error(item)
                return
            if self._read_paused and len(self._pending) < MAX_PIPELINED // 2:
                self._read_paused = False
                if transport is not None:
                    transport.resume_reading()
            self._start(*item)
        elif self._closing and transport is not None:
            transport.close()

    def _fail(self, response: Response) -> None:
        """Answer a request the parser refused (after those before it), then close."""
        self._closing = True
        if self._transport is not None and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()
        if self._task is not None or self._pending:
            self._pending.append(response)
        else:
            self._send_error(response)

    def _send_error(self, response: Response) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._pending.clear()
        transport.write(_render(response, False, False))
        if self._oversized and transport.can_write_eof():
            # Read and drop the rest of the body for a while so the client sees the 413
            # instead of a reset; the connection closes when the client does or later.
            transport.write_eof()
            self._linger = self._loop.call_later(LINGER_S, transport.close)
            if self._read_paused:
                self._read_paused = False
                transport.resume_reading()
        else:
            transport.close()

    def idle_for(self, now: float) -> float:
        return 0.0 if self._task is not None else now - self.last_active

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _Server:
    def __init__(self, app: Application, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop
        self.connections: set[_Connection] = set()
        self.in_flight = 0
        self.stopping = False

    def protocol(self) -> _Connection:
        return _Connection(self)

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
) -> tuple[asyncio.Server, _Server]:
    """Listen (port 0: a free one) and serve ``app``; :func:`serve` wraps this."""
    loop = asyncio.get_running_loop()
    state = _Server(app, loop)
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
