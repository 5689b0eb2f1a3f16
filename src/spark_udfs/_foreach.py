"""``foreach_batch_writer``: the data source's behaviour for ``writeStream.foreachBatch``,
for Spark 3.3+ where Python data sources do not exist (it uses ``mapInArrow``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ._ids import IdScope, new_job_id, streaming_scope
from ._options import SinkOptions, parse_options
from ._producer_cache import get_producer
from ._sink import PartitionCounts, PartitionSender, summarize, summary_line

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["make_foreach_batch_writer"]

log = logging.getLogger(__name__)

_COUNTS_SCHEMA = (
    "partition_id int, rows long, sent long, retried long, failed long, "
    "sent_per_broker map<string,long>, failed_per_broker map<string,long>, "
    "seconds double"
)


def _partition_writer(
    options: SinkOptions, scope: str
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition_id = ctx.partitionId() if ctx is not None else 0
        sender = PartitionSender(
            options, get_producer(options), IdScope(scope, partition_id), partition_id
        )
        counts = asdict(sender.write(batches))
        for k in ("sent_per_broker", "failed_per_broker"):
            counts[k] = list(counts[k].items())
        counts_map = pa.map_(pa.string(), pa.int64())
        schema = pa.schema(
            [
                ("partition_id", pa.int32()),
                ("rows", pa.int64()),
                ("sent", pa.int64()),
                ("retried", pa.int64()),
                ("failed", pa.int64()),
                ("sent_per_broker", counts_map),
                ("failed_per_broker", counts_map),
                ("seconds", pa.float64()),
            ]
        )
        yield pa.RecordBatch.from_pylist([counts], schema=schema)

    return write


def make_foreach_batch_writer(
    namesrv: str, topic: str | None = None, **options: Any
) -> Callable[[DataFrame, int], None]:
    """Build the ``foreachBatch`` function; options are validated here, on the driver.

    Ids are scoped by the batch id and the option ``job_id``, else the streaming query's
    id (stable across restarts from a checkpoint), else an id made here.
    """
    from ._schema import check_schema

    raw = {"namesrv": namesrv, **options}
    if topic is not None:
        raw["topic"] = topic
    opts = parse_options(raw)
    fallback_id = new_job_id()

    def write_batch(df: DataFrame, batch_id: int) -> None:
        ignored = check_schema(df.schema, has_topic_option=opts.topic is not None)
        if ignored:  # not shipped to the Python workers
            df = df.drop(*ignored)
        # The streaming query's id survives restarts from the checkpoint; it is set as a
        # local property while foreachBatch runs (checked with Spark 4.3).
        query_id = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        scope = streaming_scope(opts.job_id or query_id or fallback_id, batch_id)
        rows = df.mapInArrow(_partition_writer(opts, scope), _COUNTS_SCHEMA).collect()
        counts = []
        for r in rows:
            d = r.asDict()
            counts.append(
                PartitionCounts(
                    **{
                        **d,
                        "sent_per_broker": dict(d["sent_per_broker"]),
                        "failed_per_broker": dict(d["failed_per_broker"]),
                    }
                )
            )
        log.info("%s", summary_line(f"qclient foreachBatch: batch {batch_id}", summarize(counts)))

    return write_batch
