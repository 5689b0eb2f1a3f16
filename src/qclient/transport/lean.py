"""A lean HTTP/1.1 transport for httpx: keep-alive sockets and a C response parser.

httpx's default transport (httpcore + h11, pure Python) costs ~1 ms of CPU per request here,
several times the broker's whole work for a one-message send. This transport does what the
SDK's requests need and no more: one pooled keep-alive connection per request in flight,
the request written with one ``sendmsg``, the response parsed by ``httptools`` (llhttp, the
parser of Node.js). It raises httpx's exceptions, so the fault-tolerance rules that classify
them hold unchanged, and it is a real ``httpx.BaseTransport``: ``httpx.Client(transport=
LeanTransport())`` works. The SDK calls :meth:`LeanTransport.post` directly, which skips
building ``httpx.Request`` / ``httpx.Response`` objects on the hot path.

Fork safety: connections belong to the process that opened them. After ``os.fork()`` the
child starts with an empty pool (the inherited sockets are closed in the child only, so the
parent's connections are untouched) and fresh locks.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, cast
from urllib.parse import urlsplit

import httptools
import httpx

__all__ = ["LeanResponse", "LeanTransport", "parse_origin"]

#: an idle connection older than this is not reused (the servers keep idle ones ~75 s)
KEEPALIVE_EXPIRY = 30.0
#: idle connections kept per origin; more requests in flight than this open extra ones
MAX_IDLE_PER_ORIGIN = 64
#: a connection idle at least this long is checked for a close (or stray bytes) from the
#: server before reuse; one used more recently is not (its server has not timed it out),
#: and one closed anyway is found stale by the exchange and retried on a new connection
CHECK_IDLE_AFTER = 1.0
_RECV = 65536
#: one small request is written with one ``send``; a bigger body goes separately
_ONE_WRITE = 65536


class LeanResponse(NamedTuple):
    """Status, headers (lower-case names) and body of one response."""

    status: int
    headers: dict[str, str]
    content: bytes


class _Origin(NamedTuple):
    tls: bool
    host: str
    port: int


def parse_origin(addr: str) -> _Origin:
    """``host:port`` or ``http(s)://host:port`` -> where to connect, and whether with TLS."""
    url = urlsplit(addr if "://" in addr else f"http://{addr}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise httpx.UnsupportedProtocol(f"unsupported address {addr!r}")
    tls = url.scheme == "https"
    return _Origin(tls, url.hostname, url.port or (443 if tls else 80))


class _Reader:
    """httptools callbacks collecting one response."""

    __slots__ = ("body", "complete", "headers", "headers_done", "keep_alive", "parser")

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.complete = False
        self.headers_done = False
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # asked now: once the message is complete llhttp has reset its state
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    """A non-blocking socket and the poll object its waits use: a wait is one ``poll``,
    a read or write one syscall (a socket timeout would add a ``poll`` before every
    ``send`` and an ``ioctl`` per change of timeout)."""

    __slots__ = ("idle_since", "origin", "poller", "sock", "tls")

    def __init__(self, origin: _Origin, sock: socket.socket) -> None:
        self.origin = origin
        self.sock = sock
        self.tls = isinstance(sock, ssl.SSLSocket)
        sock.settimeout(0.0)
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.idle_since = 0.0

    def wait(self, deadline: float, exc: type[httpx.TimeoutException], what: str) -> None:
        """Until the socket is readable, or ``exc`` when the deadline passes first."""
        while not self.poller.poll(_timeout_left(deadline, exc, what) * 1000 + 1):
            pass  # woken before the deadline with nothing to read: look at the time again

    def wait_writable(self, deadline: float) -> None:
        """Until the socket takes more bytes, or ``WriteTimeout``."""
        self.poller.modify(self.sock, select.POLLOUT)
        try:
            self.wait(deadline, httpx.WriteTimeout, "write")
        finally:
            self.poller.modify(self.sock, select.POLLIN)

    def alive(self) -> bool:
        """An idle connection is reusable only if the server has not closed it (or sent
        anything unasked): then reading it would return EOF or stray bytes."""
        try:
            return not self.poller.poll(0)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _timeout_left(deadline: float, exc: type[httpx.TimeoutException], what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise exc(f"{what} timed out")
    return left


class _PoolSettings:
    """What the sync and asyncio lean transports share: TLS, keep-alive limits, the
    address -> origin cache and the request head."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None,
        keepalive_expiry: float,
        max_idle_per_origin: int,
    ) -> None:
        #: a context, or a function making it on the first TLS connection (loading a CA
        #: bundle takes tens of ms: plain-http users should not pay it)
        self._ssl_context = ssl_context
        self._expiry = keepalive_expiry
        self._max_idle = max_idle_per_origin
        self._origins: dict[str, _Origin] = {}
        self._closed = False

    def _tls_context(self) -> ssl.SSLContext:
        ctx = self._ssl_context
        if ctx is None:
            ctx = self._ssl_context = ssl.create_default_context()
        elif not isinstance(ctx, ssl.SSLContext):
            ctx = self._ssl_context = ctx()
        return ctx

    def _origin(self, addr: str) -> _Origin:
        if self._closed:
            raise httpx.ConnectError("transport is closed")
        origin = self._origins.get(addr)
        if origin is None:
            origin = parse_origin(addr)
            if len(self._origins) < 4096:
                self._origins[addr] = origin
        return origin

    @staticmethod
    def _head(method: str, origin: _Origin, path: str, length: int, extra: str) -> bytes:
        return (
            f"{method} {path} HTTP/1.1\r\nHost: {origin.host}:{origin.port}\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n"
        ).encode("latin-1")


class LeanTransport(httpx.BaseTransport, _PoolSettings):
    """Pooled HTTP/1.1 over plain (or TLS) sockets; thread-safe; see the module doc."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
        max_idle_per_origin: int = MAX_IDLE_PER_ORIGIN,
    ) -> None:
        _PoolSettings.__init__(self, ssl_context, keepalive_expiry, max_idle_per_origin)
        self._lock = threading.Lock()
        self._idle: dict[_Origin, list[_Connection]] = {}
        _LIVE.add(self)

    # --- the pool ---------------------------------------------------------------------

    def _checkout(
        self, origin: _Origin, deadline: float, on_wait: Callable[[], None] | None = None
    ) -> tuple[_Connection, bool]:
        """A connection to ``origin`` and whether it was reused from the pool
        (``on_wait()`` before connecting)."""
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get(origin)
            while idle:
                conn = idle.pop()  # most recently used first: the warmest socket
                age = now - conn.idle_since
                if age < CHECK_IDLE_AFTER or (age < self._expiry and conn.alive()):
                    return conn, True
                conn.close()
        if on_wait is not None:
            on_wait()
        return self._connect(origin, deadline), False

    def _checkin(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        with self._lock:
            if not self._closed:
                idle = self._idle.setdefault(conn.origin, [])
                if len(idle) < self._max_idle:
                    idle.append(conn)
                    return
        conn.close()

    def _connect(self, origin: _Origin, deadline: float) -> _Connection:
        timeout = _timeout_left(deadline, httpx.ConnectTimeout, "connect")
        try:
            sock = socket.create_connection((origin.host, origin.port), timeout=timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {origin.host}:{origin.port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(
                f"{exc.strerror or exc} ({origin.host}:{origin.port})"
            ) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if origin.tls:
                ctx = self._tls_context()
                sock.settimeout(_timeout_left(deadline, httpx.ConnectTimeout, "TLS handshake"))
                sock = ctx.wrap_socket(sock, server_hostname=origin.host)
        except TimeoutError as exc:
            sock.close()
            raise httpx.ConnectTimeout("TLS handshake timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise httpx.ConnectError(f"TLS handshake with {origin.host} failed: {exc}") from exc
        return _Connection(origin, sock)

    # --- one exchange -----------------------------------------------------------------

    def request(
        self,
        method: str,
        addr: str,
        path: str,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
        *,
        timeout: float,
        on_write: Callable[[], None] | None = None,
    ) -> LeanResponse:
        """One request within ``timeout`` seconds in all (connect, write and read);
        ``on_write()`` once it is written (or before waiting to connect).

        Raises httpx's exceptions: ``ConnectError``/``ConnectTimeout`` (nothing was sent),
        ``WriteError``/``WriteTimeout``, ``ReadError``/``ReadTimeout``,
        ``RemoteProtocolError`` (closed or garbled answer), ``UnsupportedProtocol``."""
        deadline = time.monotonic() + timeout
        origin = self._origin(addr)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        for _ in range(2):
            conn, reused = self._checkout(origin, deadline, on_write)
            head = self._head(method, origin, path, len(body), extra)
            try:
                resp, keep = self._exchange(conn, head, body, deadline, method == "HEAD", on_write)
            except _StaleConnection:
                conn.close()
                if reused:
                    continue  # the server closed an idle connection as we reused it
                raise httpx.RemoteProtocolError(
                    "server disconnected without sending a response"
                ) from None
            except BaseException:
                conn.close()
                raise
            if keep:
                self._checkin(conn)
            else:
                conn.close()
            return resp
        raise httpx.RemoteProtocolError("server disconnected without sending a response")

    @staticmethod
    def _exchange(
        conn: _Connection,
        head: bytes,
        body: bytes,
        deadline: float,
        head_only: bool,
        on_write: Callable[[], None] | None = None,
    ) -> tuple[LeanResponse, bool]:
        sock = conn.sock
        reader = _Reader()
        parser = reader.parser
        received = False
        try:
            if len(body) < _ONE_WRITE:
                _write(conn, head + body, deadline)
            else:
                _write(conn, head, deadline)
                _write(conn, body, deadline)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _StaleConnection() from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc)) from exc
        if on_write is not None:
            on_write()
        tls = conn.tls
        try:
            while not reader.complete:
                if not (tls and cast(ssl.SSLSocket, sock).pending()):
                    conn.wait(deadline, httpx.ReadTimeout, "read")
                try:
                    chunk = sock.recv(_RECV)
                except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                    continue  # not a whole TLS record yet
                if not chunk:
                    if not received:
                        raise _StaleConnection()
                    raise httpx.RemoteProtocolError("server closed the connection mid-response")
                received = True
                parser.feed_data(chunk)
                if head_only and reader.headers_done:
                    break
        except ConnectionResetError as exc:
            if not received:
                raise _StaleConnection() from exc
            raise httpx.ReadError(str(exc)) from exc
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"malformed response: {exc}") from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ReadError(str(exc)) from exc
        content = reader.body[0] if len(reader.body) == 1 else b"".join(reader.body)
        return LeanResponse(parser.get_status_code(), reader.headers, content), reader.keep_alive

    # --- httpx.BaseTransport ----------------------------------------------------------

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """httpx's transport interface (``httpx.Client(transport=LeanTransport())``)."""
        timeouts: Mapping[str, float | None] = request.extensions.get("timeout", {})
        limits = [t for t in timeouts.values() if t is not None]
        url = request.url
        addr = f"{url.scheme}://{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"
        target = url.raw_path.decode("ascii")
        headers = [
            (k, v)
            for k, v in request.headers.items()
            if k.lower() not in ("host", "content-length")
        ]
        resp = self.request(
            request.method,
            addr,
            target,
            request.read(),
            headers,
            timeout=max(limits) if limits else 3600.0,
        )
        return httpx.Response(
            resp.status,
            headers=list(resp.headers.items()),
            content=resp.content,
            request=request,
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.close()

    def _after_fork_in_child(self) -> None:
        # the parent's sockets stay open in the parent: close only the child's copies
        self._lock = threading.Lock()
        for idle in self._idle.values():
            for c in idle:
                c.close()
        self._idle = {}


def _write(conn: _Connection, data: bytes, deadline: float) -> None:
    """All of ``data`` by ``deadline`` (``WriteTimeout``): one ``send`` when the socket
    buffer takes it, as it does for a request on an idle keep-alive connection."""
    sock = conn.sock
    view: memoryview | None = None
    while True:
        try:
            sent = sock.send(data if view is None else view)
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
            sent = 0
        if view is None:
            if sent == len(data):
                return
            view = memoryview(data)
        view = view[sent:]
        if not view:
            return
        conn.wait_writable(deadline)


class _StaleConnection(Exception):
    """The peer closed the connection before any byte of the answer arrived."""


_LIVE: weakref.WeakSet[LeanTransport] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for transport in list(_LIVE):
        transport._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
