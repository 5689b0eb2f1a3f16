"""The sink's core, shared by the data source, the foreachBatch helper and the pandas UDF:
Arrow record batches → ``qclient.Message`` → ``Producer.send_batch`` with re-sends, counted.

Nothing here imports pyspark, so it runs (and is tested) in any Python process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from qclient._models import Message, SendResult
from qclient.errors import (
    AuthError,
    BatchSendError,
    BrokerResponseError,
    InvalidMessageError,
    QClientError,
)
from qclient.protocol.wire import RETRYABLE_CODES

from ._affinity import send_batch_pinned
from ._ids import IdScope
from ._options import SinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "COLUMNS",
    "PartitionCounts",
    "PartitionSender",
    "SinkSchemaError",
    "SinkWriteError",
    "send_with_retries",
    "summarize",
]

log = logging.getLogger(__name__)

#: Input columns and the kinds of values they accept (checked on the driver, see
#: ``_datasource.check_schema``): value is required, the others optional.
COLUMNS = ("value", "key", "topic", "deliver_at", "delay_ms", "tags", "properties", "msg_id")


class SinkSchemaError(QClientError, ValueError):
    """The DataFrame has a column the sink does not know, or one of the wrong type."""


class SinkWriteError(QClientError):
    """Rows could not be sent after the re-sends; the Spark task fails with this."""


def is_retryable(err: BaseException) -> bool:
    """Whether re-sending (same ids, so harmless) may change the outcome."""
    if isinstance(err, InvalidMessageError | AuthError | SinkSchemaError):
        return False
    if isinstance(err, BrokerResponseError):
        return err.code in RETRYABLE_CODES
    return isinstance(err, QClientError)


def describe(err: BaseException) -> str:
    """One line naming the broker (when known) and the cause."""
    broker = getattr(err, "broker_name", None)
    where = f"broker {broker}" if broker else "no broker named (failed before or between brokers)"
    return f"{where}: {type(err).__name__}: {err}"


def send_with_retries(
    producer: Any, messages: Sequence[Message], *, retries: int, backoff: float
) -> tuple[list[SendResult | QClientError], int]:
    """Send through ``producer.send_batch``; re-send retryable failures up to ``retries`` times.

    Returns one outcome per message in order (a ``SendResult`` or the last error) and the
    number of re-sent messages. Ids are fixed before the first attempt, so a re-send of a
    message the broker did store is deduplicated.
    """
    outcomes: list[SendResult | QClientError] = [None] * len(messages)  # type: ignore[list-item]
    pending = list(range(len(messages)))
    resent = 0
    attempt = 0
    while pending:
        batch = [messages[i] for i in pending]
        failed: list[int] = []
        try:
            results: Sequence[SendResult | QClientError] = send_batch_pinned(producer, batch)
        except BatchSendError as exc:
            results = exc.results
        except QClientError as exc:  # the whole call failed (no route, timeout, ...)
            results = [exc] * len(batch)
        for i, res in zip(pending, results, strict=True):
            outcomes[i] = res
            if isinstance(res, QClientError):
                failed.append(i)
        if not failed or attempt >= retries:
            break
        if not all(is_retryable(outcomes[i]) for i in failed):  # type: ignore[arg-type]
            break
        attempt += 1
        resent += len(failed)
        log.debug("re-sending %d messages (round %d)", len(failed), attempt)
        time.sleep(backoff * (2 ** (attempt - 1)))
        pending = failed
    return outcomes, resent


@dataclass
class PartitionCounts:
    """What one partition's write did."""

    partition_id: int
    rows: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    sent_per_broker: dict[str, int] = field(default_factory=dict)
    failed_per_broker: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def summarize(counts: Iterable[PartitionCounts | None]) -> dict[str, Any]:
    """Totals over partitions (``None`` = a partition whose task failed)."""
    total: dict[str, Any] = {"partitions": 0, "missing": 0, "rows": 0, "sent": 0,
                             "retried": 0, "failed": 0, "sent_per_broker": {},
                             "failed_per_broker": {}}
    for c in counts:
        if c is None:
            total["missing"] += 1
            continue
        total["partitions"] += 1
        for k in ("rows", "sent", "retried", "failed"):
            total[k] += getattr(c, k)
        for k in ("sent_per_broker", "failed_per_broker"):
            for broker, n in getattr(c, k).items():
                total[k][broker] = total[k].get(broker, 0) + n
    return total


def summary_line(prefix: str, total: dict[str, Any]) -> str:
    """The one log line of a committed batch."""
    brokers = ", ".join(f"{b} {n}" for b, n in sorted(total["sent_per_broker"].items()))
    line = (f"{prefix}: {total['sent']} of {total['rows']} rows sent "
            f"({brokers or 'no broker'}), {total['retried']} retried, "
            f"{total['failed']} failed, {total['partitions']} partitions")
    if total["failed_per_broker"]:
        failed = ", ".join(f"{b} {n}" for b, n in sorted(total["failed_per_broker"].items()))
        line += f" (failed on: {failed})"
    if total["missing"]:
        line += f", {total['missing']} without a commit message"
    return line


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    idx = batch.schema.get_field_index(name)
    if idx < 0:
        return None
    return batch.column(idx).to_pylist()  # type: ignore[no-any-return]


