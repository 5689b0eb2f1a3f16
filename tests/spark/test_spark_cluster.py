"""The Spark sink against a real two-broker LocalCluster in local[2,2]: two task threads,
one retry of a failed task, as on a cluster.

The tests marked ``on_engines`` run once per engine: qclient's own brokers and real Apache
RocketMQ 5 ones (one cluster of each for the module). "Every row once" means each row's
id stored once on qclient (its brokers drop an id they already hold), and received once by
one consumer on RocketMQ (its brokers store a re-sent id again; the group consumer drops a
UNIQ_KEY it returned recently). The other tests use what only qclient's brokers do and run
on qclient only (each says why).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import not_early, now_ms, poll_stamped, wait_until

from qclient import Consumer, LocalCluster, ReceivedMessage

pytestmark = pytest.mark.spark

ENGINES = ["qclient", "rocketmq"]

#: Runs the test once per engine (the module's cluster of each, started once).
on_engines = pytest.mark.parametrize("cluster", ENGINES, indirect=True)
#: Runs the test on qclient's brokers only.
qclient_only = pytest.mark.parametrize("cluster", ["qclient"], indirect=True)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, spark: Any) -> Iterator[LocalCluster]:
    """Two brokers of the engine the test is parametrized with (``on_engines`` /
    ``qclient_only``), ``spark`` the active session of this thread again once they run."""
    import spark_udfs

    with LocalCluster(brokers=2, engine=request.param) as c:
        # RocketMQ's JVMs are forked with a preexec_fn by a launcher thread: the forked
        # child runs Python, which drops the other threads' thread-locals, and py4j's
        # finalizer of each shuts down (SHUT_RDWR) its socket to the Spark JVM, which the
        # child shares with this process. This thread's next call opens a new connection,
        # served by a new JVM thread without an active session, where format("qclient")
        # is not found (DATA_SOURCE_NOT_FOUND).
        spark_udfs.activate(spark)
        yield c


@pytest.fixture
def cluster_topic(cluster: LocalCluster, topic: str) -> str:
    """The test's topic, on RocketMQ created with 4 queues on each broker first: a
    RocketMQ broker auto-creates a topic only when a message reaches it, and a consumer
    reads only the queues the NameServer routes."""
    if cluster.engine == "rocketmq":
        cluster.create_topic(topic, 4)
    return topic


def drain(
    namesrv: str,
    topic: str,
    done: Callable[[list[ReceivedMessage]], bool],
    timeout: float = 60.0,
    quiet: float = 1.0,
    stats: dict[str, int] | None = None,
) -> list[ReceivedMessage]:
    """Poll until ``done(messages)``, then ``quiet`` seconds more (to catch duplicates);
    fails at ``timeout``. Records each message's receive time in ``extra``. ``stats``
    gets the consumer's counters (RocketMQ's consumer has them: ``duplicates_dropped``)."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout
    with Consumer(namesrv, topic, "g-" + topic) as consumer:
        while not done(got):
            if time.monotonic() > deadline:
                pytest.fail(
                    f"timed out: {len(got)} messages on {topic} "
                    f"({len({m.msg_id for m in got})} distinct)"
                )
            got.extend(poll_stamped(consumer, 1000, 0.5))
        end = time.monotonic() + quiet
        while time.monotonic() < end:
            got.extend(poll_stamped(consumer, 1000, 0.2))
        if stats is not None and hasattr(consumer, "stats"):
            stats.update(consumer.stats())
    return got


def _print_dropped(
    cluster: LocalCluster,
    what: str,
    stats: dict[str, int],
    record_property: Callable[[str, object], None],
) -> None:
    """Report how many stored copies the consumer dropped as duplicates (RocketMQ: a
    re-sent id is stored again). qclient's brokers keep one copy of an id and its consumer
    has no such counter: the tests assert that none came twice."""
    if "duplicates_dropped" in stats:
        dropped = stats["duplicates_dropped"]
        record_property("duplicates_dropped", dropped)
        print(f"\n{cluster.engine}: {what}: {dropped} stored more than once (dropped)")


