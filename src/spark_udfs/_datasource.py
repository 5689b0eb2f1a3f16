"""The "qclient" Python data source: ``df.write`` / ``df.writeStream`` ``.format("qclient")``.

``write()`` runs per partition in the executors' Python workers (Arrow record batches in,
a ``QClientCommitMessage`` out); ``commit()`` runs elsewhere on the driver side and logs
one summary line per batch. The writers keep no state between calls: the producer is
cached per worker process (``_producer_cache``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ._ids import IdScope, batch_scope, new_job_id, streaming_scope
from ._options import SinkOptions, parse_options
from ._producer_cache import get_producer
from ._schema import check_schema
from ._sink import PartitionCounts, PartitionSender, SinkSchemaError, summarize
from ._sink import summary_line as _summary_line

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["QClientCommitMessage", "QClientDataSource", "check_schema"]

log = logging.getLogger(__name__)


@dataclass
class QClientCommitMessage(WriterCommitMessage):
    """One partition's counts, sent back to the driver's ``commit``."""

    counts: PartitionCounts
    scope: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _worker_logging(level: str | None) -> None:
    """Give spark_udfs a stderr handler in a worker process nobody configured logging in."""
    pkg = logging.getLogger("spark_udfs")
    if level:
        pkg.setLevel(level.upper())
    elif pkg.level == logging.NOTSET:
        pkg.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not pkg.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        pkg.addHandler(handler)


def _task_context() -> tuple[int, str | None, str | None]:
    """(partition id, streaming query id, streaming batch id) of the running task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, None, None
    return (
        ctx.partitionId(),
        ctx.getLocalProperty("sql.streaming.queryId"),
        ctx.getLocalProperty("streaming.sql.batchId"),
    )


def _write_partition(
    options: SinkOptions, scope: str | None, batches: Iterator[pa.RecordBatch]
) -> QClientCommitMessage:
    """The body of both writers' ``write``."""
    if options.log_level:
        _worker_logging(options.log_level)
    partition_id, query_id, batch_id = _task_context()
    if scope is None:
        if query_id is None or batch_id is None:
            raise RuntimeError("qclient streaming sink: no query id / batch id in the task")
        scope = streaming_scope(query_id, batch_id)
    sender = PartitionSender(
        options, get_producer(options), IdScope(scope, partition_id), partition_id
    )
    counts = sender.write(batches)
    return QClientCommitMessage(counts=counts, scope=scope)


def _counts(messages: list[WriterCommitMessage | None]) -> list[PartitionCounts | None]:
    return [m.counts if isinstance(m, QClientCommitMessage) else None for m in messages]


class QClientBatchWriter(DataSourceArrowWriter):
    """``df.write.format("qclient")``: one job-level id scopes every message id."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        # Made once on the driver and pickled into every task, retries included.
        self.job_id = options.job_id or new_job_id()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> QClientCommitMessage:
        return _write_partition(self.options, batch_scope(self.job_id), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _worker_logging(self.options.log_level)
        log.info(
            "%s", _summary_line(f"qclient sink: job {self.job_id}", summarize(_counts(messages)))
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Sent messages cannot be unsent; a re-run with the same job_id is deduplicated.
        _worker_logging(self.options.log_level)
        log.warning(
            "%s",
            _summary_line(f"qclient sink: job {self.job_id} ABORTED", summarize(_counts(messages))),
        )


class QClientStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("qclient")``: ids scoped by query id and batch id."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> QClientCommitMessage:
        return _write_partition(self.options, None, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _worker_logging(self.options.log_level)
        log.info(
            "%s", _summary_line(f"qclient sink: batch {batchId}", summarize(_counts(messages)))
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The replay of this batch re-derives the same ids: the broker deduplicates.
        _worker_logging(self.options.log_level)
        log.warning(
            "%s",
            _summary_line(f"qclient sink: batch {batchId} ABORTED", summarize(_counts(messages))),
        )


class QClientDataSource(DataSource):
    """The "qclient" format: each row becomes a (delayed) message."""

    @classmethod
    def name(cls) -> str:
        return "qclient"

    def _prepare(self, schema: StructType, *, stream: bool) -> SinkOptions:
        options = parse_options(self.options)
        warn_key = None
        if stream:
            # made again for every micro-batch: warn about ignored columns once per stream
            warn_key = f"stream:{options.cache_key()}:{options.topic}"
        _worker_logging(options.log_level)  # the ignored-columns warning
        check_schema(schema, has_topic_option=options.topic is not None, warn_key=warn_key)
        return options

    def writer(self, schema: StructType, overwrite: bool) -> QClientBatchWriter:
        if overwrite:
            raise SinkSchemaError("the qclient sink only appends: use mode('append')")
        return QClientBatchWriter(self._prepare(schema, stream=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> QClientStreamWriter:
        if overwrite:
            raise SinkSchemaError("the qclient sink only appends: use outputMode('append')")
        return QClientStreamWriter(self._prepare(schema, stream=True))
