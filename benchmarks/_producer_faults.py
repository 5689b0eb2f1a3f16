"""The fault phase of ``benchmarks.java_producer_bench``: qclient's ``Producer`` and RocketMQ's
Java ``DefaultMQProducer`` (its defaults, and with ``sendLatencyFaultEnable=true``) send
together, each from its own threads to its own topic at the same paced rate, while a master
of a replicated RocketMQ cluster is killed (``kill -9``) or hung (SIGSTOP, SIGCONT later).

All three start their measured phase at one instant (after their own warm-up sends to another
topic), so they meet the same fault at the same moment. Every send is recorded (start, end,
acknowledged or the error its caller got, the broker that acknowledged it, the message's
unique key); then the cluster heals (the killed JVM restarted, every replica back in its
SyncStateSet) and a fresh Java consumer group per topic reads everything back.

Per client: errors that reached callers, the longest stall (largest gap between successful
acknowledgements from the last one before the fault to the end of sending) and the longest
that began within ``FaultPlan.window_s`` of the fault (the fault's own), when sends succeed
again (the end of the last send that failed or took over ``SLOW_MS``, from the fault), when
the victim's broker group acknowledged a send again, and from the read-back the acknowledged
messages lost, the duplicates, the copies of sends whose callers got an error, and early
fires (stored or received before their deliver time).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._rocketmq_java import JavaProducers, read_timeline, run_consume
from benchmarks.one_call_bench import BODY, pct
from qclient import Producer
from qclient.engines.rocketmq.local import RocketMQCluster

__all__ = ["CLIENTS", "FaultPlan", "analyze", "run_fault"]

#: the clients of a fault run: label -> the Java producer's latency fault setting (None: qclient)
CLIENTS: dict[str, bool | None] = {"qclient": None, "java": False, "java_lfe": True}
#: a send slower than this counts as disturbed (normal sends take a few ms)
SLOW_MS = 500.0
#: the broker group whose master the fault hits
VICTIM_GROUP = "broker-a"
#: the topic every client's warm-up sends go to (kept out of the read-back)
WARM_TOPIC = "jpb-warm"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Sizes of one fault run: ``threads`` per client sending ``rate`` msgs/s (all threads of
    a client together) for ``duration_s``; the fault ``fault_at_s`` into it; SIGSTOP held for
    ``pause_s``; messages due ``delay_s`` after their send."""

    threads: int = 16
    rate: int = 100
    duration_s: int = 20
    fault_at_s: float = 5.0
    pause_s: float = 8.0
    delay_s: float = 3.0
    warmup: int = 200
    #: a stall that begins this long after the fault or later is not counted as the fault's
    window_s: float = 11.0
    #: from the end of every client's warm-up to the common start
    lead_s: float = 1.5


def _now_ms() -> float:
    return time.time() * 1000


def _wait_until_ms(t_ms: float) -> None:
    """Block until the wall clock reaches ``t_ms`` (a planned instant, not a guess)."""
    while (left := t_ms - _now_ms()) > 0:
        time.sleep(min(left / 1000, 0.05))


