"""Where the SDK's CPU per ``send_delayed`` goes (``engines_bench --profile``): this
process's CPU per message split by thread (the caller's, the connection reader's, the
rest), then a cProfile of the caller's thread by its own CPU time (``time.thread_time``:
waits cost nothing, so what is left is work)."""

from __future__ import annotations

import cProfile
import io
import pstats
import threading
import time

import psutil

from benchmarks.one_call_bench import one_thread
from qclient import Producer

__all__ = ["profile_one_call"]


def _thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def thread_split(p: Producer, n: int) -> dict[str, float]:
    """CPU us per ``send_delayed`` of each thread of this process over an ``n``-call loop
    (no profiler), by thread name; ``total`` is the process's."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    before, cpu0 = _thread_cpu(), time.process_time()
    calls = one_thread(p, n, 60.0)["calls"] + 50  # its warm-up calls count too
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


def profile_one_call(p: Producer, n: int) -> str:
    """The thread split, then the top of a cProfile of ``n`` one-thread ``send_delayed``
    calls on the caller's thread by own CPU time, and by cumulative CPU time."""
    split = thread_split(p, n)
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    one_thread(p, n, 60.0)
    prof.disable()
    text = io.StringIO()
    text.write(f"CPU us per send_delayed by thread: {split}\n")
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    return text.getvalue()
