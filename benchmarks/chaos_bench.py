"""Chaos soak: faults on repeat while traffic flows, then every acknowledgement checked.

``--engine qclient`` (the default): on a 3-broker ``LocalCluster`` (fsync on), producers
of every kind -- sync threads, ``send_async``, ``AsyncProducer``, ``send_batch`` -- send
delayed messages (most due within ``--short-max`` s, some up to ``--long-max`` s; a few
re-send an acknowledged id on purpose), while a nemesis with a fixed seed kills -9,
SIGSTOPs, cleanly stops and restarts brokers and the name server (overlapping, never every
broker at once, except once for ``--all-down`` s), and consumer-group members (child
processes) join and are killed. Then a fresh consumer group reads every queue from the
start and the run checks: every acknowledged message delivered (lost), none early, none
with changed content, duplicates (copies stored twice, on two brokers or two offsets),
errors that reached callers per fault kind, send-latency p99 per phase, and recovery times.

``--engine rocketmq``: the same traffic and members on a replicated Apache RocketMQ 5
cluster (2 groups, each a master and a slave in controller mode), a nemesis that kills,
pauses and cleanly stops masters and slaves and restarts the NameServer (never both
replicas of both groups down; no all-down), and an audit that counts every stored copy at
the storage level (see ``_chaos_rmq``).

    python -m benchmarks.chaos_bench [--engine qclient|rocketmq] [--json] [--smoke]
        [--duration 60] [--seed 17] [--plot chaos_timeline.png]

Exit status 1 when a hard check fails (lost, early, wrong content, a fault that did not
heal); the JSON is printed first either way.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._chaos import Clock, Ledger, Members, Nemesis
from benchmarks._chaos_audit import analyse, audit, timeline
from benchmarks._chaos_traffic import RESEND_FRACTION, SEND_TIMEOUT, Traffic
from benchmarks._suite.report import target
from qclient import LocalCluster

log = logging.getLogger("benchmarks.chaos_bench")

#: per engine: the longest delay of the long tail (s), and --smoke's run
LONG_MAX = {"qclient": 300.0, "rocketmq": 120.0}
SMOKE = {
    # duration, short_max, long_max, grace
    "qclient": (40.0, 5.0, 12.0, 10.0),
    "rocketmq": (30.0, 4.0, 8.0, 10.0),
}
#: --smoke on qclient's engine: the faults its check expects (the all-down's 3 and 3 more)
SMOKE_MIN_FAULTS = 6


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One soak on qclient's own engine (3 brokers, one all-down)."""
    with LocalCluster(brokers=3, heartbeat_interval=0.5, broker_expire=3.0) as cluster:
        clock = Clock()  # the run begins once the cluster serves
        ledger = Ledger(clock)
        members = Members(cluster.namesrv, clock, session_s=3.0)
        nemesis = Nemesis(
            cluster,
            members,
            clock,
            seed=args.seed,
            until=args.duration - 4,
            gap_s=(args.gap_min, args.gap_max),
            all_down_at=args.duration * 0.6,
            all_down_s=args.all_down,
            min_faults=args.min_faults,
        )
        traffic = Traffic(cluster.namesrv, ledger, args)
        try:
            for _ in range(2):
                members.join()
            traffic.start()
            time.sleep(1.0)  # calm first: a baseline phase
            nemesis.start()
            while clock() < args.duration or (
                len(nemesis.bands) < args.min_faults and clock() < args.duration + 60
            ):
                time.sleep(0.2)
            traffic.stop.set()
            nemesis.halt()
            nemesis.join(120)
            traffic.wait_sent(SEND_TIMEOUT * 5)
            end = clock()
            with ledger.lock:
                last_due = max((d for d, _, _ in ledger.acked.values()), default=0)
            wait_s = max(0.0, last_due / 1000 - time.time()) + args.grace
            # the producers stay open until every message is due, as a service's would:
            # they cancel the copies they noted (some shortly before those are due)
            copies = audit(cluster.namesrv, ledger, time.monotonic() + wait_s)
            traffic.join()
        finally:
            traffic.stop.set()
            traffic.release.set()
            nemesis.halt()
            nemesis.heal()
            members.close()
    brokers = [b.name for b in cluster.brokers]
    out = analyse(ledger, copies, members.receipts, nemesis.bands, end, brokers)
    first = out.pop("_first_receipts")
    out["timeline_data"] = timeline(ledger, first, nemesis.bands)
    out["events"] = [[round(t, 2), e] for t, e in nemesis.events]
    out["ambiguous_copies"] = dict(traffic.ambiguous)
    out["nemesis_failures"] = nemesis.failures
    out["member_errors"] = members.errors
    return out


