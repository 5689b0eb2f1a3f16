"""The one-call path: what a single ``send_delayed`` costs, from one thread and from many.

One run against a one-broker ``LocalCluster`` (100-byte bodies, delay 1 h) prints:

- the fsync floor: 1 / p50 of ``fdatasync`` after a 300-byte append, in the broker's data dir;
- the request floor: the same bare client against ``benchmarks/_floor_server.py`` (the broker's
  HTTP stack writing each body to a file -- appended, or over a zero-filled one -- and
  ``fdatasync``, nothing else; and without ``fdatasync``): what one durable request costs on
  this machine before any broker logic;
- a bare client (``http.client``, keep-alive) sending one-message ``POST /v1/send``: round-trip
  p50/p99 and the broker's CPU per request; the same client sending 256-message batches: the
  broker's CPU per message;
- a one-thread ``Producer.send_delayed`` loop: msgs/s, p50/p99, client CPU per call;
- 64 threads sharing one ``Producer``; 256 asyncio tasks sharing one ``AsyncProducer``;
- the design not taken, for comparison: the same loop and 64 threads with every call
  going through the background sender (``send_async(...).result()``, linger 0).

Every phase is bounded in count and in time.

    python -m benchmarks.one_call_bench [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psutil

from benchmarks._floor_proc import floor_process
from benchmarks._suite import report
from qclient import AsyncProducer, LocalCluster, Message, Producer
from qclient.protocol import wire

BODY = b"x" * 100
DELAY_S = 3600.0
TOPIC = "one-call"


def pct(values: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of ``values`` (nearest rank), 0.0 when empty."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def fsync_floor(directory: str, n: int, seconds: float) -> dict[str, float]:
    """p50/p99 of ``fdatasync`` after a 300-byte append (what one durable ack costs at least)."""
    path = os.path.join(directory, "fsync-probe.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    times: list[float] = []
    deadline = time.monotonic() + seconds
    try:
        for _ in range(n):
            os.write(fd, b"r" * 300)
            t = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - t) * 1000)
            if time.monotonic() > deadline:
                break
    finally:
        os.close(fd)
        os.unlink(path)
    p50 = pct(times, 0.5)
    return {
        "samples": len(times),
        "p50_ms": round(p50, 3),
        "p99_ms": round(pct(times, 0.99), 3),
        "floor_msgs_per_s": round(1000 / p50, 1) if p50 else 0.0,
    }


def _request_body(n: int) -> bytes:
    msgs = [
        wire.WireMessage(
            topic=TOPIC, msg_id=uuid.uuid4().hex, body=BODY, queue_id=i % 4, delay_ms=3_600_000
        )
        for i in range(n)
    ]
    return wire.encode(wire.SendRequest(messages=msgs), wire.MSGPACK)


def bare_client(addr: str, pid: int, per_request: int, n: int, seconds: float) -> dict[str, float]:
    """Keep-alive ``http.client`` POSTs of ``per_request`` messages each: round trip and the
    broker's CPU (psutil: user + system of its process) per request and per message."""
    host, port = addr.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    headers = {"Content-Type": wire.MSGPACK}
    bodies = [_request_body(per_request) for _ in range(n + 50)]
    broker = psutil.Process(pid)
    try:
        for body in bodies[:50]:  # warm-up: connection, topic creation, code paths
            conn.request("POST", wire.BROKER_SEND, body, headers)
            conn.getresponse().read()
        lat: list[float] = []
        c0 = broker.cpu_times()
        t0 = time.perf_counter()
        deadline = time.monotonic() + seconds
        for body in bodies[50:]:
            t = time.perf_counter()
            conn.request("POST", wire.BROKER_SEND, body, headers)
            resp = conn.getresponse()
            data = resp.read()
            lat.append((time.perf_counter() - t) * 1000)
            if resp.status != 200:
                raise RuntimeError(f"broker answered {resp.status}: {data[:200]!r}")
            if time.monotonic() > deadline:
                break
        wall = time.perf_counter() - t0
        c1 = broker.cpu_times()
    finally:
        conn.close()
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    reqs = len(lat)
    return {
        "requests": reqs,
        "requests_per_s": round(reqs / wall, 1),
        "p50_ms": round(pct(lat, 0.5), 3),
        "p99_ms": round(pct(lat, 0.99), 3),
        "broker_cpu_us_per_request": round(cpu / reqs * 1e6, 1),
        "broker_cpu_us_per_msg": round(cpu / (reqs * per_request) * 1e6, 2),
    }


