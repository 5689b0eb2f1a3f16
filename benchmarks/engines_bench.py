"""Both engines side by side: qclient's own brokers and Apache RocketMQ 5.5.0, one workload.

Each engine gets its own ``LocalCluster(brokers=2, engine=...)`` in turn (one broker each
in ``--smoke``), the same 100 B bodies, the same counts, the same code
(``one_call_bench.one_thread`` / ``many_threads``, ``_engines_work``):

- the floor: a bare request to the first broker -- qclient: ``one_call_bench.bare_client``
  (keep-alive ``http.client`` POST of one message to ``/v1/send``); RocketMQ: one
  ``SEND_MESSAGE_V2`` of the same delayed message over a plain blocking socket with the
  codec (``remoting.encode`` / ``FrameDecoder``, ``message.send_header``), no SDK --
  p50/p99, client CPU and the broker's CPU per request; on RocketMQ also the same loop
  over every broker in turn (the SDK spreads its sends: that costs the floor too);
- one-call: a one-thread ``send_delayed`` loop (1 h delay): p50/p99, msgs/s, the SDK's CPU
  per message (``time.process_time`` of this process: every server is another process).
  The floor and the loop run in ``--rounds`` alternating rounds (which goes first
  alternates too), after ``--warmup-rounds`` unrecorded ones (a new JVM compiles its
  send path first), and each figure is its median round: the host is shared, so both
  sides see the same minutes; the SDK's added CPU and its p50 over the floor's are
  taken per round, then the median;
- the brokers' CPU with no client for ``--idle-seconds`` (it is in every per-request
  figure of theirs);
- 64 threads sharing one ``Producer`` (with the brokers' CPU meanwhile); ``send_async``
  (flush at the end); ``send_batch`` of 256 ``Message`` objects;
- lateness: ``--rate`` msgs/s coming due for ``--due-seconds`` (all sent before the first
  is due), one group ``Consumer`` polling: fire lateness (``fired_at_ms - deliver_at_ms``)
  and receive lateness (``poll`` return - ``deliver_at_ms``) p50/p99; the brokers' CPU
  (% of one core, psutil) and peak RSS from the first due time to the last received.

Goals (RocketMQ): the SDK adds <= 50 us CPU per message over the bare request, and its
one-call p50 <= 1.3x the bare round trip's; both against the floor over every broker in
turn when there are several (the bare requests of the same workload: the SDK's round robin
spreads its sends, and alternating broker JVMs costs the bare loop itself ~0.08 ms p50),
with the one-broker floor's figures printed beside them. Without java or the RocketMQ
jars the RocketMQ side is ``skipped`` with the reason. ``--profile`` adds, on stderr, each
engine's one-call loop's CPU per message by thread and a cProfile of the caller's thread
by CPU time.

    python -m benchmarks.engines_bench [--json] [--smoke] [--engines qclient,rocketmq]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from benchmarks._engines_profile import profile_one_call
from benchmarks._engines_work import (
    QUEUES,
    BrokerMeter,
    lateness,
    rocketmq_bare,
    send_async_rate,
    send_batch_rate,
)
from benchmarks._suite import report
from benchmarks._suite.values import fmt
from benchmarks.one_call_bench import BODY, TOPIC, bare_client, many_threads, one_thread
from qclient import LocalCluster, Producer

ENGINES = ("qclient", "rocketmq")
LAT_TOPIC = "engines-lateness"
#: the goals, on RocketMQ: CPU the SDK adds per message over the bare request (us), and
#: the one-call p50 over the bare round trip's
GOAL_CPU_US = 50.0
GOAL_P50_RATIO = 1.3


def rocketmq_missing() -> str | None:
    """Why RocketMQ clusters cannot start here (no java 17+, no jars), or None."""
    from qclient.engines.rocketmq.local.runtime import missing

    return missing()


def _median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric figure's median over the rounds (rounds are dicts of the same keys)."""
    out: dict[str, Any] = {}
    for key, value in rounds[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = round(statistics.median(r[key] for r in rounds), 3)
    return out


def _paired(rounds: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The SDK over the floor, per round then the median: CPU added (when the floor has
    the client's CPU) and the p50 ratio."""
    ratio = [sdk["p50_ms"] / floor["p50_ms"] for floor, sdk in rounds if floor["p50_ms"]]
    out: dict[str, Any] = {"p50_vs_floor": round(statistics.median(ratio), 3) if ratio else None}
    cpu = [
        sdk["client_cpu_us_per_call"] - floor["client_cpu_us_per_request"]
        for floor, sdk in rounds
        if "client_cpu_us_per_request" in floor
    ]
    out["sdk_adds_cpu_us_per_msg"] = round(statistics.median(cpu), 1) if cpu else None
    return out


def run_engine(engine: str, brokers: int, a: argparse.Namespace) -> dict[str, Any]:
    """Every phase on one engine's cluster (started and stopped here)."""
    secs, n1 = a.seconds, a.calls
    res: dict[str, Any] = {"status": "ok", "brokers": brokers}
    res["loadavg_1m_start"] = round(os.getloadavg()[0], 1)
    t0 = time.monotonic()
    with LocalCluster(brokers=brokers, engine=engine) as cluster:
        res["cluster_start_s"] = round(time.monotonic() - t0, 1)
        for topic in (TOPIC, LAT_TOPIC):
            cluster.create_topic(topic, QUEUES)
        b0 = cluster.brokers[0]
        assert b0.pid is not None
        floor_fn: Callable[[], dict[str, Any]]
        # RocketMQ: also the floor over every broker, as the SDK spreads its sends
        floor_all: Callable[[], dict[str, Any]] | None = None
        if engine == "rocketmq":
            every = [(b.addr, b.name, b.pid or 0) for b in cluster.brokers]
            floor_fn = partial(rocketmq_bare, every[:1], n1, secs)
            if len(every) > 1:
                floor_all = partial(rocketmq_bare, every, n1, secs)
        else:
            floor_fn = partial(bare_client, b0.addr, b0.pid, 1, n1, secs)
        with Producer(cluster.namesrv) as p:
            for _ in range(a.warmup_rounds):  # a new JVM compiles its send path first
                (floor_all or floor_fn)()
                one_thread(p, n1, secs)
            rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
            rounds_all: list[tuple[dict[str, Any], dict[str, Any]]] = []
            for r in range(a.rounds):
                if r % 2 == 0:
                    floor = floor_fn()
                    sdk = one_thread(p, n1, secs)
                    spread = floor_all() if floor_all else None
                else:
                    spread = floor_all() if floor_all else None
                    sdk = one_thread(p, n1, secs)
                    floor = floor_fn()
                rounds.append((floor, sdk))
                if spread is not None:
                    rounds_all.append((spread, sdk))
                print(f"{engine} round {r}: floor {floor}\n  one-call {sdk}", file=sys.stderr)
                if spread is not None:
                    print(f"  floor over every broker {spread}", file=sys.stderr)
            res["floor"] = _median([f for f, _ in rounds])
            res["one_call"] = _median([s for _, s in rounds])
            res.update(_paired(rounds))
            res["rounds_p50_ms"] = [[f["p50_ms"], s["p50_ms"]] for f, s in rounds]
            if rounds_all:
                res["floor_all_brokers"] = _median([f for f, _ in rounds_all])
                res["floor_all_brokers"].update(_paired(rounds_all))
            if a.profile:
                rmq = (b0.addr, b0.name) if engine == "rocketmq" else None
                print(f"--- {engine}: {profile_one_call(p, n1, rmq)}", file=sys.stderr)
            pids = [b.pid for b in cluster.brokers if b.pid is not None]
            # what the brokers burn with no client: part of every per-request figure
            with BrokerMeter(pids) as idle:
                time.sleep(a.idle_seconds)
            res["brokers_idle"] = idle.result
            with BrokerMeter(pids) as busy:
                res["threads64"] = many_threads(p, 64, a.threads_calls, secs)
            res["threads64"]["brokers_cpu_pct_of_core"] = busy.result["cpu_pct_of_core"]
            res["send_async"] = send_async_rate(p, a.bulk, secs)
            res["send_batch256"] = send_batch_rate(p, a.bulk, secs)
            rate_in = res["send_batch256"]["msgs_per_s"]
            lat, samples = lateness(
                p, cluster.namesrv, LAT_TOPIC, pids, a.rate, a.due_seconds, rate_in
            )
            res["lateness"] = lat
    res["loadavg_1m_end"] = round(os.getloadavg()[0], 1)
    res["samples"] = samples
    return res


#: the side-by-side rows: label, then the path of the figure in an engine's result
ROWS: list[tuple[str, str]] = [
    ("one-call p50 ms", "one_call.p50_ms"),
    ("one-call p99 ms", "one_call.p99_ms"),
    ("one-call msgs/s", "one_call.msgs_per_s"),
    ("one-call SDK CPU us/msg", "one_call.client_cpu_us_per_call"),
    ("floor p50 ms", "floor.p50_ms"),
    ("floor p99 ms", "floor.p99_ms"),
    ("floor client CPU us/req", "floor.client_cpu_us_per_request"),
    ("floor broker CPU us/req", "floor.broker_cpu_us_per_request"),
    ("SDK adds CPU us/msg", "sdk_adds_cpu_us_per_msg"),
    ("one-call p50 / floor p50", "p50_vs_floor"),
    ("floor over every broker p50 ms", "floor_all_brokers.p50_ms"),
    ("floor over every broker client CPU us/req", "floor_all_brokers.client_cpu_us_per_request"),
    ("SDK adds CPU us/msg over that floor", "floor_all_brokers.sdk_adds_cpu_us_per_msg"),
    ("one-call p50 / that floor's p50", "floor_all_brokers.p50_vs_floor"),
    ("64 threads msgs/s", "threads64.msgs_per_s"),
    ("64 threads p50 ms", "threads64.p50_ms"),
    ("64 threads p99 ms", "threads64.p99_ms"),
    ("64 threads SDK CPU us/msg", "threads64.client_cpu_us_per_call"),
    ("64 threads brokers' CPU % of a core", "threads64.brokers_cpu_pct_of_core"),
    ("send_async msgs/s", "send_async.msgs_per_s"),
    ("send_batch(256) msgs/s", "send_batch256.msgs_per_s"),
    ("fire lateness p50 ms", "lateness.fire_p50_ms"),
    ("fire lateness p99 ms", "lateness.fire_p99_ms"),
    ("receive lateness p50 ms", "lateness.receive_p50_ms"),
    ("receive lateness p99 ms", "lateness.receive_p99_ms"),
    ("poll return - fired_at p50 ms", "lateness.after_fire_p50_ms"),
    ("poll return - fired_at p99 ms", "lateness.after_fire_p99_ms"),
    ("lost / early / duplicates", "lateness.lost,lateness.early,lateness.duplicates"),
    ("firing: brokers' CPU % of a core", "lateness.broker.cpu_pct_of_core"),
    ("firing: brokers' peak RSS MB", "lateness.broker.rss_mb"),
    ("idle: brokers' CPU % of a core", "brokers_idle.cpu_pct_of_core"),
    ("load avg 1 min (start, end)", "loadavg_1m_start,loadavg_1m_end"),
]


def _get(res: dict[str, Any], paths: str) -> Any:
    """The figure(s) at comma-separated dotted ``paths`` (several joined by " / ")."""
    got = []
    for path in paths.split(","):
        v: Any = res
        for part in path.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        got.append(v)
    if len(got) == 1:
        return got[0]
    return " / ".join(fmt(g) for g in got)


def side_by_side(engines: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per figure: ``{"name": label, "qclient": v, "rocketmq": v}``."""
    rows = []
    for label, path in ROWS:
        row: dict[str, Any] = {"name": label}
        for e, res in engines.items():
            row[e] = _get(res, path) if res.get("status") == "ok" else res.get("status")
        rows.append(row)
    return rows


def goals(rmq: dict[str, Any]) -> list[dict[str, Any]]:
    """The RocketMQ goal lines, each carrying its floor: the floor over every broker when
    it was measured (the same spread of sends as the SDK's), else the one-broker floor."""
    floor = rmq.get("floor_all_brokers") or {**rmq["floor"], **rmq}
    cpu, ratio = floor.get("sdk_adds_cpu_us_per_msg"), floor.get("p50_vs_floor")
    return [
        report.target(
            "RocketMQ: SDK CPU us/msg over the bare request",
            cpu,
            f"<= {GOAL_CPU_US:g}",
            cpu is not None and cpu <= GOAL_CPU_US,
            floor=floor.get("client_cpu_us_per_request"),
        ),
        report.target(
            "RocketMQ: one-call p50 / bare round trip p50",
            ratio,
            f"<= {GOAL_P50_RATIO:g}",
            ratio is not None and ratio <= GOAL_P50_RATIO,
            floor=floor.get("p50_ms"),
        ),
    ]


def _print_table(rows: list[dict[str, Any]], engines: list[str]) -> None:
    width = max(len(r["name"]) for r in rows) + 2
    print(f"{'':{width}}" + "".join(f"{e:>18}" for e in engines))
    for r in rows:
        cells = "".join(f"{fmt(r.get(e)):>18}" for e in engines)
        print(f"{r['name']:{width}}{cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--smoke", action="store_true", help="tiny N, one broker per engine")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated")
    ap.add_argument("--brokers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="alternating floor/one-call rounds")
    ap.add_argument("--warmup-rounds", type=int, default=1, help="unrecorded rounds first")
    ap.add_argument("--calls", type=int, default=3000, help="calls per floor/one-call phase")
    ap.add_argument("--threads-calls", type=int, default=12_800, help="64 threads' calls")
    ap.add_argument("--bulk", type=int, default=20_000, help="send_async / send_batch msgs")
    ap.add_argument("--rate", type=int, default=5000, help="due msgs/s of the lateness phase")
    ap.add_argument("--due-seconds", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=8.0, help="time bound of each phase")
    ap.add_argument("--idle-seconds", type=float, default=3.0, help="brokers' idle CPU window")
    ap.add_argument("--profile", action="store_true", help="profile the one-call loops")
    a = ap.parse_args()
    if a.smoke:
        a.brokers, a.rounds, a.warmup_rounds = 1, 1, 0
        a.calls, a.threads_calls, a.bulk = 100, 320, 512
        a.rate, a.due_seconds, a.seconds, a.idle_seconds = 1000, 0.5, 3.0, 0.5
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # the runner stops a scenario with SIGTERM: leave the with-blocks, so clusters stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    wanted = [e for e in a.engines.split(",") if e]
    out: dict[str, Any] = {"scenario": "engines_bench", "body_bytes": len(BODY)}
    engines: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[float]] = {}
    for engine in wanted:
        why = rocketmq_missing() if engine == "rocketmq" else None
        if why:
            engines[engine] = {"status": "skipped", "reason": why}
            print(f"{engine}: skipped: {why}", file=sys.stderr)
            continue
        res = run_engine(engine, a.brokers, a)
        # the report's lateness CDF: what the application sees (fire lateness: the table)
        samples[f"{engine} received @{a.rate:,}/s"] = res.pop("samples")["receive"]
        engines[engine] = res
    rows = side_by_side(engines)
    out["side_by_side"] = rows
    out["brokers_per_engine"] = a.brokers
    out["engines"] = engines
    out["lateness_samples_ms"] = samples
    out["throughput"] = {
        f"{e} {label}": r[key]["msgs_per_s"]
        for e, r in engines.items()
        if r.get("status") == "ok"
        for label, key in (("one-call", "one_call"), ("64 threads", "threads64"))
    }
    rmq = engines.get("rocketmq", {})
    out["targets"] = goals(rmq) if rmq.get("status") == "ok" else []
    out["notes"] = [
        f"{a.brokers} broker(s) per engine, engines run one after the other; 100 B bodies; "
        "one-call and floor: median of alternating rounds",
        "fire lateness = fired_at_ms - deliver_at_ms: a qclient broker fires up to 40 ms "
        "ahead by design (its consumer holds the message until deliver_at), so its figure "
        "is negative; RocketMQ fires from a 100 ms timer wheel (TIMER_DEQUEUE_MS)",
        "qclient floor: one_call_bench.bare_client, which does not measure the client's CPU",
        *[f"{e}: skipped: {r['reason']}" for e, r in engines.items() if r["status"] != "ok"],
    ]
    _print_table(rows, list(engines))
    for t in out["targets"]:
        met = "met" if t["met"] else "not met"
        print(f"goal {t['name']}: {t['value']} ({t['target']}, floor {t['floor']}): {met}")
    print(json.dumps(out) if a.json else "", flush=True)


if __name__ == "__main__":
    main()