def qclient_sends(
    p: Producer, topic: str, plan: FaultPlan, start_ms: float, prefix: str
) -> list[dict[str, Any]]:
    """``plan.threads`` threads sharing ``p``, paced together at ``plan.rate`` msgs/s from
    ``start_ms`` for ``plan.duration_s`` (Bench.java's pacing: ticket ``t`` is due at
    ``start + t / rate``; a thread that was held up catches up); every send recorded as the
    Java timeline's lines are."""
    _wait_until_ms(start_ms)
    end_ms = start_ms + plan.duration_s * 1000
    lock = threading.Lock()
    tickets = iter(range(10_000_000))
    recs: list[list[dict[str, Any]]] = [[] for _ in range(plan.threads)]

    def work(i: int) -> None:
        mine = recs[i]
        while True:
            with lock:
                t = next(tickets)
            _wait_until_ms(start_ms + t * 1000 / plan.rate)
            s = _now_ms()
            if s >= end_ms:
                return
            key = f"{prefix}{t}"
            try:
                r = p.send_delayed(topic, BODY, delay=plan.delay_s, key=key)
            except Exception as exc:  # every error that reaches the caller counts
                mine.append(_rec(s, False, key, None, None, i, f"{type(exc).__name__}: {exc}"))
            else:
                mine.append(_rec(s, True, key, r.msg_id, r.broker_name, i, None))

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(plan.threads)]
    for th in threads:
        th.start()
    for th in threads:
        # a send is bounded by send_timeout (3 s) and the ambiguous-copy handling after it
        th.join(plan.duration_s + 60)
    if any(th.is_alive() for th in threads):
        raise RuntimeError("qclient fault senders did not stop within 60 s of the end")
    return sorted((r for rs in recs for r in rs), key=lambda r: r["startMs"])


def _rec(
    start: float, ok: bool, key: str, uniq: str | None, broker: str | None, th: int, err: str | None
) -> dict[str, Any]:
    return {
        "startMs": start,
        "endMs": _now_ms(),
        "ok": ok,
        "key": key,
        "uniqKey": uniq,
        "broker": broker,
        "thread": th,
        "error": err,
    }


def analyze(sends: list[dict[str, Any]], fault_ms: float, window_s: float) -> dict[str, Any]:
    """The send-side figures of one client (see the module doc); times in s from the fault.
    ``window_s``: how long after the fault a stall counts as the fault's (``fault_stall_s``:
    the longest gap between acknowledgements that began from the last one before the fault
    to ``window_s`` after it); the host's own hiccups, which every client running beside it
    meets at the same moment, fall outside it more often than not."""
    acks = sorted(s["endMs"] for s in sends if s["ok"])
    run_end = max((s["endMs"] for s in sends), default=fault_ms)
    before = [t for t in acks if t <= fault_ms]
    after = [t for t in acks if t > fault_ms]
    points = [*before[-1:], *after, run_end]
    gaps = [(b - a, a) for a, b in itertools.pairwise(points)]
    stall, stall_from = max(gaps, default=(0.0, fault_ms))
    fault_stall = max((g for g, a in gaps if a <= fault_ms + window_s * 1000), default=0.0)
    calm = [t for t in before if t >= before[0] + 1000] if before else []
    normal_gap = max((b - a for a, b in itertools.pairwise(calm)), default=0.0)
    errors = [s for s in sends if not s["ok"]]
    disturbed = [
        s["endMs"]
        for s in sends
        if s["endMs"] > fault_ms and (not s["ok"] or s["endMs"] - s["startMs"] > SLOW_MS)
    ]
    first_after = next((s["endMs"] for s in sends if s["ok"] and s["startMs"] >= fault_ms), None)
    victim = [s["endMs"] for s in sends if s["ok"] and s["startMs"] >= fault_ms and _in_victim(s)]
    lat_after = [s["endMs"] - s["startMs"] for s in sends if s["ok"] and s["endMs"] > fault_ms]
    kinds = collections.Counter((s["error"] or "?").split(":")[0] for s in errors)
    acked_before = [s for s in sends if s["ok"] and s["endMs"] <= fault_ms]
    victim_before = sum(_in_victim(s) for s in acked_before)
    by_broker: dict[str, list[float]] = collections.defaultdict(list)
    for s in sends:
        if s["ok"] and s["startMs"] >= fault_ms:
            by_broker[s["broker"] or "?"].append(s["endMs"] - s["startMs"])

    def since(t: float | None) -> float | None:
        return None if t is None else round((t - fault_ms) / 1000, 3)

    return {
        "sends": len(sends),
        "acked": len(acks),
        "errors": len(errors),
        "error_kinds": dict(kinds.most_common(5)),
        "first_errors": [s["error"][:240] for s in errors[:3] if s["error"]],
        "fault_stall_s": round(fault_stall / 1000, 3),
        "longest_stall_s": round(stall / 1000, 3),
        "stall_began_s": round((stall_from - fault_ms) / 1000, 3),
        "normal_longest_gap_s": round(normal_gap / 1000, 3),
        "first_ack_after_s": since(first_after),
        "sends_ok_again_after_s": since(max(disturbed)) if disturbed else 0.0,
        "disturbed_sends": len(disturbed),
        "victim_group_back_s": since(victim[0]) if victim else None,
        "after_p50_ms": round(pct(lat_after, 0.5), 2) if lat_after else None,
        "after_p99_ms": round(pct(lat_after, 0.99), 2) if lat_after else None,
        "after_max_ms": round(max(lat_after), 1) if lat_after else None,
        # the fault hit a broker this client used: its share of the acks before the fault
        "victim_share_before": round(victim_before / len(acked_before), 3)
        if acked_before
        else None,
        # sends started after the fault, by the broker that acknowledged them: n, p50, p99 ms
        "after_by_broker": {
            b: [len(v), round(pct(v, 0.5), 1), round(pct(v, 0.99), 1)]
            for b, v in sorted(by_broker.items())
        },
    }


