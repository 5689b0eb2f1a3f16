"""The chaos soak's smoke run: benchmarks/chaos_bench.py --smoke, then every acknowledged
message checked.

qclient's engine (~60 s, ``make test``): a real 3-broker cluster with kills, pauses, clean
restarts, a name-server outage, one all-down, and consumer-group members joining and
dying. RocketMQ (RocketMQ's long suite): a replicated cluster -- 2 groups, each a master
and a slave in controller mode -- whose masters and slaves are killed, paused and
stopped, with a NameServer restart; its duplicates are counted by cause at the storage
level."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from tests.engines.rocketmq._needs import needs_rocketmq

ROOT = Path(__file__).resolve().parents[2]


def _marked(mark: str) -> list[psutil.Process]:
    """Processes still alive that the run started (they inherited its marker variable)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("QCLIENT_CHAOS_MARK") == mark and p.status() != "zombie":
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


#: the run's limit: a replicated RocketMQ cluster's five JVMs take a minute or more to
#: start on a busy 2-core host, before the run's 30 s
TIMEOUT_S = {"qclient": 240, "rocketmq": 480}


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param("qclient", marks=pytest.mark.slow),
        pytest.param(
            "rocketmq",
            marks=[
                pytest.mark.slow,
                pytest.mark.jvm,
                pytest.mark.timeout(600),
                needs_rocketmq,
            ],
        ),
    ],
)
def test_chaos_soak_loses_nothing_and_stops_everything(engine: str, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    env = {**os.environ, "QCLIENT_CHAOS_MARK": mark}
    cmd = [sys.executable, "-m", "benchmarks.chaos_bench", "--smoke", "--json"]
    cmd += ["--engine", engine]
    cmd += ["--plot", str(tmp_path / "chaos.png")]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S[engine])
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"chaos run did not finish in {TIMEOUT_S[engine]} s: {err[-2000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        left = _marked(mark)
        for p in left:
            p.kill()
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"
    assert proc.returncode == 0, err[-3000:]
    res = json.loads(out.strip().splitlines()[-1])
    assert res["acknowledged"] > 500
    assert res["lost"] == 0, res["lost_ids_sample"]
    assert res["early"] == 0
    assert res["wrong_content"] == 0
    assert res["nemesis_failures"] == []
    faults = res["faults"]
    if engine == "qclient":
        # --smoke goes on until it made 6 (a loaded host makes each fault slower)
        assert faults.get("all_down") == 3 and sum(faults.values()) >= 6, faults
    else:
        print(
            f"\nrocketmq smoke: duplicates {res['duplicates_by_cause']}, audit consumer "
            f"{res['audit_consumer']}, faults {faults}"
        )
        # a fresh group received every stored message, and every copy is counted
        assert res["acked_not_received_by_audit_consumer"] == 0, res["not_received_ids_sample"]
        assert sum(res["duplicates_by_cause"].values()) == res["duplicates"]
        # a master and a slave were hit, and the NameServer restarted
        roles = {k.rsplit("_", 1)[-1] for k in faults if k != "namesrv"}
        assert roles == {"master", "slave"} and "namesrv" in faults, faults
    assert (tmp_path / "chaos.png").stat().st_size > 10_000
