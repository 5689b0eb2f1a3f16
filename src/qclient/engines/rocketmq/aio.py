"""asyncio RocketMQ remoting connection: many requests in flight on one TCP connection.

The asyncio twin of :mod:`.connection`. :class:`AsyncConnection` is itself the
``asyncio.Protocol`` (``data_received`` feeds a :class:`~.remoting.FrameDecoder`; no
stream reader in between), each call waits on a future keyed by its ``opaque``, and a
timer (``loop.call_later``) fails it at its deadline. When the connection is lost every
future in flight fails at once with RemotingConnectionError. Works on uvloop too.

Requests the server sends us go to ``on_request(conn, cmd)``, which may be a plain
function or a coroutine function; a command it returns answers a non-oneway request.
Without a handler a non-oneway request is answered REQUEST_CODE_NOT_SUPPORTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

from .connection import (
    OPAQUE_MASK,
    REQUEST_CODE_NOT_SUPPORTED,
    SYSTEM_ERROR,
    RemotingConnectionError,
    RemotingError,
    RemotingTimeoutError,
    parse_addr,
)
from .remoting import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    RemotingProtocolError,
    encode,
    response_to,
)

__all__ = ["AsyncConnection", "AsyncConnectionPool", "AsyncRequestHandler"]

log = logging.getLogger(__name__)

#: ``on_request(conn, cmd)`` -> the response (or an awaitable of it), or None
AsyncRequestHandler = Callable[
    ["AsyncConnection", RemotingCommand],
    RemotingCommand | Awaitable[RemotingCommand | None] | None,
]


def _expire(fut: asyncio.Future[RemotingCommand], addr: str, code: int, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(
            RemotingTimeoutError(f"{addr}: no answer to code {code} within {timeout:.3f} s")
        )


def _wake(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class _Many:
    """The answers of one ``call_many``, filled as they come; ``done`` is set when the
    last one is in (or by the call's deadline timer). The call's opaques are consecutive
    from ``base`` (numbered in one step of the loop), so an answer's opaque is its index."""

    __slots__ = ("answers", "base", "done", "first", "left")

    def __init__(self, base: int, n: int, done: asyncio.Future[None]) -> None:
        self.base = base
        self.answers: list[RemotingCommand | RemotingError | None] = [None] * n
        self.left = n
        self.done = done
        #: the loop's time the first answer came
        self.first: float | None = None

    def fill(self, op: int, answer: RemotingCommand | RemotingError, now: float) -> None:
        """Answer the request of opaque ``op`` (once: it was popped from ``_pending``)."""
        self.answers[(op - self.base) & OPAQUE_MASK] = answer
        if self.first is None:
            self.first = now
        self.left -= 1
        if not self.left and not self.done.done():
            self.done.set_result(None)


#: what an opaque in flight is waited by: a lone call's future, or a call_many's answers
_Waiter = asyncio.Future[RemotingCommand] | _Many


class AsyncConnection(asyncio.Protocol):
    """One TCP connection to a broker or NameServer, many requests in flight.

    Open with ``await AsyncConnection.connect(addr)``. Use from its event loop only.
    :meth:`call` stamps the command's ``opaque``, so a command object belongs to one call
    at a time.
    """

    def __init__(self, addr: str, on_request: AsyncRequestHandler | None = None) -> None:
        """The protocol object; :meth:`connect` makes and connects one."""
        self.addr = addr
        self._on_request = on_request
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._feed = FrameDecoder().feed
        self._ids = itertools.count(1)
        self._pending: dict[int, _Waiter] = {}
        self._closed = False
        self._error: RemotingConnectionError | None = None
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def connect(
        cls,
        addr: str,
        *,
        connect_timeout: float = 3.0,
        on_request: AsyncRequestHandler | None = None,
    ) -> AsyncConnection:
        """Connect to ``addr`` (``host:port``) within ``connect_timeout`` seconds; raises
        RemotingConnectionError when the connect fails."""
        host, port = parse_addr(addr)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, proto = await loop.create_connection(lambda: cls(addr, on_request), host, port)
        except (OSError, TimeoutError) as exc:
            raise RemotingConnectionError(f"{addr}: connect failed: {exc!r}") from exc
        return proto

    # --- calls ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection failed or was closed; it never reopens."""
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests written and not yet answered, timed out or failed."""
        return len(self._pending)

    async def call(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``cmd`` and return its answer within ``timeout`` seconds.

        Raises RemotingTimeoutError or RemotingConnectionError (and RemotingProtocolError
        for a command too large to encode, before anything is sent).
        """
        loop = self._loop
        deadline = loop.time() + timeout
        op = cmd.opaque = next(self._ids) & OPAQUE_MASK
        frame = encode(cmd)
        if self._paused:
            await self._writable(deadline, cmd.code)
        if self._closed:
            raise self._closed_error()
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        self._pending[op] = fut
        cast(asyncio.Transport, self._transport).write(frame)
        timer = loop.call_at(deadline, _expire, fut, self.addr, cmd.code, timeout)
        try:
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(op, None)

    async def call_many(
        self,
        cmds: list[RemotingCommand],
        timeout: float,
        first: list[float] | None = None,
    ) -> list[RemotingCommand | RemotingError]:
        """Send all ``cmds`` in one write, then wait for their answers with one deadline.

        Returns the answers in order; a failed call's slot holds its RemotingTimeoutError
        or RemotingConnectionError instead (not raised). ``first``, when given, gets the
        loop's time (``monotonic()``) the first answer was had.
        """
        loop = self._loop
        deadline = loop.time() + timeout
        if not cmds:
            return []
        ids = self._ids
        frames = []
        for cmd in cmds:
            cmd.opaque = next(ids) & OPAQUE_MASK
            frames.append(encode(cmd))
        if self._paused:
            try:
                await self._writable(deadline, cmds[0].code)
            except RemotingError as exc:
                return [type(exc)(str(exc)) for _ in cmds]
        if self._closed:
            return [self._closed_error() for _ in cmds]
        # one waiter for the whole call: ``data_received`` fills its answers by opaque
        many = _Many(cmds[0].opaque, len(cmds), loop.create_future())
        pending = self._pending
        for cmd in cmds:
            pending[cmd.opaque] = many
        cast(asyncio.Transport, self._transport).write(b"".join(frames))
        timer = loop.call_at(deadline, _wake, many.done)
        try:
            await many.done
        finally:
            timer.cancel()
            for cmd in cmds:
                pending.pop(cmd.opaque, None)
        answers = many.answers
        for i, answer in enumerate(answers):
            if answer is None:  # popped above: an answer coming now is dropped
                cmd = cmds[i]
                answers[i] = RemotingTimeoutError(
                    f"{self.addr}: no answer to code {cmd.code} within {timeout:.3f} s"
                )
        if first is not None and many.first is not None:
            first.append(many.first)
        return cast(list[RemotingCommand | RemotingError], answers)

    async def oneway(self, cmd: RemotingCommand, timeout: float = 3.0) -> None:
        """Send ``cmd`` with the oneway flag; no answer is expected. ``timeout`` bounds a
        wait for the write buffer to drain (a server that stopped reading)."""
        cmd.opaque = next(self._ids) & OPAQUE_MASK
        cmd.flag |= FLAG_ONEWAY
        frame = encode(cmd)
        if self._paused:
            await self._writable(self._loop.time() + timeout, cmd.code)
        if self._closed:
            raise self._closed_error()
        cast(asyncio.Transport, self._transport).write(frame)

    async def close(self) -> None:
        """Close the connection (after writing what is buffered): every call in flight
        fails with RemotingConnectionError."""
        self._fail(RemotingConnectionError(f"{self.addr}: connection closed"))
        if self._transport is not None:
            self._transport.close()
            try:
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._lost)
            except TimeoutError:
                self._transport.abort()

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._pending)} in flight"
        return f"<AsyncConnection {self.addr} {state}>"

    # --- protocol callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport; TCP_NODELAY on (asyncio sets it, said again for any loop)."""
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        """Answers complete their futures; server requests go to the handler."""
        try:
            cmds = self._feed(data)
        except RemotingProtocolError as exc:
            self._fail(RemotingConnectionError(f"{self.addr}: protocol error: {exc}"))
            cast(asyncio.Transport, self._transport).abort()
            return
        pending = self._pending
        now = self._loop.time()
        for cmd in cmds:
            if cmd.flag & FLAG_RESPONSE:
                waiter = pending.pop(cmd.opaque, None)
                if isinstance(waiter, _Many):
                    waiter.fill(cmd.opaque, cmd, now)
                elif waiter is not None and not waiter.done():
                    waiter.set_result(cmd)
            else:
                self._serve_request(cmd)

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail every call in flight."""
        why = f": {exc}" if exc is not None else " by the peer"
        self._fail(RemotingConnectionError(f"{self.addr}: connection closed{why}"))
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        """The transport's buffer is full: later writes wait for it to drain."""
        self._paused = True

    def resume_writing(self) -> None:
        """The transport's buffer drained."""
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # --- internals -----------------------------------------------------------------------

    async def _writable(self, deadline: float, code: int) -> None:
        """Wait until the transport takes writes again, or fail at ``deadline``."""
        while self._paused and not self._closed:
            if self._drain is None:
                self._drain = self._loop.create_future()
            try:
                async with asyncio.timeout_at(deadline):
                    await asyncio.shield(self._drain)
            except TimeoutError:
                raise RemotingTimeoutError(
                    f"{self.addr}: write of code {code} blocked past timeout"
                ) from None

    def _fail(self, err: RemotingConnectionError) -> None:
        """Mark the connection closed and fail every call in flight with ``err``."""
        if self._error is None:
            self._error = err
        self._closed = True
        pending = self._pending
        msg = str(self._error)
        now = self._loop.time()
        while pending:
            op, waiter = pending.popitem()
            if isinstance(waiter, _Many):
                waiter.fill(op, RemotingConnectionError(msg), now)
            elif not waiter.done():
                waiter.set_exception(RemotingConnectionError(msg))
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _closed_error(self) -> RemotingConnectionError:
        return RemotingConnectionError(str(self._error or f"{self.addr}: connection closed"))

    def _serve_request(self, cmd: RemotingCommand) -> None:
        """Answer a server request through the handler (awaited in a task if it returns
        an awaitable), or refuse it without one."""
        handler = self._on_request
        if handler is None:
            self._reply(
                cmd,
                response_to(
                    cmd, REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
                ),
            )
            return
        try:
            answer = handler(self, cmd)
        except Exception as exc:
            log.exception("on_request failed for request code %d", cmd.code)
            self._reply(cmd, response_to(cmd, SYSTEM_ERROR, repr(exc)))
            return
        if inspect.isawaitable(answer):
            task = self._loop.create_task(self._await_answer(cmd, answer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._reply(cmd, cast(RemotingCommand | None, answer))

    async def _await_answer(self, cmd: RemotingCommand, answer: Awaitable[Any]) -> None:
        try:
            result = await answer
        except Exception as exc:
            log.exception("on_request failed for request code %d", cmd.code)
            result = response_to(cmd, SYSTEM_ERROR, repr(exc))
        self._reply(cmd, result)

    def _reply(self, req: RemotingCommand, answer: RemotingCommand | None) -> None:
        """Write ``answer`` to the server request ``req`` unless it was oneway."""
        if answer is None or req.flag & FLAG_ONEWAY or self._closed:
            return
        answer.opaque = req.opaque
        answer.flag |= FLAG_RESPONSE
        try:
            frame = encode(answer)
        except RemotingProtocolError as exc:
            log.warning("%s: could not answer request code %d: %s", self.addr, req.code, exc)
            return
        cast(asyncio.Transport, self._transport).write(frame)


class AsyncConnectionPool:
    """One live :class:`AsyncConnection` per address, opened on demand, for one loop.

    A connection that failed or closed is replaced on the next :meth:`get`; callers queued
    behind a connect that failed get its error instead of each trying again.
    """

    def __init__(
        self, *, connect_timeout: float = 3.0, on_request: AsyncRequestHandler | None = None
    ) -> None:
        self.connect_timeout = connect_timeout
        self.on_request = on_request
        self._conns: dict[str, AsyncConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._failed: dict[str, tuple[float, RemotingConnectionError]] = {}
        self._closed = False

    async def get(self, addr: str) -> AsyncConnection:
        """The live connection to ``addr``, connecting if there is none; raises
        RemotingConnectionError when the connect fails or the pool is closed."""
        conn = self._conns.get(addr)
        if conn is not None and not conn._closed:
            return conn
        if self._closed:
            raise RemotingConnectionError("connection pool closed")
        arrived = asyncio.get_running_loop().time()
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is not None and not conn._closed:
                return conn
            failed = self._failed.get(addr)
            if failed is not None and failed[0] >= arrived:
                raise RemotingConnectionError(str(failed[1]))
            try:
                conn = await AsyncConnection.connect(
                    addr, connect_timeout=self.connect_timeout, on_request=self.on_request
                )
            except RemotingConnectionError as exc:
                self._failed[addr] = (asyncio.get_running_loop().time(), exc)
                raise
            self._failed.pop(addr, None)
            if self._closed:
                await conn.close()
                raise RemotingConnectionError("connection pool closed")
            self._conns[addr] = conn
            return conn

    async def discard(self, addr: str) -> None:
        """Close and drop the connection to ``addr`` (a broker declared dead)."""
        conn = self._conns.pop(addr, None)
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        """Close every connection; later ``get`` calls raise RemotingConnectionError."""
        self._closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        await asyncio.gather(*(c.close() for c in conns))

    async def __aenter__(self) -> AsyncConnectionPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
