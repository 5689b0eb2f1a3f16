"""Spark sink for qclient: the "qclient" data source, a pandas UDF and a foreachBatch helper.

``import spark_udfs`` is cheap: pyspark is imported only when one of these is used.

Usage (PySpark 4.1+)::

    import spark_udfs
    spark_udfs.register(spark)
    (df.write.format("qclient").option("namesrv", "127.0.0.1:9876")
       .option("topic", "reminders").mode("append").save())
    (df.writeStream.format("qclient").option("namesrv", addr).option("topic", "t")
       .option("checkpointLocation", path).start())

Columns: ``value`` (string or binary, required); optional ``key``, ``topic`` (per-row
topic, overrides the option), ``deliver_at`` (timestamp), ``delay_ms`` (integer),
``tags``, ``properties`` (map<string,string>), ``msg_id``. Neither ``deliver_at`` nor
``delay_ms`` set on a row: immediate delivery; both set: an error. Other columns are
ignored (one warning names them), as Spark's Kafka sink does, except one whose name looks
like a misspelt sink column (``delay``, ``msgId``, ``Value``): that, or a sink column of
the wrong type, fails the write before any row is sent.

Options (case, ``_`` and ``.`` do not matter: ``sendTimeout`` = ``send_timeout``):

- every ``qclient.Producer`` option: ``namesrv`` (required), ``send_timeout``,
  ``retry_times``, ``send_latency_fault_enable``, ``batch_max_messages``, ``linger_ms``,
  ``access_key`` / ``secret_key``, ... (all of ``ProducerConfig``'s fields);
  ``batch_max_messages`` defaults to 1000 here (fewer, larger requests: less CPU);
- ``topic``; ``rows_per_send`` (rows per ``send_batch`` call, 2000); ``max_in_flight``
  (``send_batch`` calls of one partition at once, 2); ``write_retries`` (re-sends of
  rows that failed retryably, 2) and ``retry_backoff`` (0.2 s, doubling);
  ``on_error`` (``fail``: the task fails naming the broker and the cause, Spark retries
  it; ``skip``: count, log and go on); ``job_id`` (batch writes: a fixed id scope, so a
  re-run of the same write is deduplicated); ``log_level`` (of ``spark_udfs`` in the
  worker processes); ``producer_factory`` (``"module:callable"``, for tests).

Message ids: from a ``msg_id`` column, else derived from (query id, batch id) or the
job-level id, plus partition id and row position; each id is sent to the same broker
while that broker is healthy, so the broker's deduplication makes a retried task or a
replayed micro-batch harmless (when the input replays the same rows in the same order).
Each partition's counts (sent, retried, failed, per broker) go back in the commit
message and ``commit`` logs one line per batch. Python data sources are looked up
through the thread's *active* SparkSession: in a thread of your own, call
``spark_udfs.activate(spark)`` there first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["FORMAT", "activate", "foreach_batch_writer", "register", "send_delayed_udf"]

#: The data source's format name.
FORMAT = "qclient"


def register(spark: SparkSession) -> None:
    """Register the "qclient" data source with ``spark`` (once per session is enough)."""
    from ._datasource import QClientDataSource

    spark.dataSource.register(QClientDataSource)


def activate(spark: SparkSession) -> None:
    """Make ``spark`` the active session of the calling thread.

    Spark (4.3) finds Python data sources through the thread's active session; a thread
    other than the one that built the session has none, and ``format("qclient")`` then
    fails with DATA_SOURCE_NOT_FOUND even though the source is registered. A Spark
    Connect session needs nothing: the server resolves the source for it.
    """
    if not hasattr(spark, "_jsparkSession"):  # Spark Connect: no JVM on this side
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def send_delayed_udf(namesrv: str, topic: str, **options: Any) -> Callable[..., Column]:
    """A pandas UDF ``(value, delay_ms) -> struct<msg_id, status, error>`` sending one
    message per row; ``options`` are the data source's options (``send_timeout=...``)."""
    from ._udf import make_send_delayed_udf

    return make_send_delayed_udf(namesrv, topic, **options)


def foreach_batch_writer(
    namesrv: str, topic: str | None = None, **options: Any
) -> Callable[[DataFrame, int], None]:
    """A function for ``writeStream.foreachBatch(...)`` (Spark 3.3+, no data source API)
    that sends each micro-batch like the data source does."""
    from ._foreach import make_foreach_batch_writer

    return make_foreach_batch_writer(namesrv, topic, **options)


def __getattr__(name: str) -> Any:
    if name == "QClientDataSource":
        from ._datasource import QClientDataSource

        return QClientDataSource
    raise AttributeError(f"module 'spark_udfs' has no attribute {name!r}")
