"""The installed dependencies are ones PySpark supports: a session prints no warning wall."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from benchmarks._spark_cluster import QUICK_JVM
from tests._budget import spark_slot

pytestmark = pytest.mark.spark

# A session with Arrow on both sides: a pandas UDF (workers) and toPandas (driver), the
# paths where PySpark checks the pandas version and warns about an unsupported one.
_JOB = textwrap.dedent(
    """
    from pyspark.sql import SparkSession, functions as F
    import pandas as pd

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "512m")
             .config("spark.driver.extraJavaOptions", {quick!r}).getOrCreate())

    @F.pandas_udf("long")
    def plus_one(s: pd.Series) -> pd.Series:
        return s + 1

    out = spark.range(10).select(plus_one("id").alias("x")).toPandas()
    assert out["x"].tolist() == list(range(1, 11))
    spark.stop()
    print("job ok")
    """
).replace("{quick!r}", repr(QUICK_JVM))


def test_a_spark_session_prints_no_future_warning() -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with spark_slot():
        proc = subprocess.run(
            [sys.executable, "-c", _JOB], capture_output=True, text=True, timeout=180, env=env
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "job ok" in proc.stdout
    assert "FutureWarning" not in proc.stderr, proc.stderr[-3000:]