def on_time(cluster: LocalCluster, m: ReceivedMessage) -> bool:
    """Not received before its deliver time. On qclient also fired no earlier than its
    brokers' fire-ahead allows (:func:`not_early`); a RocketMQ timer fires by its own wheel
    and the consumer holds what comes early, so there the receive time is the promise."""
    if cluster.engine == "qclient":
        return not_early(m)
    return bool(m.extra["received_ms"] >= m.deliver_at_ms)


def _write(df: Any, namesrv: str, topic: str, **options: Any) -> Any:
    w = df.write.format("qclient").option("namesrv", namesrv).option("topic", topic)
    for k, v in options.items():
        w = w.option(k, str(v))
    return w.mode("append")


@on_engines
def test_batch_write_delayed_rows(
    spark: Any,
    cluster: LocalCluster,
    cluster_topic: str,
    record_property: Callable[[str, object], None],
) -> None:
    from pyspark.sql import functions as F

    topic = cluster_topic
    # 5,000 rows: several chunks per partition on each broker (scale is spark_bench's);
    # on RocketMQ each delayed row is a request of its own (its batch request skips the timer)
    n = 5_000
    df = spark.range(0, n, numPartitions=4).select(
        F.col("id").cast("string").alias("value"),
        ((F.col("id") % 5) * 300).alias("delay_ms"),  # 0 .. 1.2 s
    )
    t0 = now_ms()
    _write(df, cluster.namesrv, topic).save()
    stats: dict[str, int] = {}
    got = drain(cluster.namesrv, topic, lambda ms: len({m.msg_id for m in ms}) >= n, stats=stats)
    _print_dropped(cluster, f"{n} rows", stats, record_property)
    assert len({m.msg_id for m in got}) == n == len(got)  # each row received once
    assert sorted(int(m.body) for m in {m.msg_id: m for m in got}.values()) == list(range(n))
    assert {m.broker_name for m in got} == {b.name for b in cluster.brokers}
    for m in got:
        delay = (int(m.body) % 5) * 300
        assert m.deliver_at_ms >= t0 + delay  # scheduled no earlier than asked
        assert on_time(cluster, m)  # and not received early


# qclient only: its brokers drop an id they already hold, RocketMQ's store it again.
@qclient_only
def test_same_msg_ids_twice_deliver_once(spark: Any, cluster: LocalCluster, topic: str) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 1000, numPartitions=2).select(
        F.col("id").cast("string").alias("value"),
        F.concat(F.lit("order-"), F.col("id")).alias("msg_id"),
    )
    _write(df, cluster.namesrv, topic).save()
    _write(df, cluster.namesrv, topic).save()
    got = drain(cluster.namesrv, topic, lambda ms: len(ms) >= 1000, quiet=2.0)
    assert len(got) == 1000
    assert {m.msg_id for m in got} == {f"order-{i}" for i in range(1000)}


