"""The chaos bench's audit on qclient's own engine: a fresh consumer group reads every
queue from the start; then the checks (lost, early, wrong content), duplicates by kind
and the figures every engine shares (errors per fault, latency per phase, recovery)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

from benchmarks._chaos import TOPIC, Band, Ledger, Receipt, faults_at, summary
from benchmarks._chaos_member import body_for
from benchmarks._chaos_traffic import PRODUCER_KINDS, SEND_TIMEOUT
from qclient import Consumer
from qclient.errors import QClientError
from qclient.fault.strategy import id_owner
from qclient.protocol import wire


def audit(namesrv: str, ledger: Ledger, deadline: float) -> list[Any]:
    """Read every queue from offset 0 with a fresh group until each acknowledged id is
    seen and the last is due, or ``deadline`` (time.monotonic)."""
    with ledger.lock:  # a send_async callback may still be adding its last ones
        want = set(ledger.acked)
        last_due = max((d for d, _, _ in ledger.acked.values()), default=0)
    got: list[Any] = []
    seen: set[str] = set()
    with Consumer(namesrv, TOPIC, f"audit-{int(time.time())}") as c:
        while time.monotonic() < deadline:
            try:
                batch = c.poll(1024, timeout=0.5)
            except QClientError:
                time.sleep(0.2)
                continue
            received_ms = time.time_ns() // 1_000_000
            for m in batch:
                m.extra["received_ms"] = received_ms
            got.extend(batch)
            seen.update(m.msg_id for m in batch)
            if want <= seen and time.time() * 1000 > last_due + 2000 and not batch:
                break
    return got


def classify(
    ledger: Ledger,
    by_id: dict[str, set[tuple[str, int, int]]],
    dup_ids: dict[str, int],
    bands: list[Band],
    end: float,
    brokers: list[str],
) -> tuple[dict[str, int], dict[str, int], int, list[dict[str, Any]]]:
    """Duplicates by kind, the preventable ones by kind, how many would have been but for
    the kept copy's broker being down, and samples.

    Kinds: ``resent_first_home`` / ``resent_first_away`` (a caller re-sent an acknowledged
    id; its first copy on the id's own broker, or elsewhere because that one was down),
    ``ambiguous`` (one acknowledgement, an extra copy on another broker: an attempt that
    timed out but stored), ``same_broker`` (two copies on one broker), ``unacked`` (never
    acknowledged, stored twice). Preventable: the message's delay outlasted the faults --
    an extra copy's broker was back (and the copy stored) >= 2 s before it was due, time
    enough to cancel it, and the kept copy's broker was up then. While the kept copy's
    broker is down the producers leave the extra copy (it fires on time, the kept one
    again when its broker is back: a duplicate rather than a late delivery).
    """
    kinds: Counter[str] = Counter()
    preventable: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    keep_down = 0
    wall0 = ledger.clock.wall_ms(0)
    for mid, n in dup_ids.items():
        held = sorted({b for b, _, _ in by_id[mid]})
        if mid not in ledger.acked:
            kind, keep = "unacked", ""
        else:
            acks = ledger.acks[mid]
            if mid in ledger.resent and len(acks) > 1:
                home = id_owner(mid, brokers)
                kind = "resent_first_home" if acks[0][0] == home else "resent_first_away"
                # the producers keep the copy away from the id's broker
                keep = next((b for b, _ in acks if b != home), acks[-1][0])
            elif len(held) == 1:
                kind, keep = "same_broker", held[0]
            else:
                kind, keep = "ambiguous", acks[0][0]
        kinds[kind] += n
        if kind == "unacked":
            continue
        deliver_ms = ledger.acked[mid][0]
        due = (deliver_ms - wall0) / 1000
        extra = [b for b in held if b != keep]
        # the extra copy's broker was back (after its last fault that began before the
        # copy was due), and the copy stored (a re-send's acknowledgement), >= 2 s before
        # it was due
        ok = False
        for broker in extra:
            ends = [b.t1 if b.t1 >= 0 else end for b in bands if b.target == broker and b.t0 <= due]
            stored = [t for b, t in ledger.acks[mid] if b == broker]
            if ends and due - max(ends + stored) >= 2.0:
                ok = True
        if ok and any(
            b.t0 <= due and (b.t1 < 0 or b.t1 >= due - 2.0) for b in bands if b.target == keep
        ):
            ok = False
            keep_down += n
        if ok:
            preventable[kind] += n
        if (ok and len(samples) < 16) or sum(1 for s in samples if s["kind"] == kind) < 4:
            acks = ledger.acks[mid]
            samples.append(
                {
                    "kind": kind,
                    "preventable": ok,
                    "id": mid,
                    "home": id_owner(mid, brokers),
                    "acks": [(b, round(t, 2)) for b, t in acks],
                    "copies": held,
                    "due_at_s": round(due, 2),
                    "faults_at_ack": sorted(
                        faults_at(bands, acks[-1][1], end, before=SEND_TIMEOUT)
                    ),
                }
            )
    return dict(kinds), dict(preventable), keep_down, samples


def analyse(
    ledger: Ledger,
    copies: list[Any],
    receipts: list[Receipt],
    bands: list[Band],
    end: float,
    brokers: list[str],
) -> dict[str, Any]:
    """The checks and figures of one run."""
    acked = ledger.acked
    by_id: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
    early = wrong = 0
    for m in copies:
        by_id[m.msg_id].add((m.broker_name, m.queue_id, m.offset))
        # received before its time, or fired earlier than brokers fire ahead (consumers
        # hold such messages until their time)
        if m.extra["received_ms"] < m.deliver_at_ms or m.fired_at_ms < wire.firing_time_ms(
            m.deliver_at_ms
        ):
            early += 1
        if m.body != body_for(m.msg_id):
            wrong += 1
    early += sum(r.received_ms < r.deliver_at_ms for r in receipts)
    lost = [mid for mid in acked if mid not in by_id]
    dup_ids = {mid: len(s) - 1 for mid, s in by_id.items() if len(s) > 1}
    dups = sum(dup_ids.values())
    dup_kinds, preventable, keep_down, samples = classify(
        ledger, by_id, dup_ids, bands, end, brokers
    )
    figures = fault_figures(ledger, receipts, bands, end)
    errors_by_fault = figures["errors_by_fault"]
    kills = figures["faults"].get("kill", 0)
    kill_errors = errors_by_fault.get("kill", 0)
    kill_errors_by_producer = figures.pop("_errors_by_producer").get("kill", Counter())
    # back in use: the first acknowledgement by a broker after its fault ended
    back: dict[str, list[float]] = defaultdict(list)
    acks_by_broker = _ack_times(ledger)
    for b in bands:
        if b.target.startswith("broker") and b.t1 >= 0:
            after = [t for t in acks_by_broker.get(b.target, []) if t >= b.t1]
            if after:
                back[b.kind].append(round(after[0] - b.t1, 2))
    n_acked = len(acked)
    return {
        "acknowledged": n_acked,
        "failed_messages": ledger.failed_messages,
        "delivered_distinct": len(by_id),
        "lost": len(lost),
        "lost_ids_sample": lost[:10],
        "early": early,
        "wrong_content": wrong,
        "duplicates": dups,
        "duplicates_pct": round(100 * dups / n_acked, 3) if n_acked else 0.0,
        "duplicates_by_kind": dup_kinds,
        "duplicates_due_after_fault": sum(preventable.values()),
        "preventable_by_kind": preventable,
        "preventable_kept_copy_down": keep_down,
        "duplicate_samples": samples,
        "resent_ids": len(ledger.resent),
        "errors_per_kill": round(kill_errors / kills, 2) if kills else 0.0,
        "errors_per_kill_by_producer": {
            k: round(kill_errors_by_producer[k] / kills, 2) if kills else 0.0
            for k in PRODUCER_KINDS
        },
        **figures,
        "back_in_use_s": {k: max(v) for k, v in back.items()},
    }


def _ack_times(ledger: Ledger) -> dict[str, list[float]]:
    """Broker -> the bench times of its acknowledgements (of each id's first), sorted."""
    acks_by_broker: dict[str, list[float]] = defaultdict(list)
    for _d, broker, t in ledger.acked.values():
        acks_by_broker[broker].append(t)
    for ts in acks_by_broker.values():
        ts.sort()
    return acks_by_broker


def fault_figures(
    ledger: Ledger, receipts: list[Receipt], bands: list[Band], end: float
) -> dict[str, Any]:
    """What every engine's run reports alike: errors that reached callers per fault kind
    (an error counts for each fault on within the send timeout before it), send latency
    per phase, the time each restart took, the members' receipts; ``_first_receipts``
    (id -> bench time) and ``_errors_by_producer`` (fault kind -> producer kind ->
    errors) are for the caller to pop."""
    kinds = Counter(b.kind for b in bands)
    errors_by_fault: dict[str, int] = Counter()
    by_producer: dict[str, Counter[str]] = defaultdict(Counter)
    error_samples: list[dict[str, Any]] = []
    for (t, kind, _err), text in zip(ledger.errors, ledger.error_texts, strict=True):
        on = faults_at(bands, t, end, before=SEND_TIMEOUT + 0.5)
        if "all_down" in on:
            on = {"all_down"}  # every broker down: every send fails, whatever else is on
        elif len(error_samples) < 20:
            error_samples.append(
                {"t_s": round(t, 2), "by": kind, "faults": sorted(on), "error": text}
            )
        for k in on or {"none"}:
            errors_by_fault[k] += 1
            by_producer[k][kind] += 1
    phases: dict[str, list[float]] = defaultdict(list)
    for t, lat, _kind in ledger.sends:
        on = faults_at(bands, t, end)
        phases["+".join(sorted(on)) if on else "calm"].append(lat)
        for k in on:
            phases[f"any {k}"].append(lat)
    recovery: dict[str, list[float]] = defaultdict(list)
    for b in bands:
        if b.recovery_s is not None and b.kind != "pause":
            recovery[b.kind].append(b.recovery_s)
    first_receipt: dict[str, float] = {}
    redelivered: Counter[str] = Counter()
    for r in receipts:
        if r.msg_id in first_receipt:
            redelivered[r.msg_id] += 1
        else:
            first_receipt[r.msg_id] = r.t
    return {
        "errors_to_callers": len(ledger.errors),
        "errors_by_fault": dict(errors_by_fault),
        "errors_by_type": dict(Counter(e for _, _, e in ledger.errors)),
        "error_samples": error_samples,
        "faults": dict(kinds),
        "send_latency_by_phase": {k: summary(v) for k, v in sorted(phases.items())},
        "recovery_s": {k: summary([x * 1000 for x in v]) for k, v in recovery.items()},
        "member_receipts": len(receipts),
        "member_redeliveries": sum(redelivered.values()),
        "member_delivered_distinct": len(first_receipt),
        "_first_receipts": first_receipt,
        "_errors_by_producer": by_producer,
    }


def timeline(ledger: Ledger, first_receipt: dict[str, float], bands: list[Band]) -> dict[str, Any]:
    """Send latency and delivery rate over time, with the faults as bands."""
    sends = ledger.sends
    step = max(1, len(sends) // 5000)
    sample = sends[::step]
    per_s = Counter(int(t) for t in first_receipt.values())
    span = range(0, max(per_s, default=0) + 1)
    return {
        "t_s": [round(t, 3) for t, _, _ in sample],
        "latency_ms": [round(lat, 2) for _, lat, _ in sample],
        "rate_t_s": list(span),
        "delivered_per_s": [per_s.get(s, 0) for s in span],
        # the plot colours a band by its kind: a RocketMQ fault's role is in its target
        "bands": [[round(b.t0, 2), round(b.t1, 2), _base(b.kind), b.target] for b in bands],
    }


def _base(kind: str) -> str:
    """``kill_master`` -> ``kill`` (RocketMQ's faults name the role they hit)."""
    return kind.removesuffix("_master").removesuffix("_slave")