def qclient_targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's targets on qclient's engine."""
    return [
        target("lost", out["lost"], "== 0", out["lost"] == 0),
        target("early", out["early"], "== 0", out["early"] == 0),
        target("wrong content", out["wrong_content"], "== 0", out["wrong_content"] == 0),
        target(
            "errors per broker kill", out["errors_per_kill"], "<= 2", out["errors_per_kill"] <= 2
        ),
        target(
            "duplicates % of acknowledged",
            out["duplicates_pct"],
            "<= 0.1",
            out["duplicates_pct"] <= 0.1,
        ),
        target(
            "duplicates due after the fault",
            out["duplicates_due_after_fault"],
            "== 0",
            out["duplicates_due_after_fault"] == 0,
        ),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with ``--smoke`` and the engine's defaults applied."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["qclient", "rocketmq"], default="qclient")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the short run tests/integration/test_chaos.py checks (40 s of faults on "
        "qclient's engine, 30 s on rocketmq)",
    )
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--rate", type=float, default=15.0, help="sends/s of one sync thread")
    ap.add_argument("--short-max", type=float, default=10.0, help="most delays: 0.5..this s")
    ap.add_argument(
        "--long-max",
        type=float,
        default=None,
        help="the rest: 0.5..this s (default 300 on qclient's engine, 120 on rocketmq)",
    )
    ap.add_argument("--long-fraction", type=float, default=0.1)
    ap.add_argument(
        "--resend-fraction",
        type=float,
        default=RESEND_FRACTION,
        help="share of sends that re-send an acknowledged id (on rocketmq each is a copy by "
        "design, counted apart from the duplicates goal)",
    )
    ap.add_argument("--gap-min", type=float, default=2.0, help="s between nemesis actions")
    ap.add_argument("--gap-max", type=float, default=5.0)
    ap.add_argument(
        "--min-faults",
        type=int,
        default=0,
        help="qclient's engine: traffic and nemesis go on past --duration (60 s at most) "
        "until this many faults were made (--smoke: 6): a loaded host makes each one slower",
    )
    ap.add_argument(
        "--all-down",
        type=float,
        default=3.0,
        help="s every broker is down once (qclient's engine only)",
    )
    ap.add_argument("--grace", type=float, default=20.0, help="s to wait for the last ones")
    ap.add_argument("--plot", type=Path, help="also draw the timeline PNG here")
    ap.add_argument(
        "--data-dir",
        type=Path,
        help="rocketmq: keep the JVMs' stores and logs here (default: a temporary dir, "
        "removed at the end)",
    )
    args = ap.parse_args(argv)
    if args.long_max is None:
        args.long_max = LONG_MAX[args.engine]
    if args.smoke:
        args.duration, args.short_max, args.long_max, args.grace = SMOKE[args.engine]
        if args.engine == "qclient":
            args.min_faults = max(args.min_faults, SMOKE_MIN_FAULTS)
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # SIGTERM (the runner's time limit) unwinds the cluster and the members
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t = time.monotonic()
    if args.engine == "rocketmq":
        from benchmarks import _chaos_rmq as engine

        out = engine.run(args)
    else:
        out = run(args)
    out["run_s"] = round(time.monotonic() - t, 1)
    out["seed"] = args.seed
    out["duration_s"] = args.duration
    tl = out.pop("timeline_data")
    out["chaos_timeline"] = {"chaos_bench": {**tl, "events": out.pop("events")}}
    if args.engine == "rocketmq":
        out["targets"] = engine.targets(out)
        hard = engine.hard_failure(out)
        brief_line = engine.headline(out)
    else:
        out["targets"] = qclient_targets(out)
        hard = bool(out["lost"] or out["early"] or out["wrong_content"] or out["nemesis_failures"])
        brief_line = headline(out)
    if args.plot:
        from benchmarks._suite.plots import plot_chaos_timeline

        plot_chaos_timeline(out["chaos_timeline"], args.plot)
    text = json.dumps(out)
    if args.json:
        print(text)
    else:
        brief = {k: v for k, v in out.items() if k not in ("chaos_timeline",)}
        print(json.dumps(brief, indent=1))
        print(brief_line)
    if hard:
        print(
            f"chaos_bench: FAILED: lost={out['lost']} early={out['early']} "
            f"wrong_content={out['wrong_content']} nemesis={out['nemesis_failures']}",
            file=sys.stderr,
        )
        sys.exit(1)


def headline(out: dict[str, Any]) -> str:
    """The run in three lines: duplicates by kind, preventable ones, errors per kill."""
    kinds = out["duplicates_by_kind"]
    home, away = kinds.get("resent_first_home", 0), kinds.get("resent_first_away", 0)
    other = out["duplicates"] - home - away - kinds.get("ambiguous", 0)
    per = ", ".join(f"{k} {v}" for k, v in out["errors_per_kill_by_producer"].items())
    return (
        f"duplicates: {out['duplicates']} ({out['duplicates_pct']} % of "
        f"{out['acknowledged']} acknowledged): re-sent caller id {home + away} (first copy "
        f"on its broker {home}, elsewhere {away}), ambiguous {kinds.get('ambiguous', 0)}, "
        f"other {other}\n"
        f"preventable (due >= 2 s after the extra copy's broker was back and the copy stored, "
        f"the kept copy's broker up): {out['duplicates_due_after_fault']} "
        f"{out['preventable_by_kind']}; with the kept copy's broker down then: "
        f"{out['preventable_kept_copy_down']}\n"
        f"errors per broker kill: {out['errors_per_kill']} ({per or 'none'}); "
        f"seed {out['seed']}"
    )


if __name__ == "__main__":
    main()
