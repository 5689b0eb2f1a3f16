"""qclient's producer on RocketMQ against RocketMQ's own Java producer (``DefaultMQProducer``
of ``org.apache.rocketmq:rocketmq-client`` 5.5.0), same brokers, same run, same workload.

The Java producers live in one JVM (``benchmarks._rocketmq_java.JavaProducers``), started
before anything is timed; every phase has an unrecorded warm-up round on both clients first
(the JVM compiles its send path there), then alternating rounds (qclient first in even rounds,
Java first in odd ones) on the same brokers, and each figure is the median round; ratios are
taken per round, then the median, so both clients see the same minutes of a shared host.

- one-call: one thread, synchronous sends of a 100 B message delayed ``--one-call-delay-s``
  (5 s): p50/p99, msgs/s, client CPU per message (qclient: this process; Java: its whole JVM);
- 64 threads sharing one producer, synchronous (delayed 1 h, so no firing load lands on the
  next round);
- async: qclient ``send_async`` then ``flush`` against Java ``send(msg, SendCallback)`` with
  its defaults (at most ``--inflight`` callbacks outstanding, the bench's bound): msgs/s;
- faults (``benchmarks._producer_faults``) on a replicated cluster
  (``RocketMQCluster(brokers=2, replicas=2)``, what ``LocalCluster(engine="rocketmq",
  brokers=2, replicas=2)`` makes; controller mode): qclient,
  Java with its defaults and Java with ``sendLatencyFaultEnable=true`` send together at one
  paced rate while broker-a's master is SIGSTOPped (SIGCONT later), then, once healed,
  killed with ``kill -9``: caller errors, longest stall, when sends succeed again, lost,
  duplicates, early.

Goals: qclient one-call p50 <= 1.2x Java's; qclient async msgs/s >= Java's; under each fault
qclient fewer caller errors and a shorter longest stall than Java with its defaults.
Other engineers' JVMs share this 2-core host: absolute figures are noisy, the per-round
ratios less so. Without java, the RocketMQ jars or the Java peer jar the run is ``skipped``.

    python -m benchmarks.java_producer_bench [--json] [--smoke] [--phases perf,faults]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks._engines_work import QUEUES
from benchmarks._producer_faults import CLIENTS, FaultPlan, run_fault
from benchmarks._rocketmq_java import JavaProducers, java_peer_available
from benchmarks._suite import report
from benchmarks._suite.values import fmt
from benchmarks.engines_bench import rocketmq_missing
from benchmarks.one_call_bench import BODY, DELAY_S, TOPIC, many_threads, one_thread
from benchmarks.producer_bench import measure
from qclient import Message, Producer
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.errors import QClientError

#: qclient's one-call p50 over the Java producer's, at most
GOAL_P50_RATIO = 1.2
#: qclient's send_async msgs/s over Java's async send, at least
GOAL_ASYNC_RATIO = 1.0
JAVA = "perf"


def _median(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Each of ``keys``' median over ``rows`` (None when no row has it)."""
    out: dict[str, Any] = {}
    for k in keys:
        vals = [r[k] for r in rows if isinstance(r.get(k), int | float)]
        out[k] = round(statistics.median(vals), 3) if vals else None
    return out


def _ratio(rounds: list[tuple[dict[str, Any], dict[str, Any]]], key: str) -> float | None:
    """qclient's ``key`` over Java's, per round, then the median."""
    r = [q[key] / j[key] for q, j in rounds if q.get(key) and j.get(key)]
    return round(statistics.median(r), 3) if r else None


def _java_row(s: dict[str, Any]) -> dict[str, Any]:
    """A Java summary in the qclient helpers' keys."""
    return {
        "calls": s["ok"],
        "errors": s["errors"],
        "msgs_per_s": s["msgs_per_s"],
        "p50_ms": s["p50_ms"],
        "p99_ms": s["p99_ms"],
        "client_cpu_us_per_call": s["client_cpu_us_per_msg"],
    }


