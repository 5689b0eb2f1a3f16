"""The lean transport for asyncio: the same HTTP/1.1 exchange as :mod:`.lean`, on an
``asyncio.Protocol`` per pooled connection, for ``AsyncProducer`` and the ``send_async``
sender. One instance serves one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Iterable

import httptools
import httpx

from .lean import (
    KEEPALIVE_EXPIRY,
    MAX_IDLE_PER_ORIGIN,
    LeanResponse,
    _Origin,
    _PoolSettings,
    _Reader,
)

__all__ = ["LeanAsyncTransport"]


class _Stale(Exception):
    """The peer closed the connection before any byte of the answer arrived."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reader: _Reader | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._received = False

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader, waiter = self._reader, self._waiter
        if reader is None or waiter is None or waiter.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        self._received = True
        try:
            reader.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            waiter.set_exception(httpx.RemoteProtocolError(f"malformed response: {exc}"))
            self.close()
            return
        if reader.complete:
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if not self._received:
                waiter.set_exception(_Stale())
            else:
                waiter.set_exception(
                    httpx.RemoteProtocolError("server closed the connection mid-response")
                )

    # --- use ----------------------------------------------------------------------------

    async def exchange(self, data: bytes, timeout: float) -> tuple[LeanResponse, bool]:
        assert self.transport is not None
        reader = self._reader = _Reader()
        self._received = False
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            self.close()
            raise httpx.ReadTimeout("read timed out") from None
        finally:
            self._waiter = None
        content = reader.body[0] if len(reader.body) == 1 else b"".join(reader.body)
        status = reader.parser.get_status_code()
        return LeanResponse(status, reader.headers, content), reader.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class LeanAsyncTransport(_PoolSettings):
    """Pooled HTTP/1.1 for one event loop; raises httpx's exceptions, like :mod:`.lean`."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
        max_idle_per_origin: int = MAX_IDLE_PER_ORIGIN,
    ) -> None:
        super().__init__(ssl_context, keepalive_expiry, max_idle_per_origin)
        self._idle: dict[_Origin, list[_Connection]] = {}

    async def _connect(self, origin: _Origin, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        ctx = self._tls_context() if origin.tls else None
        where = f"{origin.host}:{origin.port}"
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(origin),
                    origin.host,
                    origin.port,
                    ssl=ctx,
                    server_hostname=origin.host if ctx else None,
                ),
                timeout,
            )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {where} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(f"{getattr(exc, 'strerror', None) or exc} ({where})") from exc
        return conn

    async def request(
        self,
        method: str,
        addr: str,
        path: str,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
        *,
        timeout: float,
    ) -> LeanResponse:
        """One request within ``timeout`` seconds in all; httpx's exceptions on failure."""
        deadline = time.monotonic() + timeout
        origin = self._origin(addr)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        for _ in range(2):
            conn, reused = self._checkout(origin)
            if conn is None:
                conn = await self._connect(origin, max(0.001, deadline - time.monotonic()))
            head = self._head(method, origin, path, len(body), extra)
            left = deadline - time.monotonic()
            if left <= 0:
                conn.close()
                raise httpx.WriteTimeout("write timed out")
            try:
                resp, keep = await conn.exchange(head + body, left)
            except _Stale:
                conn.close()
                if reused:
                    continue  # the server closed an idle connection as we reused it
                raise httpx.RemoteProtocolError(
                    "server disconnected without sending a response"
                ) from None
            except BaseException:
                conn.close()
                raise
            if keep and not conn.closed and not self._closed:
                self._checkin(conn)
            else:
                conn.close()
            return resp
        raise httpx.RemoteProtocolError("server disconnected without sending a response")

    def _checkout(self, origin: _Origin) -> tuple[_Connection | None, bool]:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self._expiry:
                return conn, True
            conn.close()
        return None, False

    def _checkin(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(conn.origin, [])
        if len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        self._closed = True
        conns = [c for idle in self._idle.values() for c in idle]
        self._idle.clear()
        for c in conns:
            with contextlib.suppress(Exception):
                c.close()
