"""One shared local[2,2] SparkSession for every Spark test (a session costs ~5 s)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pyspark = pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The session; workers run this interpreter and can import the fake producer."""
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
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name of its own for each test (tests share the session and the sinks)."""
    import re
    import uuid

    name = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:60]
    return f"{name}_{uuid.uuid4().hex[:6]}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, every Spark test runs in one worker (``--dist loadgroup``):
    one shared SparkSession and one JVM at a time on a 2-core machine."""
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.xdist_group("spark"))
