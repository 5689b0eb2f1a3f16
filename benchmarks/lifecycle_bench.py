"""Lookup, cancel and reschedule by id among a million far-future messages, and what the
on-disk id index costs in broker memory.

    python -m benchmarks.lifecycle_bench [--n 1000000] [--ops 300] [--max-seconds 400]
                                         [--json] [--smoke]

For the broker with the id index (the default) and without it (``--store-option
id_index=false``), each on a fresh one-broker ``LocalCluster``:

1. schedule N x 100 B messages a week ahead (spread over an hour), msgpack batches of 1000
   posted straight to ``/v1/send`` by 4 connections (fsync before each ack); broker RSS
   before and after, and the broker's CPU time per message stored (what the index costs);
2. ``--ops`` random ids (spread over the whole backlog) are looked up, a third of them
   cancelled and another third rescheduled (an hour later), one request at a time over one
   keep-alive connection: client-observed latency p50 / p99 / max per operation, and the
   broker's CPU time per operation (psutil, user + system). Without the index only ids
   still in the dedupe window (the newest ``dedupe_max_ids``) can be found: the share
   found is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil

from benchmarks._broker_http import post_bodies, store_stats
from qclient import LocalCluster
from qclient.protocol import wire

log = logging.getLogger(__name__)

CHUNK = 1000
BODY = b"x" * 100
TOPIC = "bench-lifecycle"
WEEK_MS = 7 * 86_400_000
SPREAD_MS = 3_600_000
CONCURRENCY = 4


def _bodies(prefix: str, n: int, base_ms: int) -> Iterator[bytes]:
    for start in range(0, n, CHUNK):
        msgs = [
            wire.WireMessage(
                topic=TOPIC,
                queue_id=k % 4,
                msg_id=f"{prefix}-{k}",
                body=BODY,
                deliver_at_ms=base_ms + (k * SPREAD_MS) // n,
            )
            for k in range(start, min(n, start + CHUNK))
        ]
        yield wire.encode(wire.SendRequest(msgs), wire.MSGPACK)


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p * len(s)))], 3)


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _ops(addr: str, proc: psutil.Process, prefix: str, n: int, ops: int) -> dict[str, Any]:
    rng = random.Random(7)
    ks = rng.sample(range(n), min(ops, n))
    third = len(ks) // 3
    plan: list[tuple[str, str, Any, type[Any]]] = []
    for k in ks:
        plan.append(
            (
                "lookup",
                wire.BROKER_LOOKUP,
                wire.LookupRequest(TOPIC, f"{prefix}-{k}"),
                wire.LookupResponse,
            )
        )
    for k in ks[:third]:
        plan.append(
            (
                "cancel",
                wire.BROKER_CANCEL,
                wire.CancelRequest(TOPIC, f"{prefix}-{k}"),
                wire.CancelResponse,
            )
        )
    for k in ks[third : 2 * third]:
        req = wire.RescheduleRequest(TOPIC, f"{prefix}-{k}", delay_ms=WEEK_MS + SPREAD_MS)
        plan.append(("reschedule", wire.BROKER_RESCHEDULE, req, wire.RescheduleResponse))
    out: dict[str, Any] = {}
    headers = {"content-type": wire.MSGPACK}
    with httpx.Client(base_url=f"http://{addr}", timeout=30, trust_env=False) as client:
        for op in ("lookup", "cancel", "reschedule"):
            lat: list[float] = []
            hits = 0
            cpu0 = _cpu_s(proc)
            for name, path, req, kind in plan:
                if name != op:
                    continue
                body = wire.encode(req, wire.MSGPACK)
                t0 = time.perf_counter()
                r = client.post(path, content=body, headers=headers)
                lat.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
                ans = wire.decode(r.content, kind, wire.MSGPACK)
                hits += bool(
                    getattr(ans, "found", False)
                    or getattr(ans, "cancelled", False)
                    or getattr(ans, "rescheduled", False)
                )
            cpu = _cpu_s(proc) - cpu0
            out[op] = {
                "count": len(lat),
                "found": hits,
                "p50_ms": _pct(lat, 0.5),
                "p99_ms": _pct(lat, 0.99),
                "max_ms": round(max(lat), 3) if lat else 0.0,
                "broker_cpu_ms_per_op": round(cpu * 1000 / max(1, len(lat)), 3),
            }
    return out


def bench(n: int, ops: int, index: bool, deadline: float) -> dict[str, Any]:
    prefix = f"lc{os.getpid()}{'i' if index else 'n'}"
    base_ms = int(time.time() * 1000) + WEEK_MS
    options = {} if index else {"id_index": "false"}
    with LocalCluster(brokers=1, store_options=options) as cluster:
        broker = cluster.brokers[0]
        assert broker.pid is not None
        proc = psutil.Process(broker.pid)
        time.sleep(0.5)
        rss0 = proc.memory_info().rss / 2**20
        t0 = time.monotonic()
        cpu0 = _cpu_s(proc)
        acked, _ = asyncio.run(
            post_bodies(broker.addr, _bodies(prefix, n, base_ms), CONCURRENCY, deadline, 60)
        )
        fill_s = time.monotonic() - t0
        fill_cpu = _cpu_s(proc) - cpu0
        rss1 = proc.memory_info().rss / 2**20
        stats = store_stats(broker.addr)
        res = _ops(broker.addr, proc, prefix, acked, ops) if acked else {}
        rss2 = proc.memory_info().rss / 2**20
    return {
        "index": index,
        "n": acked,
        "complete": acked == n,
        "fill_s": round(fill_s, 1),
        "fill_broker_cpu_us_per_msg": round(fill_cpu * 1e6 / max(1, acked), 2),
        "rss_start_mib": round(rss0, 1),
        "rss_filled_mib": round(rss1, 1),
        "rss_after_ops_mib": round(rss2, 1),
        "wheel_size": stats.get("wheel_size", -1),
        "dedupe_ids": stats.get("dedupe_ids", -1),
        **res,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="messages scheduled a week ahead")
    p.add_argument("--ops", type=int, default=300, help="ids looked up (1/3 cancelled, 1/3 moved)")
    p.add_argument("--max-seconds", type=float, default=400.0, help="time budget of the fills")
    p.add_argument(
        "--smoke", action="store_true", help="tiny run: n=2000, ops=30, with the index only"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.smoke:
        a.n, a.ops = 2000, 30
    end = time.monotonic() + a.max_seconds
    rows = []
    modes = (True,) if a.smoke else (True, False)  # smoke: the code paths, one cluster
    for index in modes:
        left = end - time.monotonic()
        share = left / 2 if index and len(modes) == 2 else left
        rows.append(bench(a.n, a.ops, index, time.monotonic() + share))
    out: dict[str, Any] = {"scenario": "lifecycle", "runs": rows}
    for r in rows:
        tag = "index" if r["index"] else "no_index"
        out[f"rss_filled_mib_{tag}"] = r["rss_filled_mib"]
        out[f"fill_broker_cpu_us_per_msg_{tag}"] = r["fill_broker_cpu_us_per_msg"]
        out[f"rss_growth_mib_{tag}"] = round(r["rss_filled_mib"] - r["rss_start_mib"], 1)
        for op in ("lookup", "cancel", "reschedule"):
            if op in r:
                out[f"{op}_p50_ms_{tag}"] = r[op]["p50_ms"]
                out[f"{op}_p99_ms_{tag}"] = r[op]["p99_ms"]
                out[f"{op}_found_{tag}"] = r[op]["found"]
    for r in rows:
        print(
            f"{'with' if r['index'] else 'without'} index: N={r['n']:,} filled in {r['fill_s']} s, "
            f"(broker CPU {r['fill_broker_cpu_us_per_msg']} us/msg), "
            f"RSS {r['rss_start_mib']} -> {r['rss_filled_mib']} MiB"
        )
        for op in ("lookup", "cancel", "reschedule"):
            if op in r:
                x = r[op]
                print(
                    f"  {op:<10} p50 {x['p50_ms']:>7.2f} ms  p99 {x['p99_ms']:>7.2f} ms  "
                    f"max {x['max_ms']:>7.2f} ms  found {x['found']}/{x['count']}  "
                    f"broker CPU {x['broker_cpu_ms_per_op']:.2f} ms/op"
                )
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
