"""The sink's pieces without Spark: options, ids, Arrow rows → messages, re-sends, errors."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from qclient._models import Message, SendResult, SendStatus
from qclient.errors import (
    AuthError,
    BatchSendError,
    BrokerUnavailableError,
    InvalidMessageError,
    QClientError,
    SendTimeoutError,
)
from spark_udfs._ids import IdScope, batch_scope, streaming_scope
from spark_udfs._options import OptionError, parse_options
from spark_udfs._sink import (
    PartitionCounts,
    PartitionSender,
    SinkSchemaError,
    SinkWriteError,
    resembled_column,
    send_with_retries,
    summarize,
    summary_line,
)


class ScriptedProducer:
    """Acknowledges everything except what ``fail`` says: msg_id -> errors to raise, in turn."""

    def __init__(self, fail: dict[str, list[QClientError]] | None = None) -> None:
        self.fail = fail or {}
        self.calls: list[list[Message]] = []
        self.stored: dict[str, Message] = {}

    def send_batch(self, messages: list[Message]) -> list[SendResult]:
        self.calls.append(list(messages))
        results: list[SendResult | QClientError] = []
        for i, m in enumerate(messages):
            errs = self.fail.get(str(m.msg_id))
            if errs:
                results.append(errs.pop(0))
                continue
            self.stored[str(m.msg_id)] = m
            results.append(
                SendResult(
                    str(m.msg_id), SendStatus.SEND_OK, "broker-a" if i % 2 else "broker-b", 0, 0
                )
            )
        if any(isinstance(r, QClientError) for r in results):
            raise BatchSendError("partial", results)
        return results  # type: ignore[return-value]

    def stats(self) -> dict[str, Any]:
        return {"retried": 0}


# --- options ---------------------------------------------------------------------


def test_options_case_insensitive_and_every_producer_option() -> None:
    opts = parse_options(
        {
            "NameSrv": "127.0.0.1:1",
            "TOPIC": "t",
            "sendTimeout": "1.5",
            "retry_times": "4",
            "batchMaxMessages": "64",
            "linger_ms": "2",
            "send_latency_fault_enable": "false",
            "access_key": "app",
            "secretKey": "hunter2",
            "rows_per_send": "10",
        }
    )
    kw = opts.producer_kwargs
    assert kw["namesrv"] == "127.0.0.1:1"
    assert kw["send_timeout"] == 1.5 and kw["retry_times"] == 4  # over the sink's defaults
    assert kw["batch_max_messages"] == 64 and kw["linger_ms"] == 2.0
    assert kw["send_latency_fault_enable"] is False
    assert kw["access_key"] == "app" and kw["secret_key"] == "hunter2"
    assert opts.topic == "t" and opts.rows_per_send == 10
    # The secret is in neither repr nor str nor the cache key.
    for text in (repr(opts), str(opts), opts.cache_key()):
        assert "hunter2" not in text


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"topic": "t"}, "'namesrv' is required"),
        ({"namesrv": "a:1", "colour": "red"}, "unknown qclient option 'colour'"),
        ({"namesrv": "a:1", "send_timeout": "soon"}, "must be a number"),
        ({"namesrv": "a:1", "retry_times": "-1"}, "retry_times"),
        ({"namesrv": "a:1", "access_key": "k"}, "go together"),
        ({"namesrv": "a:1", "topic": "bad topic!"}, "not a valid topic"),
        ({"namesrv": "a:1", "on_error": "ignore"}, "'fail' or 'skip'"),
    ],
)
def test_bad_options_are_clear_errors(options: dict[str, str], needle: str) -> None:
    with pytest.raises(OptionError, match=needle):
        parse_options(options)


def test_sink_defaults_differ_from_the_producers_where_a_pipeline_needs_it() -> None:
    """Larger requests, and a 30 s budget: a row once matters more than a quick answer
    (decision 0035); the producer itself keeps 3 s."""
    from qclient._config import ProducerConfig

    kw = parse_options({"namesrv": "127.0.0.1:1", "topic": "t"}).producer_kwargs
    assert kw["send_timeout"] == 30.0 and kw["batch_max_messages"] == 1000
    assert ProducerConfig.create("127.0.0.1:1").send_timeout == 3.0


def test_secret_not_in_option_errors() -> None:
    with pytest.raises(OptionError) as info:
        parse_options({"namesrv": "a:1", "secret_key": "hunter2", "send_timeout": "x"})
    assert "hunter2" not in str(info.value)


# --- ids -------------------------------------------------------------------------


def test_ids_are_deterministic_and_distinct() -> None:
    a = IdScope(streaming_scope("q1", 3), 0).ids(0, 1000)
    assert a == IdScope(streaming_scope("q1", 3), 0).ids(0, 1000)  # a replay: same ids
    others = (
        IdScope(streaming_scope("q1", 4), 0).ids(0, 1000)
        + IdScope(streaming_scope("q1", 3), 1).ids(0, 1000)
        + IdScope(streaming_scope("q2", 3), 0).ids(0, 1000)
        + IdScope(batch_scope("job"), 0).ids(0, 1000)
    )
    assert len(set(a)) == 1000
    assert not set(a) & set(others) and len(set(others)) == 4000
    assert IdScope("s", 7).id(5) == IdScope("s", 7).ids(5, 1)[0]
    assert all(len(i) <= 128 for i in a)


# --- rows -> messages ------------------------------------------------------------


def _sender(producer: Any, **opts: str) -> PartitionSender:
    options = parse_options({"namesrv": "a:1", "topic": "t", "retry_backoff": "0", **opts})
    return PartitionSender(options, producer, IdScope("job", 2), 2)


def test_rows_to_messages_every_column() -> None:
    at = datetime(2030, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)
    batch = pa.RecordBatch.from_pydict(
        {
            "value": ["a", "b", "c"],
            "key": ["k1", None, "k3"],
            "topic": [None, "other", None],
            "deliver_at": pa.array([at, None, None], pa.timestamp("us", tz="UTC")),
            "delay_ms": pa.array([None, 1500, None], pa.int64()),
            "tags": ["x", None, None],
            "properties": pa.array([[("p", "1")], None, []], pa.map_(pa.string(), pa.string())),
            "msg_id": [None, "given", None],
        }
    )
    mb = _sender(ScriptedProducer()).messages(batch)
    assert mb.topic == ["t", "other", "t"]
    assert mb.msg_ids == [IdScope("job", 2).id(0), "given", IdScope("job", 2).id(2)]
    # deliver_at in ms, rounded up so never early: .678901 s -> 679 ms
    assert mb.deliver_at_ms == [int(at.timestamp()) * 1000 + 679, None, None]
    assert mb.delay_ms == [None, 1500, None]  # row 2: neither, so immediate
    assert mb.properties == [{"p": "1"}, None, None]
    assert mb.keys == ["k1", None, "k3"] and mb.tags == ["x", None, None]
    assert mb.bodies == [b"a", b"b", b"c"]  # string values travel as their UTF-8 bytes
    # the same rows as Message objects (what a producer without columns would get)
    msgs = list(mb)
    assert msgs[1].delay == timedelta(milliseconds=1500) and msgs[1].deliver_at is None
    assert msgs[0].deliver_at == pytest.approx(at.timestamp() + 0.000099, abs=1e-6)
    assert msgs[2].delay is None and msgs[2].deliver_at is None


def test_binary_values_and_row_positions_continue_across_batches() -> None:
    s = _sender(ScriptedProducer())
    b = pa.RecordBatch.from_pydict({"value": pa.array([b"\x00\x01", b"z"], pa.binary())})
    first, second = s.messages(b), s.messages(b)
    assert first.bodies[0] == b"\x00\x01"
    assert [m.msg_id for m in [*first, *second]] == IdScope("job", 2).ids(0, 4)


@pytest.mark.parametrize(
    ("cols", "needle"),
    [
        ({"value": [None]}, "'value' is null"),
        ({"key": ["k"]}, "needs a 'value' column"),
        (
            {
                "value": ["v"],
                "delay_ms": [5],
                "deliver_at": pa.array([datetime.now(UTC)], pa.timestamp("us", tz="UTC")),
            },
            "both",
        ),
    ],
)
def test_bad_rows_are_clear_errors(cols: dict[str, Any], needle: str) -> None:
    with pytest.raises(SinkSchemaError, match=needle):
        _sender(ScriptedProducer()).messages(pa.RecordBatch.from_pydict(cols))


# --- the pandas UDF's body ------------------------------------------------------------


def test_udf_body_sends_each_row_and_reports_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    from spark_udfs import _udf

    opts = parse_options(
        {"namesrv": "127.0.0.1:1", "topic": "t", "rows_per_send": "4", "write_retries": "0"}
    )
    prod = ScriptedProducer()
    values = pd.Series([f"v{i}" for i in range(10)])
    delays = pd.Series([None, *range(1, 10)], dtype="float64")  # a null: NaN in pandas
    monkeypatch.setattr(_udf, "get_producer", lambda options: prod)
    out = _udf.send_series(opts, "udf-test", values, delays)
    assert out["status"].tolist() == ["SEND_OK"] * 10
    assert out["error"].isna().all()
    sent = {m.msg_id: m for m in prod.stored.values()}
    assert [sent[i].body for i in out["msg_id"]] == [f"v{i}" for i in range(10)]
    first = sent[out["msg_id"][0]]
    assert first.delay is None and first.deliver_at is None
    # each delay became the time it asks for (epoch s), fixed once before the first attempt
    now_ms = round(sent[out["msg_id"][1]].deliver_at * 1000) - 1
    assert [sent[i].delay for i in out["msg_id"][1:]] == [None] * 9
    assert [round(sent[i].deliver_at * 1000) - now_ms for i in out["msg_id"][1:]] == list(
        range(1, 10)
    )


# --- column conventions ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "resembles"),
    [
        ("delay", "delay_ms"),
        ("delayMs", "delay_ms"),
        ("DELAY_MS", "delay_ms"),
        ("delay_seconds", "delay_ms"),
        ("deliverAt", "deliver_at"),
        ("deliver_time", "deliver_at"),
        ("msgId", "msg_id"),
        ("message_id", "msg_id"),
        ("Value", "value"),
        ("vaule", "value"),
        ("values", "value"),
        ("keys", "key"),
        ("tag", "tags"),
        ("Topic", "topic"),
        ("headers", "properties"),
    ],
)
def test_misspelt_sink_columns_are_recognised(name: str, resembles: str) -> None:
    assert resembled_column(name) == resembles


@pytest.mark.parametrize(
    "name", ["id", "timestamp", "age", "stage", "partition", "payload", "count", "_c0", "val"]
)
def test_other_columns_resemble_nothing(name: str) -> None:
    assert resembled_column(name) is None


def test_sink_columns_resemble_nothing() -> None:
    from spark_udfs._sink import COLUMNS

    assert [resembled_column(c) for c in COLUMNS] == [None] * len(COLUMNS)


# --- sending ---------------------------------------------------------------------


def test_retryable_failures_are_resent_with_the_same_ids() -> None:
    prod = ScriptedProducer(
        {
            "m1": [BrokerUnavailableError("refused", broker_name="b1")],
            "m3": [BrokerUnavailableError("refused", broker_name="b2")] * 2,
        }
    )
    msgs = [Message("t", "x", msg_id=f"m{i}") for i in range(5)]
    outcomes, resent = send_with_retries(prod, msgs, retries=2, backoff=0)
    assert all(isinstance(o, SendResult) for o in outcomes)
    assert resent == 3  # m1 once, m3 twice
    assert [m.msg_id for m in prod.calls[1]] == ["m1", "m3"] and len(prod.calls) == 3


class ValidatingProducer(ScriptedProducer):
    """Refuses a whole batch that holds an invalid message, like the SDK (before sending)."""

    def send_batch(self, messages: list[Message]) -> list[SendResult]:
        if any(m.body == "bad" for m in messages):
            raise InvalidMessageError("body 'bad' is not acceptable")
        return super().send_batch(messages)


def test_one_invalid_message_does_not_sink_its_batch() -> None:
    prod = ValidatingProducer()
    msgs = [Message("t", "bad" if i in (5, 6) else "ok", msg_id=f"m{i}") for i in range(16)]
    outcomes, resent = send_with_retries(prod, msgs, retries=2, backoff=0)
    bad = [i for i, o in enumerate(outcomes) if isinstance(o, QClientError)]
    assert bad == [5, 6] and resent == 0  # invalid is final: not re-sent
    assert set(prod.stored) == {f"m{i}" for i in range(16)} - {"m5", "m6"}


def test_non_retryable_failure_is_not_resent() -> None:
    prod = ScriptedProducer({"m0": [AuthError("wrong signature")]})
    outcomes, resent = send_with_retries(
        prod, [Message("t", "x", msg_id="m0")], retries=3, backoff=0
    )
    assert isinstance(outcomes[0], AuthError) and resent == 0 and len(prod.calls) == 1


def test_failure_after_retries_fails_with_broker_and_cause() -> None:
    sender = _sender(
        ScriptedProducer(
            {
                IdScope("job", 2).id(1): [
                    BrokerUnavailableError("connection refused", broker_name="broker-b")
                ]
                * 3
            }
        )
    )
    batch = pa.RecordBatch.from_pydict({"value": ["a", "b", "c"]})
    with pytest.raises(SinkWriteError) as info:
        sender.write(iter([batch]))
    text = str(info.value)
    assert "1 of 3 rows of partition 2" in text and "after 3 attempts" in text
    assert "broker broker-b" in text and "connection refused" in text and "row 1" in text


def test_skip_mode_counts_and_goes_on() -> None:
    sender = _sender(
        ScriptedProducer(
            {IdScope("job", 2).id(0): [BrokerUnavailableError("down", broker_name="b9")] * 9}
        ),
        on_error="skip",
        write_retries="1",
        rows_per_send="2",
    )
    counts = sender.write(iter([pa.RecordBatch.from_pydict({"value": ["a", "b", "c"]})]))
    assert (counts.rows, counts.sent, counts.failed, counts.retried) == (3, 2, 1, 1)
    assert counts.failed_per_broker == {"b9": 1}
    assert sum(counts.sent_per_broker.values()) == 2


def test_summary_line() -> None:
    total = summarize(
        [
            PartitionCounts(0, 3, 3, 1, 0, {"a": 2, "b": 1}),
            PartitionCounts(1, 2, 2, 0, 0, {"a": 2}),
            None,
        ]
    )
    line = summary_line("qclient sink: batch 4", total)
    assert line == (
        "qclient sink: batch 4: 5 of 5 rows sent (a 4, b 1), 1 retried, 0 failed, "
        "2 partitions, 1 without a commit message"
    )


def test_import_is_cheap() -> None:
    code = "import sys, qclient, spark_udfs; print('pyspark' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"


def test_pipelined_write_sends_every_row_once_and_fails_clearly() -> None:
    prod = ScriptedProducer()
    sender = _sender(prod, rows_per_send="7", max_in_flight="3")
    batches = [
        pa.RecordBatch.from_pydict({"value": [str(i) for i in range(k, k + 50)]})
        for k in range(0, 200, 50)
    ]
    counts = sender.write(iter(batches))
    assert (counts.rows, counts.sent, counts.failed) == (200, 200, 0)
    assert sorted(int(m.body) for m in prod.stored.values()) == list(range(200))
    assert set(prod.stored) == set(IdScope("job", 2).ids(0, 200))

    bad = IdScope("job", 2).id(120)
    down = ScriptedProducer({bad: [BrokerUnavailableError("gone", broker_name="b3")] * 3})
    with pytest.raises(SinkWriteError, match=r"row 120 .* on broker b3"):
        _sender(down, rows_per_send="7", max_in_flight="3").write(iter(batches))


def test_commit_logs_one_summary_line(caplog: pytest.LogCaptureFixture) -> None:
    from spark_udfs._datasource import QClientCommitMessage, QClientStreamWriter

    writer = QClientStreamWriter(parse_options({"namesrv": "a:1", "topic": "t"}))
    msgs = [
        QClientCommitMessage(PartitionCounts(0, 4, 4, 1, 0, {"broker-a": 4})),
        QClientCommitMessage(PartitionCounts(1, 2, 2, 0, 0, {"broker-b": 2})),
    ]
    with caplog.at_level(logging.INFO, logger="spark_udfs"):
        writer.commit(msgs, 12)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("spark_udfs")]
    assert lines == [
        "qclient sink: batch 12: 6 of 6 rows sent (broker-a 4, broker-b 2), "
        "1 retried, 0 failed, 2 partitions"
    ]


class ClosableProducer(ScriptedProducer):
    """A factory target for the producer cache: records its arguments and closing."""

    def __init__(self, namesrv: str, **kwargs: Any) -> None:
        super().__init__()
        self.namesrv, self.kwargs, self.closed = namesrv, kwargs, False

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


def test_producer_cache_one_per_configuration() -> None:
    from spark_udfs import _producer_cache

    base = {"namesrv": "a:1,b:2", "producer_factory": f"{__name__}:ClosableProducer"}
    one = parse_options({**base, "send_timeout": "1.5", "secret_key": "x", "access_key": "k"})
    same = parse_options({**base, "SendTimeout": "1.5", "secretKey": "x", "accessKey": "k"})
    other = parse_options({**base, "send_timeout": "2"})
    p1 = _producer_cache.get_producer(one)
    try:
        assert _producer_cache.get_producer(same) is p1  # a new writer, same producer
        p2 = _producer_cache.get_producer(other)
        assert p2 is not p1
        assert p1.namesrv == "a:1,b:2" and p1.kwargs["send_timeout"] == 1.5
    finally:
        _producer_cache.close_all()
    assert p1.closed and p2.closed
    assert _producer_cache.get_producer(one) is not p1  # closed ones are not reused
    _producer_cache.close_all()


class TimingOutProducer(ScriptedProducer):
    """Each message's first send fails retryably (as a send whose attempts timed out),
    after the time given by ``clock`` moved on; counts ``settle`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, list[Any]] = {}
        self.settled = 0

    def send_batch(self, messages: Any) -> list[SendResult]:
        msgs = list(messages)
        for m in msgs:
            self.seen.setdefault(str(m.msg_id), []).append((m.delay, m.deliver_at))
        first = [m for m in msgs if len(self.seen[str(m.msg_id)]) == 1]
        if first:
            time.sleep(0.02)  # the re-send starts later: a relative delay would move
            err = SendTimeoutError("no answer")
            raise BatchSendError("timed out", [err] * len(msgs))
        return super().send_batch(msgs)

    def settle(self, timeout: float | None = None) -> int:
        self.settled += 1
        return 0


def test_resent_rows_keep_the_deliver_time_of_their_first_attempt() -> None:
    """A re-sent row asks for the same absolute time as its first attempt: a copy the
    first attempt may have left fires with the acknowledged one, not a re-send's delay
    earlier."""
    prod = TimingOutProducer()
    sender = _sender(prod, rows_per_send="3", write_retries="2")
    batch = pa.RecordBatch.from_pydict(
        {"value": [str(i) for i in range(6)], "delay_ms": [None, 0, 500, 1000, -1, 60_000]}
    )
    t0_ms = time.time() * 1000
    counts = sender.write(iter([batch]))
    assert (counts.sent, counts.retried) == (6, 6)
    for mid, attempts in prod.seen.items():
        assert len(attempts) == 2, mid
        assert len(set(attempts)) == 1, (mid, attempts)  # the same time in every attempt
    by_row = {int(m.body): m for m in prod.stored.values()}
    assert by_row[0].deliver_at is None and by_row[0].delay is None
    assert by_row[1].deliver_at is None and by_row[1].delay == timedelta(0)
    # a negative delay stays one (the SDK refuses it, naming the delay)
    assert by_row[4].deliver_at is None and by_row[4].delay == timedelta(milliseconds=-1)
    for row, delay in ((2, 500), (3, 1000), (5, 60_000)):
        assert by_row[row].delay is None
        assert by_row[row].deliver_at * 1000 >= t0_ms + delay


def test_a_partition_settles_its_producers_clean_ups_even_when_it_fails() -> None:
    prod = TimingOutProducer()
    batch = pa.RecordBatch.from_pydict({"value": ["a", "b"]})
    _sender(prod, write_retries="1").write(iter([batch]))
    assert prod.settled == 1
    down = TimingOutProducer()
    with pytest.raises(SinkWriteError):
        _sender(down, write_retries="0").write(iter([batch]))
    assert down.settled == 1
