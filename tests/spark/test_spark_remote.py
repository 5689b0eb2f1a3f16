"""The sink and the pandas UDF where pipelines run: a Spark standalone cluster (master,
worker and executors as JVM processes of their own, the SDK shipped to them as a zip with
``--py-files``) and Spark Connect (a server started here; the SDK shipped with
``addArtifacts(pyfile=True)``), against a real two-broker LocalCluster.

One application (``spark_app.py``) runs every scenario once per deployment; the tests
below check what each scenario did and what the brokers delivered.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from benchmarks._spark_cluster import (
    ConnectServer,
    StandaloneSpark,
    sdk_zip,
    spark_env,
    spark_home,
)
from tests._budget import spark_slot
from tests.integration.helpers import drain, not_early

from qclient import LocalCluster, ReceivedMessage

# A quiet 2-core machine runs each deployment's app in about a minute; a loaded one
# (several test suites at once) can take five.
APP_TIMEOUT = 480
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(APP_TIMEOUT + 120)]

APP = Path(__file__).resolve().parent / "spark_app.py"

#: Rows of the batch write per deployment: several chunks per partition on each broker
ROWS = {"standalone": 5_000, "connect": 5_000}
UDF_ROWS = 1_000
STREAM_ROWS = 600


@dataclass
class AppRun:
    deployment: str
    namesrv: str
    prefix: str
    results: dict[str, dict[str, Any]]
    stderr: str

    def result(self, scenario: str) -> dict[str, Any]:
        res = self.results.get(scenario)
        assert res is not None, f"{scenario}: no result; stderr tail:\n{self.stderr[-3000:]}"
        assert res["ok"], f"{scenario}: {res.get('error')}\n{self.stderr[-3000:]}"
        return res

    def topic(self, scenario: str) -> str:
        return f"{self.prefix}_{scenario}"


@pytest.fixture(scope="module")
def brokers() -> Iterator[LocalCluster]:
    with LocalCluster(brokers=2) as c:
        yield c


def _run_app(argv: list[str], env: dict[str, str], deployment: str) -> AppRun:
    """Run the application to its end; on a timeout or an error, kill its process group
    (the driver JVM and the Python driver it started)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=APP_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    results = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            obj = json.loads(line)
            results[obj.pop("scenario")] = obj
    assert proc.returncode == 0, f"the app failed ({proc.returncode}):\n{stderr[-4000:]}"
    return AppRun(deployment, "", "", results, stderr)


@pytest.fixture(scope="module", params=["standalone", "connect"])
def app(
    request: pytest.FixtureRequest, brokers: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AppRun]:
    deployment = request.param
    work = tmp_path_factory.mktemp(f"spark-{deployment}")
    prefix = f"{deployment}_{os.getpid()}_{int(time.time())}"
    zip_path = sdk_zip(work)
    args = [
        str(APP),
        brokers.namesrv,
        prefix,
        "--batch-rows",
        str(ROWS[deployment]),
        "--udf-rows",
        str(UDF_ROWS),
        "--stream-rows",
        str(STREAM_ROWS),
        "--checkpoint",
        str(work / "checkpoint"),
    ]
    if deployment == "standalone":
        with spark_slot(), StandaloneSpark(work / "cluster") as cluster:
            argv = [
                str(spark_home() / "bin" / "spark-submit"),
                *cluster.submit_args(),
                "--py-files",
                str(zip_path),
                *args,
            ]
            # the driver and the executors import the SDK from the zip only
            run = _run_app(argv, spark_env(), deployment)
    else:
        with spark_slot(), ConnectServer(work / "connect") as server:
            argv = [sys.executable, *args, "--remote", server.url, "--artifact", str(zip_path)]
            # the client imports the SDK as installed; the server's Python workers get the zip
            run = _run_app(argv, dict(os.environ), deployment)
    run.namesrv, run.prefix = brokers.namesrv, prefix
    yield run


def _distinct(got: list[ReceivedMessage]) -> dict[str, ReceivedMessage]:
    return {m.msg_id: m for m in got}


