"""Where the SDK's CPU per ``send_delayed`` goes (``engines_bench --profile``): this
process's CPU per message split by thread (the caller's, the connection reader's, the
rest); on RocketMQ also the bare request through the SDK's ``Connection.call`` (its reader
thread, no producer), between the bare socket loop and ``send_delayed``; then a cProfile
of the caller's thread by its own CPU time (``time.thread_time``: waits cost nothing, so
what is left is work)."""

from __future__ import annotations

import cProfile
import io
import pstats
import threading
import time
import uuid
from collections.abc import Callable

import psutil

from benchmarks._engines_work import bare_request
from benchmarks.one_call_bench import one_thread, pct
from qclient import Producer
from qclient.engines.rocketmq.connection import Connection

__all__ = ["profile_one_call"]


def _thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def thread_split(loop: Callable[[], int]) -> dict[str, float]:
    """CPU us per call of each thread of this process over ``loop()`` (which returns how
    many calls it made; no profiler), by thread name; ``total`` is the process's."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    before, cpu0 = _thread_cpu(), time.process_time()
    calls = loop()
    after, cpu = _thread_cpu(), time.process_time() - cpu0
    names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id})
    split: dict[str, float] = {}
    for tid, used in after.items():
        name = names.get(tid, f"thread-{tid}")
        name = "caller" if name == "MainThread" else name
        us = (used - before.get(tid, 0.0)) / calls * 1e6
        if us >= 0.5:
            split[name] = split.get(name, 0.0) + round(us, 1)
    split["total"] = round(cpu / calls * 1e6, 1)
    return split


def connection_split(addr: str, broker_name: str, n: int) -> str:
    """The thread split and round trip of ``n`` bare requests through ``Connection.call``
    (after 50 warm-up calls), as one line."""
    lat: list[float] = []
    prefix = uuid.uuid4().hex[:24]
    # read by its callers, as the producer's are; open across the split
    with Connection(addr, read_by_callers=True) as conn:
        for i in range(50):
            conn.call(bare_request(prefix, i, broker_name), 10.0)

        def loop() -> int:
            for i in range(50, 50 + n):
                t = time.perf_counter()
                conn.call(bare_request(prefix, i, broker_name), 10.0)
                lat.append((time.perf_counter() - t) * 1000)
            return n

        split = thread_split(loop)
    return (
        f"bare request via Connection.call, CPU us per call by thread: {split}; "
        f"p50 {pct(lat, 0.5):.3f} ms, p99 {pct(lat, 0.99):.3f} ms\n"
    )


def profile_one_call(p: Producer, n: int, rocketmq_broker: tuple[str, str] | None) -> str:
    """The thread split of ``send_delayed`` (and on RocketMQ, ``rocketmq_broker`` =
    (address, name), of the bare request through ``Connection.call``), then the top of
    a cProfile of ``n`` one-thread ``send_delayed`` calls on the caller's thread by own
    CPU time, and by cumulative CPU time."""
    text = io.StringIO()
    if rocketmq_broker is not None:
        text.write(connection_split(*rocketmq_broker, n))
    split = thread_split(lambda: int(one_thread(p, n, 60.0)["calls"]) + 50)  # + its warm-up
    text.write(f"send_delayed, CPU us per call by thread: {split}\n")
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    one_thread(p, n, 60.0)
    prof.disable()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    return text.getvalue()
