"""Requests a server sends the client (flag bit 0 clear), and a broken stream, through the
blocking and asyncio drivers.

A real NameServer or broker sends NOTIFY_CONSUMER_IDS_CHANGED (40), GET_CONSUMER_RUNNING_INFO
(307) or CHECK_TRANSACTION_STATE (39) only in states a test cannot call up on demand, so the
peer here is a small scripted TCP server on 127.0.0.1 that sends exactly those frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from qclient.engines.rocketmq.aio import AsyncConnection
from qclient.engines.rocketmq.connection import Connection, RemotingConnectionError
from qclient.engines.rocketmq.remoting import (
    FrameDecoder,
    RemotingCommand,
    encode,
    request,
    response_to,
)

#: what the peer sends: a oneway notification, a request, and one the handler fails on
_SERVER_REQUESTS = [
    RemotingCommand(40, opaque=900, flag=2, ext_fields={"consumerGroup": "g"}),
    RemotingCommand(307, opaque=901, ext_fields={"consumerGroup": "g", "clientId": "c"}),
    RemotingCommand(39, opaque=902),
]
#: a frame length below the minimum (4): the stream cannot be read past it
_GARBAGE = (3).to_bytes(4, "big") + b"\0\0\0\0"


class ScriptedPeer:
    """A TCP server on 127.0.0.1 that sends ``frames`` to each client, then records the
    frames the client sends back (until EOF or 10 s)."""

    def __init__(self, frames: bytes) -> None:
        self.received: queue.SimpleQueue[RemotingCommand] = queue.SimpleQueue()
        peer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.sendall(frames)
                sock.settimeout(10)
                dec = FrameDecoder()
                with contextlib.suppress(OSError):
                    while data := sock.recv(65536):
                        for cmd in dec.feed(data):
                            peer.received.put(cmd)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))
        self._thread.start()

    def next(self, timeout: float = 5.0) -> RemotingCommand:
        return self.received.get(timeout=timeout)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@contextlib.contextmanager
def scripted_peer(frames: bytes) -> Iterator[ScriptedPeer]:
    peer = ScriptedPeer(frames)
    try:
        yield peer
    finally:
        peer.close()


def _server_frames() -> bytes:
    return b"".join(encode(c) for c in _SERVER_REQUESTS)


def _handler_answer(cmd: RemotingCommand) -> RemotingCommand | None:
    if cmd.code == 39:
        raise RuntimeError("handler failed")
    return response_to(cmd, 0, f"handled {cmd.code}")


def _check_handled(peer: ScriptedPeer) -> None:
    # the oneway notification (opaque 900) gets no answer although the handler returns one
    ok, failed = peer.next(), peer.next()
    assert (ok.opaque, ok.code, ok.flag & 1, ok.remark) == (901, 0, 1, "handled 307")
    assert (failed.opaque, failed.code, failed.flag & 1) == (902, 1, 1)  # SYSTEM_ERROR
    assert "handler failed" in (failed.remark or "")


def _check_refused(peer: ScriptedPeer) -> None:
    # the oneway notification (opaque 900) gets no answer: the first answer is 901's
    first, second = peer.next(), peer.next()
    assert [(c.opaque, c.code, c.flag & 1) for c in (first, second)] == [(901, 3, 1), (902, 3, 1)]


def test_server_requests_refused_without_handler() -> None:
    with scripted_peer(_server_frames()) as peer, Connection(peer.addr):
        _check_refused(peer)


def test_server_requests_go_to_on_request() -> None:
    seen: queue.SimpleQueue[tuple[object, RemotingCommand]] = queue.SimpleQueue()

    def on_request(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        seen.put((conn, cmd))
        return _handler_answer(cmd)

    with (
        scripted_peer(_server_frames()) as peer,
        Connection(peer.addr, on_request=on_request) as conn,
    ):
        _check_handled(peer)
        got = [seen.get(timeout=5) for _ in range(3)]
        assert all(c is conn for c, _ in got)
        assert [(r.code, r.opaque, r.ext_fields) for _, r in got] == [
            (r.code, r.opaque, r.ext_fields) for r in _SERVER_REQUESTS
        ]


def test_bad_frame_fails_the_connection() -> None:
    with scripted_peer(_GARBAGE) as peer, Connection(peer.addr) as conn:
        deadline = time.monotonic() + 5
        while not conn.closed:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with pytest.raises(RemotingConnectionError, match="protocol error"):
            conn.call(request(105, {"topic": "x"}), 1.0)


def _loop_factories() -> list[Any]:
    params: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        params.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip("no uvloop")))
    else:
        params.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return params


@pytest.mark.parametrize("loop_factory", _loop_factories())
def test_async_server_requests(loop_factory: Any) -> None:
    async def main() -> None:
        with scripted_peer(_server_frames()) as peer:
            conn = await AsyncConnection.connect(peer.addr)
            await asyncio.to_thread(_check_refused, peer)
            await conn.close()

        seen: list[RemotingCommand] = []

        async def on_request(conn: AsyncConnection, cmd: RemotingCommand) -> RemotingCommand | None:
            seen.append(cmd)
            await asyncio.sleep(0)
            return _handler_answer(cmd)

        with scripted_peer(_server_frames()) as peer:
            async with await AsyncConnection.connect(peer.addr, on_request=on_request):
                await asyncio.to_thread(_check_handled, peer)
            assert [c.opaque for c in seen] == [900, 901, 902]

        with scripted_peer(_GARBAGE) as peer:
            conn = await AsyncConnection.connect(peer.addr)
            while not conn.closed:
                await asyncio.sleep(0.005)
            with pytest.raises(RemotingConnectionError, match="protocol error"):
                await conn.call(request(105, {"topic": "x"}), 1.0)
            await conn.close()

    async def bounded() -> None:
        async with asyncio.timeout(30):
            await main()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(bounded())
