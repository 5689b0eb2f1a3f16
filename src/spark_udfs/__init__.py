"""Spark sink for qclient: the "qclient" data source, a pandas UDF and a foreachBatch helper.

``import spark_udfs`` is cheap: pyspark is imported only when one of these is used.

>>> import spark_udfs
>>> spark_udfs.register(spark)
>>> df.write.format("qclient").option("namesrv", addr).option("topic", "t").save()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["FORMAT", "foreach_batch_writer", "register", "send_delayed_udf"]

#: The data source's format name.
FORMAT = "qclient"


def register(spark: SparkSession) -> None:
    """Register the "qclient" data source with ``spark`` (once per session is enough)."""
    from ._datasource import QClientDataSource

    spark.dataSource.register(QClientDataSource)


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
