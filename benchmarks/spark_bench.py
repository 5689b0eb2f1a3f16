"""Spark → qclient throughput, one local[2] session, one LocalCluster of 2 brokers:
the "qclient" data source (Arrow writer, send_batch per chunk) vs the pandas UDF
(``spark_udfs.send_delayed_udf``) vs a naive per-row Python UDF (``send_delayed`` per
row, producer cached per worker). Rows/s acknowledged by the brokers (durable), and the
ratios. Every row is a delayed message (10-20 min ahead, so nothing fires meanwhile).
Then the same data source write from a driver on a standalone cluster (a master and a
worker with 2 cores started from the pyspark package; executors in JVMs of their own).

Steady state, as a long-running pipeline sees it: a warm-up write (``--warm-rows``, and
half as many rows through the pandas UDF) first lets the JVM compile the row-generation
and Arrow paths (the first 200k rows after start-up cost the JVM ~3x the CPU of later
ones), then the data source and the pandas UDF are each timed ``--repeat`` times and the
median reported, every run printed.

    python -m benchmarks.spark_bench [--json] [--smoke] [--rows N] [--udf-rows N]
                                     [--naive-rows N] [--partitions P] [--repeat R]
                                     [--warm-rows N] [--no-standalone]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Any

DELAY_MS = 600_000  # 10 min + up to 10 min more per row: nothing fires during the run


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally blocks below

    signal.signal(signal.SIGTERM, handler)


def naive_send(namesrv: str, topic: str) -> Any:
    """A per-row Python UDF: one ``send_delayed`` (one HTTP request) per row."""
    from pyspark.sql.functions import udf

    from spark_udfs._options import parse_options

    opts = parse_options({"namesrv": namesrv, "topic": topic})

    def send(value: str, delay_ms: int) -> str:
        from spark_udfs._producer_cache import get_producer

        res = get_producer(opts).send_delayed(topic, value, delay=delay_ms / 1000)
        return str(res.status)

    return udf(send, "string").asNondeterministic()


def _rows(spark: Any, n: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(0, n, numPartitions=partitions).select(
        F.format_string("event-%012d-%s", "id", F.lit("x" * 60)).alias("value"),
        (F.lit(DELAY_MS) + F.col("id") % DELAY_MS).alias("delay_ms"),
    )


def _cpu(pids: set[int] | None, exclude: set[int]) -> float:
    """CPU seconds of ``pids``, or of this process and all its descendants but ``exclude``."""
    import psutil

    me = psutil.Process()
    procs = (
        [psutil.Process(p) for p in pids]
        if pids is not None
        else [me, *me.children(recursive=True)]
    )
    total = 0.0
    for proc in procs:
        if proc.pid in exclude:
            continue
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a process that ended meanwhile
            pass
    return total


def _timed(fn: Any, brokers: set[int]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds of Spark (driver, JVM, Python workers), of the brokers."""
    s0, b0 = _cpu(None, brokers), _cpu(brokers, set())
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return wall, _cpu(None, brokers) - s0, _cpu(brokers, set()) - b0


