"""A user's Spark application writing to qclient, run by the tests as its own driver:
``spark-submit --master spark://... --py-files qclient-sdk.zip spark_app.py ...`` on a
standalone cluster, or ``python spark_app.py --remote sc://... --artifact zip ...``
through Spark Connect. Prints one JSON line per scenario on stdout.

    spark_app.py NAMESRV PREFIX [--remote URL] [--artifact ZIP] [--batch-rows N]
                 [--udf-rows N] [--stream-rows N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


def _emit(scenario: str, **fields: Any) -> None:
    print(json.dumps({"scenario": scenario, **fields}), flush=True)


def _run(scenario: str, fn: Callable[[], dict[str, Any]]) -> None:
    t0 = time.monotonic()
    try:
        res = fn()
        _emit(scenario, ok=True, seconds=round(time.monotonic() - t0, 1), **res)
    except Exception as exc:
        traceback.print_exc()
        _emit(scenario, ok=False, error=f"{type(exc).__name__}: {exc}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("namesrv")
    ap.add_argument("prefix", help="topic prefix; each scenario writes to PREFIX_<scenario>")
    ap.add_argument("--remote", help="a Spark Connect URL (sc://host:port)")
    ap.add_argument("--artifact", help="a zip to ship with addArtifacts(pyfile=True)")
    ap.add_argument("--batch-rows", type=int, default=20_000)
    ap.add_argument("--udf-rows", type=int, default=1_000)
    ap.add_argument("--stream-rows", type=int, default=600)
    ap.add_argument("--checkpoint", default="/tmp/qclient-app-ck", help="streaming checkpoint dir")
    args = ap.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_udfs

    t0 = time.monotonic()
    builder = SparkSession.builder.appName("qclient-app")
    spark = builder.remote(args.remote).getOrCreate() if args.remote else builder.getOrCreate()
    if args.artifact:
        spark.addArtifacts(args.artifact, pyfile=True)
    if not args.remote:
        spark.sparkContext.setLogLevel("WARN")
    spark_udfs.register(spark)
    spark_udfs.activate(spark)  # a no-op through Spark Connect
    _emit("session", ok=True, seconds=round(time.monotonic() - t0, 1))
    ns, prefix = args.namesrv, args.prefix

    def where() -> dict[str, Any]:
        # Which spark_udfs the Python workers import: the shipped zip, not an install.
        def module_file(_):  # type: ignore[no-untyped-def]  # no hints: a plain Python UDF
            import spark_udfs

            return str(spark_udfs.__file__)

        module_file = F.udf(module_file, "string")

        files = spark.range(0, 4, numPartitions=2).select(module_file("id").alias("f")).collect()
        return {"files": sorted({r.f for r in files})}

    def batch() -> dict[str, Any]:
        n = args.batch_rows
        df = spark.range(0, n, numPartitions=4).select(
            F.col("id").cast("string").alias("value"),
            ((F.col("id") % 5) * 300).alias("delay_ms"),  # 0 .. 1.2 s
            F.lit("ignored").alias("colour"),  # not a sink column: ignored
        )
        t0 = time.time_ns() // 1_000_000
        (
            df.write.format("qclient")
            .option("namesrv", ns)
            .option("topic", f"{prefix}_batch")
            .mode("append")
            .save()
        )
        return {"rows": n, "t0_ms": t0}

    def misspelt() -> dict[str, Any]:
        df = spark.range(0, 10).select(
            F.col("id").cast("string").alias("value"), F.lit(5000).alias("delay")
        )
        try:
            (
                df.write.format("qclient")
                .option("namesrv", ns)
                .option("topic", f"{prefix}_misspelt")
                .mode("append")
                .save()
            )
        except Exception as exc:
            return {"raised": True, "error": str(exc)[:2000]}
        return {"raised": False}

    def udf() -> dict[str, Any]:
        send = spark_udfs.send_delayed_udf(ns, f"{prefix}_udf")
        df = spark.range(0, args.udf_rows, numPartitions=2).select(
            F.col("id").cast("string").alias("value"), (F.col("id") % 3 * 100).alias("delay_ms")
        )
        rows = (
            df.select("value", send("value", "delay_ms").alias("r"))
            .select("value", "r.msg_id", "r.status", "r.error")
            .collect()
        )
        return {
            "statuses": sorted({r.status for r in rows}),
            "errors": sorted({r.error for r in rows if r.error})[:5],
            "ids": {r.msg_id: r.value for r in rows},
        }

    def stream() -> dict[str, Any]:
        src = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 300)
            .option("numPartitions", 2)
            .load()
        )
        query = (
            src.select(
                F.col("value").cast("string").alias("value"),
                # 10 s: longer than the producer's clean-up of an extra copy left by an
                # attempt that timed out on a loaded host, so each row fires once
                F.lit(10_000).cast("long").alias("delay_ms"),
                "timestamp",  # the rate source's other column: ignored
            )
            .writeStream.format("qclient")
            .option("namesrv", ns)
            .option("topic", f"{prefix}_stream")
            .option("rows_per_send", 50)
            .option("checkpointLocation", args.checkpoint)
            .trigger(processingTime="500 milliseconds")
            .start()
        )

        def reported() -> int:
            # classic: dicts; Spark Connect: StreamingQueryProgress, whose "numInputRows"
            # item is None (the property sums its sources)
            return sum(
                p.numInputRows if hasattr(p, "numInputRows") else p["numInputRows"]
                for p in query.recentProgress
            )

        deadline = time.monotonic() + 90
        try:
            while reported() < args.stream_rows:
                if time.monotonic() > deadline or not query.isActive:
                    break
                time.sleep(0.2)
        finally:
            query.stop()
        exc = query.exception()
        return {
            "reported": reported(),
            "exception": None if exc is None else str(exc)[:2000],
        }

    _run("where", where)
    _run("batch", batch)
    _run("misspelt", misspelt)
    _run("udf", udf)
    _run("stream", stream)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
