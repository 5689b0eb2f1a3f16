"""Benchmark the delay store alone (no HTTP): group-commit throughput and firing lateness.

1. **accept**: ``--threads`` submitters, each submitting batches of 256 x 100 B messages
   (due a week ahead, so firing does not interfere) and waiting for each batch's durable
   acknowledgement, like HTTP handlers; plus a *pipelined* run where one thread keeps up to
   ``--inflight`` batches outstanding (like an asyncio app with many requests in flight).
2. **fire**: a submitter schedules ``--rate`` messages/s, each due 1 s after submission
   (ms-spread), for ``--duration`` s; afterwards every fired copy is read back and lateness
   ``fired_at - deliver_at`` is reported (p50/p99/max) with the count fired early (must be 0).

    python benchmarks/store_bench.py [--duration 3] [--rate 5000] [--threads 4] [--no-fsync]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path

from qclient.server.store import DelayStore, NewMessage, StoreConfig, wall_clock_ms

log = logging.getLogger(__name__)

BATCH = 256
BODY = b"x" * 100
MAX_MESSAGES = 5_000_000  # hard cap per run on top of the time bound


def _store(d: Path, fsync: bool) -> DelayStore:
    s = DelayStore(StoreConfig(data_dir=d, bucket_ms=60_000, load_ahead_ms=30_000, fsync=fsync))
    s.open()
    return s


def bench_accept(d: Path, duration: float, threads: int, fsync: bool) -> dict[str, float]:
    """Durably acknowledged msgs/s with ``threads`` blocking submitters."""
    s = _store(d, fsync)
    week = wall_clock_ms() + 7 * 86_400_000
    counts = [0] * threads
    stop = time.monotonic() + duration

    def run(k: int) -> None:
        i = 0
        while time.monotonic() < stop and i < MAX_MESSAGES // threads:
            batch = [
                NewMessage("bench", j % 4, f"a{k}-{j}", BODY, week + j) for j in range(i, i + BATCH)
            ]
            s.submit(batch).result()
            i += BATCH
        counts[k] = i

    t0 = time.monotonic()
    c0 = time.process_time()
    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - t0
    cpu = time.process_time() - c0
    st = s.stats()
    s.close()
    return {
        "msgs_per_s": sum(counts) / elapsed,
        "cpu_us_per_msg": cpu / max(1, sum(counts)) * 1e6,
        "fsyncs_per_s": st["fsyncs"] / elapsed,
        "avg_group_size": st["avg_group_size"],
    }


def bench_pipelined(d: Path, duration: float, inflight: int, fsync: bool) -> dict[str, float]:
    """Durably acknowledged msgs/s with up to ``inflight`` batches outstanding."""
    s = _store(d, fsync)
    week = wall_clock_ms() + 7 * 86_400_000
    pending: deque[Future[object]] = deque()
    n = 0
    t0 = time.monotonic()
    c0 = time.process_time()
    stop = t0 + duration
    while time.monotonic() < stop and n < MAX_MESSAGES:
        if len(pending) >= inflight:
            pending.popleft().result()
        batch = [NewMessage("bench", j % 4, f"p{j}", BODY, week + j) for j in range(n, n + BATCH)]
        pending.append(s.submit(batch))  # type: ignore[arg-type]
        n += BATCH
    while pending:
        pending.popleft().result()
    elapsed = time.monotonic() - t0
    cpu = time.process_time() - c0
    st = s.stats()
    s.close()
    return {
        "msgs_per_s": n / elapsed,
        "cpu_us_per_msg": cpu / max(1, n) * 1e6,
        "fsyncs_per_s": st["fsyncs"] / elapsed,
        "avg_group_size": st["avg_group_size"],
    }


def bench_fire(d: Path, duration: float, rate: int, fsync: bool) -> dict[str, float]:
    """Lateness of messages fired at ``rate``/s while new ones keep arriving."""
    s = _store(d, fsync)
    tick = 0.01
    per_tick = max(1, int(rate * tick))
    n = 0
    t0 = time.monotonic()
    next_t = t0
    while time.monotonic() < t0 + duration and n < MAX_MESSAGES:
        now = wall_clock_ms()
        batch = [
            NewMessage("fire", j % 4, f"f{j}", BODY, now + 1000 + (j - n) * 10 // per_tick)
            for j in range(n, n + per_tick)
        ]
        s.submit(batch).result()
        n += per_tick
        next_t += tick
        time.sleep(max(0.0, next_t - time.monotonic()))
    deadline = time.monotonic() + 30
    while sum(s.max_offset("fire", q) for q in range(4)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    late = []
    for q in range(4):
        off = 0
        while batch_ := s.pull("fire", q, off, 5000):
            late.extend(m.fired_at_ms - m.deliver_at_ms for m in batch_)
            off = batch_[-1].offset + 1
    s.close()
    late.sort()
    if not late:
        return {"fired": 0}
    return {
        "scheduled": n,
        "fired": len(late),
        "rate_per_s": n / duration,
        "early": sum(1 for x in late if x < 0),
        "p50_ms": late[len(late) // 2],
        "p99_ms": late[min(len(late) - 1, len(late) * 99 // 100)],
        "max_ms": late[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--dir",
        default=str(Path(__file__).resolve().parent.parent),
        help="parent of the temp data dir (default: the repo, same disk as its data)",
    )
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny run: the same code paths")
    a = ap.parse_args()
    if a.smoke:
        a.duration, a.rate = 0.3, 500
    fsync = not a.no_fsync
    base = Path(tempfile.mkdtemp(prefix="store-bench-", dir=a.dir))
    try:
        out = {
            "fsync": fsync,
            "accept_threads": bench_accept(base / "a", a.duration, a.threads, fsync),
            "accept_pipelined": bench_pipelined(base / "p", a.duration, a.inflight, fsync),
            "fire": bench_fire(base / "f", a.duration, a.rate, fsync),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    at, ap_, fi = out["accept_threads"], out["accept_pipelined"], out["fire"]

    print(
        f"fsync={fsync}  batches of {BATCH} x {len(BODY)} B  "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    print(
        f"accept, {a.threads} blocking submitters: {at['msgs_per_s']:,.0f} msgs/s "
        f"({at['fsyncs_per_s']:,.0f} fsync/s, {at['avg_group_size']:.0f} msgs/group, "
        f"{at['cpu_us_per_msg']:.1f} us CPU/msg)"
    )
    print(
        f"accept, pipelined x{a.inflight}:        {ap_['msgs_per_s']:,.0f} msgs/s "
        f"({ap_['fsyncs_per_s']:,.0f} fsync/s, {ap_['avg_group_size']:.0f} msgs/group, "
        f"{ap_['cpu_us_per_msg']:.1f} us CPU/msg)"
    )
    print(
        f"fire at {fi.get('rate_per_s', 0):,.0f} due msgs/s: "
        f"{fi['fired']}/{fi.get('scheduled', 0)} fired, "
        f"early {fi.get('early')}, lateness p50 {fi.get('p50_ms')} ms, p99 {fi.get('p99_ms')} ms, "
        f"max {fi.get('max_ms')} ms"
    )


if __name__ == "__main__":
    main()
