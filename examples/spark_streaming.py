"""Streaming: Spark's rate source → a delayed message per row through the "qclient"
data source (``writeStream.format("qclient")``), then every row the query reported is
consumed once, after its delay.

    .venv/bin/python examples/spark_streaming.py [seconds]

Starts its own LocalCluster and a local[2] SparkSession; runs the stream ~10 s
(longer while Spark warms up, at most 90 s).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import spark_udfs
from qclient import Consumer, LocalCluster

TOPIC = "ticks"
DELAY_MS = 1500


def main(seconds: float = 10.0) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("qclient-spark-streaming")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    # stop() interrupts the micro-batch in flight and Spark logs that at ERROR; the
    # batch was not committed, and a restart would replay it with the same message ids.
    spark.sparkContext.setLogLevel("FATAL")
    spark_udfs.register(spark)
    try:
        with (
            LocalCluster(brokers=2) as cluster,
            tempfile.TemporaryDirectory(prefix="qclient-ck-") as checkpoint,
        ):
            print(f"cluster up: namesrv={cluster.namesrv}")
            rows = (
                spark.readStream.format("rate")
                .option("rowsPerSecond", 500)
                .option("numPartitions", 2)
                .load()
                .select(
                    F.format_string("tick %d at %s", "value", "timestamp").alias("value"),
                    F.col("value").cast("string").alias("key"),
                    F.lit(DELAY_MS).cast("long").alias("delay_ms"),
                )
            )
            query = (
                rows.writeStream.format("qclient")
                .option("namesrv", cluster.namesrv)
                .option("topic", TOPIC)
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="1 second")
                .start()
            )
            # Run at least `seconds`, and until 3 micro-batches carried rows (the first
            # Python worker can take a while to start on a busy machine); at most 90 s.
            start = time.monotonic()
            while query.isActive and time.monotonic() - start < 90:
                batches = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
                if batches >= 3 and time.monotonic() - start >= seconds:
                    break
                time.sleep(0.5)
            query.stop()
            if query.exception() is not None:
                print(f"query failed: {query.exception()}", file=sys.stderr)
                return 1
            reported = sum(p["numInputRows"] for p in query.recentProgress)
            print(
                f"stream stopped: {reported} rows reported in "
                f"{len(query.recentProgress)} micro-batches"
            )

            seen: Counter[str] = Counter()
            deadline = time.monotonic() + 30
            with Consumer(cluster.namesrv, TOPIC, "ticker") as consumer:
                want = set(map(str, range(reported)))
                while time.monotonic() < deadline and not want <= set(seen):
                    for m in consumer.poll(1000, 0.5):
                        seen[m.key or ""] += 1
            missing = len(want - set(seen))
            twice = sum(1 for n in seen.values() if n > 1)
            print(
                f"delivered {len(seen)} distinct rows ({missing} of the reported missing, "
                f"{twice} delivered twice), each ~{DELAY_MS} ms after it was written"
            )
            return 0 if missing == 0 and twice == 0 else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0))
