"""The sink's core, shared by the data source, the foreachBatch helper and the pandas UDF:
Arrow record batches → ``qclient.MessageBatch`` (columns, no object per row) →
``Producer.send_batch`` with re-sends, counted.

Nothing here imports pyspark, so it runs (and is tested) in any Python process.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from qclient._models import Message, MessageBatch, SendResult
from qclient.errors import (
    AuthError,
    BatchSendError,
    BrokerResponseError,
    InvalidMessageError,
    QClientError,
)
from qclient.protocol.wire import RETRYABLE_CODES

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
    "fix_deliver_times",
    "resembled_column",
    "send_with_retries",
    "settle_copies",
    "summarize",
]

log = logging.getLogger(__name__)

#: Input columns and the kinds of values they accept (checked on the driver, see
#: ``_datasource.check_schema``): value is required, the others optional.
COLUMNS = ("value", "key", "topic", "deliver_at", "delay_ms", "tags", "properties", "msg_id")

#: Names that mean a sink column without resembling it in spelling.
_ALIASES = {"messageid": "msg_id", "props": "properties", "headers": "properties"}

#: Normalised name prefixes of the time columns: any ``delay*`` / ``deliver*`` column is
#: taken for one, because ignoring it would deliver every row at once.
_TIME_PREFIXES = (("delay", "delay_ms"), ("deliver", "deliver_at"))


def _squash(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def resembled_column(name: str) -> str | None:
    """The sink column that ``name`` (not a sink column itself) looks like a misspelling
    of, or None: same letters in another case or separator (``msgId``, ``Value``), a
    ``delay*`` / ``deliver*`` name, a known alias, or a close spelling (``vaule``, ``tag``).
    """
    import difflib

    if name in COLUMNS:
        return None
    squashed = _squash(name)
    if not squashed:
        return None
    for column in COLUMNS:
        if squashed == _squash(column):
            return column
    for prefix, column in _TIME_PREFIXES:
        if squashed.startswith(prefix):
            return column
    if squashed in _ALIASES:
        return _ALIASES[squashed]
    # 0.8: one swapped, missing or extra letter in a 4-6 letter name ("vaule", "keys",
    # "topics"), not a different word ("id", "age", "timestamp", "stage").
    best = max(COLUMNS, key=lambda c: difflib.SequenceMatcher(None, squashed, _squash(c)).ratio())
    if difflib.SequenceMatcher(None, squashed, _squash(best)).ratio() >= 0.8:
        return best
    return None


class SinkSchemaError(QClientError, ValueError):
    """The DataFrame lacks ``value``, has a column of the wrong type, or one whose name
    looks like a misspelt sink column."""


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


Batch = MessageBatch | Sequence[Message]


def fix_deliver_times(messages: Batch, now_ms: int | None = None) -> Batch:
    """``messages`` with each positive relative delay turned into the absolute deliver
    time it asks for now (epoch ms, rounded up: never early).

    Done once, before a row's first attempt: every re-send of the row then asks for the
    same time, so a copy an ambiguous attempt left and the acknowledged one fire
    together and the clean-up that compares them (by id and deliver time) sees one
    message. A delay recomputed per re-send would be due later by the time the earlier
    attempts took. Rows with no delay, a deliver time already, or a delay the SDK refuses
    (negative) are left as they are.
    """
    now = -(-time.time_ns() // 1_000_000) if now_ms is None else now_ms
    if isinstance(messages, MessageBatch):
        delays = messages.delay_ms
        if delays is None:
            return messages
        given = messages.deliver_at_ms or [None] * len(delays)
        moved = [d is not None and d > 0 and a is None for d, a in zip(delays, given, strict=True)]
        if not any(moved):
            return messages
        return MessageBatch(
            messages.topic,
            messages.bodies,
            msg_ids=messages.msg_ids,
            delay_ms=[None if m else d for d, m in zip(delays, moved, strict=True)],
            deliver_at_ms=[
                now + d if m and d is not None else a
                for d, a, m in zip(delays, given, moved, strict=True)
            ],
            keys=messages.keys,
            tags=messages.tags,
            properties=messages.properties,
        )
    out: list[Message] = []
    for m in messages:
        delay = m.delay
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if m.deliver_at is None and isinstance(delay, int | float) and delay > 0:
            m = copy.copy(m)
            m.delay, m.deliver_at = None, (now + math.ceil(delay * 1000)) / 1000
        out.append(m)
    return out


def settle_copies(producer: Any, where: str) -> None:
    """Let the producer cancel the extra copies its ambiguous attempts may have left
    before the task ends (``Producer.settle``, bounded by its ``send_timeout``): a Spark
    Python worker may exit right after (``os._exit``: no ``atexit``, no ``close``), and a
    clean-up still owed then is lost and its copy fires twice. Free when none is owed."""
    settle = getattr(producer, "settle", None)
    if settle is None:
        return
    try:
        left = settle()
    except Exception as exc:  # the task's own outcome matters more than this wait
        log.warning("%s: settling extra copies failed: %s", where, exc)
        return
    if left:
        log.warning(
            "%s: %d possible extra copies still owed a clean-up as the task ends "
            "(their brokers do not answer); they may fire twice",
            where,
            left,
        )


def _send_once(producer: Any, batch: Batch) -> list[SendResult | QClientError]:
    """One ``send_batch`` round: an outcome per message, never an exception.

    The SDK validates a whole batch before any network call and refuses all of it for one
    bad message; the batch is then halved until the bad messages are isolated (cheap: no
    network for the refused halves), so every other message is still sent and the error
    names the right row.
    """
    try:
        # every row has an explicit id, so the producer pins each to the broker that owns
        # the id (Producer: select_for_id): a replay is deduplicated by that broker
        return list(producer.send_batch(batch))
    except BatchSendError as exc:
        return list(exc.results)
    except InvalidMessageError as exc:
        if len(batch) == 1:
            return [exc]
        mid = len(batch) // 2
        return _send_once(producer, batch[:mid]) + _send_once(producer, batch[mid:])
    except QClientError as exc:  # the whole call failed (no route, timeout, ...)
        return [exc] * len(batch)


def send_with_retries(
    producer: Any, messages: Batch, *, retries: int, backoff: float
) -> tuple[list[SendResult | QClientError], int]:
    """Send through ``producer.send_batch``; re-send retryable failures up to ``retries`` times.

    Returns one outcome per message in order (a ``SendResult`` or the last error) and the
    number of re-sent messages. Ids and deliver times are fixed before the first attempt
    (``fix_deliver_times``), so a re-send of a message the broker did store is
    deduplicated, and a copy left elsewhere is due with the acknowledged one.
    """
    messages = fix_deliver_times(messages)
    outcomes: list[SendResult | QClientError] = [None] * len(messages)  # type: ignore[list-item]
    pending = list(range(len(messages)))
    resent = 0
    attempt = 0
    while pending:
        if len(pending) == len(messages):
            todo: Batch = messages
        elif isinstance(messages, MessageBatch):
            todo = messages.take(pending)
        else:
            todo = [messages[i] for i in pending]
        results = _send_once(producer, todo)
        retry: list[int] = []
        for i, res in zip(pending, results, strict=True):
            outcomes[i] = res
            if isinstance(res, QClientError) and is_retryable(res):
                retry.append(i)
        if not retry or attempt >= retries:
            break
        attempt += 1
        resent += len(retry)
        log.debug("re-sending %d messages (round %d)", len(retry), attempt)
        time.sleep(backoff * (2 ** (attempt - 1)))
        pending = retry
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
    total: dict[str, Any] = {
        "partitions": 0,
        "missing": 0,
        "rows": 0,
        "sent": 0,
        "retried": 0,
        "failed": 0,
        "sent_per_broker": {},
        "failed_per_broker": {},
    }
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
    line = (
        f"{prefix}: {total['sent']} of {total['rows']} rows sent "
        f"({brokers or 'no broker'}), {total['retried']} retried, "
        f"{total['failed']} failed, {total['partitions']} partitions"
    )
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
    return batch.column(idx).to_pylist()


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

    def __init__(
        self, options: SinkOptions, producer: Any, scope: IdScope | None, partition_id: int
    ) -> None:
        self.options = options
        self.producer = producer
        self.scope = scope
        self.counts = PartitionCounts(partition_id=partition_id)
        self._position = 0

    def messages(self, batch: pa.RecordBatch) -> MessageBatch:
        """The batch's rows as a ``MessageBatch`` (columns straight from Arrow, no object
        per row); ids derived from the row position when not given."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = batch.num_rows
        start = self._position
        self._position += n
        schema = batch.schema
        idx = schema.get_field_index("value")
        if idx < 0:
            raise SinkSchemaError("the DataFrame needs a 'value' column (string or binary)")
        value_col = batch.column(idx)
        if value_col.null_count:
            first = pc.index(pc.is_null(value_col), True).as_py()
            raise SinkSchemaError(f"row {start + first}: 'value' is null")
        if pa.types.is_string(value_col.type) or pa.types.is_large_string(value_col.type):
            # UTF-8 already: reading the same buffers as binary gives bytes, no re-encoding
            value_col = value_col.cast(
                pa.binary() if pa.types.is_string(value_col.type) else pa.large_binary()
            )
        values = value_col.to_pylist()

        default_topic = self.options.topic
        idx = schema.get_field_index("topic")
        topics: str | list[Any]
        if idx < 0:
            if default_topic is None:
                raise SinkSchemaError("no topic: set the 'topic' option or a 'topic' column")
            topics = default_topic
        else:
            col = batch.column(idx)
            if col.null_count and default_topic is not None:
                col = pc.fill_null(col, default_topic)
            if col.null_count:
                first = pc.index(pc.is_null(col), True).as_py()
                raise SinkSchemaError(
                    f"row {start + first}: no topic (set the 'topic' option or the column)"
                )
            topics = col.to_pylist()

        derived = self.scope.ids(start, n) if self.scope is not None else None
        given = _column(batch, "msg_id")
        ids: list[Any] | None
        if given is None:
            ids = derived
        elif derived is None:
            ids = given
        else:
            ids = [g if g is not None else d for g, d in zip(given, derived, strict=True)]

        delays: list[Any] | None = None
        idx = schema.get_field_index("delay_ms")
        if idx >= 0:
            delay_col = batch.column(idx)
            if delay_col.null_count < n:
                delays = pc.cast(delay_col, pa.int64()).to_pylist()
        deliver = _deliver_at_ms(batch)
        if deliver is not None and delays is not None:
            both = pc.and_(
                batch.column(idx).is_valid(),
                batch.column(schema.get_field_index("deliver_at")).is_valid(),
            )
            if pc.any(both).as_py():
                first = pc.index(both, True).as_py()
                raise SinkSchemaError(
                    f"row {start + first}: both 'deliver_at' and 'delay_ms' are set"
                )
        props_raw = _column(batch, "properties")
        return MessageBatch(
            topics,
            values,
            msg_ids=ids,
            delay_ms=delays,
            deliver_at_ms=deliver,
            keys=_column(batch, "key"),
            tags=_column(batch, "tags"),
            properties=None if props_raw is None else [dict(p) if p else None for p in props_raw],
        )

    def _record(
        self,
        chunk: MessageBatch,
        first_row: int,
        outcomes: Sequence[SendResult | QClientError],
        resent: int,
    ) -> None:
        """Count one chunk's outcomes; fail (or, with on_error=skip, log) its failures."""
        opts = self.options
        c = self.counts
        c.rows += len(chunk)
        c.retried += resent
        errors: list[tuple[int, QClientError]] = []
        per_broker = c.sent_per_broker
        for j, res in enumerate(outcomes):
            if isinstance(res, SendResult):
                per_broker[res.broker_name] = per_broker.get(res.broker_name, 0) + 1
            else:
                errors.append((j, res))
                broker = getattr(res, "broker_name", None) or "unknown"
                c.failed_per_broker[broker] = c.failed_per_broker.get(broker, 0) + 1
        c.sent += len(chunk) - len(errors)
        if errors:
            c.failed += len(errors)
            j, err = errors[0]
            text = (
                f"qclient sink: {len(errors)} of {len(chunk)} rows of partition "
                f"{c.partition_id} could not be sent after {opts.write_retries + 1} "
                f"attempts; first: row {first_row + j} msg_id={chunk.msg_id(j)} "
                f"on {describe(err)}"
            )
            if opts.on_error == "fail":
                raise SinkWriteError(text) from err
            log.warning("%s (on_error=skip: going on)", text)

    def _send_chunk(self, chunk: MessageBatch) -> tuple[list[SendResult | QClientError], int]:
        opts = self.options
        return send_with_retries(
            self.producer, chunk, retries=opts.write_retries, backoff=opts.retry_backoff
        )

    def send(self, messages: MessageBatch, first_row: int) -> None:
        """Send in chunks of ``rows_per_send``, one at a time; count the outcomes."""
        step = self.options.rows_per_send
        for lo in range(0, len(messages), step):
            chunk = messages[lo : lo + step]
            self._record(chunk, first_row + lo, *self._send_chunk(chunk))

    def write(self, batches: Iterator[pa.RecordBatch]) -> PartitionCounts:
        """Send every row of the partition; return the counts.

        Up to ``max_in_flight`` chunks are being sent at once (threads), so building the
        next chunk's messages overlaps with waiting for the brokers' acknowledgements.
        """
        t0 = time.monotonic()
        before = _producer_retries(self.producer)
        in_flight = self.options.max_in_flight
        try:
            if in_flight <= 1:
                for batch in batches:
                    if batch.num_rows:
                        first = self._position
                        self.send(self.messages(batch), first)
            else:
                self._write_pipelined(batches, in_flight)
        finally:
            # also when the task fails: its worker exits then, with the clean-ups it owes
            settle_copies(self.producer, f"qclient sink: partition {self.counts.partition_id}")
        after = _producer_retries(self.producer)
        self.counts.retried += max(0, after - before)
        self.counts.seconds = time.monotonic() - t0
        return self.counts

    def _write_pipelined(self, batches: Iterator[pa.RecordBatch], in_flight: int) -> None:
        from concurrent.futures import Future, ThreadPoolExecutor

        step = self.options.rows_per_send
        pending: deque[tuple[MessageBatch, int, Future[Any]]] = deque()
        pool = ThreadPoolExecutor(in_flight, thread_name_prefix="qclient-sink")
        try:
            for batch in batches:
                if not batch.num_rows:
                    continue
                first = self._position
                messages = self.messages(batch)
                for lo in range(0, len(messages), step):
                    while len(pending) >= in_flight:
                        chunk, row, fut = pending.popleft()
                        self._record(chunk, row, *fut.result())
                    chunk = messages[lo : lo + step]
                    pending.append((chunk, first + lo, pool.submit(self._send_chunk, chunk)))
            while pending:
                chunk, row, fut = pending.popleft()
                self._record(chunk, row, *fut.result())
        finally:
            # On a failure the chunks still in flight finish (their ids make a retry
            # harmless); nothing new starts.
            pool.shutdown(wait=True, cancel_futures=True)


def _producer_retries(producer: Any) -> int:
    """The producer's own retry counter (its in-send re-tries on another broker), if any."""
    try:
        stats = producer.stats()
        value = stats.get("retried", 0)
        return int(value) if isinstance(value, int | float) else 0
    except Exception:  # stats are informative only
        return 0
