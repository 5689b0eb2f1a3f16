"""What the RocketMQ remoting drivers add to a round trip, against a real NameServer.

The call is GET_ROUTEINFO_BY_TOPIC (105) for a topic nobody created: the NameServer answers
TOPIC_NOT_EXIST at once, so the round trip is the transport and the codec, not server work.
Phases (each bounded in count and in time):

- one caller, p50/p99 and client CPU per call: a bare socket loop (encode + sendall + recv +
  decode on the calling thread: no reader thread, no opaque matching) against
  ``Connection.call``; bare asyncio streams (write, ``readexactly``, decode) against
  ``AsyncConnection.call``, on asyncio and on uvloop. Each pair runs in alternating blocks
  of 100 calls, so both sides see the same load from other processes;
- throughput: 64 threads sharing one ``Connection``, 64 tasks sharing one ``AsyncConnection``,
  and ``call_many`` batches of 100;
- the waiter cycle (create, complete, wait) of the per-request slot against a
  ``threading.Event`` and a ``concurrent.futures.Future``, in-process.

A NameServer JVM (127.0.0.1, a free port, 128 MB heap) is started and killed by the run
unless ``--addr`` names one.

    python -m benchmarks.rocketmq_remoting_bench [--calls 2000] [--addr HOST:PORT] [--json]
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from qclient.engines.rocketmq.aio import AsyncConnection
from qclient.engines.rocketmq.connection import Connection
from qclient.engines.rocketmq.remoting import FrameDecoder, RemotingCommand, encode, request

LIB = Path(__file__).resolve().parent.parent / "tools" / "rocketmq" / "lib"
GET_ROUTEINFO_BY_TOPIC = 105
TOPIC_NOT_EXIST = 17
PHASE_LIMIT_S = 60.0
_LOGBACK = """<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file><encoder><pattern>%d %p %c{{1}} - %m%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="F"/></root>
</configuration>
"""


def _probe(i: int) -> RemotingCommand:
    return request(GET_ROUTEINFO_BY_TOPIC, {"topic": f"bench-none-{i}"})


def _pct(values: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of ``values`` (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))] if s else 0.0


def _latency(samples_s: list[float], cpu_s: float) -> dict[str, float]:
    n = len(samples_s)
    return {
        "calls": n,
        "p50_us": round(_pct(samples_s, 0.50) * 1e6, 1),
        "p99_us": round(_pct(samples_s, 0.99) * 1e6, 1),
        "cpu_us_per_call": round(cpu_s / n * 1e6, 1) if n else 0.0,
    }


@contextlib.contextmanager
def namesrv() -> Iterator[str]:
    """A NameServer on 127.0.0.1:<free port>; yields its address, kills it after."""
    if shutil.which("java") is None or not LIB.is_dir():
        raise SystemExit("needs java and tools/rocketmq/lib (make setup), or --addr")
    with tempfile.TemporaryDirectory(prefix="rmq-remoting-bench-") as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        conf, logback = Path(tmp, "namesrv.conf"), Path(tmp, "logback.xml")
        conf.write_text(f"listenPort={port}\nbindAddress=127.0.0.1\n")
        logback.write_text(_LOGBACK.format(log=Path(tmp, "namesrv.log")))
        cmd = ["java", "-Xms128m", "-Xmx128m", "-XX:+UseSerialGC", f"-Duser.home={tmp}"]
        cmd += [f"-Drocketmq.home.dir={tmp}", f"-Drmq.logback.configurationFile={logback}"]
        cmd += ["-cp", f"{LIB}/*", "org.apache.rocketmq.namesrv.NamesrvStartup", "-c", str(conf)]
        with open(Path(tmp, "stdout.txt"), "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 60
                while True:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"namesrv did not start (exit {proc.returncode})")
                    with (
                        contextlib.suppress(OSError),
                        socket.create_connection(("127.0.0.1", port), timeout=0.5),
                    ):
                        break
                    time.sleep(0.05)
                yield f"127.0.0.1:{port}"
            finally:
                proc.kill()
                proc.wait(10)


# --- single caller: the bare loop and the driver, interleaved -----------------------------

#: calls per block; the bare loop and the driver alternate blocks (which goes first
#: alternates too), so both see the same machine load: other JVMs share these 2 cores
BLOCK = 100
WARMUP = 3000


def _rate(n: int, wall: float, cpu: float) -> dict[str, float]:
    return {"calls": n, "calls_per_s": round(n / wall), "cpu_us_per_call": round(cpu / n * 1e6, 1)}


def _interleaved(calls: int, a: Callable[[int], Any], b: Callable[[int], Any]) -> list[Any]:
    """Warm up, then ``calls`` timed calls of each of ``a`` and ``b`` in alternating blocks;
    returns their latency figures (``cpu_us_per_call`` from process CPU per block)."""
    for i in range(WARMUP // 2):
        a(i)
        b(i)
    samples: tuple[list[float], list[float]] = ([], [])
    cpu = [0.0, 0.0]
    end = time.monotonic() + PHASE_LIMIT_S
    for r in range(max(1, calls // BLOCK)):
        order = ((0, a), (1, b)) if r % 2 == 0 else ((1, b), (0, a))
        for k, fn in order:
            out, c0 = samples[k], time.process_time()
            for i in range(BLOCK):
                t0 = time.perf_counter()
                fn(i)
                out.append(time.perf_counter() - t0)
            cpu[k] += time.process_time() - c0
        if time.monotonic() > end:
            break
    return [_latency(samples[k], cpu[k]) for k in (0, 1)]


def blocking_single(addr: str, calls: int) -> dict[str, Any]:
    """The bare socket loop (encode + sendall + recv + decode on this thread: no reader
    thread, no opaque matching) against ``Connection.call``, one thread: with its reader
    thread, and read by its callers (a producer's)."""
    host, port = addr.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as sock,
        Connection(addr) as conn,
        Connection(addr, read_by_callers=True) as own,
    ):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        dec = FrameDecoder()

        def bare(i: int) -> RemotingCommand:
            sock.sendall(encode(_probe(i)))
            while True:
                got = dec.feed(sock.recv(65536))
                if got:
                    return got[0]

        def driver(i: int) -> RemotingCommand:
            return conn.call(_probe(i), 5.0)

        def callers(i: int) -> RemotingCommand:
            return own.call(_probe(i), 5.0)

        assert bare(0).code == driver(0).code == callers(0).code == TOPIC_NOT_EXIST
        bare_res, driver_res = _interleaved(calls, bare, driver)
        _, callers_res = _interleaved(calls, bare, callers)
    return {"bare_socket": bare_res, "connection": driver_res, "callers_read": callers_res}


