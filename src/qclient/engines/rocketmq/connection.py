"""Blocking RocketMQ remoting connection: many requests in flight on one TCP connection.

The model of RocketMQ's ``NettyRemotingClient`` channel: requests carry an ``opaque`` and
the answers come back in any order, matched to their caller by it. Callers write on their
own thread (one ``send`` of the encoded frame, under a write lock); one daemon reader thread
per connection decodes frames with :class:`~.remoting.FrameDecoder` and hands each answer to
its waiting caller through a per-request slot (a pre-acquired ``_thread.lock``, released by
the reader: 0.3 us per request against 4 us for a ``threading.Event``).

When the reader sees EOF or an error, every caller in flight fails at once with
:class:`RemotingConnectionError` (a dead broker must not make callers wait for their
timeout) and the connection is closed for good; :class:`ConnectionPool` opens a new one on
the next ``get``. Requests the server sends us (flag bit 0 clear: NOTIFY_CONSUMER_IDS_CHANGED,
CHECK_TRANSACTION_STATE, GET_CONSUMER_RUNNING_INFO, ...) go to ``on_request(conn, cmd)``
on a per-connection worker thread (so a handler may itself call the server); a handler
that returns a command answers a non-oneway request with it. Without a handler a
non-oneway request is answered REQUEST_CODE_NOT_SUPPORTED, as the Java client does.

``read_by_callers=True`` drops the reader thread: the callers waiting for answers take
turns reading the socket (leader/follower). The caller reading dispatches every answer it
decodes to its slot and, once its own has come, passes the turn to the oldest caller
still waiting. A lone caller so reads its own answer in its own thread: no thread switch
and no GIL hand-off per request, which cost a one-thread producer 30 us of CPU per
request (``benchmarks/engines_bench.py --profile``). Requests from the server are then
served when a caller next reads (a producer's connection gets none: brokers send them to
consumers and transactional producers).
"""

from __future__ import annotations

import _thread
import contextlib
import itertools
import logging
import queue
import select
import socket
import threading
from collections.abc import Callable
from time import monotonic
from typing import cast

from . import _reading
from .remoting import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    RemotingProtocolError,
    encode,
    response_to,
)

__all__ = [
    "Connection",
    "RemotingConnectionError",
    "RemotingError",
    "RemotingTimeoutError",
    "RequestHandler",
    "parse_addr",
]

log = logging.getLogger(__name__)

#: ``ResponseCode.SYSTEM_ERROR`` and ``REQUEST_CODE_NOT_SUPPORTED`` (``RemotingSysResponseCode``)
SYSTEM_ERROR = 1
REQUEST_CODE_NOT_SUPPORTED = 3
#: opaques are Java ints on the server: the sequence wraps at 2**31
OPAQUE_MASK = 0x7FFFFFFF
#: how long an answer to a server request may wait for the write lock
REPLY_TIMEOUT = 3.0
_RECV = 256 * 1024
#: how long a connection its callers read may go unread before ``check_idle`` looks for
#: what the peer sent: a peer that closed an idle connection (a broker's idle timeout, a
#: restart) is noticed before a request goes into it; one dead for less than this fails
#: the request like any in flight, and the producer retries it elsewhere
IDLE_CHECK_AFTER = 1.0
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


class RemotingError(Exception):
    """A remoting call that got no answer."""


class RemotingTimeoutError(RemotingError):
    """No answer within the call's timeout. The connection stays usable; a late answer is
    dropped."""


class RemotingConnectionError(RemotingError):
    """The connection could not be opened, failed or was closed; it will not recover."""


#: ``on_request(conn, cmd)`` -> the response to send (ignored for a oneway request) or None
RequestHandler = Callable[["Connection", RemotingCommand], RemotingCommand | None]


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {addr!r}")
    return host.strip("[]"), int(port)


class _Slot:
    """One caller's wait: ``lock`` is held until the reader (or a failure) sets ``result``."""

    __slots__ = ("lock", "result", "turn")

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.result: RemotingCommand | RemotingConnectionError | None = None
        #: set (with ``lock`` released) when the reading turn passes to this slot's caller
        self.turn = False


