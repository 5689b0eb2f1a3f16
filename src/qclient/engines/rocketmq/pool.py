"""``ConnectionPool``: one live blocking :class:`~.connection.Connection` per address."""

from __future__ import annotations

import os
import threading
import weakref
from time import monotonic

from .connection import Connection, RemotingConnectionError, RequestHandler

__all__ = ["ConnectionPool"]


class ConnectionPool:
    """One live :class:`Connection` per address, opened on demand. Thread-safe.

    A connection that failed or closed is replaced on the next :meth:`get`. Callers that
    queued behind a connect that failed get its error instead of each trying again (a
    blackholed address would otherwise cost every one of them ``connect_timeout``).
    ``read_by_callers`` opens connections whose callers read their own answers (see
    :class:`Connection`); ``get`` then first notices a peer that closed an idle
    connection, so a request goes out on a new one rather than into a dead socket.
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 3.0,
        on_request: RequestHandler | None = None,
        read_by_callers: bool = False,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.on_request = on_request
        self.read_by_callers = read_by_callers
        self._conns: dict[str, Connection] = {}
        self._lock = threading.Lock()
        self._addr_locks: dict[str, threading.Lock] = {}
        self._failed: dict[str, tuple[float, RemotingConnectionError]] = {}
        self._closed = False
        _POOLS.add(self)

    def get(self, addr: str) -> Connection:
        """The live connection to ``addr``, connecting if there is none; raises
        RemotingConnectionError when the connect fails or the pool is closed."""
        conn = self._conns.get(addr)
        if conn is not None and not conn._closed and conn.check_idle():
            return conn
        arrived = monotonic()
        with self._lock:
            if self._closed:
                raise RemotingConnectionError("connection pool closed")
            addr_lock = self._addr_locks.setdefault(addr, threading.Lock())
        with addr_lock:
            conn = self._conns.get(addr)
            if conn is not None and not conn._closed:
                return conn
            if conn is not None:
                conn.close()  # its descriptor, if no caller is reading it
            failed = self._failed.get(addr)
            if failed is not None and failed[0] >= arrived:
                raise RemotingConnectionError(str(failed[1]))
            try:
                conn = Connection(
                    addr,
                    connect_timeout=self.connect_timeout,
                    on_request=self.on_request,
                    read_by_callers=self.read_by_callers,
                )
            except RemotingConnectionError as exc:
                self._failed[addr] = (monotonic(), exc)
                raise
            self._failed.pop(addr, None)
            with self._lock:
                if self._closed:
                    conn.close()
                    raise RemotingConnectionError("connection pool closed")
                self._conns[addr] = conn
            return conn

    def discard(self, addr: str) -> None:
        """Close and drop the connection to ``addr`` (a broker declared dead)."""
        with self._lock:
            conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every connection; later ``get`` calls raise RemotingConnectionError."""
        with self._lock:
            self._closed = True
            conns = list(self._conns.values())
            self._conns.clear()
        for conn in conns:
            conn.close()

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _after_fork(self) -> None:
        # close the child's copy of each socket, without the shutdown that would cut the
        # parent's connection too
        for conn in self._conns.values():
            conn._closed = True
            conn._sock.close()
        self._conns.clear()
        self._lock = threading.Lock()
        self._addr_locks.clear()
        self._failed.clear()


# a forked child has none of the parent's reader threads: its pools start empty
_POOLS: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()


def _reset_pools_after_fork() -> None:
    for pool in list(_POOLS):
        pool._after_fork()


os.register_at_fork(after_in_child=_reset_pools_after_fork)