@contextlib.contextmanager
def floor_server(directory: str, *flags: str) -> Iterator[tuple[str, int]]:
    """``(addr, pid)`` of a running ``benchmarks._floor_server``, stopped on exit."""
    with floor_process("benchmarks._floor_server", "--dir", directory, *flags) as (port, pid):
        yield f"http://127.0.0.1:{port}", pid


def _inline(p: Producer) -> None:
    p.send_delayed(TOPIC, BODY, delay=DELAY_S)


def _via_sender(p: Producer) -> None:
    # the other design: every call through the background sender, the caller waits
    p.send_async(Message(TOPIC, BODY, delay=DELAY_S)).result()


def one_thread(p: Producer, n: int, seconds: float, send: Any = _inline) -> dict[str, float]:
    """A ``send_delayed`` loop in one thread: rate, latency, client CPU per call."""
    for _ in range(50):  # warm-up (route, connections)
        send(p)
    lat: list[float] = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    deadline = time.monotonic() + seconds
    for _ in range(n):
        t = time.perf_counter()
        send(p)
        lat.append((time.perf_counter() - t) * 1000)
        if time.monotonic() > deadline:
            break
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "calls": len(lat),
        "msgs_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(pct(lat, 0.5), 3),
        "p99_ms": round(pct(lat, 0.99), 3),
        "client_cpu_us_per_call": round(cpu / len(lat) * 1e6, 1),
    }


def many_threads(
    p: Producer, threads: int, n: int, seconds: float, send: Any = _inline
) -> dict[str, float]:
    """``threads`` threads calling ``send_delayed`` on one shared ``Producer``."""
    per = max(1, n // threads)
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads + 1)
    deadline = time.monotonic() + seconds + 5

    def work(i: int) -> None:
        mine = lat[i]
        start.wait()
        try:
            for _ in range(per):
                t = time.perf_counter()
                send(p)
                mine.append((time.perf_counter() - t) * 1000)
                if time.monotonic() > deadline:
                    return
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    cpu0 = time.process_time()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join(seconds + 30)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if errors:
        raise RuntimeError(f"{len(errors)} send(s) failed, first: {errors[0]!r}")
    flat = [x for xs in lat for x in xs]
    return {
        "threads": threads,
        "calls": len(flat),
        "msgs_per_s": round(len(flat) / wall, 1),
        "p50_ms": round(pct(flat, 0.5), 3),
        "p99_ms": round(pct(flat, 0.99), 3),
        "client_cpu_us_per_call": round(cpu / max(1, len(flat)) * 1e6, 1),
    }


