"""A tiny real HTTP name server + brokers on 127.0.0.1 that misbehave on cue.

Used where respx cannot model the failure (a broker that accepts the connection and
never answers, a health endpoint that comes back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from qclient.protocol.wire import (
    MSGPACK,
    ErrorBody,
    ErrorResponse,
    MessageResult,
    SendRequest,
    SendResponse,
    decode,
    encode,
)

from .conftest import route


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on a hung request: nothing to report


class FakeBroker:
    """mode: "ok", "hang" (read the request, answer only when released), "busy" (503)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "ok"
        self.health_ok = True
        self.sends = 0
        self.reject_ids: set[str] = set()  # answered INVALID_MESSAGE
        self.messages: list[Any] = []
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        broker = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", MSGPACK)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/health":
                    if broker.mode == "hang" or not broker.health_ok:
                        broker.release.wait(30)
                    self._reply(200, b"\x80")
                else:
                    self._reply(404, b"\x80")

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                req = decode(body, SendRequest, MSGPACK)
                with broker.lock:
                    broker.sends += 1
                mode = broker.mode
                if mode == "hang":
                    broker.release.wait(30)
                if mode == "busy":
                    self._reply(
                        503,
                        encode(
                            ErrorResponse(error=ErrorBody(code="BROKER_BUSY", message="busy")),
                            MSGPACK,
                        ),
                    )
                    return
                with broker.lock:
                    broker.messages.extend(req.messages)
                self._reply(
                    200,
                    encode(
                        SendResponse(
                            broker_name=broker.name,
                            results=[
                                MessageResult(
                                    msg_id=m.msg_id,
                                    queue_id=m.queue_id,
                                    status="INVALID_MESSAGE"
                                    if m.msg_id in broker.reject_ids
                                    else "SEND_OK",
                                    deliver_at_ms=int(time.time() * 1000) + (m.delay_ms or 0),
                                )
                                for m in req.messages
                            ],
                        ),
                        MSGPACK,
                    ),
                )

        return H

    def start(self) -> FakeBroker:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class FakeNameServer:
    def __init__(self, brokers: list[FakeBroker], queues: int = 4) -> None:
        self.route = route("t", {b.name: b.addr for b in brokers}, queues)
        self.calls = 0
        ns = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                ns.calls += 1
                body = encode(ns.route, MSGPACK)
                self.send_response(200)
                self.send_header("Content-Type", MSGPACK)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = _Server(("127.0.0.1", 0), H)
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def fake_cluster(n: int = 2) -> Iterator[tuple[FakeNameServer, list[FakeBroker]]]:
    brokers = [FakeBroker(f"broker-{chr(97 + i)}").start() for i in range(n)]
    ns = FakeNameServer(brokers)
    try:
        yield ns, brokers
    finally:
        ns.stop()
        for b in brokers:
            b.stop()


def wait_until(cond: Any, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())
