"""The ~60 s chaos soak of ``make test``: benchmarks/chaos_bench.py --smoke on a real
3-broker cluster with kills, pauses, clean restarts, a name-server outage, one all-down,
and consumer-group members joining and dying; then every acknowledged message checked."""

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


def test_chaos_soak_loses_nothing_and_stops_everything(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    env = {**os.environ, "QCLIENT_CHAOS_MARK": mark}
    cmd = [sys.executable, "-m", "benchmarks.chaos_bench", "--smoke", "--json"]
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
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"chaos run did not finish in 240 s: {err[-2000:]}")
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
    assert faults.get("all_down") == 3 and sum(faults.values()) >= 6, faults
    assert (tmp_path / "chaos.png").stat().st_size > 10_000
