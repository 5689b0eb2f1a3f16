"""REPORT.md from the collected results: summary tables, targets, plots, per-scenario numbers."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks._suite.plots import plot_all
from benchmarks._suite.values import flatten
from benchmarks._suite.values import fmt as _fmt

log = logging.getLogger(__name__)

__all__ = [
    "engines_table",
    "flatten",
    "peers_table",
    "rebalance_table",
    "target",
    "targets_table",
    "write_report",
]

MAX_ROWS = 80


def target(name: str, value: Any, wanted: str, met: bool, *, floor: Any = None) -> dict[str, Any]:
    """One entry of a scenario's ``targets`` list, as the targets table reads it;
    ``floor``: what this machine allows for the same figure, measured in the same run."""
    t = {"name": name, "value": value, "target": wanted, "met": bool(met)}
    if floor is not None:
        t["floor"] = floor
    return t


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    h = list(header)
    lines = ["| " + " | ".join(h) + " |", "|" + "---|" * len(h)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def peers_table(rows: list[dict[str, Any]]) -> str:
    """qclient and each peer side by side."""
    body = []
    for r in rows:
        if r.get("status") != "ok":
            reason = " ".join(str(r.get("reason", "")).split())
            body.append(
                [
                    r["peer"],
                    f"{r.get('status')}: {reason[:200]}",
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                ]
            )
            continue
        lat = r.get("lateness_ms") or {}
        k = r.get("kill9") or {}
        kill = (
            (
                f"{k['survived']}/{k['n']} ({k['survived_pct']:.0f}%)"
                + (f", {k['duplicates']} dup" if k.get("duplicates") else "")
                + (
                    f", {k['delivered_before_kill']} of them before the kill"
                    if k.get("delivered_before_kill")
                    else ""
                )
            )
            if k
            else "-"
        )
        body.append(
            [
                r["peer"],
                r.get("description", ""),
                r.get("enqueue_msgs_per_s"),
                lat.get("p50"),
                lat.get("p99"),
                lat.get("max"),
                r.get("early"),
                f"{r.get('lost')}" + (f" (+{r['duplicates']} dup)" if r.get("duplicates") else ""),
                kill,
            ]
        )
    return _table(
        [
            "system",
            "how",
            "enqueue msgs/s",
            "lateness p50 ms",
            "p99 ms",
            "max ms",
            "early",
            "lost",
            "kill -9: survived",
        ],
        body,
    )


def rebalance_table(phases: list[dict[str, Any]]) -> str:
    """rebalance_bench: per phase, how soon the queues that changed hands were consumed
    again, and what came twice."""
    body = []
    for r in sorted(phases, key=lambda r: str(r.get("name"))):  # rounds of a kind together
        tk = r.get("takeover") or {}
        body.append(
            [
                r.get("name"),
                r.get("session_timeout_s"),
                tk.get("queues"),
                tk.get("p50_s"),
                tk.get("all_s"),
                r.get("assigned_s"),
                r.get("redelivered"),
                r.get("uncommitted_at_death"),
                r.get("lost"),
                r.get("early"),
                r.get("duplicates"),
            ]
        )
    return _table(
        [
            "phase",
            "session_timeout s",
            "queues moved",
            "consumed again p50 s",
            "all s",
            "assigned s",
            "redelivered",
            "uncommitted at death",
            "lost",
            "early",
            "duplicates",
        ],
        body,
    )


_OPS = {
    ">=": lambda v, t: v >= t,
    "<=": lambda v, t: v <= t,
    "==": lambda v, t: v == t,
    ">": lambda v, t: v > t,
    "<": lambda v, t: v < t,
}


def _find_metric(result: Mapping[str, Any], name: str) -> Any:
    """The value of the flattened key equal to ``name`` or ending in ``.name`` (first found)."""
    for k, v in flatten(result):
        if (k == name or k.endswith("." + name)) and isinstance(v, int | float):
            return v
    return None


def declared_targets(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A scenario's targets as ``[{name, value, target, met}]`` (plus ``floor``: what the
    machine allows, measured in the same run, where the scenario gives one).

    Accepts the README's list form, and the short form ``{"metric>=": 30000, ...}`` whose
    metric is looked up (by key or key suffix) among the result's numbers.
    """
    raw = result.get("targets")
    out: list[dict[str, Any]] = []
    if isinstance(raw, list):
        out = [t for t in raw if isinstance(t, dict)]
    elif isinstance(raw, dict):
        for key, want in raw.items():
            op = next((o for o in (">=", "<=", "==", ">", "<") if str(key).endswith(o)), None)
            if op is None or not isinstance(want, int | float):
                out.append({"name": key, "value": None, "target": str(want), "met": None})
                continue
            metric = str(key)[: -len(op)]
            value = _find_metric(result, metric)
            met = None if value is None else bool(_OPS[op](value, want))
            out.append({"name": metric, "value": value, "target": f"{op} {want}", "met": met})
    return out