# qclient only: the broker keeping one copy of a retried task's ids is what it tests.
@qclient_only
def test_worker_lost_mid_partition_is_retried_once_delivered_once(
    spark: Any, cluster: LocalCluster, topic: str
) -> None:
    """A Python worker dies after sending part of its partition; Spark retries the task
    (``local[2,2]``, as a cluster would) and the retry's ids match the first attempt's,
    so the broker keeps one copy of each row."""
    import os

    from pyspark.sql import functions as F

    root = Path(os.environ["QCLIENT_FAKE_SINK_DIR"])
    (root / f"crash-{topic}").write_text("600")
    n = 4000
    df = spark.range(0, n, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    _write(
        df,
        cluster.namesrv,
        topic,
        producer_factory="fake_producer:CrashOnceProducer",
        rows_per_send=200,
    ).save()
    assert (root / f"crashed-{topic}").exists()  # a worker did die mid-partition
    got = drain(cluster.namesrv, topic, lambda ms: len(ms) >= n, quiet=2.0)
    assert Counter(int(m.body) for m in got) == Counter(range(n))  # each row exactly once
    assert all(not_early(m) for m in got)


def _rate_query(
    spark: Any,
    namesrv: str,
    topic: str,
    checkpoint: Path,
    transform: Callable[[Any], Any] = lambda df: df,
) -> Any:
    from pyspark.sql import functions as F

    src = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 300)
        .option("numPartitions", 2)
        .load()
    )
    # 10 s: on a loaded host an attempt can time out after its broker stored the rows, and
    # the sink re-sends rows a send_batch reported failed 0.2 s later, elsewhere; the
    # producer cancels the extra copy in rounds 0.5 s apart (and asks again 2 s before it is
    # due), so "each row once" needs a delay that clean-up can beat: 2 s did not, twice
    rows = transform(src).select(
        F.col("value").cast("string").alias("value"), F.lit(10_000).cast("long").alias("delay_ms")
    )
    return (
        rows.writeStream.format("qclient")
        .option("namesrv", namesrv)
        .option("topic", topic)
        .option("rows_per_send", 50)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def _reported(query: Any) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def _assert_each_value_once(got: list[ReceivedMessage], reported: int) -> None:
    by_value = Counter(int(m.body) for m in got)
    assert set(range(reported)) <= set(by_value)  # every reported row delivered
    twice = sorted(v for v, n in by_value.items() if n > 1)
    # and none twice; if one is, say where each copy was (same id on two brokers: a
    # re-send went elsewhere; two ids: the rows were sent under another scope)
    copies = [
        (int(m.body), m.msg_id, m.broker_name, m.queue_id, m.offset, m.deliver_at_ms, m.fired_at_ms)
        for m in got
        if int(m.body) in twice[:3]
    ]
    assert not twice, f"{len(twice)} values twice, first {twice[:10]}; copies {sorted(copies)}"
    assert len({m.msg_id for m in got}) == len(got)  # one id per row, each received once


@on_engines
def test_streaming_delivers_every_reported_row(
    spark: Any, cluster: LocalCluster, cluster_topic: str, tmp_path: Path
) -> None:
    topic = cluster_topic
    query = _rate_query(spark, cluster.namesrv, topic, tmp_path / "ck")
    try:
        wait_until(lambda: _reported(query) >= 600, 60, "600 rows through the stream", 0.1)
    finally:
        query.stop()
    assert query.exception() is None
    reported = _reported(query)
    got = drain(
        cluster.namesrv, topic, lambda ms: set(range(reported)) <= {int(m.body) for m in ms}
    )
    _assert_each_value_once(got, reported)
    assert all(on_time(cluster, m) for m in got)


@on_engines
def test_streaming_restart_after_failure_mid_batch(
    spark: Any,
    cluster: LocalCluster,
    cluster_topic: str,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """The query dies mid-batch (the odd rows' partition fails at the threshold, twice,
    while the even one commits), restarts from its checkpoint and replays that batch with
    the same ids."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    topic = cluster_topic

    marker = tmp_path / "fail-now"
    marker.touch()
    threshold = 450
    marker_path = str(marker)

    def fail_once(value: int) -> int:
        import os

        # Odd rows only: the even partition commits its part, the odd one dies half-way.
        if value >= threshold and value % 2 == 1 and os.path.exists(marker_path):
            raise RuntimeError(f"injected failure at row {value}")
        return value

    guard = F.udf(fail_once, LongType()).asNondeterministic()
    ck = tmp_path / "ck"
    query = _rate_query(
        spark, cluster.namesrv, topic, ck, lambda df: df.withColumn("value", guard("value"))
    )
    try:
        wait_until(lambda: not query.isActive, 60, "the injected failure to stop the query", 0.1)
    finally:
        query.stop()
    assert "injected failure" in str(query.exception())
    first_reported = _reported(query)

    marker.unlink()
    query = _rate_query(
        spark, cluster.namesrv, topic, ck, lambda df: df.withColumn("value", guard("value"))
    )
    try:
        wait_until(lambda: _reported(query) >= 600, 60, "the restarted query to go on", 0.1)
    finally:
        query.stop()
    assert query.exception() is None
    # Offsets continue from the checkpoint: the failed batch was replayed first.
    reported = first_reported + _reported(query)
    assert reported > threshold
    stats: dict[str, int] = {}
    got = drain(
        cluster.namesrv,
        topic,
        lambda ms: set(range(reported)) <= {int(m.body) for m in ms},
        stats=stats,
    )
    _assert_each_value_once(got, reported)
    # RocketMQ: the replayed rows (none when the failed batch had sent nothing) and the
    # re-sent ones are stored again; the consumer dropped them.
    _print_dropped(cluster, f"{reported} rows, restarted mid-batch", stats, record_property)


@on_engines
def test_pandas_udf_sends_and_returns_ids(
    spark: Any, cluster: LocalCluster, cluster_topic: str
) -> None:
    from pyspark.sql import functions as F

    import spark_udfs

    topic = cluster_topic

    send = spark_udfs.send_delayed_udf(cluster.namesrv, topic)
    df = spark.range(0, 300, numPartitions=2).select(
        F.col("id").cast("string").alias("value"),
        # row 7 asks for a negative delay: an error for that row, the others are sent
        F.when(F.col("id") == 7, F.lit(-1)).otherwise(F.col("id") % 3 * 100).alias("delay_ms"),
    )
    rows = (
        df.select("value", send("value", "delay_ms").alias("r"))
        .select("value", "r.msg_id", "r.status", "r.error")
        .collect()
    )
    assert len(rows) == 300
    bad = [r for r in rows if r.status != "SEND_OK"]
    assert [(r.value, r.status) for r in bad] == [("7", "InvalidMessageError")]
    assert "delay" in bad[0].error
    assert {r.error for r in rows if r.status == "SEND_OK"} == {None}
    ids = {r.msg_id: r.value for r in rows if r.status == "SEND_OK"}
    assert len(ids) == 299
    got = drain(cluster.namesrv, topic, lambda ms: len(ms) >= 299)
    assert {m.msg_id: m.body.decode() for m in got} == ids


def _group_of_two(namesrv: str, topic: str, queues: int) -> list[Any]:
    """Two members of one group, polled until they hold every one of the topic's
    ``queues`` queues between them, each its own, for a second on end (both members
    known to both): from then on no queue moves while both keep polling."""
    members = [Consumer(namesrv, topic, "two-" + topic) for _ in range(2)]
    try:
        steady_since: float | None = None
        deadline = time.monotonic() + 60
        while True:
            for c in members:
                assert c.poll(100, 0.1) == []  # nothing was sent yet
            a, b = (set(c.assignment()) for c in members)
            if a and b and not a & b and len(a | b) == queues:
                steady_since = steady_since or time.monotonic()
                if time.monotonic() - steady_since >= 1.0:
                    return members
            else:
                steady_since = None
            assert time.monotonic() < deadline, f"no steady assignment: {sorted(a)} {sorted(b)}"
    except BaseException:
        for c in members:
            c.close()
        raise


@on_engines
def test_rows_whose_first_attempt_timed_out_after_being_stored_arrive_once(
    spark: Any,
    cluster: LocalCluster,
    topic: str,
    record_property: Callable[[str, object], None],
) -> None:
    """The answers to the first attempts of each worker's first two send calls to
    broker-a are lost after broker-a stored the rows (the attempt times out:
    ``fake_producer.HookedProducer``),
    so those rows are re-sent while a copy is already stored; a third of the rows are due
    at once, too soon for any clean-up. A consumer group of two members, holding the
    queues of the topic between them, receives every row exactly once: the re-sends went
    back to the queue that holds the copy (qclient's broker keeps one copy of the id;
    on RocketMQ the member holding that queue drops the second), none to broker-b."""
    import json
    import os

    from pyspark.sql import functions as F

    import spark_udfs

    root = Path(os.environ["QCLIENT_FAKE_SINK_DIR"])
    victim = cluster.brokers[0].name
    (root / f"lose-{topic}").write_text(f"{victim} 2")
    cluster.create_topic(topic, 4)
    n = 2000
    df = spark.range(0, n, numPartitions=2).select(
        F.col("id").cast("string").alias("value"),
        ((F.col("id") % 3) * 600).alias("delay_ms"),  # now, 0.6 s, 1.2 s
    )
    members = _group_of_two(cluster.namesrv, topic, 4 * len(cluster.brokers))
    got: list[tuple[int, ReceivedMessage]] = []
    error: list[BaseException] = []
    t0 = now_ms()

    def run() -> None:
        try:
            spark_udfs.activate(spark)  # the thread's active session (see the kill test)
            _write(
                df,
                cluster.namesrv,
                topic,
                producer_factory="fake_producer:HookedProducer",
                rows_per_send=100,
            ).save()
        except BaseException as exc:  # reported by the assertion below
            error.append(exc)

    writer = threading.Thread(target=run, name="spark-write")
    writer.start()
    stats: list[dict[str, int]] = []
    try:
        deadline = time.monotonic() + 180
        quiet_until: float | None = None
        while quiet_until is None or time.monotonic() < quiet_until:
            for k, c in enumerate(members):
                got.extend((k, m) for m in poll_stamped(c, 1000, 0.1))
            done = not writer.is_alive() and (error or len({m.msg_id for _, m in got}) >= n)
            if quiet_until is None and done:
                quiet_until = time.monotonic() + 2.0  # then any second copy shows
            assert time.monotonic() < deadline, f"{len(got)} of {n} rows received"
        for c in members:
            stats.append(dict(c.stats()) if hasattr(c, "stats") else {})
    finally:
        writer.join(timeout=180)
        for c in members:
            c.close()
    assert error == [], f"the write failed: {error}"
    lost = [json.loads(line) for line in (root / f"lost-{topic}.jsonl").read_text().splitlines()]
    lost_ids = {i for call in lost for i in call["ids"]}
    assert lost and lost_ids, "no answer was lost: nothing was tested"
    by_id = Counter(m.msg_id for _, m in got)
    twice = {
        i: [(k, m.broker_name, m.queue_id, m.offset) for k, m in got if m.msg_id == i]
        for i, c in by_id.items()
        if c > 1
    }
    assert not twice, f"{len(twice)} ids received twice, e.g. {list(twice.items())[:3]}"
    assert sorted(int(m.body) for _, m in got) == list(range(n))  # every row, once
    assert {k for k, _ in got} == {0, 1}  # both members received rows
    # the copies kept are those the lost answers were for, on the broker that stored them
    assert {m.broker_name for _, m in got if m.msg_id in lost_ids} == {victim}
    for _, m in got:
        assert m.deliver_at_ms >= t0 + (int(m.body) % 3) * 600  # no earlier than asked
        assert on_time(cluster, m)
    dropped = sum(s.get("duplicates_dropped", 0) for s in stats)
    record_property("lost_answers", len(lost_ids))
    record_property("duplicates_dropped", dropped)
    print(f"\n{cluster.engine}: {len(lost)} calls lost their answers ({len(lost_ids)} rows)")
    if cluster.engine == "rocketmq":
        # RocketMQ stored each of those rows twice, in one queue: its member dropped one
        assert dropped >= len(lost_ids), (dropped, len(lost_ids))


# qclient only, for the Spark group's time budget: a broker restart and a 10,000-row write
# at 10 rows per request fit in it once.
@qclient_only
def test_broker_killed_during_batch_write(spark: Any, cluster: LocalCluster, topic: str) -> None:
    """The victim broker is killed while the write is certainly in progress: every task
    process stops before its send once it has 2,000 rows acknowledged (``HookedProducer``'s
    hold), the victim has stored some of them, it is killed, then the sends go on."""
    import os

    from pyspark.sql import functions as F

    import spark_udfs

    root = Path(os.environ["QCLIENT_FAKE_SINK_DIR"])
    (root / f"hold-{topic}").write_text("2000")
    n = 10_000
    victim = cluster.brokers[0]
    df = spark.range(0, n, numPartitions=4).select(F.col("id").cast("string").alias("value"))
    error: list[BaseException] = []

    def run() -> None:
        try:
            # Spark 4.3 finds Python data sources through the thread's *active* session;
            # a new thread has none (the default session is not enough).
            spark_udfs.activate(spark)
            _write(
                df,
                cluster.namesrv,
                topic,
                rows_per_send=10,
                producer_factory="fake_producer:HookedProducer",
            ).save()
        except BaseException as exc:  # reported by the assertion below
            error.append(exc)

    writer = threading.Thread(target=run, name="spark-write")
    writer.start()
    try:
        # 2,000 rows acknowledged by two brokers in ids' order: some are the victim's
        wait_until(
            lambda: (root / f"held-{topic}").exists() or not writer.is_alive(),
            120,
            "a task to hold its write",
            0.02,
        )
        alive_at_kill = writer.is_alive()
        victim.kill()
        (root / f"go-{topic}").touch()
        writer.join(timeout=120)
        assert not writer.is_alive()
    finally:
        (root / f"go-{topic}").touch()  # a held task never waits past the test
        if not victim.running:
            victim.start()
    assert error == [], f"the write failed: {error}"
    assert alive_at_kill, "the write ended before its hold: nothing was tested"
    cluster.wait_registered()
    got = drain(cluster.namesrv, topic, lambda ms: len({m.msg_id for m in ms}) >= n)
    assert sorted(int(b) for b in {m.msg_id: m.body for m in got}.values()) == list(range(n))
    assert victim.name in {m.broker_name for m in got}  # the victim had stored rows


# qclient only: the keys are checked by qclient's brokers (their auth file); the RocketMQ
# engine refuses access keys (UnsupportedByEngineError: RocketMQ's ACL is the cluster's).
def test_credentials_as_options(spark: Any, tmp_path: Path) -> None:
    import json

    from pyspark.sql import functions as F

    secret, wrong = "s3cret-for-spark-test", "not-the-secret-value"
    auth = tmp_path / "auth.json"
    auth.write_text(
        json.dumps(
            {"accounts": [{"access_key": "etl", "secret_key": secret, "topics": ["signed_*"]}]}
        )
    )
    df = spark.range(0, 100, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    with LocalCluster(brokers=1, auth_file=str(auth)) as c:
        (
            df.write.format("qclient")
            .option("namesrv", c.namesrv)
            .option("topic", "signed_t")
            .option("accessKey", "etl")
            .option("secretKey", secret)
            .mode("append")
            .save()
        )
        with pytest.raises(Exception) as info:
            (
                df.write.format("qclient")
                .option("namesrv", c.namesrv)
                .option("topic", "signed_t")
                .option("access_key", "etl")
                .option("secret_key", wrong)
                .mode("append")
                .save()
            )
        text = str(info.value)
        assert "AuthError" in text and wrong not in text and secret not in text
        got: list[ReceivedMessage] = []
        with Consumer(c.namesrv, "signed_t", "g", access_key="etl", secret_key=secret) as consumer:
            deadline = time.monotonic() + 30
            while len(got) < 100 and time.monotonic() < deadline:
                got.extend(consumer.poll(100, 0.5))
    assert sorted(int(m.body) for m in got) == list(range(100))


# qclient only: pinning an explicit id to one broker serves qclient's broker-side dedupe.
@qclient_only
def test_pinned_sends_put_an_id_on_the_same_broker(cluster: LocalCluster, topic: str) -> None:
    """Rows carry explicit ids; the producer pins each id to one broker (no Spark here)."""
    from qclient import Message, Producer

    msgs = [Message(topic, f"m{i}", msg_id=f"{topic}-{i}") for i in range(400)]
    # a budget no load exhausts and no fault table: a slow answer on a loaded host would
    # otherwise send some ids of a batch to their stand-in broker, by design (the retry
    # of a timed-out attempt's last round, a broker marked unreachable)
    opts = {"send_timeout": 30.0, "send_latency_fault_enable": False}
    with Producer(cluster.namesrv, **opts) as p1, Producer(cluster.namesrv, **opts) as p2:
        first = p1.send_batch(msgs)
        again = p2.send_batch(msgs)  # another process's producer, same ids
    assert [(r.broker_name, r.queue_id) for r in first] == [
        (r.broker_name, r.queue_id) for r in again
    ]
    assert {r.broker_name for r in first} == {b.name for b in cluster.brokers}
    got = drain(cluster.namesrv, topic, lambda ms: len(ms) >= 400)
    assert len(got) == 400
