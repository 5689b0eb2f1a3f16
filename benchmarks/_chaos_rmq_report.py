"""The chaos bench's checks and figures on RocketMQ: lost (with the scenario of each loss:
which node acknowledged it, the group's sync state then, the faults that followed),
received early, wrong content, duplicates by cause, recovery per fault kind.

Duplicates by cause, per id (its copies, the producer attempts they came from -- each
attempt stamps its own born time -- and its acknowledgements):

- ``resent_by_caller``: a caller re-sent an acknowledged id on purpose; RocketMQ stores
  every send, so each acknowledged re-send is a copy by design. Counted apart from the
  duplicates goal (``duplicates_goal_pct`` leaves them out).
- ``retry_same_group`` / ``retry_other_group``: an attempt that timed out or lost its
  connection was stored anyway, and the retry that was acknowledged is another copy, on
  the same group or another one (the producer's recall of such copies did not get there
  before they fired).
- ``refired``: one stored attempt put into the topic twice (the same born time, beyond
  the acknowledgements of that group): the timer fired it again (a restart replays the
  timer log from its last checkpoint, or a new master's timer fires what the old one had
  fired).
- ``unacked``: copies beyond the first of an id no caller saw acknowledged.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from benchmarks._chaos import Band, Ledger, Receipt, faults_at
from benchmarks._chaos_audit import fault_figures
from benchmarks._chaos_rmq_audit import AuditResult, Copy, describe_consumer
from benchmarks._chaos_rmq_nemesis import Monitor, Sample
from benchmarks._chaos_traffic import SEND_TIMEOUT
from qclient.engines.rocketmq.local import TIMER_PRECISION_MS

#: the causes the duplicates goal leaves out (copies made by design)
BY_DESIGN = ("resent_by_caller",)


def queue_divergence(copies: list[Copy]) -> list[dict[str, Any]]:
    """The (group, queue, offset)s whose replicas' consume queues name different records:
    a queue offset given twice (apache/rocketmq#7689), so each replica skips one of them."""
    at: dict[tuple[str, int, int], dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    ids: dict[tuple[str, int], str] = {}  # a commit log offset is one group's
    for c in copies:
        at[(c.group, c.queue, c.offset)][c.phys].add(c.replica)
        ids[(c.group, c.phys)] = c.msg_id
    return [
        {
            "group": g,
            "queue": q,
            "offset": o,
            "records": {ids[(g, phys)]: sorted(replicas) for phys, replicas in recs.items()},
        }
        for (g, q, o), recs in sorted(at.items())
        if len(recs) > 1
    ]


def _causes(mid: str, copies: list[Copy], ledger: Ledger) -> tuple[Counter[str], int]:
    """Duplicates of one id by cause, and its acknowledgements with no stored copy on
    the group that acknowledged them."""
    out: Counter[str] = Counter()
    born: dict[str, set[int]] = defaultdict(set)
    held: Counter[str] = Counter()
    for c in copies:
        born[c.group].add(c.born_ms)
        held[c.group] += 1
    acks = Counter(g for g, _ in ledger.acks.get(mid, ()))
    # attempts stored on each group: one per born time -- or per acknowledgement, when
    # copies allow (two re-sends of one id in one batch call share a born time)
    sends = {g: max(len(b), min(acks.get(g, 0), held[g])) for g, b in born.items()}
    n_sends = sum(sends.values())
    out["refired"] = len(copies) - n_sends
    missing = sum(max(0, n - held.get(g, 0)) for g, n in acks.items())
    if not acks:
        out["unacked"] = n_sends - 1
    else:
        resent = min(sum(acks.values()) - 1, n_sends - 1)
        out["resent_by_caller"] = resent
        rest = n_sends - 1 - resent
        other = sum(n for g, n in sends.items() if acks.get(g, 0) == 0)
        out["retry_other_group"] = min(rest, other)
        out["retry_same_group"] = rest - min(rest, other)
    return +out, missing


def refired_by_fault(
    by_id: dict[str, dict[tuple[str, int], Copy]], bands: list[Band], ledger: Ledger
) -> dict[str, int]:
    """The refired copies by the faults on their group (or the NameServer) that were on
    between the first fire and the last (give or take a second): what made the timer fire
    them again."""
    wall0 = ledger.clock.wall_ms(0)
    out: Counter[str] = Counter()
    for copies in by_id.values():
        attempts: dict[tuple[str, int], list[int]] = defaultdict(list)
        for c in copies.values():
            attempts[(c.group, c.born_ms)].append(c.fired_ms)
        for (group, _born), fired in attempts.items():
            if len(fired) < 2:
                continue
            t0, t1 = (min(fired) - wall0) / 1000, (max(fired) - wall0) / 1000
            kinds = sorted(
                {
                    b.kind
                    for b in bands
                    if b.t0 <= t1 + 1
                    and (b.t1 < 0 or b.t1 >= t0 - 1)
                    and (b.target.startswith(group) or b.target == "namesrv")
                }
            )
            out["+".join(kinds) or "no fault began then"] += len(fired) - 1
    return dict(out)


def _group_faults(bands: list[Band], group: str, t0: float, t1: float) -> list[str]:
    """The faults on ``group``'s JVMs or the NameServer that overlap ``[t0, t1]``."""
    out = []
    for b in bands:
        end = b.t1 if b.t1 >= 0 else 1e18
        if b.t0 <= t1 and end >= t0 and (b.target.startswith(group) or b.target == "namesrv"):
            info = {k: v for k, v in b.info.items() if v}
            out.append(f"{b.t0:.1f}-{b.t1:.1f} {b.kind} {b.target} {info}")
    return out


def lost_scenarios(
    lost: list[str], ledger: Ledger, bands: list[Band], monitor: Monitor
) -> list[dict[str, Any]]:
    """The lost ids grouped by (group, the node that was master when it was
    acknowledged, the SyncStateSet then), each with its ack and due windows and the faults
    on the group from the first ack to the last due time."""
    wall0 = ledger.clock.wall_ms(0)
    groups: dict[tuple[str, str, str], list[tuple[str, float, float]]] = defaultdict(list)
    for mid in lost:
        deliver, group, t = ledger.acked[mid]
        state = monitor.describe(monitor.at(t), group)
        key = (group, str(state.get("routed_master")), ",".join(state.get("in_sync", [])))
        groups[key].append((mid, t, (deliver - wall0) / 1000))
    out = []
    for (group, master, in_sync), items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        t_ack = [t for _, t, _ in items]
        t_due = [d for _, _, d in items]
        out.append(
            {
                "count": len(items),
                "acked_by_group": group,
                "master_at_ack": master,
                "in_sync_at_ack": in_sync,
                "acked_s": [round(min(t_ack), 2), round(max(t_ack), 2)],
                "due_s": [round(min(t_due), 2), round(max(t_due), 2)],
                "ids_sample": [m for m, _, _ in items[:5]],
                "faults": _group_faults(bands, group, min(t_ack) - SEND_TIMEOUT, max(t_due) + 10),
            }
        )
    return out


def _all_routed(groups: list[str]) -> Callable[[Sample], bool]:
    return lambda s: all(s.routed.get(g) for g in groups)


def _master_again(group: str, me: str | None, t1: float) -> Callable[[Sample], bool]:
    """A master routed: another node, or this one once its fault ended."""
    return lambda s: s.routed.get(group) is not None and (s.routed.get(group) != me or s.t >= t1)


def _other_master(group: str, me: str | None) -> Callable[[Sample], bool]:
    return lambda s: s.routed.get(group) not in (None, me)


def _in_sync(group: str, me: str | None) -> Callable[[Sample], bool]:
    return lambda s: me in s.synced.get(group, (None, frozenset()))[1]


def recovery(
    bands: list[Band], monitor: Monitor, ledger: Ledger, groups: list[str]
) -> dict[str, Any]:
    """Per fault kind: how long the group was without a routed master after a master
    fault (``master_again_s``), how long a restarted or resumed node took to be in its
    SyncStateSet again (``in_sync_again_s``), the routes' return after a NameServer
    restart (``routes_back_s``), and the first acknowledgement by the group after the
    fault ended (``back_in_use_s``)."""
    addr = {n: a for a, n in monitor.names.items()}
    acks: dict[str, list[float]] = defaultdict(list)
    for _d, g, t in ledger.acked.values():
        acks[g].append(t)
    for ts in acks.values():
        ts.sort()
    out: dict[str, dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for b in bands:
        if b.t1 < 0:
            continue
        fig = out[b.kind]
        if b.target == "namesrv":
            fig["routes_back_s"].append(monitor.after(b.t1, _all_routed(groups)))
            continue
        group = b.target.rsplit("-", 1)[0]
        me = addr.get(b.target)
        if b.kind.endswith("_master"):
            fig["master_again_s"].append(monitor.after(b.t0, _master_again(group, me, b.t1)))
            elected = monitor.after(b.t0, _other_master(group, me))
            fig["elected"].append(1.0 if elected is not None and elected < b.t1 - b.t0 else 0.0)
        fig["in_sync_again_s"].append(monitor.after(b.t1, _in_sync(group, me)))
        after = [t for t in acks.get(group, []) if t >= b.t1]
        fig["back_in_use_s"].append(round(after[0] - b.t1, 2) if after else None)
    summary: dict[str, Any] = {}
    for kind, figs in out.items():
        summary[kind] = {}
        for name, vals in figs.items():
            known = [v for v in vals if v is not None]
            if name == "elected":
                summary[kind]["elections"] = f"{int(sum(known))} of {len(vals)}"
                continue
            summary[kind][name] = {
                "n": len(vals),
                "never": len(vals) - len(known),
                "p50": sorted(known)[len(known) // 2] if known else None,
                "max": max(known) if known else None,
            }
    return summary


def analyse(
    ledger: Ledger,
    res: AuditResult,
    receipts: list[Receipt],
    bands: list[Band],
    end: float,
    monitor: Monitor,
    groups: list[str],
) -> dict[str, Any]:
    """The checks and figures of one run on RocketMQ."""
    acked = ledger.acked
    # a copy is a record of a group's commit log, whichever replicas' queues listed it
    by_id: dict[str, dict[tuple[str, int], Copy]] = defaultdict(dict)
    for c in res.copies:
        by_id[c.msg_id][(c.group, c.phys)] = c
    copies = [c for d in by_id.values() for c in d.values()]
    divergent = queue_divergence(res.copies)
    wrong = sum(not c.body_ok for c in copies)
    # the timer puts a message into its queue when its slot (100 ms) comes up: up to one
    # slot before TIMER_DELIVER_MS; the consumer holds it until then
    fired_before_slot = sum(
        c.fired_ms < c.deliver_ms // TIMER_PRECISION_MS * TIMER_PRECISION_MS for c in copies
    )
    early_audit = [c for c in res.consumed if c.received_ms < c.deliver_ms]
    early_members = [r for r in receipts if r.received_ms < r.deliver_at_ms]
    lost = [mid for mid in acked if mid not in by_id]
    # stored, yet the audit's consumer never returned it (it read until the deadline)
    not_received = set(acked) - {c.msg_id for c in res.consumed} - set(lost)
    causes: Counter[str] = Counter()
    missing_copies = recalled = 0
    # an acknowledgement whose group holds no copy from any attempt of it (the id is
    # delivered through another copy): a write lost behind a duplicate
    missing_samples: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for mid, d in by_id.items():
        if len(d) < 2 and mid not in ledger.resent:
            continue
        got, missing = _causes(mid, list(d.values()), ledger)
        causes.update(got)
        for cause in got:
            if sum(1 for s in samples if s["cause"] == cause) < 3:
                samples.append(
                    {
                        "cause": cause,
                        "id": mid,
                        "acks": [(g, round(t, 2)) for g, t in ledger.acks.get(mid, [])],
                        "copies": sorted(
                            (c.group, c.queue, c.offset, c.born_ms, c.fired_ms) for c in d.values()
                        ),
                    }
                )
        if missing and len({g for g, _ in ledger.acks.get(mid, [])}) > 1:
            # acknowledged by both groups: the producers' cleaner recalls the copy on one
            # of them once the other is acknowledged (see producer/_ambiguous.py)
            recalled += missing
            continue
        missing_copies += missing
        if missing and len(missing_samples) < 10:
            acks = ledger.acks.get(mid, [])
            missing_samples.append(
                {
                    "id": mid,
                    "acks": [(g, round(t, 2), monitor.describe(monitor.at(t), g)) for g, t in acks],
                    "copies": sorted((c.group, c.queue, c.offset, c.born_ms) for c in d.values()),
                    "faults": _group_faults(
                        bands, acks[0][0], acks[0][1] - SEND_TIMEOUT, acks[-1][1] + 30
                    ),
                }
            )
    dups = sum(causes.values())
    goal = dups - sum(causes[c] for c in BY_DESIGN)
    n_acked = len(acked)
    figures = fault_figures(ledger, receipts, bands, end)
    figures.pop("_errors_by_producer")
    faults = figures["faults"]
    per_fault = {
        k: round(figures["errors_by_fault"].get(k, 0) / n, 2) for k, n in faults.items() if n
    }

    # calls that took longer than the send timeout (plus scheduling slack): by kind, with
    # the faults on when they began (send_async's include time queued in the producer)
    over: dict[str, list[float]] = defaultdict(list)
    over_at: Counter[str] = Counter()
    for t, lat, kind in ledger.sends:
        if lat > (SEND_TIMEOUT + 0.5) * 1000:
            over[kind].append(lat)
            over_at["+".join(sorted(faults_at(bands, t, end))) or "calm"] += 1

    # errors over time (5 s buckets) and by what they say, per phase (ids and numbers out)
    error_times = Counter(int(t // 5) * 5 for t, _, _ in ledger.errors)
    error_kinds: Counter[str] = Counter()
    for (t, _kind, _type), text in zip(ledger.errors, ledger.error_texts, strict=True):
        phase = "+".join(sorted(faults_at(bands, t, end, before=SEND_TIMEOUT + 0.5))) or "none"
        error_kinds[f"{phase}: {re.sub(r'[0-9.:]+', '#', text)[:120]}"] += 1

    def pct(n: int) -> float:
        return round(100 * n / n_acked, 3) if n_acked else 0.0

    return {
        "acknowledged": n_acked,
        "failed_messages": ledger.failed_messages,
        "delivered_distinct": len(by_id),
        "stored_copies": len(copies),
        "lost": len(lost),
        "lost_ids_sample": lost[:10],
        "lost_scenarios": lost_scenarios(lost, ledger, bands, monitor)[:10],
        "queue_offsets_divergent": len(divergent),
        "queue_offsets_divergent_samples": divergent[:5],
        "acked_copies_missing": missing_copies,
        "acked_copies_recalled_by_producer": recalled,
        "acked_copies_missing_samples": missing_samples,
        "acked_not_received_by_audit_consumer": len(not_received),
        "not_received_ids_sample": sorted(not_received)[:10],
        "early": len(early_audit) + len(early_members),
        "early_audit_consumer": len(early_audit),
        "early_members": len(early_members),
        "fired_before_slot": fired_before_slot,
        "wrong_content": wrong,
        "duplicates": dups,
        "duplicates_pct": pct(dups),
        "duplicates_by_cause": dict(causes),
        "duplicates_by_cause_pct": {k: pct(v) for k, v in causes.items()},
        "refired_by_fault": refired_by_fault(by_id, bands, ledger),
        "duplicates_goal": goal,
        "duplicates_goal_pct": pct(goal),
        "duplicates_goal_leaves_out": list(BY_DESIGN),
        "duplicate_samples": samples,
        "resent_ids": len(ledger.resent),
        "audit_consumer": describe_consumer(res),
        "raw_read": {
            "rounds": res.rounds,
            "errors": len(res.raw_errors),
            "errors_sample": res.raw_errors[:5],
            "offsets_moved": res.moved[:10],
            "audit_s": res.audit_s,
        },
        **figures,
        "errors_per_fault": per_fault,
        "errors_per_5s": dict(sorted(error_times.items())),
        "error_kinds": dict(error_kinds.most_common(15)),
        "sends_over_timeout": {
            k: {"n": len(v), "max_ms": round(max(v), 1)} for k, v in sorted(over.items())
        },
        "sends_over_timeout_by_phase": dict(over_at),
        "recovery_by_fault": recovery(bands, monitor, ledger, groups),
    }
