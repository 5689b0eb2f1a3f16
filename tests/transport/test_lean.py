"""The lean transports against raw sockets on 127.0.0.1 that answer exactly what a test
needs: keep-alive reuse, chunked bodies, truncated and garbled answers, a server that
closes idle connections, timeouts, refused connections; sync and asyncio alike."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from qclient.transport.lean import LeanTransport
from qclient.transport.lean_async import LeanAsyncTransport

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
Handler = Callable[[socket.socket, int], bool]  # (conn, request number) -> keep serving?


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    body = bytearray(rest)
    while len(body) < length:
        chunk = conn.recv(1 << 20)
        if not chunk:
            return b""
        body += chunk
    return head


@contextmanager
def server(handler: Handler) -> Iterator[tuple[str, list[int]]]:
    """A one-thread-per-connection server; yields its address and the connections made."""
    lsock = socket.create_server(("127.0.0.1", 0))
    addr = f"127.0.0.1:{lsock.getsockname()[1]}"
    conns: list[int] = []
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        n = 0
        with conn:
            while not stop.is_set():
                if not read_request(conn):
                    return
                n += 1
                if not handler(conn, n):
                    return

    def accept() -> None:
        lsock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield addr, conns
    finally:
        stop.set()
        lsock.close()
        t.join(5)


def ok(conn: socket.socket, n: int) -> bool:
    conn.sendall(OK)
    return True


def test_keep_alive_reuses_one_connection() -> None:
    with server(ok) as (addr, conns):
        t = LeanTransport()
        for _ in range(20):
            r = t.request("POST", addr, "/x", b"body", [("Content-Type", "a/b")], timeout=2)
            assert (r.status, r.content, r.headers["content-type"]) == (200, b"ok", "text/plain")
        t.close()
    assert len(conns) == 1


def test_chunked_answer() -> None:
    def chunked(conn: socket.socket, n: int) -> bool:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        return True

    with server(chunked) as (addr, _):
        t = LeanTransport()
        assert t.request("GET", addr, "/", timeout=2).content == b"abcde"
        assert t.request("GET", addr, "/", timeout=2).content == b"abcde"
        t.close()


def test_truncated_answer_is_a_protocol_error() -> None:
    def truncated(conn: socket.socket, n: int) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        return False  # close mid-body

    with server(truncated) as (addr, _), pytest.raises(httpx.RemoteProtocolError, match="mid"):
        LeanTransport().request("GET", addr, "/", timeout=2)


def test_garbage_answer_is_a_protocol_error() -> None:
    def garbage(conn: socket.socket, n: int) -> bool:
        conn.sendall(b"\x00\x01 this is not http\r\n\r\n")
        return True

    with server(garbage) as (addr, _), pytest.raises(httpx.RemoteProtocolError, match="malf"):
        LeanTransport().request("GET", addr, "/", timeout=2)


def test_server_closing_idle_connection_is_retried_on_a_new_one() -> None:
    def one_per_connection(conn: socket.socket, n: int) -> bool:
        conn.sendall(OK)  # keep-alive promised, then closed: the next reuse finds it stale
        return False

    with server(one_per_connection) as (addr, conns):
        t = LeanTransport()
        for _ in range(5):
            assert t.request("POST", addr, "/", b"x", timeout=2).status == 200
        t.close()
    assert len(conns) == 5


def test_silent_server_times_out_within_the_budget() -> None:
    def silent(conn: socket.socket, n: int) -> bool:
        threading.Event().wait(3)
        return False

    with server(silent) as (addr, _):
        t = LeanTransport()
        with pytest.raises(httpx.ReadTimeout):
            t.request("POST", addr, "/", b"x", timeout=0.3)


def test_refused_connection_is_a_connect_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(httpx.ConnectError):
        LeanTransport().request("GET", f"127.0.0.1:{port}", "/", timeout=1)


def test_bad_address_is_unsupported() -> None:
    with pytest.raises(httpx.UnsupportedProtocol):
        LeanTransport().request("GET", "ftp://127.0.0.1:1", "/", timeout=1)


def test_is_an_httpx_transport() -> None:
    with server(ok) as (addr, _), httpx.Client(transport=LeanTransport()) as client:
        r = client.post(f"http://{addr}/x", content=b"abc", timeout=2)
        assert (r.status_code, r.text) == (200, "ok")


def test_async_transport_reuse_errors_and_timeouts() -> None:
    def mixed(conn: socket.socket, n: int) -> bool:
        if n == 3:
            threading.Event().wait(2)  # the third request on a connection hangs
            return False
        conn.sendall(OK)
        return True

    async def main(addr: str) -> None:
        t = LeanAsyncTransport()
        assert (await t.request("POST", addr, "/", b"x", timeout=2)).content == b"ok"
        assert (await t.request("POST", addr, "/", b"x", timeout=2)).content == b"ok"
        with pytest.raises(httpx.ReadTimeout):
            await t.request("POST", addr, "/", b"x", timeout=0.3)
        # the timed-out connection was dropped: a new one serves the next request
        assert (await t.request("POST", addr, "/", b"x", timeout=2)).status == 200
        await t.aclose()

    with server(mixed) as (addr, conns):
        asyncio.run(main(addr))
    assert len(conns) == 2


def test_body_bigger_than_the_socket_buffers_is_written_whole() -> None:
    written: list[int] = []
    with server(ok) as (addr, _):
        t = LeanTransport()
        assert t.request("POST", addr, "/", b"warm", timeout=2).status == 200
        body = b"b" * (8 << 20)  # more than loopback's buffers take at once: partial sends
        r = t.request("POST", addr, "/", body, timeout=10, on_write=lambda: written.append(1))
        assert (r.status, r.content) == (200, b"ok")  # the server read all Content-Length
        t.close()
    assert written == [1]  # once, when the whole request was out (the connection was idle)


def test_server_that_reads_nothing_is_a_write_timeout() -> None:
    lsock = socket.create_server(("127.0.0.1", 0))  # never accepts: the backlog connects
    addr = f"127.0.0.1:{lsock.getsockname()[1]}"
    try:
        with pytest.raises(httpx.WriteTimeout):
            LeanTransport().request("POST", addr, "/", b"b" * (64 << 20), timeout=0.3)
    finally:
        lsock.close()
