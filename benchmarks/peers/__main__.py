"""`python -m benchmarks.peers --json [--smoke] [--n N] [--only a,b]`: the peer comparison."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
import time
from typing import Any

from benchmarks.peers import peer_specs
from benchmarks.peers.workload import Workload, run_peer

log = logging.getLogger("benchmarks.peers")

#: the smoke workload: same code paths, seconds per peer
SMOKE = Workload(n=30, min_delay_s=0.2, max_delay_s=0.6, grace_s=1.5, batch=16)


def _sigterm(signum: int, frame: Any) -> None:
    # Turn the runner's SIGTERM into an exception so every `finally` stops its servers.
    raise SystemExit(f"terminated by signal {signum}")


def run(
    *,
    smoke: bool = False,
    n: int | None = None,
    only: list[str] | None = None,
    kill_test: bool = True,
    smoke_only: bool = False,
) -> dict[str, Any]:
    """Run the selected peers; returns the scenario's JSON object."""
    base = SMOKE if smoke else Workload()
    w = dataclasses.replace(base, n=n or base.n, kill_test=kill_test)
    specs = peer_specs(only)
    rows: list[dict[str, Any]] = []
    for spec in specs:
        if smoke_only and not spec.in_smoke:
            rows.append(
                {
                    "peer": spec.label,
                    "status": "skipped",
                    "reason": "not in the quick smoke set (slow to start)",
                }
            )
            continue
        t0 = time.perf_counter()
        print(f"peers: {spec.label} ...", file=sys.stderr, flush=True)
        try:
            peer = spec.make()
        except Exception as exc:  # an adapter that cannot even be built is one failed row
            log.exception("%s: adapter failed to load", spec.label)
            row: dict[str, Any] = {
                "peer": spec.label,
                "status": "error",
                "reason": f"adapter: {exc}",
            }
        else:
            row = run_peer(peer, w, label=spec.label, batch=spec.batch)
        row["elapsed_s"] = round(time.perf_counter() - t0, 2)
        print(
            f"peers: {spec.label}: {row['status']} {row.get('reason', '')} ({row['elapsed_s']} s)",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    ok = [r for r in rows if r["status"] == "ok"]
    return {
        "scenario": "peers",
        "workload": {
            "n": w.n,
            "delay_s": [w.min_delay_s, w.max_delay_s],
            "kill_test": w.kill_test,
            "batch": w.batch,
        },
        "peers": rows,
        "throughput": {
            f"{r['peer']} enqueue": r["enqueue_msgs_per_s"]
            for r in ok
            if r.get("enqueue_msgs_per_s")
        },
        "lateness_samples_ms": {r["peer"]: r.get("samples_ms", []) for r in ok},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--smoke", action="store_true", help="tiny N and short delays")
    ap.add_argument("--n", type=int, default=None, help="messages per phase")
    ap.add_argument("--only", default="", help="comma-separated peer labels")
    ap.add_argument("--no-kill", action="store_true", help="skip the kill -9 phase")
    ap.add_argument(
        "--smoke-set",
        action="store_true",
        help="skip peers that are slow to start (used by the smoke test)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    # pika logs every connection step, and errors with tracebacks for the connections a
    # kill -9 breaks on purpose; the workload reports what matters.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGTERM, _sigterm)
    only = [s for s in args.only.split(",") if s] or None
    try:
        result = run(
            smoke=args.smoke,
            n=args.n,
            only=only,
            kill_test=not args.no_kill,
            smoke_only=args.smoke_set,
        )
    except ValueError as exc:
        print(f"peers: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        from benchmarks._suite.report import peers_table

        print(peers_table(result["peers"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
