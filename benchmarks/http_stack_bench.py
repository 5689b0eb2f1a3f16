"""Compare HTTP server stacks for the name server and broker, by measurement.

Each stack serves, in its own subprocess on 127.0.0.1, ``POST /v1/send`` (decode a msgpack
``SendRequest`` of 256 small messages with msgspec, answer a small msgpack body: the broker's
send path minus storage) and ``GET /health``. The client side is what our SDK uses: an
``httpx.Client`` (sequential, keep-alive) and an ``httpx.AsyncClient`` with 8 concurrent
tasks. Reported per stack and mode: requests/s, p50/p99 latency, server CPU seconds per 1k
requests (psutil, server process plus its children) and client CPU per 1k, median of
``--repeat`` runs. A third mode, ``health`` (sequential GET /health), isolates the stack's
own per-request cost from the msgspec decode.

    python benchmarks/http_stack_bench.py [--duration 1.5] [--repeat 3] [--json]

Internally the same file is the server: ``--serve STACK --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec

from qclient.protocol import wire

log = logging.getLogger(__name__)

STACKS = ["aiohttp", "aiohttp-uvloop", "uvicorn", "granian-asgi", "granian-rsgi", "stdlib"]
STACK_NOTES = {
    "aiohttp": "aiohttp web.Application (default asyncio loop, access log off)",
    "aiohttp-uvloop": "the same aiohttp app on uvloop",
    "uvicorn": "uvicorn + starlette, loop=uvloop, http=httptools, access log off",
    "granian-asgi": "granian (1 worker, 1 runtime thread) serving the same starlette app",
    "granian-rsgi": "granian (1 worker, 1 runtime thread), raw RSGI handler, no framework",
    "stdlib": "http.server.ThreadingHTTPServer, HTTP/1.1 keep-alive, disable_nagle_algorithm",
    "stdlib-nagle": "the same with Nagle left on (stdlib default); opt-in via --stacks",
}
N_MESSAGES = 256
ASYNC_CONCURRENCY = 8
MAX_REQUESTS = 50_000  # hard cap per phase, on top of the time bound

# --- server side (runs in the subprocess) ---------------------------------------------

_send_decoder = msgspec.msgpack.Decoder(wire.SendRequest)
_encoder = msgspec.msgpack.Encoder()


class SendAck(msgspec.Struct):
    """Small reply: what the broker would say minus the per-message results."""

    broker_name: str
    accepted: int
    first_msg_id: str


def handle_send(body: bytes) -> bytes:
    """The CPU work of /v1/send without storage: validate-decode, build a small reply."""
    req = _send_decoder.decode(body)
    return _encoder.encode(SendAck("bench-broker", len(req.messages), req.messages[0].msg_id))


HEALTH_BODY = _encoder.encode(wire.Health(status="ok", name="bench-broker", role="broker"))
CT = wire.MSGPACK


def serve_aiohttp(port: int, use_uvloop: bool = False) -> None:
    from aiohttp import web

    if use_uvloop:
        import uvloop

        uvloop.install()

    async def send(request: web.Request) -> web.Response:
        return web.Response(body=handle_send(await request.read()), content_type=CT)

    async def health(request: web.Request) -> web.Response:
        return web.Response(body=HEALTH_BODY, content_type=CT)

    app = web.Application()
    app.router.add_post(wire.BROKER_SEND, send)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def make_starlette_app() -> Any:
    """ASGI app used by uvicorn and granian-asgi (also a granian factory target)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def send(request: Request) -> Response:
        return Response(handle_send(await request.body()), media_type=CT)

    async def health(request: Request) -> Response:
        return Response(HEALTH_BODY, media_type=CT)

    return Starlette(
        routes=[
            Route(wire.BROKER_SEND, send, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


class RsgiApp:
    """Raw RSGI app for granian: the framework-free lower bound."""

    async def __call__(self, scope: Any, proto: Any) -> None:
        headers = [("content-type", CT)]
        if scope.path == wire.BROKER_SEND and scope.method == "POST":
            proto.response_bytes(200, headers, handle_send(await proto()))
        elif scope.path == "/health":
            proto.response_bytes(200, headers, HEALTH_BODY)
        else:
            proto.response_bytes(404, headers, b"")


def make_rsgi_app() -> RsgiApp:
    return RsgiApp()


def serve_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(
        make_starlette_app(),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


def serve_granian(port: int, interface: str) -> None:
    from granian import Granian

    target = "make_starlette_app" if interface == "asgi" else "make_rsgi_app"
    Granian(
        f"http_stack_bench:{target}",
        address="127.0.0.1",
        port=port,
        interface=interface,  # type: ignore[arg-type]
        workers=1,
        runtime_threads=1,
        factory=True,
        log_level="warning",  # type: ignore[arg-type]
        working_dir=Path(__file__).resolve().parent,
    ).serve()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # else delayed-ACK costs ~40 ms per keep-alive request

    def _reply(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", CT)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == wire.BROKER_SEND:
            self._reply(handle_send(body))
        else:
            self._reply(b"", 404)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(HEALTH_BODY)
        else:
            self._reply(b"", 404)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no per-request logging, like the other stacks


class _NagleHandler(_Handler):
    disable_nagle_algorithm = False  # the stdlib default, to show the delayed-ACK cost


def serve_stdlib(port: int, nagle: bool = False) -> None:
    ThreadingHTTPServer.daemon_threads = True
    handler = _NagleHandler if nagle else _Handler
    ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()


SERVERS: dict[str, Callable[[int], None]] = {
    "aiohttp": serve_aiohttp,
    "aiohttp-uvloop": lambda p: serve_aiohttp(p, use_uvloop=True),
    "uvicorn": serve_uvicorn,
    "granian-asgi": lambda p: serve_granian(p, "asgi"),
    "granian-rsgi": lambda p: serve_granian(p, "rsgi"),
    "stdlib": serve_stdlib,
    "stdlib-nagle": lambda p: serve_stdlib(p, nagle=True),
}

# --- client side ----------------------------------------------------------------------


@dataclass
class Result:
    """One stack x mode, medians over repeats."""

    stack: str
    mode: str  # a key of MODES
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    server_cpu_s_per_1k: float
    client_cpu_s_per_1k: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_body() -> bytes:
    """A SendRequest of 256 small messages (100 B bodies), as the SDK would batch it."""
    now = int(time.time() * 1000)
    msgs = [
        wire.WireMessage(
            topic="bench",
            queue_id=i % 8,
            msg_id=uuid.uuid4().hex,
            body=os.urandom(50).hex().encode(),
            key=f"k{i}",
            delay_ms=60_000,
            deliver_at_ms=None if i % 2 else now + 60_000,
        )
        for i in range(N_MESSAGES)
    ]
    return wire.encode(wire.SendRequest(messages=msgs), wire.MSGPACK)


def server_cpu(proc: Any) -> float:
    """User+system CPU seconds of the server process and all its descendants."""
    import psutil

    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def start_server(stack: str) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = free_port()
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")  # granian imports us
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", stack, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"{stack} server exited: {err[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    stop_server(proc)
    raise RuntimeError(f"{stack} server not healthy within 20 s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    import psutil

    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    for k in kids:  # granian's worker, if it outlived its parent
        with contextlib.suppress(psutil.NoSuchProcess):
            k.kill()
    if proc.stderr:
        proc.stderr.close()


def run_sync(url: str, body: bytes, duration: float) -> list[float]:
    """Sequential keep-alive POSTs for ``duration`` seconds; returns latencies (s)."""
    import httpx

    lat: list[float] = []
    headers = {"content-type": CT}
    with httpx.Client(base_url=url, timeout=10) as c:
        c.post(wire.BROKER_SEND, content=body, headers=headers).raise_for_status()  # warm
        end = time.perf_counter() + duration
        while time.perf_counter() < end and len(lat) < MAX_REQUESTS:
            t0 = time.perf_counter()
            r = c.post(wire.BROKER_SEND, content=body, headers=headers)
            lat.append(time.perf_counter() - t0)
            r.raise_for_status()
    return lat


def run_health(url: str, body: bytes, duration: float) -> list[float]:
    """Sequential keep-alive GET /health: the stack's own per-request cost, no payload."""
    import httpx

    lat: list[float] = []
    with httpx.Client(base_url=url, timeout=10) as c:
        c.get("/health").raise_for_status()  # warm
        end = time.perf_counter() + duration
        while time.perf_counter() < end and len(lat) < MAX_REQUESTS:
            t0 = time.perf_counter()
            r = c.get("/health")
            lat.append(time.perf_counter() - t0)
            r.raise_for_status()
    return lat


async def _run_async(url: str, body: bytes, duration: float) -> list[float]:
    import httpx

    lat: list[float] = []
    headers = {"content-type": CT}
    limits = httpx.Limits(max_connections=ASYNC_CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as c:
        await asyncio.gather(
            *(
                c.post(wire.BROKER_SEND, content=body, headers=headers)
                for _ in range(ASYNC_CONCURRENCY)
            )
        )  # warm: open the 8 connections
        end = time.perf_counter() + duration

        async def worker() -> None:
            while time.perf_counter() < end and len(lat) < MAX_REQUESTS:
                t0 = time.perf_counter()
                r = await c.post(wire.BROKER_SEND, content=body, headers=headers)
                lat.append(time.perf_counter() - t0)
                r.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(ASYNC_CONCURRENCY)))
    return lat


def run_async(url: str, body: bytes, duration: float) -> list[float]:
    """8 concurrent tasks on one AsyncClient for ``duration`` seconds; latencies (s)."""
    return asyncio.run(_run_async(url, body, duration))


#: sync: httpx.Client POST /v1/send; async8: AsyncClient x8 POST; health: Client GET /health
MODES: dict[str, Callable[[str, bytes, float], list[float]]] = {
    "sync": run_sync,
    "async8": run_async,
    "health": run_health,
}


def decode_cost_ms(body: bytes, n: int = 200) -> float:
    """In-process cost of handle_send alone (ms): the floor every stack pays per /v1/send."""
    handle_send(body)
    t0 = time.process_time()
    for _ in range(n):
        handle_send(body)
    return (time.process_time() - t0) / n * 1e3


def one_run(
    ps: Any, url: str, mode: str, body: bytes, duration: float
) -> tuple[float, float, float, float, float, float]:
    """One timed run: (req/s, p50 ms, p99 ms, server CPU s/1k, client CPU s/1k, requests)."""
    cpu0, ccpu0 = server_cpu(ps), time.process_time()
    t0 = time.perf_counter()
    lat = MODES[mode](url, body, duration)
    wall = time.perf_counter() - t0
    cpu, ccpu = server_cpu(ps) - cpu0, time.process_time() - ccpu0
    lat.sort()
    n_all = len(lat) + (ASYNC_CONCURRENCY if mode == "async8" else 1)  # + warm-up requests
    # wall includes the client's connect/warm-up; small and the same for every stack
    return (
        len(lat) / wall,
        lat[len(lat) // 2] * 1e3,
        lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
        cpu / n_all * 1e3,
        ccpu / n_all * 1e3,
        len(lat),
    )


def measure(
    stacks: list[str], body: bytes, duration: float, repeat: int, errors: dict[str, str]
) -> list[Result]:
    """Start every stack, then run rounds of (stack x mode) so noise bursts on this shared
    machine spread over all stacks instead of hitting one; medians over ``repeat`` rounds."""
    import psutil

    servers: dict[str, tuple[subprocess.Popen[bytes], Any, str]] = {}
    runs: dict[tuple[str, str], list[tuple[float, ...]]] = {}
    try:
        for stack in stacks:
            try:
                proc, url = start_server(stack)
            except Exception as e:  # a stack that won't start is reported, not fatal
                log.warning("%s failed: %s", stack, e)
                errors[stack] = str(e)[:500]
                continue
            servers[stack] = (proc, psutil.Process(proc.pid), url)
        for _ in range(repeat):
            for stack, (_, ps, url) in servers.items():
                for mode in MODES:
                    runs.setdefault((stack, mode), []).append(
                        one_run(ps, url, mode, body, duration)
                    )
    finally:
        for proc, _, _ in servers.values():
            stop_server(proc)
    out = []
    for (stack, mode), rs in runs.items():
        med = [statistics.median(r[i] for r in rs) for i in range(6)]
        out.append(Result(stack, mode, int(med[5]), *(round(v, 3) for v in med[:5])))
    return out


def print_table(results: list[Result]) -> None:
    print(
        f"{'stack':<16}{'mode':<8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'srv CPU s/1k':>14}{'cli CPU s/1k':>14}"
    )
    for r in results:
        print(
            f"{r.stack:<16}{r.mode:<8}{r.rps:>9.0f}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}"
            f"{r.server_cpu_s_per_1k:>14.3f}{r.client_cpu_s_per_1k:>14.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve", choices=list(SERVERS), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--stacks", default=",".join(STACKS), help=f"comma list of: {', '.join(SERVERS)}"
    )
    ap.add_argument("--duration", type=float, default=1.5, help="seconds per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode; median reported")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--smoke", action="store_true", help="tiny run: aiohttp only, one round")
    args = ap.parse_args()
    if args.smoke:
        args.stacks, args.duration, args.repeat = "aiohttp", 0.3, 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.serve:
        SERVERS[args.serve](args.port)
        return
    body = make_body()
    floor_ms = decode_cost_ms(body)
    errors: dict[str, str] = {}
    results = measure(args.stacks.split(","), body, args.duration, args.repeat, errors)
    print(
        f"body: {len(body)} B msgpack, {N_MESSAGES} messages; handler alone "
        f"{floor_ms:.3f} ms CPU; {args.repeat} runs x {args.duration}s per mode, medians; "
        f"cores={os.cpu_count()}"
    )
    print_table(results)
    if args.json:
        print(
            json.dumps(
                {
                    "bench": "http_stack",
                    "body_bytes": len(body),
                    "messages_per_request": N_MESSAGES,
                    "repeat": args.repeat,
                    "duration_s": args.duration,
                    "handler_cpu_ms": round(floor_ms, 4),
                    "stacks": STACK_NOTES,
                    "results": [asdict(r) for r in results],
                    "errors": errors,
                }
            )
        )


if __name__ == "__main__":
    main()
