"""Failover benchmark: one thread sends delayed messages while one of two brokers is
killed (``kill -9``, then restarted) or hung (SIGSTOP, then SIGCONT); with latency fault
tolerance on (the qclient default) and off (the RocketMQ default), side by side.

Prints, per case: errors surfaced to the caller, p50/p99/max send latency before,
during and after the fault, and the time from recovery until the broker is back in use.

    python -m benchmarks.failover_bench [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from qclient import LocalCluster, Producer
from qclient.errors import QClientError


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p * len(s)))], 1)


def _summary(lat_ms: list[float]) -> dict[str, float]:
    return {"n": len(lat_ms), "p50_ms": _pct(lat_ms, 0.5), "p99_ms": _pct(lat_ms, 0.99),
            "max_ms": round(max(lat_ms), 1) if lat_ms else 0.0}


def run_case(cluster: LocalCluster, fault: str, ft: bool, *, n_before: int, during_s: float,
             n_after: int, back_cap_s: float) -> dict[str, Any]:
    """One case on a running cluster; leaves both brokers serving."""
    victim = cluster.brokers[0]
    topic = f"fo_{fault}_{'on' if ft else 'off'}"
    phases: dict[str, list[float]] = {"before": [], "during": [], "recovery": [], "after": []}
    t_s: list[float] = []
    lat: list[float] = []
    events: list[list[Any]] = []
    errors = 0
    with Producer(cluster.namesrv, send_latency_fault_enable=ft, start_detector_enable=ft,
                  send_timeout=3.0) as p:
        t_run = time.monotonic()

        def send(phase: str) -> str | None:
            nonlocal errors
            t0 = time.monotonic()
            try:
                broker = p.send_delayed(topic, b"x" * 100, delay=1.0).broker_name
            except QClientError:
                errors += phase in ("during", "recovery")
                broker = None
            ms = (time.monotonic() - t0) * 1000
            phases[phase].append(ms)
            t_s.append(round(t0 - t_run, 4))
            lat.append(round(ms, 2))
            return broker

        for _ in range(n_before):
            send("before")
        events.append([round(time.monotonic() - t_run, 3), "kill -9" if fault == "kill"
                       else "SIGSTOP"])
        victim.kill() if fault == "kill" else victim.pause()
        end = time.monotonic() + during_s
        while time.monotonic() < end:
            send("during")
        if fault == "kill":
            victim.start()
        else:
            victim.resume()
        recovered = time.monotonic()
        events.append([round(recovered - t_run, 3), "restarted" if fault == "kill"
                       else "SIGCONT"])
        back_s: float | None = None
        while time.monotonic() - recovered < back_cap_s:
            if send("recovery") == victim.name:
                back_s = round(time.monotonic() - recovered, 2)
                break
        for _ in range(n_after):
            send("after")
    return {
        "fault": fault, "fault_tolerance": ft, "errors_surfaced": errors,
        "back_in_use_s": back_s if back_s is not None else -1.0,
        **{ph: _summary(v) for ph, v in phases.items()},
        "timeline": {"t_s": t_s, "latency_ms": lat, "events": events},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--smoke", action="store_true", help="tiny run, a few seconds per case")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    n_before, during_s, n_after, cap = (20, 1.5, 20, 10.0) if args.smoke else (300, 8.0, 300,
                                                                                40.0)
    cases = []
    # a long broker expiry keeps the faulty broker in the route, as RocketMQ's 120 s does:
    # what is measured is the producer, not the name server dropping the broker
    with LocalCluster(2, broker_expire=60.0) as cluster:
        for fault in ("kill", "hang"):
            for ft in (True, False):
                cases.append(run_case(cluster, fault, ft, n_before=n_before,
                                      during_s=during_s, n_after=n_after, back_cap_s=cap))
    head = (f"{'case':<14}{'errors':>7}  {'before p50/p99/max ms':>24}  "
            f"{'during p50/p99/max ms':>24}  {'sends during':>12}  "
            f"{'after p50/p99/max ms':>24}  {'back in use':>11}")
    print(head)
    for c in cases:
        def fmt(ph: dict[str, float]) -> str:
            return f"{ph['p50_ms']:.1f}/{ph['p99_ms']:.1f}/{ph['max_ms']:.1f}"

        name = f"{c['fault']} FT {'on' if c['fault_tolerance'] else 'off'}"
        back = f"{c['back_in_use_s']:.2f} s" if c["back_in_use_s"] >= 0 else "never"
        print(f"{name:<14}{c['errors_surfaced']:>7}  {fmt(c['before']):>24}  "
              f"{fmt(c['during']):>24}  {c['during']['n']:>12}  {fmt(c['after']):>24}  "
              f"{back:>11}")
    if args.json:
        out: dict[str, Any] = {"smoke": args.smoke, "timeline": {}, "targets": [],
                               "notes": ["send_timeout=3 s, retry_times=2: a per-attempt "
                                         "share of 1 s; broker_expire=60 s"]}
        for c in cases:
            key = f"{c['fault']}_ft_{'on' if c['fault_tolerance'] else 'off'}"
            out["timeline"][key] = c.pop("timeline")
            out[key] = c
        on_hang = out["hang_ft_on"]
        out["targets"] = [
            {"name": "hang, FT on: max send latency during (ms)",
             "value": on_hang["during"]["max_ms"], "target": "< 1500",
             "met": on_hang["during"]["max_ms"] < 1500},
            {"name": "kill, FT on: errors surfaced", "value": out["kill_ft_on"][
                "errors_surfaced"], "target": "<= 2",
             "met": out["kill_ft_on"]["errors_surfaced"] <= 2},
            {"name": "hang, FT on: back in use after SIGCONT (s)",
             "value": on_hang["back_in_use_s"], "target": "<= 30",
             "met": 0 <= on_hang["back_in_use_s"] <= 30},
        ]
        print(json.dumps(out))


if __name__ == "__main__":
    main()
