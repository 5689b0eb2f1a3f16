"""Failure handling on qclient's own engine, beyond what both engines share
(tests/integration/test_consumer_failures.py): on brokers that do not auto-create topics
the retry and dead-letter topics are created anyway and the DLQ reads like any topic
(``qclient consume``); a tag filter skips on the broker and commits what it skipped;
bad hand-backs are refused with nothing sent; ``AsyncConsumer`` hands back too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.helpers import wait_until

from qclient import AsyncConsumer, Consumer, LocalCluster, Producer, ReceivedMessage
from qclient.consumer._failures import PROP_ORIGIN_MSG_ID, PROP_REASON
from qclient.errors import ConsumerClosedError, InvalidMessageError
from qclient.protocol import wire

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(brokers=2, auto_create_topics=False) as c:
        yield c


def _samples(addr: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = httpx.get(f"http://{addr}{wire.METRICS}", timeout=5.0, trust_env=False).text
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def _total(cluster: LocalCluster, name: str, **labels: str) -> float:
    want = tuple(sorted(labels.items()))
    return sum(_samples(b.addr, name).get(want, 0.0) for b in cluster.brokers)


def _first(consumer: Consumer, timeout: float = 20) -> ReceivedMessage:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = consumer.poll(1, timeout=0.5)
        if batch:
            return batch[0]
    pytest.fail("no message arrived")


def test_retry_and_dlq_topics_exist_without_auto_creation_and_the_dlq_reads_as_a_topic(cluster):
    cluster.create_topic("noauto", 2)
    with Producer(cluster.namesrv) as p:
        sent = p.send("noauto", b"body", key="k")
    with Consumer(cluster.namesrv, "noauto", "g-noauto", retry_delays=[0.5]) as c:
        m = _first(c)
        c.retry_later(m)
        again = _first(c)
        assert (again.msg_id, again.attempt) == (sent.msg_id, 2)
        c.dead_letter(again, "gave up")
    out = subprocess.run(
        [sys.executable, "-m", "qclient", "consume", "--namesrv", cluster.namesrv,
         "--topic", "%DLQ%g-noauto", "--group", "dlq-cli", "--max", "1", "--timeout", "30"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stdout.splitlines()[0])
    assert line["topic"] == "%DLQ%g-noauto" and line["body"] == "body" and line["key"] == "k"
    assert line["properties"][PROP_ORIGIN_MSG_ID] == sent.msg_id
    assert line["properties"][PROP_REASON] == "gave up"
    assert _total(cluster, "qclient_broker_retries_total", group="g-noauto") == 1
    assert _total(cluster, "qclient_broker_dead_lettered_total", group="g-noauto") == 1


def test_tag_filter_skips_on_the_broker_and_commits_what_it_skipped(cluster):
    cluster.create_topic("tagged", 1)
    with Producer(cluster.namesrv) as p:
        sent = [p.send("tagged", f"m{i}", tags="TagA" if i % 3 == 0 else "TagB") for i in range(30)]
    per_broker = Counter(r.broker_name for r in sent)
    # a raw pull with the filter: only TagA crosses the network, the offsets move past all
    for b in cluster.brokers:
        req = wire.PullRequest("tagged", "raw", 1024, 0, tags=["TagA"])
        resp = httpx.post(
            f"http://{b.addr}{wire.BROKER_PULL}",
            content=wire.encode(req, wire.MSGPACK),
            headers={"content-type": wire.MSGPACK},
            timeout=5.0,
        )
        answer = wire.decode(resp.content, wire.PullResponse, wire.MSGPACK)
        assert {m.tags for m in answer.messages} <= {"TagA"}
        if per_broker[b.name]:  # (one queue: offsets 0..n-1 on this broker)
            assert answer.next_offsets == {0: per_broker[b.name]}
    got: list[ReceivedMessage] = []
    with Consumer(cluster.namesrv, "tagged", "g-tagged", tags="TagA") as c:
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            got += c.poll(64, timeout=0.5)
        got += c.poll(64, timeout=0.5)  # commits the first polls
    assert len(got) == 10 and {m.tags for m in got} == {"TagA"}
    # closed: everything committed, the 20 skipped messages included
    lag = "qclient_broker_consume_lag_messages"
    wait_until(
        lambda: (
            _total(cluster, lag, topic="tagged", group="g-tagged") == 0
            and any(_samples(b.addr, lag) for b in cluster.brokers)
        ),
        10,
        "the filtered group's lag to reach 0",
    )


def test_bad_hand_backs_are_refused_and_send_nothing(cluster):
    cluster.create_topic("badback", 2)
    with Producer(cluster.namesrv) as p:
        p.send("badback", b"x")
    with pytest.raises(ValueError, match="tags"):
        Consumer(cluster.namesrv, "badback", "g", tags="A || ")
    with pytest.raises(ValueError, match="max_attempts"):
        Consumer(cluster.namesrv, "badback", "g", max_attempts=0)
    with pytest.raises(ValueError, match="retry_delays"):
        Consumer(cluster.namesrv, "badback", "g", retry_delays=[-1])
    c = Consumer(cluster.namesrv, "badback", "g-bad", retry_delays=[0.5])
    other = Consumer(cluster.namesrv, "badback", "g-other")
    try:
        m = _first(c)
        theirs = _first(other)
        forged = ReceivedMessage(m.msg_id, m.topic, m.body, None, None, {}, 0, 0, "b", 0, 0)
        for bad in (forged, theirs, "not a message"):
            with pytest.raises(InvalidMessageError, match=r"this consumer|ReceivedMessage"):
                c.retry_later(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidMessageError, match="delay"):
            c.retry_later(m, delay=-1)
        with pytest.raises(InvalidMessageError, match="reason"):
            c.dead_letter(m, None)  # type: ignore[arg-type]
        assert _total(cluster, "qclient_broker_retries_total", group="g-bad") == 0
        c.retry_later(m, delay=0.2)  # still possible: nothing was done
        with pytest.raises(InvalidMessageError, match="already"):
            c.retry_later(m)
        with pytest.raises(InvalidMessageError, match="already"):
            c.dead_letter(m, "again")
        assert _total(cluster, "qclient_broker_retries_total", group="g-bad") == 1
        again = _first(c)
        assert again.attempt == 2
    finally:
        c.close()
        other.close()
    with pytest.raises(ConsumerClosedError):
        c.retry_later(again)


def test_async_consumer_hands_back(cluster):
    cluster.create_topic("asyncback", 2)
    with Producer(cluster.namesrv) as p:
        sent = p.send("asyncback", b"x")

    async def run() -> list[int]:
        attempts: list[int] = []
        async with AsyncConsumer(
            cluster.namesrv, "asyncback", "g-async", retry_delays=[0.3], max_attempts=2
        ) as c:
            deadline = time.monotonic() + 30
            while len(attempts) < 2 and time.monotonic() < deadline:
                for m in await c.poll(8, 0.5):
                    assert m.msg_id == sent.msg_id
                    attempts.append(m.attempt)
                    await c.retry_later(m)  # the second one dead-letters
        return attempts

    assert asyncio.run(run()) == [1, 2]
    wait_until(
        lambda: _total(cluster, "qclient_broker_dead_lettered_total", group="g-async") == 1,
        10,
        "the dead-lettered copy",
    )