def many_tasks(namesrv: str, tasks: int, n: int, seconds: float) -> dict[str, float]:
    """``tasks`` asyncio tasks awaiting ``send_delayed`` on one shared ``AsyncProducer``."""

    async def run() -> dict[str, float]:
        async with AsyncProducer(namesrv) as p:
            await asyncio.gather(*(p.send_delayed(TOPIC, BODY, delay=DELAY_S) for _ in range(50)))
            per = max(1, n // tasks)
            lat: list[float] = []
            deadline = time.monotonic() + seconds

            async def work() -> None:
                for _ in range(per):
                    t = time.perf_counter()
                    await p.send_delayed(TOPIC, BODY, delay=DELAY_S)
                    lat.append((time.perf_counter() - t) * 1000)
                    if time.monotonic() > deadline:
                        return

            cpu0, t0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(work() for _ in range(tasks)))
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            return {
                "tasks": tasks,
                "calls": len(lat),
                "msgs_per_s": round(len(lat) / wall, 1),
                "p50_ms": round(pct(lat, 0.5), 3),
                "p99_ms": round(pct(lat, 0.99), 3),
                "client_cpu_us_per_call": round(cpu / max(1, len(lat)) * 1e6, 1),
            }

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--smoke", action="store_true", help="tiny N: the same code paths, seconds")
    ap.add_argument("--seconds", type=float, default=8.0, help="time bound of each phase")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    n = 200 if args.smoke else 20_000
    secs = 3.0 if args.smoke else args.seconds
    out: dict[str, Any] = {"scenario": "one_call_bench", "body_bytes": len(BODY)}
    with tempfile.TemporaryDirectory(prefix="qc-one-call-") as data_dir:
        out["fsync"] = fsync_floor(data_dir, 200 if args.smoke else 2000, secs)
        with floor_server(data_dir) as (addr, pid):
            out["floor_one"] = bare_client(addr, pid, 1, n // 4, secs)
        with floor_server(data_dir, "--prealloc") as (addr, pid):
            out["floor_one_prealloc"] = bare_client(addr, pid, 1, n // 4, secs)
        with floor_server(data_dir, "--no-sync") as (addr, pid):
            out["floor_one_nosync"] = bare_client(addr, pid, 1, n // 4, secs)
        with LocalCluster(brokers=1, data_dir=data_dir) as cluster:
            broker = cluster.brokers[0]
            out["bare_one"] = bare_client(broker.addr, broker.pid, 1, n // 4, secs)
            out["bare_batch256"] = bare_client(
                broker.addr, broker.pid, 256, 20 if args.smoke else 400, secs
            )
            with Producer(cluster.namesrv) as p:
                out["loop"] = one_thread(p, n // 4, secs)
                out["threads64"] = many_threads(p, 64, n, secs)
            with Producer(cluster.namesrv, linger_ms=0) as p:
                out["via_sender_loop"] = one_thread(p, n // 4, secs, _via_sender)
                out["via_sender_threads64"] = many_threads(p, 64, n, secs, _via_sender)
            out["asyncio256"] = many_tasks(cluster.namesrv, 256, n, secs)
    loop_rate = out["loop"]["msgs_per_s"]
    floor = out["fsync"]["floor_msgs_per_s"]
    out["loop_vs_fsync_floor"] = round(loop_rate / floor, 3) if floor else 0.0
    out["threads64_vs_loop"] = round(out["threads64"]["msgs_per_s"] / loop_rate, 2)
    out["asyncio256_vs_loop"] = round(out["asyncio256"]["msgs_per_s"] / loop_rate, 2)
    out["throughput"] = {
        "send_delayed loop": loop_rate,
        "64 threads": out["threads64"]["msgs_per_s"],
        "256 asyncio tasks": out["asyncio256"]["msgs_per_s"],
    }

    def target(
        name: str, value: float, op: str, goal: float, floor: float | None = None
    ) -> dict[str, Any]:
        met = value >= goal if op == ">=" else value <= goal
        # floor: what the request floor server measured in this run
        return report.target(name, value, f"{op} {goal:g}", met, floor=floor)

    # the request floor: the cheaper of the two durable floor servers, by each figure
    floors = (out["floor_one"], out["floor_one_prealloc"])
    floor_one = {k: min(f[k] for f in floors) for k in ("broker_cpu_us_per_request", "p50_ms")}

    out["targets"] = [
        target("loop / fsync floor", out["loop_vs_fsync_floor"], ">=", 0.30),
        target("loop p50 ms", out["loop"]["p50_ms"], "<=", 0.7),
        target("64 threads / loop", out["threads64_vs_loop"], ">=", 10),
        target("256 asyncio tasks / loop", out["asyncio256_vs_loop"], ">=", 10),
        target(
            "broker CPU us / 1-msg request",
            out["bare_one"]["broker_cpu_us_per_request"],
            "<=",
            150,
            floor_one["broker_cpu_us_per_request"],
        ),
        target(
            "broker CPU us / msg, 256-msg batches",
            out["bare_batch256"]["broker_cpu_us_per_msg"],
            "<=",
            10,
        ),
        target(
            "bare 1-msg round trip p50 ms",
            out["bare_one"]["p50_ms"],
            "<=",
            0.5,
            floor_one["p50_ms"],
        ),
    ]
    if not args.json:
        keys = (
            "fsync",
            "floor_one",
            "floor_one_prealloc",
            "floor_one_nosync",
            "bare_one",
            "bare_batch256",
            "loop",
            "threads64",
            "asyncio256",
        )
        for key in (*keys, "via_sender_loop", "via_sender_threads64"):
            print(f"{key:14s} {out[key]}")
        for t in out["targets"]:
            floor = f", request floor {t['floor']}" if "floor" in t else ""
            met = "met " if t["met"] else "MISS"
            print(f"{met} {t['name']}: {t['value']} ({t['target']}{floor})")
    print(json.dumps(out) if args.json else "", flush=True)


if __name__ == "__main__":
    main()
