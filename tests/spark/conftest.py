"""A local[2,2] SparkSession per module (a session costs ~5 s), holding the host's one
Spark driver (``spark_slot``, tests/_budget.py): a module that starts Spark processes of its
own (a standalone cluster, a Connect server, a session of its own) runs with no other
driver alive, and the Spark tests on RocketMQ (another worker) wait for the slot."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks._spark_cluster import QUICK_JVM
from tests._budget import spark_slot

HERE = Path(__file__).resolve().parent

pyspark = pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The session; workers run this interpreter and can import the fake producer."""
    with spark_slot():
        yield from _session(tmp_path_factory)


def _session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from pyspark.sql import SparkSession

    import spark_udfs

    sink_dir = tmp_path_factory.mktemp("fake-sink")
    saved = {
        k: os.environ.get(k)
        for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "QCLIENT_FAKE_SINK_DIR")
    }
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), saved["PYTHONPATH"]) if p)
    # The fakes write under per-test subdirectories of this one (see `fake_sink`).
    os.environ["QCLIENT_FAKE_SINK_DIR"] = str(sink_dir)
    session = (
        # local[2,2]: a failed task gets one retry, as on a cluster (spark.task.maxFailures);
        # plain local[2] never retries, so a worker the host loses would fail the query.
        SparkSession.builder.master("local[2,2]")
        .appName("qclient-spark-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.driver.memory", "768m")
        # C1 and the serial collector: a test session lives a module, not a pipeline's hours
        .config("spark.driver.extraJavaOptions", QUICK_JVM)
        .config("spark.python.worker.reuse", "true")
        # A crashed Python worker then reports its Python stack, not only "exited unexpectedly".
        .config("spark.python.worker.faulthandler.enabled", "true")
        .config("spark.sql.execution.pyspark.udf.faulthandler.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_udfs.register(session)
    try:
        yield session
    finally:
        session.stop()
        _stop_gateway()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stop_gateway() -> None:
    """End the driver's JVM: ``SparkSession.stop`` stops the context but keeps the py4j
    gateway JVM for the process's next session, which would then also inherit the old
    session's environment; the JVM exits when its stdin closes (PythonGatewayServer)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        proc.stdin.close()
        proc.wait(60)
    SparkContext._gateway = None
    SparkContext._jvm = None


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name of its own for each test (tests share the session and the sinks)."""
    import re
    import uuid

    name = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:60]
    return f"{name}_{uuid.uuid4().hex[:6]}"
