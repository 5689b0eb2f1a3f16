"""The chaos soak on a replicated Apache RocketMQ 5 cluster (``chaos_bench --engine
rocketmq``): ``LocalCluster(engine="rocketmq", brokers=2, replicas=2)`` -- 2 broker
groups, each a master and a slave in controller mode, the controller inside the
NameServer -- the same producers and consumer-group members as on qclient's engine, the
nemesis of ``_chaos_rmq_nemesis``, the audit of ``_chaos_rmq_audit`` (every stored copy,
and a fresh group's consumer), the checks of ``_chaos_rmq_report``."""

from __future__ import annotations

import argparse
import time
from typing import Any, cast

from benchmarks._chaos import TOPIC, Clock, Ledger, Members
from benchmarks._chaos_audit import timeline
from benchmarks._chaos_rmq_audit import QUEUES, audit
from benchmarks._chaos_rmq_nemesis import Monitor, RmqNemesis
from benchmarks._chaos_rmq_report import analyse
from benchmarks._chaos_traffic import SEND_TIMEOUT, Traffic
from benchmarks._suite.report import target
from qclient import LocalCluster, Producer
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.errors import QClientError

#: the warm-up topic, and when the brokers count as warm: this many sends in a row each
#: acknowledged within this many ms
WARM_TOPIC = "chaos-warm-up"
WARM_FAST = 30
WARM_MS = 100
#: how long the cluster may take to start and sync (a busy 2-core host: JVMs boot slowly)
STARTUP_S = 240.0


def warm_up(cluster: RocketMQCluster, limit_s: float = 60.0) -> dict[str, Any]:
    """Delayed sends to a topic of their own until ``WARM_FAST`` in a row are acknowledged
    within ``WARM_MS`` (fresh JVMs interpret, then compile, the send and timer paths: on a
    busy host their first sends take seconds and would count as the run's errors), for
    ``limit_s`` at most."""
    cluster.create_topic(WARM_TOPIC, QUEUES, timeout=STARTUP_S)
    t0 = time.monotonic()
    sent = fast = errors = 0
    with Producer(cluster.namesrv, send_timeout=10.0) as p:
        while fast < WARM_FAST and time.monotonic() - t0 < limit_s and sent < 5000:
            t = time.monotonic()
            try:
                p.send_delayed(WARM_TOPIC, b"warm", delay=0.5)
            except QClientError:
                errors += 1
                fast = 0
                continue
            sent += 1
            fast = fast + 1 if time.monotonic() - t < WARM_MS / 1000 else 0
    took = round(time.monotonic() - t0, 1)
    return {"sends": sent, "errors": errors, "s": took, "warm": fast >= WARM_FAST}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One soak on a fresh replicated cluster; every JVM is stopped on the way out."""
    t_start = time.monotonic()
    cluster = cast(
        RocketMQCluster,
        LocalCluster(
            engine="rocketmq",
            brokers=2,
            replicas=2,
            data_dir=args.data_dir,
            startup_timeout=STARTUP_S,
        ),
    )
    with cluster:
        cluster.wait_in_sync(STARTUP_S)
        cluster.create_topic(TOPIC, QUEUES, timeout=STARTUP_S)
        startup_s = round(time.monotonic() - t_start, 1)
        warm = warm_up(cluster)
        clock = Clock()  # the run begins once the cluster serves
        ledger = Ledger(clock)
        monitor = Monitor(cluster, clock)
        monitor.start()
        members = Members(cluster.namesrv, clock, session_s=3.0)
        nemesis = RmqNemesis(
            cluster,
            members,
            monitor,
            clock,
            seed=args.seed,
            until=args.duration - 4,
            gap_s=(args.gap_min, args.gap_max),
        )
        traffic = Traffic(cluster.namesrv, ledger, args)
        try:
            for _ in range(2):
                members.join()
            traffic.start()
            time.sleep(1.0)  # calm first: a baseline phase
            nemesis.start()
            while clock() < args.duration:
                time.sleep(0.2)
            traffic.stop.set()
            nemesis.halt()
            # the fault threads end their faults, then heal() waits for sync and routes
            nemesis.join(600)
            traffic.wait_sent(SEND_TIMEOUT * 5)
            end = clock()
            healed_s = round(end - args.duration, 1)
            with ledger.lock:
                last_due = max((d for d, _, _ in ledger.acked.values()), default=0)
            wait_s = max(0.0, last_due / 1000 - time.time()) + args.grace
            res = audit(cluster, ledger, time.monotonic() + wait_s)
            traffic.join()
        finally:
            traffic.stop.set()
            traffic.release.set()
            nemesis.halt()
            if nemesis.is_alive():
                nemesis.join(300)
            members.close()
            monitor.stop()
            monitor.join(10)
    groups = list(cluster.replicas)
    out = analyse(ledger, res, members.receipts, nemesis.bands, end, monitor, groups)
    first = out.pop("_first_receipts")
    out["timeline_data"] = timeline(ledger, first, nemesis.bands)
    events = nemesis.events + monitor.changes()
    out["events"] = [[round(t, 2), e] for t, e in sorted(events)]
    out["engine"] = "rocketmq"
    out["cluster"] = "2 groups x (master + slave), controller mode in the NameServer"
    out["startup_s"] = startup_s
    out["warm_up"] = warm
    out["healed_after_traffic_s"] = healed_s
    out["ambiguous_copies"] = dict(traffic.ambiguous)
    out["nemesis_failures"] = nemesis.failures
    out["nemesis_skipped"] = nemesis.skipped
    out["member_errors"] = members.errors
    return out


def targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's targets on RocketMQ (the duplicates goal leaves out re-sent ids)."""
    lost = out["lost"]
    missed = out["acked_not_received_by_audit_consumer"]
    return [
        target("lost (not stored)", lost, "== 0", lost == 0),
        target("stored, not received by a fresh group", missed, "== 0", missed == 0),
        target("received early", out["early"], "== 0", out["early"] == 0),
        target("wrong content", out["wrong_content"], "== 0", out["wrong_content"] == 0),
        target(
            "duplicates % of acknowledged (not counting re-sent ids)",
            out["duplicates_goal_pct"],
            "<= 0.1",
            out["duplicates_goal_pct"] <= 0.1,
        ),
    ]


def hard_failure(out: dict[str, Any]) -> bool:
    """Lost, missed by the consumer, early, wrong content, or a fault that did not heal."""
    return bool(
        out["lost"]
        or out["acked_not_received_by_audit_consumer"]
        or out["early"]
        or out["wrong_content"]
        or out["nemesis_failures"]
    )


def headline(out: dict[str, Any]) -> str:
    """The run in three lines: losses, duplicates by cause, errors per fault kind."""
    causes = ", ".join(
        f"{k} {v} ({out['duplicates_by_cause_pct'][k]} %)"
        for k, v in sorted(out["duplicates_by_cause"].items())
    )
    per = ", ".join(f"{k} {v}" for k, v in sorted(out["errors_per_fault"].items()))
    return (
        f"rocketmq: {out['acknowledged']} acknowledged, lost {out['lost']}, not received "
        f"{out['acked_not_received_by_audit_consumer']}, early {out['early']}, wrong "
        f"{out['wrong_content']}\n"
        f"duplicates: {out['duplicates']} ({out['duplicates_pct']} %): {causes or 'none'}; "
        f"goal (without re-sent ids) {out['duplicates_goal']} ({out['duplicates_goal_pct']} %)\n"
        f"errors per fault: {per or 'none'}; faults {out['faults']}; seed {out['seed']}"
    )