def _in_victim(send: dict[str, Any]) -> bool:
    return send.get("broker") == VICTIM_GROUP


def read_back(
    namesrv_addr: str, topic: str, sends: list[dict[str, Any]], prefix: str, timeout_s: float
) -> dict[str, Any]:
    """A fresh Java consumer group reads ``topic`` from its first offset: lost (acknowledged,
    never delivered), duplicates (copies beyond the first of a key), unacked_delivered (keys
    whose caller got an error, delivered anyway), early (stored or received before the
    message's TIMER_DELIVER_MS)."""
    acked = {s["uniqKey"] for s in sends if s["ok"]}
    got = run_consume(
        namesrv_addr, topic, f"jpb-read-{prefix}{int(_now_ms())}", len(acked), timeout_s, settle_s=3
    )
    got = [m for m in got if (m.get("keys") or "").startswith(prefix)]
    ids = collections.Counter(m["uniqKey"] for m in got)
    early = 0
    for m in got:
        due = float((m.get("properties") or {}).get("TIMER_DELIVER_MS") or 0)
        early += min(m["storeTimestamp"], m["receivedMs"]) < due
    return {
        "delivered": len(ids),
        "lost": len(acked - set(ids)),
        "duplicates": sum(n - 1 for n in ids.values()),
        "unacked_delivered": len(set(ids) - acked),
        "early": early,
    }