async def _async_interleaved(
    calls: int, a: Callable[[int], Any], b: Callable[[int], Any]
) -> list[Any]:
    """``_interleaved`` for coroutine functions."""
    for i in range(WARMUP // 2):
        await a(i)
        await b(i)
    samples: tuple[list[float], list[float]] = ([], [])
    cpu = [0.0, 0.0]
    end = time.monotonic() + PHASE_LIMIT_S
    for r in range(max(1, calls // BLOCK)):
        order = ((0, a), (1, b)) if r % 2 == 0 else ((1, b), (0, a))
        for k, fn in order:
            out, c0 = samples[k], time.process_time()
            for i in range(BLOCK):
                t0 = time.perf_counter()
                await fn(i)
                out.append(time.perf_counter() - t0)
            cpu[k] += time.process_time() - c0
        if time.monotonic() > end:
            break
    return [_latency(samples[k], cpu[k]) for k in (0, 1)]


async def async_single(addr: str, calls: int) -> dict[str, Any]:
    """Bare asyncio streams (write, ``readexactly``, decode: no futures, no matching)
    against ``AsyncConnection.call``, one task."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    conn = await AsyncConnection.connect(addr)
    dec = FrameDecoder()

    async def bare(i: int) -> RemotingCommand:
        writer.write(encode(_probe(i)))
        head = await reader.readexactly(4)
        rest = await reader.readexactly(int.from_bytes(head, "big"))
        return dec.feed(head + rest)[0]

    async def driver(i: int) -> RemotingCommand:
        return await conn.call(_probe(i), 5.0)

    try:
        assert (await bare(0)).code == (await driver(0)).code == TOPIC_NOT_EXIST
        bare_res, driver_res = await _async_interleaved(calls, bare, driver)
        return {"bare_streams": bare_res, "async_connection": driver_res}
    finally:
        writer.close()
        await conn.close()


# --- throughput ----------------------------------------------------------------------------


def threads_one_connection(
    addr: str, threads: int, per_thread: int, by_callers: bool = False
) -> dict[str, float]:
    """``threads`` threads sharing one Connection, ``per_thread`` calls each."""
    with Connection(addr, read_by_callers=by_callers) as conn:
        conn.call(_probe(0), 5.0)
        done = [0] * threads
        end = time.monotonic() + PHASE_LIMIT_S
        start = threading.Barrier(threads + 1)

        def worker(t: int) -> None:
            start.wait()
            for i in range(per_thread):
                assert conn.call(_probe(i), 10.0).code == TOPIC_NOT_EXIST
                done[t] += 1
                if time.monotonic() > end:
                    return

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        start.wait()
        t0, cpu0 = time.perf_counter(), time.process_time()
        for th in pool:
            th.join(PHASE_LIMIT_S + 10)
        return _rate(sum(done), time.perf_counter() - t0, time.process_time() - cpu0)


def call_many_batches(addr: str, batches: int, size: int = 100) -> dict[str, float]:
    """One thread, ``call_many`` of ``size`` requests at a time."""
    with Connection(addr) as conn:
        conn.call_many([_probe(i) for i in range(size)], 10.0)
        t0, cpu0, n = time.perf_counter(), time.process_time(), 0
        end = time.monotonic() + PHASE_LIMIT_S
        for _ in range(batches):
            out = conn.call_many([_probe(i) for i in range(size)], 10.0)
            n += sum(isinstance(r, RemotingCommand) for r in out)
            if time.monotonic() > end:
                break
        return _rate(n, time.perf_counter() - t0, time.process_time() - cpu0)


async def tasks_one_connection(addr: str, tasks: int, per_task: int) -> dict[str, float]:
    """``tasks`` tasks sharing one AsyncConnection, ``per_task`` calls each."""
    async with await AsyncConnection.connect(addr) as conn:
        await conn.call(_probe(0), 5.0)

        async def worker() -> int:
            for i in range(per_task):
                assert (await conn.call(_probe(i), 10.0)).code == TOPIC_NOT_EXIST
            return per_task

        t0, cpu0 = time.perf_counter(), time.process_time()
        async with asyncio.timeout(PHASE_LIMIT_S):
            n = sum(await asyncio.gather(*(worker() for _ in range(tasks))))
        return _rate(n, time.perf_counter() - t0, time.process_time() - cpu0)


def run_loop(coro_fn: Callable[[], Any], kind: str) -> Any:
    if kind == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro_fn())


# --- waiter microbenchmark -----------------------------------------------------------------


def waiter_cycles(n: int = 200_000) -> dict[str, float]:
    """ns per create + complete + wait of one request's waiter, in-process."""

    def lock() -> None:
        w = _thread.allocate_lock()
        w.acquire()
        w.release()
        w.acquire(True, 1.0)

    def event() -> None:
        e = threading.Event()
        e.set()
        e.wait(1.0)

    def future() -> None:
        f: Future[int] = Future()
        f.set_result(1)
        f.result(1.0)

    out: dict[str, float] = {}
    for name, fn in (("lock_slot", lock), ("threading_event", event), ("future", future)):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[f"{name}_ns"] = round((time.perf_counter() - t0) / n * 1e9)
    return out


def measure(addr: str, calls: int, threads: int, per_thread: int) -> dict[str, Any]:
    """Every phase against the NameServer at ``addr``."""
    res: dict[str, Any] = {"calls": calls}
    res["blocking_one_thread"] = blocking_single(addr, calls)
    res[f"connection_{threads}_threads"] = threads_one_connection(addr, threads, per_thread)
    res[f"connection_{threads}_threads_callers_read"] = threads_one_connection(
        addr, threads, per_thread, by_callers=True
    )
    res["connection_call_many_100"] = call_many_batches(addr, threads * per_thread // 100)
    kinds = ["asyncio"]
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401

        kinds.append("uvloop")
    for kind in kinds:
        res[f"{kind}_one_task"] = run_loop(lambda: async_single(addr, calls), kind)
        res[f"{kind}_{threads}_tasks"] = run_loop(
            lambda: tasks_one_connection(addr, threads, per_thread), kind
        )
    res["waiter_cycle"] = waiter_cycles()
    # p50 of the driver minus p50 of the bare loop run beside it (and, for asyncio, minus
    # the bare blocking socket loop too)
    one = res["blocking_one_thread"]
    bare_p50 = one["bare_socket"]["p50_us"]
    adds = {
        "blocking_vs_bare_socket": round(one["connection"]["p50_us"] - bare_p50, 1),
        "callers_read_vs_bare_socket": round(one["callers_read"]["p50_us"] - bare_p50, 1),
    }
    for kind in kinds:
        pair = res[f"{kind}_one_task"]
        p50 = pair["async_connection"]["p50_us"]
        adds[f"{kind}_vs_bare_streams"] = round(p50 - pair["bare_streams"]["p50_us"], 1)
        adds[f"{kind}_vs_bare_socket"] = round(p50 - bare_p50, 1)
    res["driver_adds_p50_us"] = adds
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="single-caller calls per phase")
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--per-thread", type=int, default=200)
    ap.add_argument("--addr", help="an existing NameServer (default: start one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        addr = args.addr or stack.enter_context(namesrv())
        res = measure(addr, args.calls, args.threads, args.per_thread)
    res["cpus"] = os.cpu_count()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    for key, value in res.items():
        if isinstance(value, dict):
            print(key)
            for k, v in value.items():
                print(f"    {k:24} {v}")
        else:
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
