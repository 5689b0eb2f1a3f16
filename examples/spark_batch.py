"""Batch: a DataFrame of reminders, each with its own ``deliver_at``, sent through the
"qclient" Spark data source to a local two-broker cluster, then consumed as they fire.

    .venv/bin/python examples/spark_batch.py

Starts its own LocalCluster and a local[2] SparkSession; ends in well under a minute.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime, timedelta

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import spark_udfs
from qclient import Consumer, LocalCluster

N_USERS = 200
TOPIC = "reminders"


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("qclient-spark-batch")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_udfs.register(spark)
    try:
        with LocalCluster(brokers=2) as cluster:
            print(f"cluster up: namesrv={cluster.namesrv}")
            # Far enough ahead that starting the Python workers does not make them late.
            start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=15)
            # Each user gets a reminder 15..17 s from now; the message id is the reminder's
            # own key, so running this write twice would not remind anyone twice.
            reminders = spark.range(N_USERS, numPartitions=4).select(
                F.concat(F.lit("reminder for user "), F.col("id")).alias("value"),
                F.concat(F.lit("user-"), F.col("id")).alias("key"),
                (
                    F.lit(start) + F.make_interval(secs=(F.col("id") % 3).cast("decimal(18,6)"))
                ).alias("deliver_at"),
                F.concat(F.lit("reminder-2024-"), F.col("id")).alias("msg_id"),
                F.create_map(F.lit("kind"), F.lit("reminder")).alias("properties"),
            )
            t0 = time.monotonic()
            (
                reminders.write.format("qclient")
                .option("namesrv", cluster.namesrv)
                .option("topic", TOPIC)
                .mode("append")
                .save()
            )
            print(
                f"wrote {N_USERS} reminders in {time.monotonic() - t0:.1f}s; "
                f"first due at {start.isoformat()}"
            )

            got: dict[str, int] = {}
            early = 0
            deadline = time.monotonic() + 30
            with Consumer(cluster.namesrv, TOPIC, "reminder-service") as consumer:
                while len(got) < N_USERS and time.monotonic() < deadline:
                    for m in consumer.poll(256, 0.5):
                        late_ms = int(time.time() * 1000) - m.deliver_at_ms  # as received
                        got[m.msg_id] = late_ms
                        early += late_ms < 0
            if len(got) < N_USERS:
                print(f"only {len(got)} of {N_USERS} reminders arrived", file=sys.stderr)
                return 1
            late = sorted(got.values())
            print(
                f"all {N_USERS} reminders delivered, {early} early; lateness p50 "
                f"{late[len(late) // 2]} ms, max {late[-1]} ms"
            )
            return 0 if early == 0 else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