def run_fault(
    cluster: RocketMQCluster, jp: JavaProducers, kind: str, plan: FaultPlan, work: Path
) -> dict[str, Any]:
    """One fault (``kill`` or ``stop``) on ``broker-a``'s master with every client sending;
    heals the cluster before it reads back. Per client: ``analyze`` + ``read_back``."""
    topics = {label: f"jpb-{kind}-{label.replace('_', '')}" for label in CLIENTS}
    for topic in [WARM_TOPIC, *topics.values()]:
        cluster.create_topic(topic, 4)
    victim = cluster.broker(VICTIM_GROUP)
    java = {label: f"{kind}-{label}" for label, lfe in CLIENTS.items() if lfe is not None}
    settings = {
        label: jp.open(name, cluster.namesrv_addr, latency_fault_enable=CLIENTS[label])
        for label, name in java.items()
    }
    delay_ms = int(plan.delay_s * 1000)
    events: list[tuple[float, str]] = []
    sends: dict[str, list[dict[str, Any]]] = {}
    with Producer(cluster.namesrv) as p, ThreadPoolExecutor(1) as pool:
        # warm-up, outside the timed window: routes, connections, the JVM's compiled send path
        warm = [
            jp.start(
                name,
                WARM_TOPIC,
                "threads",
                threads=4,
                count=plan.warmup,
                warmup=0,
                delay_ms=delay_ms,
            )
            for name in java.values()
        ]
        for _ in range(plan.warmup):
            with contextlib.suppress(Exception):
                p.send_delayed(WARM_TOPIC, BODY, delay=plan.delay_s)
        for w in warm:
            w.result(120)
        # every client's measured phase starts at this instant
        start_ms = _now_ms() + plan.lead_s * 1000
        runs = {
            label: jp.start(
                name,
                topics[label],
                "faults",
                threads=plan.threads,
                rate=plan.rate,
                duration_s=plan.duration_s,
                delay_ms=delay_ms,
                warmup=0,
                start_at_ms=int(start_ms),
                key_prefix=f"{kind}{label}-",
                out=work / f"{kind}-{label}.jsonl",
            )
            for label, name in java.items()
        }
        fault_ms = start_ms + plan.fault_at_s * 1000
        ours = pool.submit(qclient_sends, p, topics["qclient"], plan, start_ms, f"{kind}qclient-")
        try:
            for run in runs.values():
                run.wait_measuring(plan.lead_s + 60)
            _wait_until_ms(fault_ms)
            events.append((_now_ms(), f"{kind} {victim.name}"))
            (victim.kill if kind == "kill" else victim.pause)()
            if kind == "stop":
                _wait_until_ms(fault_ms + plan.pause_s * 1000)
                victim.resume()
                events.append((_now_ms(), f"SIGCONT {victim.name}"))
        finally:
            if kind == "stop":
                victim.resume()
            sends["qclient"] = ours.result(timeout=plan.duration_s + 120)
        sdk = p.stats()
    with open(work / f"{kind}-qclient.jsonl", "w") as f:  # as the Java timelines are
        f.writelines(json.dumps(r) + "\n" for r in sends["qclient"])
    for label, run in runs.items():
        summary = run.result(plan.duration_s + 120)
        sends[label] = read_timeline(Path(summary["out"]))
        jp.close(java[label])
    heal_s = _heal(cluster, victim, kind, list(topics.values()))
    last_due = max(s["startMs"] for ss in sends.values() for s in ss) + delay_ms
    _wait_until_ms(last_due + 1000)  # every message is due by then: the read-back is complete

    def back(label: str) -> dict[str, Any]:
        return read_back(cluster.namesrv_addr, topics[label], sends[label], f"{kind}{label}-", 60)

    with ThreadPoolExecutor(len(topics)) as rpool:
        readback = dict(zip(topics, rpool.map(back, topics), strict=True))
    out: dict[str, Any] = {
        "fault": kind,
        "victim": victim.name,
        "heal_s": heal_s,
        "events_s": [[round((t - fault_ms) / 1000, 3), e] for t, e in events],
        # when each client's first send began, from the common start (its lag)
        "start_lag_s": {
            label: round((ss[0]["startMs"] - start_ms) / 1000, 3) if ss else None
            for label, ss in sends.items()
        },
        "java_settings": settings,
    }
    for label in CLIENTS:
        out[label] = {**analyze(sends[label], fault_ms, plan.window_s), **readback[label]}
    # the SDK's own counters (warm-up included): attempts retried, and per broker the
    # requests, those that failed (timeouts among them) and the slowest
    out["qclient"]["sdk_retried"] = sdk["retried"]
    out["qclient"]["sdk_brokers"] = {
        b: [v["requests"], v["errors"], v["max_ms"]] for b, v in sdk["brokers"].items()
    }
    for label in CLIENTS:
        print(f"{kind} {label}: {out[label]}", file=sys.stderr)
    return out


def _heal(cluster: RocketMQCluster, victim: Any, kind: str, topics: list[str]) -> float:
    """Restart a killed JVM, then wait until every replica is in sync and every topic routed
    to a master of each group; the seconds it took."""
    t0 = time.monotonic()
    if kind == "kill":
        victim.start(timeout=120)
    cluster.wait_in_sync(120)
    for topic in topics:
        cluster.wait_routed(topic, 60)
    return round(time.monotonic() - t0, 1)