def _alternate(
    name: str,
    rounds: int,
    ours: Callable[[], dict[str, Any]],
    theirs: Callable[[], dict[str, Any]],
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``rounds`` rounds of both, qclient first in even rounds and Java first in odd ones."""
    out = []
    for r in range(rounds):
        if r % 2 == 0:
            q = ours()
            j = theirs()
        else:
            j = theirs()
            q = ours()
        print(f"{name} round {r}: qclient {q}\n  java {j}", file=sys.stderr)
        out.append((q, j))
    return out


def _summarize(
    rounds: list[tuple[dict[str, Any], dict[str, Any]]], keys: tuple[str, ...]
) -> dict[str, Any]:
    return {
        "qclient": _median([q for q, _ in rounds], keys),
        "java": _median([j for _, j in rounds], keys),
        "rounds": len(rounds),
    }


def async_rate(p: Producer, n: int, seconds: float) -> dict[str, Any]:
    """``_engines_work.send_async_rate``'s loop (``send_async`` of ``n`` messages delayed 1 h,
    then ``flush``), counting the futures that failed instead of raising: msgs/s of the
    acknowledged ones, as the Java bench counts its callbacks."""
    failed = 0

    def run() -> int:
        nonlocal failed
        deadline = time.monotonic() + seconds
        futures = []
        for _ in range(n):
            futures.append(p.send_async(Message(TOPIC, BODY, delay=DELAY_S)))
            if time.monotonic() > deadline:
                break
        p.flush(seconds + 30)
        failed = sum(f.exception(0) is not None for f in futures)
        return len(futures) - failed

    r = measure(run)
    return {**r, "client_cpu_us_per_call": r["cpu_us_per_msg"], "errors": failed}


def run_perf(jp: JavaProducers, cluster: RocketMQCluster, a: argparse.Namespace) -> dict[str, Any]:
    """One-call, 64 threads and async on ``cluster``."""
    res: dict[str, Any] = {"brokers": len(cluster.replicas)}
    cluster.create_topic(TOPIC, QUEUES)
    res["java_settings"] = jp.open(JAVA, cluster.namesrv_addr)
    secs = int(a.seconds)
    one_ms = int(a.one_call_delay_s * 1000)
    with Producer(cluster.namesrv) as p:

        def q_one() -> dict[str, Any]:
            try:
                return one_thread(
                    p,
                    a.calls,
                    secs,
                    lambda p: p.send_delayed(TOPIC, BODY, delay=a.one_call_delay_s),
                )
            except QClientError as exc:  # the round ends at the first error: no figures
                return {"errors": repr(exc)}

        def j_one() -> dict[str, Any]:
            s = jp.run(JAVA, TOPIC, "one-call", count=a.calls, delay_ms=one_ms, warmup=50,
                       duration_s=secs)  # fmt: skip
            return _java_row(s)

        def q_threads() -> dict[str, Any]:
            try:
                return many_threads(p, 64, a.threads_calls, secs)
            except RuntimeError as exc:  # a send failed: the round has no rate
                return {"errors": str(exc)}

        def j_threads() -> dict[str, Any]:
            s = jp.run(JAVA, TOPIC, "threads", threads=64, count=a.threads_calls,
                       delay_ms=int(DELAY_S * 1000), warmup=0, duration_s=secs)  # fmt: skip
            return _java_row(s)

        def q_async() -> dict[str, Any]:
            return async_rate(p, a.bulk, secs)

        def j_async() -> dict[str, Any]:
            s = jp.run(JAVA, TOPIC, "async", count=a.bulk, inflight=a.inflight,
                       delay_ms=int(DELAY_S * 1000), warmup=0, duration_s=secs)  # fmt: skip
            return _java_row(s)

        for _ in range(a.warmup_rounds):  # a new JVM compiles its send path first
            for fn in (q_one, j_one, q_threads, j_threads, q_async, j_async):
                fn()
        one = _alternate("one-call", a.rounds, q_one, j_one)
        thr = _alternate("64 threads", a.bulk_rounds, q_threads, j_threads)
        asy = _alternate("async", a.bulk_rounds, q_async, j_async)
    jp.close(JAVA)
    keys = ("p50_ms", "p99_ms", "msgs_per_s", "client_cpu_us_per_call", "errors")
    res["one_call"] = _summarize(one, keys)
    res["one_call"]["p50_ratio"] = _ratio(one, "p50_ms")
    res["one_call"]["p99_ratio"] = _ratio(one, "p99_ms")
    res["one_call"]["rounds_p50_ms"] = [[q.get("p50_ms"), j.get("p50_ms")] for q, j in one]
    res["threads64"] = _summarize(thr, keys)
    res["threads64"]["msgs_per_s_ratio"] = _ratio(thr, "msgs_per_s")
    res["async"] = _summarize(asy, ("msgs_per_s", "client_cpu_us_per_call", "errors"))
    res["async"]["msgs_per_s_ratio"] = _ratio(asy, "msgs_per_s")
    res["async"]["rounds_msgs_per_s"] = [[q["msgs_per_s"], j["msgs_per_s"]] for q, j in asy]
    res["async"]["java_inflight"] = a.inflight
    return res


def run_faults(
    jp: JavaProducers, cluster: RocketMQCluster, a: argparse.Namespace
) -> dict[str, Any]:
    """SIGSTOP, then (healed) kill -9 of broker-a's master with every client sending."""
    plan = FaultPlan(
        threads=a.fault_threads,
        rate=a.fault_rate,
        duration_s=a.fault_duration_s,
        fault_at_s=a.fault_at_s,
        pause_s=a.pause_s,
        warmup=a.fault_warmup,
    )
    res: dict[str, Any] = {"plan": {k: getattr(plan, k) for k in plan.__slots__}}
    with tempfile.TemporaryDirectory(prefix="qclient-jpb-") as tmp:
        work = Path(a.keep_timelines or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for kind in a.faults.split(","):
            res[kind] = run_fault(cluster, jp, kind, plan, work)
    return res


@contextlib.contextmanager
def _cluster(out: dict[str, Any], label: str, **kw: Any) -> Iterator[RocketMQCluster]:
    """A RocketMQ cluster (what ``LocalCluster(engine="rocketmq", ...)`` makes), its start
    time in ``out[label + "_start_s"]``; stopped on leaving."""
    t0 = time.monotonic()
    with RocketMQCluster(startup_timeout=180, **kw) as cluster:
        out[f"{label}_start_s"] = round(time.monotonic() - t0, 1)
        yield cluster


def goals(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The PASS/FAIL lines of the phases that ran."""
    t: list[dict[str, Any]] = []
    perf = out.get("perf") or {}
    if perf:
        one, asy = perf["one_call"], perf["async"]
        r = one["p50_ratio"]
        t.append(
            report.target(
                "one-call p50: qclient / Java (per-round median)",
                r,
                f"<= {GOAL_P50_RATIO:g}",
                r is not None and r <= GOAL_P50_RATIO,
                floor=one["java"]["p50_ms"],
            )
        )
        r = asy["msgs_per_s_ratio"]
        t.append(
            report.target(
                "async msgs/s: qclient / Java (per-round median)",
                r,
                f">= {GOAL_ASYNC_RATIO:g}",
                r is not None and r >= GOAL_ASYNC_RATIO,
                floor=asy["java"]["msgs_per_s"],
            )
        )
    for kind in ("stop", "kill"):
        f = (out.get("faults") or {}).get(kind)
        if not f:
            continue
        q, j = f["qclient"], f["java"]
        t.append(
            report.target(
                f"{kind}: caller errors, qclient (Java defaults beside)",
                q["errors"],
                f"< {j['errors']} (or 0)",
                q["errors"] < j["errors"] or q["errors"] == 0,
                floor=j["errors"],
            )
        )
        qs, js = q["fault_stall_s"], j["fault_stall_s"]
        t.append(
            report.target(
                f"{kind}: longest stall s from the fault, qclient (Java defaults beside)",
                qs,
                f"< {js}",
                qs < js,
                floor=js,
            )
        )
    return t


#: the side-by-side rows of the fault table: label, key in a client's figures
FAULT_ROWS = [
    ("caller errors", "errors"),
    ("longest stall s that began within the window", "fault_stall_s"),
    ("longest stall s of the run", "longest_stall_s"),
    ("which began s after the fault", "stall_began_s"),
    ("longest gap before the fault s", "normal_longest_gap_s"),
    ("first ack of a send after the fault s", "first_ack_after_s"),
    ("sends succeed again after s", "sends_ok_again_after_s"),
    ("sends failed or > 0.5 s after the fault", "disturbed_sends"),
    ("victim group acks again after s", "victim_group_back_s"),
    ("victim group's share of the acks before", "victim_share_before"),
    ("sends", "sends"),
    ("acked", "acked"),
    ("acked lost", "lost"),
    ("duplicates", "duplicates"),
    ("errored but delivered", "unacked_delivered"),
    ("early", "early"),
    ("latency after the fault p50 / p99 / max ms", "after_p50_ms,after_p99_ms,after_max_ms"),
]


def side_by_side(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{"name", "qclient", "java", "java_lfe"}`` of every figure (report.engines_table)."""
    rows: list[dict[str, Any]] = []
    perf = out.get("perf") or {}
    for phase, label, key in [
        ("one_call", "one-call p50 ms", "p50_ms"),
        ("one_call", "one-call p99 ms", "p99_ms"),
        ("one_call", "one-call msgs/s", "msgs_per_s"),
        ("one_call", "one-call client CPU us/msg", "client_cpu_us_per_call"),
        ("threads64", "64 threads msgs/s", "msgs_per_s"),
        ("threads64", "64 threads p50 ms", "p50_ms"),
        ("threads64", "64 threads p99 ms", "p99_ms"),
        ("threads64", "64 threads client CPU us/msg", "client_cpu_us_per_call"),
        ("async", "async msgs/s", "msgs_per_s"),
        ("async", "async client CPU us/msg", "client_cpu_us_per_call"),
    ]:
        if phase in perf:
            p = perf[phase]
            q, j = p["qclient"][key], p["java"][key]
            rows.append({"name": label, "qclient": q, "java": j, "java_lfe": None})
    for kind in ("stop", "kill"):
        f = (out.get("faults") or {}).get(kind)
        if not f:
            continue
        for label, keys in FAULT_ROWS:
            row: dict[str, Any] = {"name": f"{kind}: {label}"}
            for client in CLIENTS:
                vals = [f[client].get(k) for k in keys.split(",")]
                row[client] = vals[0] if len(vals) == 1 else " / ".join(str(v) for v in vals)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--smoke", action="store_true", help="tiny N, one cluster, a 1 s SIGSTOP")
    ap.add_argument("--phases", default="perf,faults", help="perf and/or faults")
    ap.add_argument("--brokers", type=int, default=2, help="masters of the perf cluster")
    ap.add_argument("--rounds", type=int, default=4, help="alternating one-call rounds")
    ap.add_argument("--bulk-rounds", type=int, default=4, help="64-thread and async rounds")
    ap.add_argument("--warmup-rounds", type=int, default=1, help="unrecorded rounds first")
    ap.add_argument("--calls", type=int, default=3000, help="one-call calls per round")
    ap.add_argument("--one-call-delay-s", type=float, default=5.0)
    ap.add_argument("--threads-calls", type=int, default=12_800, help="64 threads' calls")
    ap.add_argument("--bulk", type=int, default=20_000, help="async messages per round")
    ap.add_argument("--inflight", type=int, default=1024, help="Java async callbacks pending")
    ap.add_argument("--seconds", type=float, default=8.0, help="time bound of each round")
    ap.add_argument("--faults", default="stop,kill", help="stop and/or kill, in this order")
    ap.add_argument("--replicas", type=int, default=2, help="JVMs per broker group (faults)")
    ap.add_argument("--fault-threads", type=int, default=16, help="sending threads per client")
    ap.add_argument("--fault-rate", type=int, default=100, help="msgs/s per client")
    ap.add_argument("--fault-duration-s", type=int, default=20)
    ap.add_argument("--fault-at-s", type=float, default=5.0)
    ap.add_argument("--pause-s", type=float, default=8.0, help="how long SIGSTOP holds")
    ap.add_argument("--fault-warmup", type=int, default=200, help="warm-up sends per client")
    ap.add_argument("--keep-timelines", metavar="DIR", help="keep every send of the faults here")
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.bulk_rounds, a.warmup_rounds = 1, 1, 0
        a.calls, a.threads_calls, a.bulk, a.seconds = 100, 320, 512, 3.0
        a.faults, a.replicas, a.fault_threads, a.fault_rate = "stop", 1, 4, 100
        a.fault_duration_s, a.fault_at_s, a.pause_s, a.fault_warmup = 3, 1.0, 1.0, 20
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # the runner stops a scenario with SIGTERM: leave the with-blocks, so JVMs stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out: dict[str, Any] = {"scenario": "java_producer_bench", "body_bytes": len(BODY)}
    why = rocketmq_missing() or java_peer_available()
    if why:
        out.update(status="skipped", reason=why, targets=[], notes=[f"skipped: {why}"])
        print(f"skipped: {why}", file=sys.stderr)
        print(json.dumps(out) if a.json else "", flush=True)
        return
    phases = a.phases.split(",")
    out["loadavg_1m_start"] = round(os.getloadavg()[0], 1)
    with JavaProducers() as jp:
        if a.smoke:  # one cluster of two lone masters for both, to save a start
            with _cluster(out, "cluster", brokers=2) as cluster:
                out["perf"] = run_perf(jp, cluster, a)
                out["faults"] = run_faults(jp, cluster, a)
        if "perf" in phases and not a.smoke:
            with _cluster(out, "perf_cluster", brokers=a.brokers) as cluster:
                out["perf"] = run_perf(jp, cluster, a)
        if "faults" in phases and not a.smoke:
            # a start takes a minute and more on a busy host: five JVMs, replicas in sync
            with _cluster(out, "faults_cluster", brokers=2, replicas=a.replicas) as cluster:
                out["faults"] = run_faults(jp, cluster, a)
    out["loadavg_1m_end"] = round(os.getloadavg()[0], 1)
    out["targets"] = goals(out)
    out["side_by_side"] = side_by_side(out)
    perf = out.get("perf") or {}
    out["throughput"] = {
        f"{c} {label}": perf[k][c]["msgs_per_s"]
        for label, k in (("one-call", "one_call"), ("64 threads", "threads64"), ("async", "async"))
        if k in perf
        for c in ("qclient", "java")
    }
    out["notes"] = [
        "Java: DefaultMQProducer 5.5.0 with its defaults (send timeout 3 s, 2 retries, latency "
        "fault tolerance off, name server poll 30 s) but for loopback settings; one JVM "
        "(-Xms256m -Xmx512m) started before anything is timed; its CPU is the whole JVM's",
        "perf: alternating rounds after an unrecorded warm-up round, figures the median round, "
        "ratios per round then the median; other engineers' JVMs share this 2-core host",
        f"faults: qclient, Java defaults and Java sendLatencyFaultEnable=true send together "
        f"({a.fault_threads} threads and {a.fault_rate} msgs/s each) on broker groups of "
        f"{a.replicas} JVMs; stall = largest gap between acknowledgements; the goal takes the "
        f"longest that began within {FaultPlan().window_s:g} s of the fault (the whole run's, "
        "printed beside, also holds the host's hiccups, which every client meets at once)",
    ]
    rows = out["side_by_side"]
    width = max((len(r["name"]) for r in rows), default=10) + 2
    print(f"{'':{width}}" + "".join(f"{c:>22}" for c in CLIENTS))
    for r in rows:
        print(f"{r['name']:{width}}" + "".join(f"{fmt(r.get(c)):>22}" for c in CLIENTS))
    for t in out["targets"]:
        verdict = "PASS" if t["met"] else "FAIL"
        print(f"{verdict}  {t['name']}: {t['value']} (goal {t['target']}; Java {t['floor']})")
    print(json.dumps(out) if a.json else "", flush=True)


if __name__ == "__main__":
    main()
