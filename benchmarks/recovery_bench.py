"""Crash recovery time vs backlog size, and broker memory vs a far-future backlog.

    python -m benchmarks.recovery_bench [--sizes 10000,100000,1000000] [--max-seconds 240]
                                        [--body-bytes 100] [--json] [--smoke]

For each size N, on a fresh one-broker ``LocalCluster``:

1. schedule N x 100 B (``--body-bytes``) messages a week ahead (spread over an hour),
   msgpack batches of 1000 posted straight to ``/v1/send`` by 4 concurrent connections
   (fsync before each ack);
2. broker RSS before and after; then ``kill -9`` the broker and time ``start()``, which
   returns once the restarted broker serves (store recovered) -> recovery seconds;
3. RSS after the restart, the store stats (``wheel_size`` must be 0: nothing a week ahead
   is loaded; ``unloaded_buckets``/``dedupe_ids``/``log_bytes`` show the backlog is known),
   and a few of the messages are cancelled (each must answer ``cancelled``).

Sizes that would not fit in ``--max-seconds`` (estimated from the previous size) are skipped
with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
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
BODY_BYTES = 100
TOPIC = "bench-recovery"
WEEK_MS = 7 * 86_400_000
SPREAD_MS = 3_600_000  # due times spread over one hour, a week ahead
N_CANCEL = 5
CONCURRENCY = 4


def _deliver_at(base_ms: int, k: int, n: int) -> int:
    return base_ms + (k * SPREAD_MS) // max(1, n)


def _bodies(prefix: str, n: int, base_ms: int, body: bytes) -> Iterator[bytes]:
    """msgpack SendRequest bodies of CHUNK messages each, made lazily (1M do not fit well)."""
    for start in range(0, n, CHUNK):
        msgs = [
            wire.WireMessage(
                topic=TOPIC,
                queue_id=k % 4,
                msg_id=f"{prefix}-{k}",
                body=body,
                deliver_at_ms=_deliver_at(base_ms, k, n),
            )
            for k in range(start, min(n, start + CHUNK))
        ]
        yield wire.encode(wire.SendRequest(msgs), wire.MSGPACK)


def _rss_mib(pid: int | None) -> float:
    assert pid is not None
    return psutil.Process(pid).memory_info().rss / 2**20


def _cancel_some(addr: str, prefix: str, n: int, base_ms: int) -> tuple[int, int]:
    """Cancel a few messages spread over the backlog; returns (cancelled, tried)."""
    ks = sorted({(i * n) // N_CANCEL for i in range(N_CANCEL)} | {n - 1})
    done = 0
    with httpx.Client(base_url=f"http://{addr}", timeout=30, trust_env=False) as client:
        for k in ks:
            req = wire.CancelRequest(TOPIC, f"{prefix}-{k}", _deliver_at(base_ms, k, n))
            r = client.post(
                wire.BROKER_CANCEL,
                content=wire.encode(req, wire.MSGPACK),
                headers={"content-type": wire.MSGPACK},
            )
            r.raise_for_status()
            resp = wire.decode(r.content, wire.CancelResponse, wire.MSGPACK)
            done += resp.cancelled
            if not resp.cancelled:
                log.warning("cancel of %s-%d after restart: %s", prefix, k, resp.reason)
    return done, len(ks)


def bench_size(n: int, deadline: float, body_bytes: int = BODY_BYTES) -> dict[str, Any]:
    """Fill one fresh broker with n far-future messages, crash it, time the restart."""
    prefix = f"rec{os.getpid()}-{n}"
    base_ms = int(time.time() * 1000) + WEEK_MS
    with LocalCluster(brokers=1) as cluster:
        broker = cluster.brokers[0]
        time.sleep(0.5)  # let the fresh process settle before the baseline RSS
        rss0 = _rss_mib(broker.pid)
        t0 = time.monotonic()
        bodies = _bodies(prefix, n, base_ms, b"x" * body_bytes)
        acked, _ = asyncio.run(post_bodies(broker.addr, bodies, CONCURRENCY, deadline, timeout=60))
        fill_s = time.monotonic() - t0
        rss1 = _rss_mib(broker.pid)
        before = store_stats(broker.addr)
        broker.kill()
        t1 = time.monotonic()
        broker.start(timeout=max(30.0, deadline - t1 + 30))
        recovery_s = time.monotonic() - t1
        rss2 = _rss_mib(broker.pid)
        after = store_stats(broker.addr)
        cancelled, tried = _cancel_some(broker.addr, prefix, n, base_ms) if acked == n else (0, 0)
    return {
        "n": n,
        "body_bytes": body_bytes,
        "acked": acked,
        "complete": acked == n,
        "fill_s": round(fill_s, 3),
        "fill_msgs_per_s": round(acked / fill_s, 1) if fill_s else 0.0,
        "rss_start_mib": round(rss0, 1),
        "rss_filled_mib": round(rss1, 1),
        "rss_growth_mib": round(rss1 - rss0, 1),
        "rss_per_1k_msgs_kib": round((rss1 - rss0) * 1024 / max(1, acked) * 1000, 1),
        "recovery_s": round(recovery_s, 3),
        "rss_restarted_mib": round(rss2, 1),
        "log_bytes": after.get("log_bytes", 0),
        "wheel_size_before": before.get("wheel_size", -1),
        "wheel_size_after": after.get("wheel_size", -1),
        "unloaded_buckets_after": after.get("unloaded_buckets", -1),
        "dedupe_ids_after": after.get("dedupe_ids", -1),
        "cancelled_after_restart": cancelled,
        "cancel_tried": tried,
    }


def run(sizes: list[int], max_seconds: float, body_bytes: int = BODY_BYTES) -> dict[str, Any]:
    """Every size in order, skipping those the time budget cannot hold."""
    t_start = time.monotonic()
    end = t_start + max_seconds
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    per_msg_s: float | None = None  # seconds per message (fill + recovery) of the last size
    for n in sizes:
        left = end - time.monotonic()
        est = 3.0 + (per_msg_s * n if per_msg_s is not None else 0.0)
        if est > left:
            notes.append(
                f"N={n:,} skipped: estimated {est:.0f} s > {left:.0f} s left of "
                f"--max-seconds {max_seconds:.0f}"
            )
            log.warning(notes[-1])
            continue
        row = bench_size(n, end, body_bytes)
        if not row["complete"]:
            notes.append(f"N={n:,}: only {row['acked']:,} scheduled before the time budget ran out")
        rows.append(row)
        per_msg_s = (row["fill_s"] + row["recovery_s"]) / max(1, row["acked"])
        print(f"N={n:,}: recovery {row['recovery_s']:.2f} s", file=sys.stderr)
    out: dict[str, Any] = {"scenario": "recovery", "sizes": rows, "notes": notes}
    for row in rows:  # flat keys for the report's table
        out[f"recovery_s_{row['n']}"] = row["recovery_s"]
        out[f"rss_filled_mib_{row['n']}"] = row["rss_filled_mib"]
    out["throughput"] = {f"fill far-future N={r['n']:,}": r["fill_msgs_per_s"] for r in rows}
    out["targets"] = [
        {
            "name": f"wheel empty after restart (N={r['n']:,})",
            "value": r["wheel_size_after"],
            "target": "== 0",
            "met": r["wheel_size_after"] == 0,
        }
        for r in rows
    ] + [
        {
            "name": f"cancel after restart (N={r['n']:,})",
            "value": r["cancelled_after_restart"],
            "target": f"== {r['cancel_tried']} (all tried)",
            "met": r["cancelled_after_restart"] == r["cancel_tried"] > 0,
        }
        for r in rows
        if r["complete"]
    ]
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'N':>10} {'fill msg/s':>11} {'RSS start':>10} {'RSS full':>9} {'recover s':>10} "
        f"{'RSS after':>10} {'wheel':>6} {'unloaded':>9} {'dedupe':>8} {'cancel':>7}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['acked']:>10,} {r['fill_msgs_per_s']:>11,.0f} {r['rss_start_mib']:>8.1f}MB "
            f"{r['rss_filled_mib']:>7.1f}MB {r['recovery_s']:>10.2f} "
            f"{r['rss_restarted_mib']:>8.1f}MB {r['wheel_size_after']:>6} "
            f"{r['unloaded_buckets_after']:>9} {r['dedupe_ids_after']:>8} "
            f"{r['cancelled_after_restart']:>3}/{r['cancel_tried']:<3}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated backlogs")
    p.add_argument("--max-seconds", type=float, default=240.0, help="time budget of the run")
    p.add_argument("--body-bytes", type=int, default=BODY_BYTES, help="message body size")
    p.add_argument("--smoke", action="store_true", help="tiny run: sizes 2000,5000")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    # SIGTERM (the runner's time limit) unwinds the LocalCluster context: brokers stopped
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.smoke:
        a.sizes = "2000,5000"
    sizes = [int(s) for s in a.sizes.split(",") if s.strip()]
    res = run(sizes, a.max_seconds, a.body_bytes)
    print(_table(res["sizes"]))
    for note in res["notes"]:
        print(f"note: {note}")
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