def _deliver_at_ms(batch: pa.RecordBatch) -> list[int | None] | None:
    """The ``deliver_at`` column as epoch milliseconds, rounded up (never early)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    idx = batch.schema.get_field_index("deliver_at")
    if idx < 0:
        return None
    col = batch.column(idx)
    if not pa.types.is_timestamp(col.type):
        raise SinkSchemaError(f"column 'deliver_at' must be a timestamp, got {col.type}")
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[col.type.unit]
    raw = pc.cast(col, pa.int64()).to_pylist()  # epoch in the column's unit, UTC
    if per_ms is None:
        return [None if v is None else v * 1000 for v in raw]
    return [None if v is None else -(-v // per_ms) for v in raw]


class PartitionSender:
    """Sends one partition's rows (Arrow record batches) and counts what happened."""

    def __init__(self, options: SinkOptions, producer: Any, scope: IdScope | None,
                 partition_id: int) -> None:
        self.options = options
        self.producer = producer
        self.scope = scope
        self.counts = PartitionCounts(partition_id=partition_id)
        self._position = 0

    def messages(self, batch: pa.RecordBatch) -> list[Message]:
        """The batch's rows as messages; ids derived from the row position when not given."""
        n = batch.num_rows
        start = self._position
        self._position += n
        values = _column(batch, "value")
        if values is None:
            raise SinkSchemaError("the DataFrame needs a 'value' column (string or binary)")
        keys = _column(batch, "key")
        topics = _column(batch, "topic")
        tags = _column(batch, "tags")
        props = _column(batch, "properties")
        ids = _column(batch, "msg_id")
        delays = _column(batch, "delay_ms")
        deliver = _deliver_at_ms(batch)
        derived = self.scope.ids(start, n) if self.scope is not None else None
        default_topic = self.options.topic
        out: list[Message] = []
        append = out.append
        for i in range(n):
            value = values[i]
            if value is None:
                raise SinkSchemaError(f"row {start + i}: 'value' is null")
            topic = (topics[i] if topics is not None else None) or default_topic
            if topic is None:
                raise SinkSchemaError(
                    f"row {start + i}: no topic (set the 'topic' option or the column)")
            msg_id = ids[i] if ids is not None else None
            if msg_id is None and derived is not None:
                msg_id = derived[i]
            delay = None
            at = deliver[i] if deliver is not None else None
            d = delays[i] if delays is not None else None
            if d is not None:
                if at is not None:
                    raise SinkSchemaError(
                        f"row {start + i}: both 'deliver_at' and 'delay_ms' are set")
                delay = timedelta(milliseconds=d)
            p = props[i] if props is not None else None
            append(Message(
                topic, value,
                key=keys[i] if keys is not None else None,
                tags=tags[i] if tags is not None else None,
                properties=dict(p) if p else None,
                delay=delay,
                deliver_at=None if at is None else at / 1000.0,
                msg_id=msg_id,
            ))
        return out

    def send(self, messages: Sequence[Message], first_row: int) -> None:
        """Send in chunks of ``rows_per_send``; fail (or skip) what cannot be sent."""
        opts = self.options
        c = self.counts
        step = opts.rows_per_send
        for lo in range(0, len(messages), step):
            chunk = messages[lo:lo + step]
            outcomes, resent = send_with_retries(
                self.producer, chunk, retries=opts.write_retries, backoff=opts.retry_backoff)
            c.rows += len(chunk)
            c.retried += resent
            errors: list[tuple[int, QClientError]] = []
            for j, res in enumerate(outcomes):
                if isinstance(res, SendResult):
                    c.sent += 1
                    c.sent_per_broker[res.broker_name] = c.sent_per_broker.get(
                        res.broker_name, 0) + 1
                else:
                    errors.append((first_row + lo + j, res))
                    broker = getattr(res, "broker_name", None) or "unknown"
                    c.failed_per_broker[broker] = c.failed_per_broker.get(broker, 0) + 1
            if errors:
                c.failed += len(errors)
                row, err = errors[0]
                text = (f"qclient sink: {len(errors)} of {len(chunk)} rows of partition "
                        f"{c.partition_id} could not be sent after {opts.write_retries + 1} "
                        f"attempts; first: row {row} msg_id={chunk[row - first_row - lo].msg_id}"
                        f" on {describe(err)}")
                if opts.on_error == "fail":
                    raise SinkWriteError(text) from err
                log.warning("%s (on_error=skip: going on)", text)

    def write(self, batches: Iterator[pa.RecordBatch]) -> PartitionCounts:
        """Send every row of the partition; return the counts."""
        t0 = time.monotonic()
        before = _producer_retries(self.producer)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            first = self._position
            self.send(self.messages(batch), first)
        after = _producer_retries(self.producer)
        self.counts.retried += max(0, after - before)
        self.counts.seconds = time.monotonic() - t0
        return self.counts


def _producer_retries(producer: Any) -> int:
    """The producer's own retry counter (its in-send re-tries on another broker), if any."""
    try:
        stats = producer.stats()
        value = stats.get("retried", 0)
        return int(value) if isinstance(value, int | float) else 0
    except Exception:  # stats are informative only
        return 0