class Connection:
    """One TCP connection to a broker or NameServer, many requests in flight.

    Thread-safe. :meth:`call` stamps the command's ``opaque`` (a per-connection sequence),
    so a command object belongs to one call at a time.
    """

    def __init__(
        self,
        addr: str,
        *,
        connect_timeout: float = 3.0,
        on_request: RequestHandler | None = None,
        read_by_callers: bool = False,
    ) -> None:
        """Connect to ``addr`` (``host:port``) within ``connect_timeout`` seconds and start
        the reader thread (none with ``read_by_callers``); raises RemotingConnectionError
        when the connect fails."""
        self.addr = addr
        self._on_request = on_request
        try:
            sock = socket.create_connection(parse_addr(addr), timeout=connect_timeout)
        except OSError as exc:
            raise RemotingConnectionError(f"{addr}: connect failed: {exc}") from exc
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._ids = itertools.count(1)
        self._pending: dict[int, _Slot] = {}
        self._wlock = threading.Lock()
        self._closed = False
        self._error: RemotingConnectionError | None = None
        self._requests: queue.SimpleQueue[RemotingCommand | None] | None = None
        self._feed = FrameDecoder().feed
        self._buf = bytearray(_RECV)
        self._view = memoryview(self._buf)
        self._reader: threading.Thread | None = None
        #: with ``read_by_callers``: guards ``_reading`` (a caller holds the reading turn),
        #: the hand-over of the turn and ``_fail``'s wake-ups, so a slot is released once
        self._rlock = threading.Lock()
        self._reading = False
        self._read_at = monotonic()  # when callers last read (``check_idle``)
        self._by_callers = read_by_callers
        if read_by_callers:
            self._poller = select.poll()
            self._poller.register(sock, select.POLLIN)
        else:
            self._reader = threading.Thread(
                target=self._read_loop, name=f"rocketmq-reader-{addr}", daemon=True
            )
            self._reader.start()

    # --- calls ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection failed or was closed; it never reopens."""
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests written and not yet answered, timed out or failed."""
        return len(self._pending)

    def call(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``cmd`` and return its answer within ``timeout`` seconds.

        Raises RemotingTimeoutError or RemotingConnectionError (and RemotingProtocolError
        for a command too large to encode, before anything is sent).
        """
        result = self.call_many([cmd], timeout)[0]
        if type(result) is RemotingCommand:
            return result
        raise cast(RemotingError, result)

    def call_many(
        self,
        cmds: list[RemotingCommand],
        timeout: float,
        first: list[float] | None = None,
    ) -> list[RemotingCommand | RemotingError]:
        """Send all ``cmds`` in one write, then wait for their answers with one deadline.

        Returns the answers in order; a failed call's slot holds its RemotingTimeoutError
        or RemotingConnectionError instead (not raised). ``first``, when given, gets the
        ``monotonic()`` time the first answer was had (one request's latency, which the
        whole call's is not when many are pipelined).
        """
        deadline = monotonic() + timeout
        if not cmds:
            return []
        ids = self._ids
        frames = []
        for cmd in cmds:
            cmd.opaque = next(ids) & OPAQUE_MASK
            frames.append(encode(cmd))
        slots = [_Slot() for _ in cmds]
        pending = self._pending
        for cmd, slot in zip(cmds, slots, strict=True):
            pending[cmd.opaque] = slot
        answers: list[RemotingCommand | RemotingError] = []
        try:
            # checked after registering: a failure that drains ``pending`` sets ``_closed``
            # first, so either it sees these slots or this check sees the flag
            if self._closed:
                raise self._closed_error()
            self._send(frames[0] if len(frames) == 1 else b"".join(frames), deadline, cmds[0].code)
            wait = self._wait
            for cmd, slot in zip(cmds, slots, strict=True):
                answers.append(wait(slot, cmd.opaque, cmd.code, deadline, timeout))
                if first is not None and not first:
                    first.append(monotonic())
        except BaseException as exc:
            self._forget([(cmd.opaque, slot) for cmd, slot in zip(cmds, slots, strict=True)])
            if isinstance(exc, RemotingError) and not answers:
                return [type(exc)(str(exc)) for _ in cmds]
            raise
        return answers

    def oneway(self, cmd: RemotingCommand, timeout: float = 3.0) -> None:
        """Send ``cmd`` with the oneway flag; no answer is expected. ``timeout`` bounds the
        write (a server that stopped reading)."""
        cmd.opaque = next(self._ids) & OPAQUE_MASK
        cmd.flag |= FLAG_ONEWAY
        frame = encode(cmd)
        if self._closed:
            raise self._closed_error()
        self._send(frame, monotonic() + timeout, cmd.code)

    def _wait(
        self, slot: _Slot, op: int, code: int, deadline: float, timeout: float
    ) -> RemotingCommand | RemotingError:
        """The answer in ``slot``, or the error to raise for it."""
        if self._by_callers:
            return _reading.wait(self, slot, op, code, deadline, timeout)
        if not slot.lock.acquire(True, max(deadline - monotonic(), 0.0)):
            if self._pending.pop(op, None) is not None:
                return self._timed_out(code, timeout)
            slot.lock.acquire()  # the reader took the slot: its result is a moment away
        return self._answer(slot)

    def _answer(self, slot: _Slot) -> RemotingCommand | RemotingError:
        result = slot.result
        if type(result) is RemotingCommand:
            return result
        return RemotingConnectionError(str(result))

    def _timed_out(self, code: int, timeout: float) -> RemotingTimeoutError:
        return RemotingTimeoutError(f"{self.addr}: no answer to code {code} within {timeout:.3f} s")

    def _forget(self, slots: list[tuple[int, _Slot]]) -> None:
        """Drop the slots of a call that failed to send or was interrupted; with callers
        reading, a slot handed the reading turn passes it on."""
        with self._rlock:
            handed = False
            for op, slot in slots:
                if self._pending.pop(op, None) is not None and slot.turn:
                    slot.turn, handed = False, True
            if handed and not _reading.pass_turn(self):
                self._reading = False

    def close(self) -> None:
        """Close the connection: every call in flight fails with RemotingConnectionError."""
        self._fail(RemotingConnectionError(f"{self.addr}: connection closed"))
        if self._reader is None:
            _reading.close_unread(self)
        elif threading.current_thread() is not self._reader:
            self._reader.join(1.0)

    def check_idle(self) -> bool:
        """Whether the connection is still open; when callers read it and it has not been
        read for ``IDLE_CHECK_AFTER``, having first read what the peer sent meanwhile (its
        close, a server request)."""
        if (
            self._reader is None
            and not self._pending
            and monotonic() - self._read_at > IDLE_CHECK_AFTER
        ):
            _reading.drain_idle(self)
        return not self._closed

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._pending)} in flight"
        return f"<Connection {self.addr} {state}>"

    # --- writing -------------------------------------------------------------------------

    def _send(self, data: bytes, deadline: float, code: int) -> None:
        """Write ``data`` whole before ``deadline``. A write that stops part-way leaves half
        a frame on the stream, so it fails the connection."""
        wlock = self._wlock
        if not wlock.acquire(True, max(deadline - monotonic(), 0.0)):
            raise RemotingTimeoutError(f"{self.addr}: write of code {code} timed out")
        try:
            if self._closed:
                raise self._closed_error()
            try:
                sent = self._sock.send(data, _DONTWAIT)
            except BlockingIOError:
                sent = 0
            if sent < len(data):
                self._send_slow(memoryview(data), sent, deadline, code)
        except OSError as exc:
            err = RemotingConnectionError(f"{self.addr}: write failed: {exc}")
            self._fail(err)
            raise err from exc
        finally:
            wlock.release()

    def _send_slow(self, data: memoryview, sent: int, deadline: float, code: int) -> None:
        """The rest of a write the socket buffer could not take at once."""
        poller = select.poll()
        poller.register(self._sock, select.POLLOUT)
        while sent < len(data):
            left = deadline - monotonic()
            if left <= 0 or not poller.poll(left * 1000.0):
                if sent:
                    self._fail(RemotingConnectionError(f"{self.addr}: a write timed out mid-frame"))
                raise RemotingTimeoutError(f"{self.addr}: write of code {code} timed out")
            if self._closed:
                raise self._closed_error()
            with contextlib.suppress(BlockingIOError):
                sent += self._sock.send(data[sent:], _DONTWAIT)

    # --- reading -------------------------------------------------------------------------

    def _read_loop(self) -> None:
        """The reader thread: answers to their slots, requests to the worker, then fail."""
        sock = self._sock
        buf = self._buf
        view = self._view
        dispatch = self._dispatch
        err: RemotingConnectionError
        try:
            while True:
                n = sock.recv_into(buf)
                if not n:
                    err = self._eof()
                    break
                dispatch(view[:n])
        except BaseException as exc:
            err = self._read_error(exc)
        self._fail(err)
        self._close_socket()

    def _close_socket(self) -> None:
        """Close the descriptor, by the thread that reads it (or holds the reading turn),
        under the write lock, so no recv or send runs on a number the process reused."""
        got = self._wlock.acquire(True, REPLY_TIMEOUT)
        try:
            self._sock.close()
        finally:
            if got:
                self._wlock.release()
            if self._requests is not None:
                self._requests.put(None)

    def _dispatch(self, data: memoryview) -> None:
        """Decode what was read: answers to their slots, server requests to the worker."""
        pending = self._pending
        for cmd in self._feed(data):
            if cmd.flag & FLAG_RESPONSE:
                slot = pending.pop(cmd.opaque, None)
                if slot is not None:
                    slot.result = cmd
                    slot.lock.release()
            else:
                self._submit_request(cmd)

    def _eof(self) -> RemotingConnectionError:
        return RemotingConnectionError(f"{self.addr}: connection closed by the peer")

    def _read_error(self, exc: BaseException) -> RemotingConnectionError:
        """The error every caller in flight fails with after a read raised ``exc``."""
        if isinstance(exc, RemotingProtocolError):
            return RemotingConnectionError(f"{self.addr}: protocol error: {exc}")
        if isinstance(exc, OSError):
            return RemotingConnectionError(f"{self.addr}: read failed: {exc}")
        # a bug: fail the callers rather than strand them
        log.exception("rocketmq reader of %s died", self.addr)
        return RemotingConnectionError(f"{self.addr}: reader failed: {exc!r}")

    def _fail(self, err: RemotingConnectionError) -> None:
        """Mark the connection closed and fail every caller in flight with ``err``."""
        with self._rlock:
            if self._error is None:
                self._error = err
            first = not self._closed
            self._closed = True
            pending = self._pending
            while pending:
                try:
                    _, slot = pending.popitem()
                except KeyError:
                    break
                slot.result = self._error
                if not slot.turn:  # a slot handed the turn was released by the hand-over
                    slot.lock.release()
        if first:
            # wakes the reader's recv (EOF) and a writer's poll; the reader closes the fd
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def _closed_error(self) -> RemotingConnectionError:
        return RemotingConnectionError(str(self._error or f"{self.addr}: connection closed"))

    # --- requests from the server --------------------------------------------------------

    def _submit_request(self, cmd: RemotingCommand) -> None:
        """Queue a server request for the worker thread, started on the first one (only
        the reader thread calls this)."""
        if self._requests is None:
            self._requests = queue.SimpleQueue()
            threading.Thread(
                target=self._serve_requests,
                args=(self._requests,),
                name=f"rocketmq-requests-{self.addr}",
                daemon=True,
            ).start()
        self._requests.put(cmd)

    def _serve_requests(self, q: queue.SimpleQueue[RemotingCommand | None]) -> None:
        """The worker thread: the answer to a server request is the handler's, a refusal
        without a handler, or SYSTEM_ERROR when the handler raised (as Java's
        ``NettyRemotingAbstract`` does); none for a oneway request."""
        while (cmd := q.get()) is not None:
            if self._on_request is None:
                why = f" request type {cmd.code} not supported"
                answer: RemotingCommand | None = response_to(cmd, REQUEST_CODE_NOT_SUPPORTED, why)
            else:
                try:
                    answer = self._on_request(self, cmd)
                except Exception as exc:
                    log.exception("on_request failed for request code %d", cmd.code)
                    answer = response_to(cmd, SYSTEM_ERROR, repr(exc))
            if answer is None or cmd.flag & FLAG_ONEWAY or self._closed:
                continue
            answer.opaque = cmd.opaque
            answer.flag |= FLAG_RESPONSE
            try:
                self._send(encode(answer), monotonic() + REPLY_TIMEOUT, answer.code)
            except (RemotingError, RemotingProtocolError) as exc:
                log.warning("%s: could not answer request code %d: %s", self.addr, cmd.code, exc)