def standalone_run(
    namesrv: str, rows: int, partitions: int, repeat: int, warm_rows: int, brokers: set[int]
) -> dict[str, Any]:
    """The same data source write from a driver on a standalone cluster (master, worker
    and executors as processes of their own, the SDK shipped with ``addPyFile``)."""
    import tempfile
    from pathlib import Path

    from pyspark.sql import SparkSession

    import spark_udfs
    from benchmarks._spark_cluster import StandaloneSpark, sdk_zip

    with (
        tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp,
        StandaloneSpark(Path(tmp), cores=2, memory="2g", quick_jvm=False) as cluster,
    ):
        spark = (
            SparkSession.builder.master(cluster.master_url)
            .appName("qclient-spark-bench-standalone")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executor.memory", "1g")
            .getOrCreate()
        )
        try:
            spark.sparkContext.setLogLevel("ERROR")
            spark.sparkContext.addPyFile(str(sdk_zip(Path(tmp))))
            spark_udfs.register(spark)

            def write(n: int) -> None:
                (
                    _rows(spark, n, partitions)
                    .write.format("qclient")
                    .option("namesrv", namesrv)
                    .option("topic", "bench_standalone")
                    .mode("append")
                    .save()
                )

            write(warm_rows)
            runs = [_timed(lambda: write(rows), brokers) for _ in range(repeat)]
        finally:
            spark.stop()
    wall, spark_cpu, broker_cpu = sorted(runs)[len(runs) // 2]
    return {
        "rows": rows,
        "rows_per_s": round(rows / wall),
        "runs_rows_per_s": [round(rows / r[0]) for r in runs],
        "cpu_us_per_row": {
            "spark": round(spark_cpu / rows * 1e6, 1),
            "brokers": round(broker_cpu / rows * 1e6, 1),
        },
    }


def run(
    rows: int,
    udf_rows: int,
    naive_rows: int,
    partitions: int,
    options: dict[str, str] | None = None,
    smoke: bool = False,
    repeat: int = 3,
    warm_rows: int = 100_000,
    standalone: bool = True,
) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    import spark_udfs
    from qclient import LocalCluster

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("qclient-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if smoke:  # the code paths only: the short-lived JVM flags (measured runs keep C2)
        from benchmarks._spark_cluster import QUICK_JVM

        builder = builder.config("spark.driver.extraJavaOptions", QUICK_JVM)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark_udfs.register(spark)
    try:
        with LocalCluster(brokers=2) as cluster:
            ns = cluster.namesrv

            def datasource(n: int, topic: str) -> None:
                (
                    _rows(spark, n, partitions)
                    .write.format("qclient")
                    .option("namesrv", ns)
                    .option("topic", topic)
                    .options(**(options or {}))
                    .mode("append")
                    .save()
                )

            udf = spark_udfs.send_delayed_udf(ns, "bench_udf", **(options or {}))

            def pandas_udf(n: int) -> None:
                out = (
                    _rows(spark, n, partitions)
                    .select(udf("value", "delay_ms").alias("r"))
                    .groupBy("r.status")
                    .count()
                    .collect()
                )
                ok = sum(r["count"] for r in out if r["status"] == "SEND_OK")
                assert ok == n, f"pandas UDF: {ok} of {n} SEND_OK: {out}"

            naive = naive_send(ns, "bench_naive")

            def per_row(n: int) -> None:
                out = (
                    _rows(spark, n, partitions)
                    .select(naive("value", "delay_ms").alias("s"))
                    .groupBy("s")
                    .count()
                    .collect()
                )
                ok = sum(r["count"] for r in out if r["s"] == "SEND_OK")
                assert ok == n, f"per-row UDF: {ok} of {n} SEND_OK: {out}"

            # Warm-up: Python workers, producers and routes exist, and the JVM has
            # compiled its hot paths, before any timing.
            warm = 10 if smoke else 1
            datasource(max(2000 // warm, warm_rows), "bench_ds")
            pandas_udf(max(2000 // warm, warm_rows // 2))
            per_row(200 // warm)

            # the name server too: it is no Spark process
            servers = {b.pid for b in cluster.brokers} | {cluster.namesrv_node.pid}
            brokers = {p for p in servers if p is not None}
            ds_runs = [_timed(lambda: datasource(rows, "bench_ds"), brokers) for _ in range(repeat)]
            # the median run by wall time, with its own CPU figures
            t_ds, spark_ds, broker_ds = sorted(ds_runs)[len(ds_runs) // 2]
            udf_runs = [_timed(lambda: pandas_udf(udf_rows), brokers) for _ in range(repeat)]
            t_udf, spark_udf, broker_udf = sorted(udf_runs)[len(udf_runs) // 2]
            t_naive, spark_nv, broker_nv = _timed(lambda: per_row(naive_rows), brokers)
            spark.stop()  # one SparkContext per process: the standalone driver is next
            cluster_res = (
                standalone_run(ns, rows, partitions, repeat, warm_rows, brokers)
                if standalone
                else None
            )
    finally:
        spark.stop()
    ds, pu, nv = rows / t_ds, udf_rows / t_udf, naive_rows / t_naive
    return {
        "rows": {"datasource": rows, "pandas_udf": udf_rows, "per_row_udf": naive_rows},
        "seconds": {
            "datasource": round(t_ds, 2),
            "pandas_udf": round(t_udf, 2),
            "per_row_udf": round(t_naive, 2),
        },
        "throughput": {"datasource": round(ds), "pandas_udf": round(pu), "per_row_udf": round(nv)},
        "datasource_runs_rows_per_s": [round(rows / r[0]) for r in ds_runs],
        "pandas_udf_runs_rows_per_s": [round(udf_rows / r[0]) for r in udf_runs],
        "cpu_us_per_row": {
            "datasource": {
                "spark": round(spark_ds / rows * 1e6, 1),
                "brokers": round(broker_ds / rows * 1e6, 1),
            },
            "pandas_udf": {
                "spark": round(spark_udf / udf_rows * 1e6, 1),
                "brokers": round(broker_udf / udf_rows * 1e6, 1),
            },
            "per_row_udf": {
                "spark": round(spark_nv / naive_rows * 1e6, 1),
                "brokers": round(broker_nv / naive_rows * 1e6, 1),
            },
        },
        "standalone": cluster_res,
        "ratio_datasource_to_per_row": round(ds / nv, 1),
        "ratio_pandas_udf_to_per_row": round(pu / nv, 1),
        "targets": [
            {
                "name": "data source rows/s",
                "value": round(ds),
                "target": ">= 50000",
                "met": ds >= 50_000,
            },
            {
                "name": "pandas UDF rows/s",
                "value": round(pu),
                "target": ">= 40000",
                "met": pu >= 40_000,
            },
            {
                "name": "data source / per-row UDF",
                "value": round(ds / nv, 1),
                "target": ">= 15",
                "met": ds / nv >= 15,
            },
        ],
        "notes": [
            f"local[2], {partitions} partitions, 2 brokers on the same 2-core machine; "
            "rows are delayed messages acknowledged durably by a broker; data source and "
            f"pandas UDF: median of {repeat} runs after a {warm_rows}-row warm-up write"
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    ap.add_argument("--smoke", action="store_true", help="tiny N: the code paths only")
    ap.add_argument("--rows", type=int, default=200_000, help="rows via the data source")
    ap.add_argument("--udf-rows", type=int, default=100_000, help="rows via the pandas UDF")
    ap.add_argument("--naive-rows", type=int, default=5_000, help="rows via per-row UDF")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="timed data source runs (median)")
    ap.add_argument(
        "--warm-rows", type=int, default=100_000, help="rows of the warm-up write (JVM JIT)"
    )
    ap.add_argument(
        "--no-standalone",
        action="store_true",
        help="skip the standalone-cluster run (master + worker processes; not in --smoke)",
    )
    ap.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a data source / UDF option (e.g. batch_max_messages=512)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows, args.udf_rows, args.naive_rows = 2000, 1000, 100
        args.repeat, args.warm_rows = 1, 200
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    _stop_on_sigterm()
    options = dict(o.split("=", 1) for o in args.option)
    res = run(
        args.rows,
        args.udf_rows,
        args.naive_rows,
        args.partitions,
        options,
        args.smoke,
        max(1, args.repeat),
        args.warm_rows,
        standalone=not (args.smoke or args.no_standalone),
    )
    if args.smoke:
        del res["targets"]  # tiny N measures start-up, not throughput
    tp = res["throughput"]
    runs = ", ".join(f"{r:,}" for r in res["datasource_runs_rows_per_s"])
    print(
        f"data source   {res['rows']['datasource']:>8} rows  {tp['datasource']:>8} rows/s"
        f"  (median; runs: {runs})"
    )
    udf_runs = ", ".join(f"{r:,}" for r in res["pandas_udf_runs_rows_per_s"])
    print(
        f"pandas UDF    {res['rows']['pandas_udf']:>8} rows  {tp['pandas_udf']:>8} rows/s"
        f"  (median; runs: {udf_runs})"
    )
    print(f"per-row UDF   {res['rows']['per_row_udf']:>8} rows  {tp['per_row_udf']:>8} rows/s")
    cpu = res["cpu_us_per_row"]
    for name in ("datasource", "pandas_udf", "per_row_udf"):
        print(
            f"CPU per row, {name}: Spark {cpu[name]['spark']} us, brokers {cpu[name]['brokers']} us"
        )
    sa = res["standalone"]
    if sa is not None:
        sa_runs = ", ".join(f"{r:,}" for r in sa["runs_rows_per_s"])
        print(
            f"standalone    {sa['rows']:>8} rows  {sa['rows_per_s']:>8} rows/s  (median; runs: "
            f"{sa_runs}); CPU per row: Spark {sa['cpu_us_per_row']['spark']} us, "
            f"brokers {sa['cpu_us_per_row']['brokers']} us"
        )
    print(
        f"data source / per-row: {res['ratio_datasource_to_per_row']}x, "
        f"pandas UDF / per-row: {res['ratio_pandas_udf_to_per_row']}x"
    )
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
