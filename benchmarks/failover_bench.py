"""Failover benchmark: one thread sends delayed messages while one of two brokers is
killed (``kill -9``, then restarted), hung (SIGSTOP, then SIGCONT) or slow (reached
through a latency-injecting TCP proxy that holds each client-to-broker chunk for
``--slow-ms``, then passes through again); with latency fault tolerance on (the qclient
default) and off (the RocketMQ default), side by side.

Prints, per case: errors surfaced to the caller, p50/p99/max send latency before,
during and after the fault, and the time from recovery until the broker is back in use.

    python -m benchmarks.failover_bench [--json] [--smoke] [--slow-ms 600]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks._latency_proxy import LatencyProxy
from qclient import LocalCluster, Producer
from qclient.cluster import NodeHandle
from qclient.errors import QClientError

log = logging.getLogger(__name__)

# the fault: (event label, action) to start it and to end it
Fault = tuple[tuple[str, Callable[[], None]], tuple[str, Callable[[], None]]]


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p * len(s)))], 1)


def _summary(lat_ms: list[float]) -> dict[str, float]:
    return {
        "n": len(lat_ms),
        "p50_ms": _pct(lat_ms, 0.5),
        "p99_ms": _pct(lat_ms, 0.99),
        "max_ms": round(max(lat_ms), 1) if lat_ms else 0.0,
    }


def kill_or_hang(victim: NodeHandle, fault: str) -> Fault:
    """kill -9 then restart, or SIGSTOP then SIGCONT."""
    if fault == "kill":
        return ("kill -9", victim.kill), ("restarted", victim.start)
    return ("SIGSTOP", victim.pause), ("SIGCONT", victim.resume)


def slow(proxy: LatencyProxy, slow_ms: float) -> Fault:
    """The proxy in front of the victim adds ``slow_ms`` per request, then 0 again."""
    return (
        (f"slow on ({slow_ms:.0f} ms)", lambda: proxy.set_delay(slow_ms / 1000)),
        ("slow off", lambda: proxy.set_delay(0.0)),
    )


def run_case(
    cluster: LocalCluster,
    victim: NodeHandle,
    fault: str,
    actions: Fault,
    ft: bool,
    *,
    n_before: int,
    during_s: float,
    n_after: int,
    back_cap_s: float,
) -> dict[str, Any]:
    """One case on a running cluster; leaves both brokers serving."""
    (start_label, start_fault), (end_label, end_fault) = actions
    topic = f"fo_{fault}_{'on' if ft else 'off'}"
    phases: dict[str, list[float]] = {"before": [], "during": [], "recovery": [], "after": []}
    t_s: list[float] = []
    lat: list[float] = []
    events: list[list[Any]] = []
    errors = 0
    during_to_victim = 0
    with Producer(
        cluster.namesrv, send_latency_fault_enable=ft, start_detector_enable=ft, send_timeout=3.0
    ) as p:
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
        events.append([round(time.monotonic() - t_run, 3), start_label])
        start_fault()
        end = time.monotonic() + during_s
        while time.monotonic() < end:
            to = send("during")
            during_to_victim += to == victim.name
        end_fault()
        recovered = time.monotonic()
        events.append([round(recovered - t_run, 3), end_label])
        back_s: float | None = None
        while time.monotonic() - recovered < back_cap_s:
            if send("recovery") == victim.name:
                back_s = round(time.monotonic() - recovered, 2)
                break
        for _ in range(n_after):
            send("after")
    return {
        "fault": fault,
        "fault_tolerance": ft,
        "errors_surfaced": errors,
        "during_sends_to_faulty": during_to_victim,
        "back_in_use_s": back_s if back_s is not None else -1.0,
        **{ph: _summary(v) for ph, v in phases.items()},
        "timeline": {"t_s": t_s, "latency_ms": lat, "events": events},
    }


@contextmanager
def slow_cluster(
    broker_expire: float,
) -> Iterator[tuple[LocalCluster, NodeHandle, LatencyProxy]]:
    """A name server, broker-a direct, and broker-b that registers the proxy's address.

    LocalCluster gives all its brokers the same arguments, so broker-b is started here
    with ``--advertise-addr`` of the proxy; every client byte to it goes through the proxy.
    """
    proxy = LatencyProxy().start()
    victim: NodeHandle | None = None
    try:
        with LocalCluster(1, broker_expire=broker_expire) as cluster:
            try:
                victim = NodeHandle(
                    "broker-b",
                    "broker",
                    [
                        "--name",
                        "broker-b",
                        "--data-dir",
                        str(cluster.data_dir / "broker-b"),
                        "--heartbeat-interval",
                        "1.0",
                        "--namesrv",
                        cluster.namesrv,
                        "--advertise-addr",
                        f"{proxy.host}:{proxy.port}",
                    ],
                    cluster.data_dir,
                )
                victim.start()
                proxy.set_upstream(victim.host, victim.port)
                cluster.wait_registered(["broker-a", "broker-b"])
                yield cluster, victim, proxy
            finally:
                if victim is not None:
                    victim.stop()
    finally:
        proxy.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--smoke", action="store_true", help="tiny run, a few seconds per case")
    ap.add_argument(
        "--slow-ms",
        type=float,
        default=600.0,
        help="delay the proxy adds to each request to the slow broker (ms)",
    )
    ap.add_argument(
        "--faults",
        default="kill,hang,slow",
        help="comma-separated subset of kill,hang,slow (all by default)",
    )
    args = ap.parse_args()
    faults = [f for f in ("kill", "hang", "slow") if f in args.faults.split(",")]
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    n_before, during_s, n_after, cap = (20, 1.5, 20, 10.0) if args.smoke else (300, 8.0, 300, 40.0)
    cases = []
    # a long broker expiry keeps the faulty broker in the route, as RocketMQ's 120 s does:
    # what is measured is the producer, not the name server dropping the broker
    sizes: dict[str, Any] = {
        "n_before": n_before,
        "during_s": during_s,
        "n_after": n_after,
        "back_cap_s": cap,
    }
    if {"kill", "hang"} & set(faults):
        with LocalCluster(2, broker_expire=60.0) as cluster:
            victim = cluster.brokers[0]
            for fault in faults:
                if fault == "slow":
                    continue
                for ft in (True, False):
                    cases.append(
                        run_case(cluster, victim, fault, kill_or_hang(victim, fault), ft, **sizes)
                    )
    # a cluster of its own: the slow broker is reached only through the proxy; in smoke
    # the phases are shorter, to pay for that cluster's start-up
    slow_sizes = {**sizes, "n_before": 10, "during_s": 1.0, "n_after": 10} if args.smoke else sizes
    if "slow" in faults:
        with slow_cluster(60.0) as (cluster, victim, proxy):
            for ft in (True, False):
                cases.append(
                    run_case(cluster, victim, "slow", slow(proxy, args.slow_ms), ft, **slow_sizes)
                )
    head = (
        f"{'case':<14}{'errors':>7}  {'before p50/p99/max ms':>24}  "
        f"{'during p50/p99/max ms':>24}  {'sends during':>12}  {'to faulty':>9}  "
        f"{'after p50/p99/max ms':>24}  {'back in use':>11}"
    )
    print(head)
    for c in cases:

        def fmt(ph: dict[str, float]) -> str:
            return f"{ph['p50_ms']:.1f}/{ph['p99_ms']:.1f}/{ph['max_ms']:.1f}"

        name = f"{c['fault']} FT {'on' if c['fault_tolerance'] else 'off'}"
        back = f"{c['back_in_use_s']:.2f} s" if c["back_in_use_s"] >= 0 else "never"
        print(
            f"{name:<14}{c['errors_surfaced']:>7}  {fmt(c['before']):>24}  "
            f"{fmt(c['during']):>24}  {c['during']['n']:>12}  "
            f"{c['during_sends_to_faulty']:>9}  {fmt(c['after']):>24}  "
            f"{back:>11}"
        )
    if args.json:
        out: dict[str, Any] = {
            "smoke": args.smoke,
            "timeline": {},
            "targets": [],
            "notes": [
                "send_timeout=3 s, retry_times=2: a per-attempt share of 1 s; broker_expire=60 s",
                f"slow: broker-b behind a TCP proxy adding "
                f"{args.slow_ms:.0f} ms to each client-to-broker "
                "chunk, in a cluster of its own (broker-a direct)",
                "to faulty / during_sends_to_faulty: sends "
                "acknowledged by the faulty broker during the "
                "fault",
            ],
        }
        for c in cases:
            key = f"{c['fault']}_ft_{'on' if c['fault_tolerance'] else 'off'}"
            out["timeline"][key] = c.pop("timeline")
            out[key] = c
        out["targets"] = _targets(out, args.slow_ms)
        print(json.dumps(out))


def _targets(out: dict[str, Any], slow_ms: float) -> list[dict[str, Any]]:
    """The issue-3 targets for the cases that ran, and the slow case's own."""
    targets: list[dict[str, Any]] = []
    if "hang_ft_on" in out:
        on_hang = out["hang_ft_on"]
        targets += [
            {
                "name": "hang, FT on: max send latency during (ms)",
                "value": on_hang["during"]["max_ms"],
                "target": "< 1500",
                "met": on_hang["during"]["max_ms"] < 1500,
            },
            {
                "name": "hang, FT on: back in use after SIGCONT (s)",
                "value": on_hang["back_in_use_s"],
                "target": "<= 30",
                "met": 0 <= on_hang["back_in_use_s"] <= 30,
            },
        ]
    if "kill_ft_on" in out:
        errors = out["kill_ft_on"]["errors_surfaced"]
        targets.append(
            {
                "name": "kill, FT on: errors surfaced",
                "value": errors,
                "target": "<= 2",
                "met": errors <= 2,
            }
        )
    if "slow_ft_on" in out:
        # not an issue-3 target: the slow broker should stop costing every other send
        p99 = out["slow_ft_on"]["during"]["p99_ms"]
        targets.append(
            {
                "name": "slow, FT on: p99 send latency during (ms)",
                "value": p99,
                "target": f"< {slow_ms:.0f}",
                "met": p99 < slow_ms,
            }
        )
    return targets


if __name__ == "__main__":
    main()
