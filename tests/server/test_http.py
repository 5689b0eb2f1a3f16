"""The servers' HTTP layer on a real socket (no cluster): keep-alive, HTTP/1.0 and
``Connection: close``, pipelining, chunked bodies, size limits, error answers, a slow
client and a long-polling handler not holding up others, malformed requests, stop."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from qclient.server._http import (
    ApiError,
    Application,
    Request,
    Response,
    make_app,
    read_body,
    reply,
)
from qclient.server._serve import start_server

LIMIT = 64 * 1024


class Served:
    """An app served on an event loop in a thread; ``addr`` is its host:port."""

    def __init__(self, app: Application) -> None:
        self.loop = asyncio.new_event_loop()
        self.app = app
        started = threading.Event()

        async def main() -> None:
            self.server, self.state = await start_server(app, "127.0.0.1", 0)
            self.addr = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
            started.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(main(), self.loop).result(10)
        assert started.wait(10)

    def stop(self) -> None:
        async def down() -> None:
            self.server.close()
            await self.state.drain()

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def connect(self) -> socket.socket:
        host, port = self.addr.split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def _app(wait_s: float = 5.0) -> Application:
    release = asyncio.Event()

    async def echo(request: Request) -> Response:
        data = await request.read()
        return Response(body=data, content_type="application/octet-stream")

    async def info(request: Request) -> Response:
        return reply(
            request,
            {
                "path": request.path,
                "query": dict(request.query),
                "ct": request.content_type,
                "x": request.headers.get("x-thing"),
                "version": request.version,
                "match": dict(request.match_info),
            },
        )

    async def typed(request: Request) -> Response:
        body = await read_body(request, dict)
        return reply(request, {"got": body})

    async def boom(request: Request) -> Response:
        raise RuntimeError("a bug\nwith two lines")

    async def refuse(request: Request) -> Response:
        raise ApiError(409, "CONFLICT", "no\nway")

    async def wait(request: Request) -> Response:
        # A long poll: answers when released (or after app["wait_s"])
        try:
            await asyncio.wait_for(release.wait(), request.app["wait_s"])
        except TimeoutError:
            return Response(body=b"timeout")
        return Response(body=b"released")

    async def let_go(request: Request) -> Response:
        release.set()
        return Response(body=b"ok")

    async def pending(request: Request) -> Response:
        return Response(body=str(request.app.pending_handlers).encode())

    async def routed(request: Request) -> Response:
        return Response(body=b"routed:" + await request.read())

    def direct(body: bytes, media_type: str, answer: Callable[[Response], None]) -> Response | None:
        if body == b"boom":
            raise RuntimeError("a bug")
        if body == b"later":  # answered through the callback, in a later loop iteration
            asyncio.get_running_loop().call_soon(answer, Response(body=b"later"))
            return None
        return Response(body=b"now:" + body + b":" + media_type.encode())

    async def stamp(request: Request, handler: Any) -> Response:
        request["seen"] = True
        resp = await handler(request)
        resp.headers = {"X-Seen": str(request.get("seen"))}
        return resp

    app = make_app(LIMIT, [stamp])
    app["wait_s"] = wait_s
    app.router.add_post("/echo", echo)
    app.router.add_get("/info", info)
    app.router.add_get("/items/{name}", info)
    app.router.add_post("/typed", typed)
    app.router.add_get("/boom", boom)
    app.router.add_get("/refuse", refuse)
    app.router.add_get("/wait", wait)
    app.router.add_get("/release", let_go)
    app.router.add_get("/pending", pending)
    app.router.add_post("/direct", routed)
    app.add_direct("POST", "/direct", direct)
    return app


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(headers={"Content-Type": "application/json"}) as c:
        yield c


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served(_app())
    try:
        yield s
    finally:
        s.stop()


def _read_response(f: Any) -> tuple[int, dict[str, str], bytes]:
    """One response from a socket file: status, headers (lower-case), body."""
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    body = f.read(int(headers.get("content-length", "0")))
    return status, headers, body


def _request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def test_keep_alive_and_pipelining_answer_in_order(served: Served) -> None:
    with served.connect() as sock, sock.makefile("rb") as f:
        # three requests in one write: answered in order on the same connection
        sock.sendall(
            _request("POST", "/echo", b"one")
            + _request("GET", "/wait")  # slow: the next ones must wait their turn
            + _request("POST", "/echo", b"three")
        )
        with httpx.Client() as other:  # a second connection is not held up
            assert other.get(f"http://{served.addr}/release").text == "ok"
        answers = [_read_response(f) for _ in range(3)]
        assert [a[2] for a in answers] == [b"one", b"released", b"three"]
        assert all(a[0] == 200 and "connection" not in a[1] for a in answers)
        assert answers[0][1]["x-seen"] == "True"  # middleware and per-request storage
        sock.sendall(_request("POST", "/echo", b"again"))
        assert _read_response(f)[2] == b"again"


def test_handlers_see_the_requests_still_waiting_in_their_loop_iteration(
    served: Served,
) -> None:
    """Requests read in one loop iteration: each handler sees how many are still waiting
    to be handled after it (the broker commits at once only when none is)."""
    socks = [served.connect() for _ in range(3)]
    files = [s.makefile("rb") for s in socks]
    try:
        for s, f in zip(socks, files, strict=True):  # connected and idle
            s.sendall(_request("GET", "/pending"))
            assert _read_response(f)[2] == b"0"
        held, go = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            go.wait(10)

        served.loop.call_soon_threadsafe(hold)  # the loop reads nothing meanwhile
        assert held.wait(10)
        for s in socks:
            s.sendall(_request("GET", "/pending"))
        go.set()
        seen = sorted(_read_response(f)[2] for f in files)
        assert seen == [b"0", b"1", b"2"]
        assert served.app.pending_handlers == 0
    finally:
        for f in files:
            f.close()
        for s in socks:
            s.close()


def test_a_direct_handler_answers_a_lone_request_without_a_task(served: Served) -> None:
    ct = "Content-Type: application/json\r\n"
    with served.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(_request("POST", "/direct", b"a", ct))
        status, headers, body = _read_response(f)
        # no middleware ran (no X-Seen): the direct handler answered
        assert (status, body, "x-seen" in headers) == (200, b"now:a:application/json", False)
        sock.sendall(_request("POST", "/direct", b"later"))
        assert _read_response(f)[2] == b"later"
        # pipelined behind one in flight, or spelled otherwise: the route's handler
        sock.sendall(
            _request("POST", "/direct", b"later")
            + _request("POST", "/direct", b"b")
            + _request("POST", "/%64irect", b"c")
        )
        answers = [_read_response(f) for _ in range(3)]
        assert [a[2] for a in answers] == [b"later", b"routed:b", b"routed:c"]
        assert answers[1][1]["x-seen"] == "True"
        sock.sendall(_request("POST", "/direct", b"d", "Connection: close\r\n"))
        status, headers, body = _read_response(f)
        assert (status, body, headers["connection"]) == (
            200,
            b"now:d:application/octet-stream",
            "close",
        )
        assert f.read() == b""  # closed by the server
    with served.connect() as sock, sock.makefile("rb") as f:  # a bug in it: 500, closed
        sock.sendall(_request("POST", "/direct", b"boom"))
        status, headers, body = _read_response(f)
        assert status == 500 and headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "INTERNAL"
        assert f.read() == b""
    assert served.app.pending_handlers == 0 and served.state.in_flight == 0


def test_http10_and_connection_close_end_the_connection(served: Served) -> None:
    for head in (
        b"GET /info HTTP/1.0\r\n\r\n",
        b"GET /info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ):
        with served.connect() as sock, sock.makefile("rb") as f:
            sock.sendall(head)
            status, headers, _ = _read_response(f)
            assert status == 200 and headers["connection"] == "close"
            assert f.read() == b""  # closed by the server
    with served.connect() as sock, sock.makefile("rb") as f:  # 1.0 keep-alive: kept
        sock.sendall(b"GET /info HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
        assert _read_response(f)[0] == 200
        assert _read_response(f)[0] == 200


def test_request_fields(served: Served, client: httpx.Client) -> None:
    r = client.get(
        f"http://{served.addr}/items/a%2Fb?x=1&y=%20",
        headers={"X-Thing": "v", "Content-Type": "application/JSON; charset=utf-8"},
    )
    assert r.status_code == 200
    assert r.json() == {
        "path": "/items/a/b",
        "query": {"x": "1", "y": " "},
        "ct": "application/json",
        "x": "v",
        "version": "1.1",
        "match": {"name": "a/b"},
    }
    head = client.head(f"http://{served.addr}/info")
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) > 0


def test_chunked_body(served: Served) -> None:
    with served.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        )
        time.sleep(0.05)  # the rest in a later segment
        sock.sendall(b"6\r\n world\r\n0\r\n\r\n")
        assert _read_response(f)[2] == b"hello world"


def _error(r: httpx.Response) -> dict[str, str]:
    err: dict[str, str] = r.json()["error"]
    assert "\n" not in err["message"]
    return err


def test_error_answers_are_one_line_json(served: Served, client: httpx.Client) -> None:
    base = f"http://{served.addr}"
    r = client.get(f"{base}/nowhere")
    assert r.status_code == 404
    assert _error(r) == {"code": "NOT_FOUND", "message": "no such endpoint: GET /nowhere"}
    r = client.post(f"{base}/info")
    assert r.status_code == 405
    assert _error(r)["message"] == "method POST not allowed on /info"
    r = client.post(f"{base}/typed", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    assert _error(r)["message"].startswith("Content-Type must be application/json or")
    r = client.post(f"{base}/typed", content=b"{")
    assert r.status_code == 400 and _error(r)["code"] == "INVALID_REQUEST"
    r = client.post(
        f"{base}/typed", content=b'{"a": 1}', headers={"Content-Type": "application/json"}
    )
    assert r.json() == {"got": {"a": 1}}
    r = client.get(f"{base}/boom")
    assert r.status_code == 500
    assert _error(r) == {"code": "INTERNAL", "message": "internal error: RuntimeError"}
    r = client.get(f"{base}/refuse")
    assert r.status_code == 409 and _error(r) == {"code": "CONFLICT", "message": "no way"}
    assert client.get(f"{base}/info").status_code == 200  # still serving


def test_too_large_bodies_get_413(served: Served, client: httpx.Client) -> None:
    big = b"x" * (LIMIT + 1)
    r = client.post(f"http://{served.addr}/echo", content=big)  # Content-Length
    assert r.status_code == 413
    assert _error(r) == {
        "code": "PAYLOAD_TOO_LARGE",
        "message": f"request body larger than {LIMIT} bytes",
    }
    # chunked: refused once the chunks pass the limit; msgpack asked, msgpack answered
    r = client.post(
        f"http://{served.addr}/echo",
        content=iter([big[:40_000], big[40_000:]]),
        headers={"Content-Type": "application/msgpack"},
    )
    assert r.status_code == 413 and r.headers["content-type"] == "application/msgpack"
    assert client.post(f"http://{served.addr}/echo", content=big[:LIMIT]).content == big[:LIMIT]


def test_malformed_requests_get_400_and_a_close(served: Served) -> None:
    for raw in (
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /info HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /info HTTP/1.1\r\n" + b"X-Big: " + b"b" * 100_000 + b"\r\n\r\n",
    ):
        with served.connect() as sock, sock.makefile("rb") as f:
            sock.sendall(raw)
            status, headers, body = _read_response(f)
            assert status == 400, raw[:40]
            assert headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "INVALID_REQUEST"


def test_a_slow_client_does_not_block_others(served: Served, client: httpx.Client) -> None:
    with served.connect() as slow, served.connect() as half:
        slow.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        half.sendall(b"GET /in")  # half a request line
        t0 = time.monotonic()
        for _ in range(20):
            assert client.get(f"http://{served.addr}/info").status_code == 200
        assert time.monotonic() - t0 < 5  # (a bound against a hang, not a timing goal)
        slow.sendall(b"defghij")
        with slow.makefile("rb") as f:
            assert _read_response(f)[2] == b"abcdefghij"


def test_stop_finishes_requests_in_flight_then_closes() -> None:
    s = Served(_app(wait_s=0.5))
    try:
        with s.connect() as sock, sock.makefile("rb") as f:
            sock.sendall(_request("GET", "/wait"))
            deadline = time.monotonic() + 5
            while s.state.in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            stopper = threading.Thread(target=s.stop)
            stopper.start()
            # the waiting request still gets its answer (inside the shutdown grace) and
            # the connection is closed after it
            status, headers, body = _read_response(f)
            assert (status, body) == (200, b"timeout")
            assert headers["connection"] == "close"
            stopper.join(20)
            assert not stopper.is_alive()
    finally:
        if s.thread.is_alive():
            s.stop()
