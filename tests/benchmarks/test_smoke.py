"""Smoke runs of every benchmark scenario with tiny N, so the scripts cannot rot.

Peers that are not installed here are skipped with the reason; `make bench` runs them
all for real (after `bash benchmarks/setup_peers.sh`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path

import psutil
import pytest
from benchmarks._suite.runner import SCENARIOS, Scenario, run_scenario, run_suite
from benchmarks.peers import PEERS, PeerSpec
from benchmarks.peers.workload import Workload, percentile, run_peer
from tests._budget import spark_slot

#: run RabbitMQ and Celery too (each takes ~10 s to start and restart)
ALL_PEERS = os.environ.get("QCLIENT_BENCH_SMOKE_ALL") == "1"

#: tiny and short: delivery and the kill -9 phase in ~2 s per peer
TINY = Workload(n=20, min_delay_s=0.1, max_delay_s=0.3, grace_s=2.0, batch=8)

#: peers whose acknowledgement is durable: everything must survive kill -9
DURABLE = {
    "qclient",
    "qclient-batch",
    "redis-aof-always",
    "redis-aof-everysec",
    "beanstalkd-binlog",
    "rabbitmq",
}

#: chaos_bench --smoke is the ~60 s soak, run and checked by tests/integration/test_chaos.py;
#: one-off decision experiments (``smoke=False``) are run by hand
OTHERS = [
    # each runs a whole script with its own cluster: slow, out of make test-quick
    pytest.param(
        sc,
        id=sc.name,
        marks=[
            pytest.mark.slow,
            # the script's own bound ends it first (run_scenario), with its output
            pytest.mark.timeout(sc.smoke_timeout_s + 60),
            *([pytest.mark.jvm(sc.jvm)] if sc.jvm else []),
        ],
    )
    for sc in SCENARIOS
    if sc.smoke and sc.name not in ("peers", "chaos_bench")
]


@pytest.mark.parametrize("sc", OTHERS)
def test_scenario_script_smoke(sc: Scenario, tmp_path: Path) -> None:
    """Each scenario script runs with --smoke --json and ends with one JSON object."""
    if not sc.exists():
        pytest.skip(f"{sc.path.name} not written yet")
    with spark_slot() if sc.jvm == "spark" else contextlib.nullcontext():
        rec = run_scenario(sc, smoke=True, logs=tmp_path)
    if rec["status"] == "skipped":
        pytest.skip(f"{sc.name}: {rec['reason']} (convention: benchmarks/README.md)")
    assert rec["status"] == "ok", f"{sc.name}: {rec.get('reason')}"
    assert isinstance(rec["result"], dict) and rec["result"]


SMOKE_PEERS = [p for p in PEERS if p.label != "redis-batch"]


@pytest.mark.slow
@pytest.mark.parametrize("spec", SMOKE_PEERS, ids=[p.label for p in SMOKE_PEERS])
def test_peer_smoke(spec: PeerSpec, tmp_path: Path) -> None:
    """Every peer adapter delivers a tiny workload, none early, and survives its kill -9."""
    peer = spec.make()
    why = peer.missing()
    if why:  # first: a peer that is not installed is skipped for that, whatever else
        pytest.skip(f"{spec.label}: {why}")
    if not spec.in_smoke and not ALL_PEERS:
        pytest.skip(f"{spec.label}: slow to start; QCLIENT_BENCH_SMOKE_ALL=1 runs it")
    # The batch rows share their server and kill path with the plain rows: no second kill.
    w = dataclasses.replace(TINY, kill_test=False) if spec.batch else TINY
    row = run_peer(peer, w, label=spec.label, batch=spec.batch, keep_dir=tmp_path)
    assert row["status"] == "ok", row.get("reason")
    assert row["delivered"] == TINY.n and row["lost"] == 0
    assert row["early"] == 0, row["lateness_ms"]
    assert row["enqueue_msgs_per_s"] > 0
    if spec.batch:
        return
    kill = row["kill9"]
    assert 0 <= kill["survived"] <= TINY.n
    if spec.label in DURABLE:
        assert kill["survived"] == TINY.n, kill


def test_runner_reports_missing_times_out_and_writes_report(tmp_path: Path) -> None:
    """Missing scripts are 'missing', a hung one is killed (with its child) at its time
    limit, bad output is an error, and the report and plots are written."""
    pidfile = tmp_path / "child.pid"
    selftest = "benchmarks._suite._selftest"
    scenarios = [
        Scenario("not_written", "benchmarks.not_written_bench", 10),
        Scenario("ok", selftest, 30, smoke_args=("--mode", "ok")),
        Scenario(
            "hang",
            selftest,
            3,
            smoke_timeout_s=3,
            smoke_args=("--mode", "hang", "--pidfile", str(pidfile)),
        ),
        Scenario("garbage", selftest, 30, smoke_args=("--mode", "garbage")),
        Scenario("fail", selftest, 30, smoke_args=("--mode", "fail")),
    ]
    t0 = time.monotonic()
    results = run_suite(scenarios, smoke=True, out_dir=tmp_path, progress=False)
    assert time.monotonic() - t0 < 60
    st = {n: r["status"] for n, r in results["scenarios"].items()}
    assert st == {
        "not_written": "missing",
        "ok": "ok",
        "hang": "timeout",
        "garbage": "error",
        "fail": "error",
    }
    assert "boom" in results["scenarios"]["fail"]["reason"]
    assert results["scenarios"]["ok"]["result"]["value"] == 42
    # the hung scenario's child went with it
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child) and time.monotonic() < deadline:
        if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
    saved = json.loads((tmp_path / "latest.json").read_text())
    assert saved["scenarios"]["ok"]["result"]["value"] == 42
    report = (tmp_path / "REPORT.md").read_text()
    assert "| not_written | missing |" in report
    assert "| ok | value | 42 | >= 40 | **met** |" in report
    assert (tmp_path / "throughput.png").stat().st_size > 1000


def test_report_draws_every_plot(tmp_path: Path) -> None:
    """Given lateness samples, a kill timeline and throughputs, all three PNGs appear."""
    from benchmarks._suite.report import write_report

    peers_row = {
        "peer": "qclient",
        "status": "ok",
        "description": "d",
        "n": 3,
        "enqueue_msgs_per_s": 100.0,
        "delivered": 3,
        "lost": 0,
        "duplicates": 0,
        "early": 0,
        "lateness_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0},
        "kill9": {"n": 3, "survived": 3, "survived_pct": 100.0, "duplicates": 0},
    }
    results = {
        "started_at": "t0",
        "finished_at": "t1",
        "git": "abc",
        "host": {},
        "smoke": True,
        "scenarios": {
            "peers": {
                "status": "ok",
                "result": {
                    "peers": [
                        peers_row,
                        {"peer": "rabbitmq", "status": "skipped", "reason": "not installed"},
                    ],
                    "workload": {"n": 3, "delay_s": [1, 5], "batch": 8},
                    "throughput": {"qclient enqueue": 100.0},
                    "lateness_samples_ms": {"qclient": [1.0, 2.0, 3.0]},
                },
            },
            "failover_bench": {
                "status": "ok",
                "result": {
                    "timeline": {
                        "kill, FT on": {
                            "t_s": [0.1, 0.2, 0.3],
                            "latency_ms": [2.0, 900.0, 3.0],
                            "events": [[0.15, "kill -9"]],
                        }
                    }
                },
            },
        },
    }
    path = write_report(results, tmp_path)
    text = path.read_text()
    for png in ("lateness_cdf.png", "failover_timeline.png", "throughput.png"):
        assert (tmp_path / png).stat().st_size > 1000, png
        assert f"({png})" in text
    assert "| qclient | d | 100 | 1 | 2 | 3 | 0 | 0 | 3/3 (100%) |" in text
    assert "rabbitmq | skipped: not installed" in text


def test_percentile_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == 50.0
    assert percentile(xs, 99) == 99.0
    assert percentile(xs, 100) == 100.0
    assert percentile([5.0], 99) == 5.0


def test_short_form_targets_and_pretty_json() -> None:
    """broker_bench's ``{"metric>=": n}`` targets are checked against its nested numbers;
    a pretty-printed final object is still found."""
    from benchmarks._suite.report import declared_targets
    from benchmarks._suite.runner import _last_json

    res = {
        "accept": {"accepted_msgs_per_s": 41000.0},
        "firing": {"lateness_p99_ms": 12.0, "early": 0},
        "targets": {"accepted_msgs_per_s>=": 30000, "lateness_p99_ms<=": 10, "early==": 0},
    }
    got = {t["name"]: (t["value"], t["met"]) for t in declared_targets(res)}
    assert got == {
        "accepted_msgs_per_s": (41000.0, True),
        "lateness_p99_ms": (12.0, False),
        "early": (0, True),
    }
    assert _last_json('log line\n{\n  "a": 1,\n  "b": {"c": 2}\n}\n') == {"a": 1, "b": {"c": 2}}
    assert _last_json("x\nnot json\n") is None


def test_targets_table_shows_the_floor_measured_in_the_run() -> None:
    """A target that carries the machine's floor (one_call_bench's request floor) shows it
    beside the goal; a target without one leaves the column empty."""
    from benchmarks._suite.report import targets_table

    table = targets_table(
        {
            "scenarios": {
                "one_call_bench": {
                    "result": {
                        "targets": [
                            {
                                "name": "cpu",
                                "value": 388,
                                "target": "<= 150",
                                "met": False,
                                "floor": 208,
                            },
                            {"name": "ratio", "value": 12, "target": ">= 10", "met": True},
                        ]
                    }
                }
            }
        }
    )
    assert table is not None
    assert "floor (same run)" in table.splitlines()[0]
    cpu = next(line for line in table.splitlines() if "| cpu |" in line)
    ratio = next(line for line in table.splitlines() if "| ratio |" in line)
    assert cpu.split("|")[-2].strip() == "208"
    assert ratio.split("|")[-2].strip() == ""
    assert "NOT met" in cpu and "**met**" in ratio


def test_merge_keeps_earlier_results(tmp_path: Path) -> None:
    """--merge keeps what an earlier run wrote for the scenarios not run now."""
    selftest = "benchmarks._suite._selftest"
    first = Scenario("first", selftest, 30, smoke_args=("--mode", "ok"))
    second = Scenario("second", selftest, 30, smoke_args=("--mode", "ok"))
    run_suite([first], smoke=True, out_dir=tmp_path, progress=False)
    results = run_suite([second], smoke=True, out_dir=tmp_path, progress=False, merge=True)
    assert set(results["scenarios"]) == {"first", "second"}
    assert results["scenarios"]["first"]["from_earlier_run"]
    assert "from_earlier_run" not in results["scenarios"]["second"]


def test_report_rebalance_section(tmp_path: Path) -> None:
    """rebalance_bench's phases get their own table in REPORT.md."""
    from benchmarks._suite.report import write_report

    phase = {
        "name": "kill @6s",
        "session_timeout_s": 6.0,
        "takeover": {"queues": 6, "p50_s": 7.1, "all_s": 7.2},
        "assigned_s": 7.0,
        "redelivered": 3,
        "uncommitted_at_death": 4,
        "lost": 0,
        "early": 0,
        "duplicates": 3,
    }
    result = {"members": 3, "queues": 16, "due_rate_msgs_per_s": 1000.0, "phases": [phase]}
    results = {"smoke": True, "scenarios": {"rebalance_bench": {"status": "ok", "result": result}}}
    text = write_report(results, tmp_path).read_text()
    assert "## Consumer-group rebalance" in text
    assert "| kill @6s | 6 | 6 | 7.1 | 7.2 | 7 | 3 | 4 | 0 | 0 | 3 |" in text
