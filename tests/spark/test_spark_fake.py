"""Spark mechanics of the sink against a stand-in producer (no cluster): columns and types
as Spark hands them over, schema errors, re-sends, a failing task, the foreachBatch helper."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from fake_producer import fake_sent

pytestmark = pytest.mark.spark

FAKE = "fake_producer:FakeProducer"


def _writer(df: Any, topic: str, factory: str = FAKE) -> Any:
    return (
        df.write.format("qclient")
        .option("namesrv", "127.0.0.1:1")
        .option("topic", topic)
        .option("producer_factory", factory)
        .option("rows_per_send", 64)
        .mode("append")
    )


def test_batch_write_every_column(spark: Any, topic: str) -> None:
    from pyspark.sql import functions as F

    at = datetime(2031, 5, 6, 7, 8, 9, 250_000, tzinfo=UTC)
    df = spark.range(0, 3000, numPartitions=3).select(
        F.col("id").cast("string").alias("value"),
        F.concat(F.lit("k"), F.col("id")).alias("key"),
        F.when(F.col("id") % 2 == 0, F.lit(at)).alias("deliver_at"),
        F.when(F.col("id") % 2 == 1, F.col("id") * 10).alias("delay_ms"),
        F.lit("tagA").alias("tags"),
        F.create_map(F.lit("n"), F.col("id").cast("string")).alias("properties"),
    )
    t0 = time.time()
    _writer(df, topic).save()
    t1 = time.time()
    sent = fake_sent(topic)
    assert len(sent) == 3000
    assert len({m["msg_id"] for m in sent}) == 3000
    assert sorted(int(m["body"]) for m in sent) == list(range(3000))
    for m in sent:
        n = int(m["body"])
        assert m["key"] == f"k{n}" and m["tags"] == "tagA" and m["properties"] == {"n": str(n)}
        if n % 2 == 0:
            assert m["deliver_at"] == at.timestamp() and m["delay"] is None
        else:  # the delay became the time it asks for, before the row's first attempt
            assert m["delay"] is None
            assert t0 + n * 10 / 1000 <= m["deliver_at"] <= t1 + n * 10 / 1000 + 0.001
    assert {m["broker"] for m in sent} == {"fake-a", "fake-b"}


def test_msg_id_column_and_per_row_topic(spark: Any, topic: str) -> None:
    from pyspark.sql import functions as F

    other = topic + "_b"
    df = spark.range(0, 100, numPartitions=2).select(
        F.col("id").cast("string").cast("binary").alias("value"),
        F.concat(F.lit("id-"), F.col("id")).alias("msg_id"),
        F.when(F.col("id") < 10, F.lit(other)).alias("topic"),
    )
    _writer(df, topic).save()
    assert sorted(m["msg_id"] for m in fake_sent(other)) == sorted(f"id-{i}" for i in range(10))
    assert len(fake_sent(topic)) == 90


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda F, df: df.withColumn("delay", F.lit(5000)), "'delay' looks like .*'delay_ms'"),
        (lambda F, df: df.withColumn("msgId", F.lit("a")), "'msgId' looks like .*'msg_id'"),
        (lambda F, df: df.withColumn("delay_ms", F.lit("soon")), "'delay_ms' must be an integer"),
        (lambda F, df: df.withColumn("deliver_at", F.lit(5)), "'deliver_at' must be timestamp"),
        (lambda F, df: df.withColumnRenamed("value", "body"), "needs a 'value' column"),
    ],
)
def test_schema_errors_before_any_task(spark: Any, topic: str, make: Any, needle: str) -> None:
    from pyspark.sql import functions as F

    df = make(F, spark.range(3).select(F.col("id").cast("string").alias("value")))
    with pytest.raises(Exception, match=needle):
        _writer(df, topic).save()
    assert fake_sent(topic) == []


def test_other_columns_are_ignored(spark: Any, topic: str) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 200, numPartitions=2).select(
        "id",
        F.col("id").cast("string").alias("value"),
        F.lit("red").alias("colour"),
        F.current_timestamp().alias("timestamp"),
    )
    _writer(df, topic).save()
    sent = fake_sent(topic)
    assert sorted(int(m["body"]) for m in sent) == list(range(200))
    assert all(m["properties"] is None and m["key"] is None for m in sent)


def test_ignored_columns_get_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from spark_udfs._schema import check_schema

    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("value", StringType()),
            StructField("colour", StringType()),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="spark_udfs"):
        assert check_schema(schema, has_topic_option=True) == ["id", "colour"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'id', 'colour'" in warnings[0]


def test_overwrite_and_unknown_option_are_refused(spark: Any, topic: str) -> None:
    from pyspark.sql import functions as F

    df = spark.range(3).select(F.col("id").cast("string").alias("value"))
    with pytest.raises(Exception, match="only appends"):
        _writer(df, topic).mode("overwrite").save()
    with pytest.raises(Exception, match="unknown qclient option 'sendtimeuot'"):
        _writer(df, topic).option("sendTimeuot", "3").save()


def test_retryable_failures_are_resent(spark: Any, topic: str) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 2000, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    _writer(df, topic, "fake_producer:FlakyProducer").save()
    sent = fake_sent(topic)
    assert sorted(int(m["body"]) for m in sent) == list(range(2000))  # each stored once


def test_unsendable_rows_fail_the_job_naming_broker_and_cause(spark: Any, topic: str) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 10, numPartitions=1).select(F.col("id").cast("string").alias("value"))
    with pytest.raises(Exception) as info:
        _writer(df, topic, "fake_producer:DownProducer").option("retry_backoff", "0").save()
    text = str(info.value)
    assert "could not be sent after 3 attempts" in text
    assert "broker broker-x" in text and "connection refused" in text


def test_foreach_batch_helper(spark: Any, topic: str) -> None:
    from pyspark.sql import functions as F

    import spark_udfs

    write = spark_udfs.foreach_batch_writer(
        "127.0.0.1:1", topic, producer_factory=FAKE, job_id="fb-test"
    )
    df = spark.range(0, 500, numPartitions=2).select(
        F.col("id").cast("string").alias("value"), F.lit(100).cast("long").alias("delay_ms")
    )
    t0 = time.time()
    write(df, 7)
    write(df, 7)  # a replayed batch: the same ids again
    t1 = time.time()
    sent = fake_sent(topic)
    assert len(sent) == 1000 and len({m["msg_id"] for m in sent}) == 500
    # each delay became the time it asks for, fixed before the row's first attempt
    assert all(m["delay"] is None for m in sent)
    assert all(t0 + 0.1 <= m["deliver_at"] <= t1 + 0.101 for m in sent)


def test_foreach_batch_ids_follow_the_query_id(spark: Any, topic: str, tmp_path: Any) -> None:
    import time

    from pyspark.sql import functions as F

    import spark_udfs
    from spark_udfs._ids import IdScope, streaming_scope

    write = spark_udfs.foreach_batch_writer("127.0.0.1:1", topic, producer_factory=FAKE)
    src = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    query = (
        src.select(F.col("value").cast("string").alias("value"))
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while sum(p["numInputRows"] for p in query.recentProgress) < 20:
            assert time.monotonic() < deadline, "no rows through foreachBatch"
            time.sleep(0.2)
    finally:
        query.stop()
    sent = fake_sent(topic)
    assert sent
    # Every id is <digest of (query id, batch id)>-<partition>-<row>: a restart of the
    # query from its checkpoint re-derives the same ids for a replayed batch.
    digests = {IdScope(streaming_scope(query.id, b), 0).digest: b for b in range(50)}
    assert all(m["msg_id"].split("-")[0] in digests for m in sent)