def test_workers_import_the_shipped_sdk(app: AppRun) -> None:
    files = app.result("where")["files"]
    assert files and all("qclient-sdk.zip" in f for f in files), files


def test_batch_write_delivered_once_none_early(app: AppRun) -> None:
    res = app.result("batch")
    n, t0 = res["rows"], res["t0_ms"]
    got = drain(app.namesrv, app.topic("batch"), "g", n, timeout=90, settle=1.0)
    by_id = _distinct(got)
    # every row once, no duplicates; if an id comes twice, say where each copy was (two
    # brokers: stored twice; one broker, queue and offset: read twice)
    twice = [i for i, k in Counter(m.msg_id for m in got).items() if k > 1]
    copies = sorted(
        (m.msg_id, m.broker_name, m.queue_id, m.offset, m.deliver_at_ms, m.fired_at_ms)
        for m in got
        if m.msg_id in twice[:3]
    )
    assert len(got) == len(by_id) == n, (
        f"{len(got)} received, {len(by_id)} ids of {n}; {len(twice)} ids twice, copies {copies}"
    )
    assert sorted(int(m.body) for m in by_id.values()) == list(range(n))
    for m in got:
        delay = (int(m.body) % 5) * 300
        assert m.deliver_at_ms >= t0 + delay  # scheduled no earlier than asked
        assert not_early(m)


def test_extra_column_is_ignored_with_one_warning(app: AppRun) -> None:
    app.result("batch")
    if app.deployment == "standalone":  # the driver's log is this app's stderr
        assert len(re.findall(r"ignoring column 'colour'", app.stderr)) == 1
        # a stream plans its writer at start in a Python process of its own, then every
        # micro-batch in a reused one: one warning per process, not one per micro-batch
        assert 1 <= len(re.findall(r"ignoring column 'timestamp'", app.stderr)) <= 2


def test_misspelt_delay_column_fails_naming_delay_ms(app: AppRun) -> None:
    res = app.result("misspelt")
    assert res["raised"]
    assert "'delay' looks like the sink column 'delay_ms'" in res["error"]
    assert drain(app.namesrv, app.topic("misspelt"), "g", 1, timeout=2.0) == []


def test_pandas_udf_returns_send_ok_per_row(app: AppRun) -> None:
    res = app.result("udf")
    assert res["statuses"] == ["SEND_OK"], res["errors"]
    ids = res["ids"]
    assert sorted(int(v) for v in ids.values()) == list(range(UDF_ROWS))
    got = drain(app.namesrv, app.topic("udf"), "g", UDF_ROWS, timeout=60, settle=0.5)
    assert {m.msg_id: m.body.decode() for m in got} == ids
    assert len(got) == UDF_ROWS


def test_streaming_delivers_every_reported_row(app: AppRun) -> None:
    res = app.result("stream")
    assert res["exception"] is None
    reported = res["reported"]
    assert reported >= STREAM_ROWS
    got = drain(app.namesrv, app.topic("stream"), "g", reported, timeout=60, settle=1.0)
    by_value = Counter(int(m.body) for m in got)
    assert set(range(reported)) <= set(by_value)  # every reported row delivered
    # and none twice; if one comes twice, say where each copy was (one id on two brokers:
    # stored twice; two ids: written twice)
    twice = {v for v, k in by_value.items() if k > 1}
    copies = sorted(
        (int(m.body), m.msg_id, m.broker_name, m.queue_id, m.offset, m.deliver_at_ms)
        for m in got
        if int(m.body) in sorted(twice)[:3]
    )
    assert not twice, f"{len(twice)} rows twice, copies {copies}"
    assert all(not_early(m) for m in got)
    if app.deployment == "standalone":
        # each micro-batch's counts reach the driver and show in its log
        sent = [
            int(m.group(1))
            for m in re.finditer(r"qclient sink: batch \d+: (\d+) of \d+ rows sent", app.stderr)
        ]
        assert sent and sum(sent) >= reported