def engines_table(rows: list[dict[str, Any]]) -> str:
    """engines_bench's figures, one row each, one column per engine."""
    engines = [k for k in rows[0] if k != "name"] if rows else []
    return _table(["figure", *engines], [[r["name"], *(r.get(e) for e in engines)] for r in rows])


def targets_table(results: Mapping[str, Any]) -> str | None:
    """Every scenario's declared targets, met or not."""
    rows = []
    for name, rec in results.get("scenarios", {}).items():
        for t in declared_targets(rec.get("result") or {}):
            met = t.get("met")
            rows.append(
                [
                    name,
                    t.get("name"),
                    t.get("value"),
                    t.get("target"),
                    "**met**" if met is True else ("NOT met" if met is False else "?"),
                    t.get("floor", ""),
                ]
            )
    if not rows:
        return None
    header = ["scenario", "target", "measured", "wanted", "met?", "floor (same run)"]
    return _table(header, rows)


def write_report(results: Mapping[str, Any], out_dir: Path) -> Path:
    """Draw the plots and write REPORT.md into ``out_dir``; returns its path."""
    plots = plot_all(results, out_dir)
    scen: Mapping[str, Any] = results.get("scenarios", {})
    host = results.get("host", {})
    md = [
        "# qclient benchmark report",
        "",
        f"Run {results.get('started_at')} → {results.get('finished_at')}, git "
        f"`{results.get('git')}`, {host.get('cpus')} CPUs, {host.get('mem_gib')} GiB, "
        f"Python {host.get('python')}, {host.get('platform')}."
        + (" **Smoke run (tiny N): the numbers mean nothing.**" if results.get("smoke") else ""),
        "",
        "Reproduce: `make bench` (peers: `bash benchmarks/setup_peers.sh` first). "
        "Raw data: `latest.json`; logs: `logs/`.",
        "",
        "## Scenarios",
        "",
        _table(
            ["scenario", "status", "seconds", "note"],
            [
                [
                    n,
                    r.get("status")
                    + (f" (run {r['from_earlier_run']})" if r.get("from_earlier_run") else ""),
                    r.get("elapsed_s"),
                    (r.get("reason") or "").splitlines()[0][:160]
                    if r.get("status") != "ok"
                    else "",
                ]
                for n, r in scen.items()
            ],
        ),
        "",
    ]
    peers = scen.get("peers", {}).get("result") or {}
    if peers.get("peers"):
        wl = peers.get("workload", {})
        md += [
            "## qclient and the delay queues users pick instead",
            "",
            f"Same machine, same run, each server on loopback with its data in a temp dir. "
            f"Workload per system: {wl.get('n')} messages, random delays "
            f"{wl.get('delay_s', ['?', '?'])[0]}-{wl.get('delay_s', ['?', '?'])[1]} s, sent "
            "one at a time by one thread, each acknowledged before the next (batch rows: "
            f"{wl.get('batch')} per request); one consumer thread. Lateness = arrival at the "
            "consumer - asked time. kill -9: the same N again, the server killed right after "
            "the last acknowledgement, restarted on the same data; distinct messages that "
            "arrived in the end.",
            "",
            peers_table(peers["peers"]),
            "",
        ]
        notes = sorted({f"`{r['peer']}`: {r['note']}" for r in peers["peers"] if r.get("note")})
        for r in peers["peers"]:
            bd = r.get("breakdown") or {}
            parts = [
                f"{k.replace('_ms', '').replace('_', ' ')} p50/p99/max "
                f"{_fmt(v.get('p50'))}/{_fmt(v.get('p99'))}/{_fmt(v.get('max'))} ms"
                for k, v in bd.items()
                if isinstance(v, dict)
            ]
            if parts:
                notes.append(f"`{r['peer']}` lateness split: " + "; ".join(parts))
        md += [f"- {n}" for n in notes] + ([""] if notes else [])
    rebalance = scen.get("rebalance_bench", {}).get("result") or {}
    if rebalance.get("phases"):
        md += [
            "## Consumer-group rebalance",
            "",
            f"{rebalance.get('members')} members (child processes, each spending "
            f"{_fmt(rebalance.get('work_ms_per_msg'))} ms on a message) of one group on "
            f"{rebalance.get('queues')} queues over 2 brokers, "
            f"{_fmt(rebalance.get('due_rate_msgs_per_s'))} msgs/s coming due throughout. "
            "Consumed again = from the SIGKILL / the close() call / the joiner's start to the "
            "first message a member receives from each queue that changed hands (p50 over "
            "those queues; all = the last); assigned = when the assignments first covered "
            "them. Redelivered = what the member that left had received and another received "
            "again; uncommitted at death = what it had received past the offsets its consumer "
            "recorded as committed (an upper bound).",
            "",
            rebalance_table(rebalance["phases"]),
            "",
        ]
    engines = scen.get("engines_bench", {}).get("result") or {}
    if engines.get("side_by_side"):
        md += [
            "## Engines side by side",
            "",
            "One workload on qclient's brokers and on Apache RocketMQ 5.5.0 "
            f"({engines.get('brokers_per_engine')} broker(s) each, 100 B bodies, the same "
            "counts; engines_bench). Floor = a bare request to one broker without the SDK.",
            "",
            engines_table(engines["side_by_side"]),
            "",
        ]
    jpb = scen.get("java_producer_bench", {}).get("result") or {}
    if jpb.get("side_by_side"):
        md += [
            "## qclient's producer and RocketMQ's Java producer",
            "",
            "The same RocketMQ 5.5.0 brokers in one run (java_producer_bench): one-call, 64 "
            "threads and async in alternating rounds (the median round); under faults qclient, "
            "Java's defaults and Java with sendLatencyFaultEnable send together through a SIGSTOP "
            "and a kill -9 of a master of a replicated cluster.",
            "",
            engines_table(jpb["side_by_side"]),
            "",
        ]
    tt = targets_table(results)
    md += ["## Targets", "", tt or "No scenario reported `targets` in this run.", ""]
    md += ["## Plots", ""]
    captions = {
        "lateness_cdf": "Firing lateness CDF",
        "failover_timeline": "Send latency around a broker kill / hang (failover_bench)",
        "throughput": "Throughput",
        "chaos_timeline": "Chaos soak: faults, send latency, delivery rate (chaos_bench)",
    }
    for key, caption in captions.items():
        f = plots.get(key)
        md += [f"![{caption}]({f})" if f else f"_{caption}: no data in this run._", ""]
    md += ["## Per scenario", ""]
    for name, rec in scen.items():
        md += [
            f"### {name}",
            "",
            f"Status: {rec.get('status')}"
            + (f" — {rec['reason']}" if rec.get("reason") and rec.get("status") != "ok" else ""),
            "",
        ]
        res = rec.get("result") or {}
        for note in res.get("notes") or []:
            md.append(f"- {note}")
        rows = [(k, v) for k, v in flatten(res) if k not in ("scenario",)]
        if name == "peers":
            rows = []
        if rows:
            more = len(rows) - MAX_ROWS
            md += ["", _table(["metric", "value"], rows[:MAX_ROWS])]
            if more > 0:
                md.append(f"\n… {more} more in latest.json")
        md.append("")
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(md) + "\n")
    return path
