"""One HTTP/1.1 client connection of the servers: an :class:`asyncio.Protocol` with the
``httptools`` parser (llhttp, in C), and the limits it enforces.

It parses requests, answers them one at a time and in order (pipelined requests wait,
reading pauses after ``MAX_PIPELINED``), runs each handler as a task, or calls a route's
direct handler (:meth:`Application.add_direct`) as the request is parsed when nothing else
is in flight on the connection, and renders the answers. :mod:`._serve` listens, keeps the
set of connections and stops them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from email.utils import formatdate
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING

import httptools

from ..protocol import wire
from ..protocol.wire import ErrorCode
from ._http import (
    DirectHandler,
    Request,
    Response,
    error_response,
    media_type_of,
)

if TYPE_CHECKING:
    from ._serve import ServerState

__all__ = [
    "KEEPALIVE_TIMEOUT_S",
    "LINGER_S",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "MAX_LINE_BYTES",
    "MAX_PIPELINED",
    "SHUTDOWN_GRACE_S",
    "Connection",
]

log = logging.getLogger(__name__)

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


# --- the wire -------------------------------------------------------------------------

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_date_second = 0
_date_line = b""


def _date_header() -> bytes:
    """``Date: ...`` (formatted once a second)."""
    global _date_second, _date_line
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_line = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
    return _date_line


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


class _Direct:
    """Stands for a direct handler's request in flight where a handler task would be: it
    answers through its callback; a stopping server waits for it (it cannot be
    cancelled)."""

    __slots__ = ()

    def cancel(self) -> bool:
        return False


_DIRECT = _Direct()


class Connection(asyncio.Protocol):
    """One client connection: parse, answer requests one at a time, in order."""

    def __init__(self, server: ServerState) -> None:
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
        self._task: asyncio.Task[None] | _Direct | None = None
        self._closing = False
        self._write_paused = False
        self._read_paused = False
        self._linger: asyncio.TimerHandle | None = None
        self.last_active = time.monotonic()
        self._seq = 0
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._content_type: bytes | None = None
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
        # (the state was reset when the connection opened or the last message completed)
        self._seq += 1

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE_BYTES:
            raise self._error(400, f"request line longer than {MAX_LINE_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        self._head_bytes += size
        headers = self._headers
        headers.append((name, value))  # kept as bytes: decoded if a handler asks
        if len(headers) > MAX_HEADERS or size > MAX_LINE_BYTES or self._head_bytes > MAX_HEAD_BYTES:
            if len(headers) > MAX_HEADERS:
                raise self._error(400, f"more than {MAX_HEADERS} header fields")
            if size > MAX_LINE_BYTES:
                raise self._error(400, f"a header field longer than {MAX_LINE_BYTES} bytes")
            raise self._error(400, f"request headers larger than {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self._head_done = True
        length = -1
        expect = False
        for name, value in self._headers:
            lname = name.lower()
            if lname == b"content-length":
                if value.strip().isdigit():
                    length = int(value)
            elif lname == b"content-type":
                if self._content_type is None:
                    self._content_type = value
            elif lname == b"expect" and value.lower() == b"100-continue":
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
        data = body[0] if len(body) == 1 else b"".join(body)
        content_type = media_type_of(self._content_type)
        keep_alive = parser.should_keep_alive()
        idle = self._task is None and not self._pending and not self._write_paused
        direct = self._app.direct
        if direct and idle and not self._closing:
            handler = direct.get((parser.get_method(), raw_path))
            if handler is not None:
                self._reset()
                self._direct(handler, data, content_type, keep_alive)
                return
        request = Request(
            parser.get_method().decode("latin-1"),
            raw_path.decode("latin-1"),
            query.decode("latin-1"),
            self._headers,
            data,
            self._app,
            version=parser.get_http_version(),
            remote=self._remote,
            content_type=content_type,
        )
        self._reset()
        if idle:
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
        return _HttpError(status, code, message, self._error_type())

    def _too_large(self) -> _HttpError:
        return self._error(413, f"request body larger than {self._max_body} bytes")

    def _error_type(self) -> str:
        """The encoding of an error answer the server gives itself (JSON if unknown)."""
        for name, value in self._headers:
            if name.lower() == b"content-type":
                return wire.media_type(media_type_of(value))
        return wire.JSON

    def _start(self, request: Request, keep_alive: bool) -> None:
        # (a handler cancelled before it starts -- a stopping server -- stays counted)
        self._app.pending_handlers += 1
        self._task = self._loop.create_task(self._handle(request, keep_alive))

    async def _handle(self, request: Request, keep_alive: bool) -> None:
        self._app.pending_handlers -= 1
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
        self._answer(response, keep_alive, request.method == "HEAD")

    def _direct(
        self, handler: DirectHandler, body: bytes, content_type: str, keep_alive: bool
    ) -> None:
        self._server.in_flight += 1
        self._task = _DIRECT
        try:
            response = handler(body, content_type, partial(self._direct_answer, keep_alive))
        except Exception as exc:  # the handler's own errors are its to answer: a bug
            log.exception("internal error in a direct handler")
            response = error_response(500, ErrorCode.INTERNAL, f"internal error: {exc!r}")
            keep_alive = False
        if response is not None:
            self._direct_answer(keep_alive, response)

    def _direct_answer(self, keep_alive: bool, response: Response) -> None:
        if self._task is not _DIRECT:
            return  # answered already
        self._server.in_flight -= 1
        self._task = None
        self._answer(response, keep_alive, False)

    def _answer(self, response: Response, keep_alive: bool, head: bool) -> None:
        """Send the answer of the request in flight; then the next one, or close."""
        if self._server.stopping:
            keep_alive = False
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(_render(response, keep_alive, head))
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
