"""Consumer failure handling on both engines, one test body each: ``retry_later`` with the
group's backoff, dead-lettering after ``max_attempts`` (and ``dead_letter`` at once), a
member killed right after a ``retry_later``, and tag filters. qclient's own name server
and delay brokers, and real Apache RocketMQ 5 NameServers and brokers; each engine's
cluster (2 brokers) starts once for the module. Public API only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qclient import Consumer, LocalCluster, Producer, ReceivedMessage
from qclient.consumer._failures import (
    PROP_ATTEMPTS,
    PROP_ORIGIN_MSG_ID,
    PROP_ORIGIN_TOPIC,
    PROP_REASON,
    dlq_topic,
)

from .helpers import engine_topic, now_ms

pytestmark = [pytest.mark.timeout(240), pytest.mark.shares_rocketmq_cluster]

ENGINES = ["qclient", "rocketmq"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=ENGINES)
def cluster(request: pytest.FixtureRequest):
    if request.param == "rocketmq":
        # tests/conftest.py's: these tests stop no broker
        yield request.getfixturevalue("rocketmq_cluster")
        return
    with LocalCluster(brokers=2, engine=request.param) as c:
        yield c


def _poll_until(consumer: Consumer, done, timeout: float, handle) -> None:
    """Poll, calling ``handle(m)`` for each message, until ``done()`` or ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        for m in consumer.poll(32, timeout=0.3):
            handle(m)


def _drain_for(consumer: Consumer, seconds: float) -> list[ReceivedMessage]:
    """Everything ``consumer`` gets within ``seconds``."""
    got: list[ReceivedMessage] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got.extend(consumer.poll(32, timeout=min(0.3, max(0.01, end - time.monotonic()))))
    return got


def test_fails_twice_then_succeeds_on_the_third_attempt_each_retry_on_time(cluster):
    topic = engine_topic(cluster, "retry3")
    group = f"g-retry3-{cluster.engine}"
    delays = [1, 2]
    with Producer(cluster.namesrv) as p:
        sent = p.send(topic, b"payload", key="k-1", tags="TagA", properties={"order": "42"})
    got: list[tuple[ReceivedMessage, int]] = []  # (message, received at, epoch ms)
    retried_at: list[int] = []  # epoch ms before each retry_later call
    with Consumer(cluster.namesrv, topic, group, retry_delays=delays, max_attempts=5) as c:

        def handle(m: ReceivedMessage) -> None:
            got.append((m, now_ms()))
            if m.attempt < 3:
                retried_at.append(now_ms())
                c.retry_later(m)

        _poll_until(c, lambda: len(got) >= 3, 60, handle)
        assert [m.attempt for m, _ in got] == [1, 2, 3], got
        got += [(m, now_ms()) for m in _drain_for(c, max(delays) + 1.5)]
    assert [m.attempt for m, _ in got] == [1, 2, 3], "delivered again after it succeeded"
    first = got[0][0]
    for m, _ in got:
        assert m.msg_id == sent.msg_id
        assert (m.topic, m.body, m.key, m.tags) == (topic, b"payload", "k-1", "TagA")
        assert m.properties == first.properties  # no bookkeeping shows
        assert m.properties["order"] == "42"
    for i, delay in enumerate(delays):
        waited = got[i + 1][1] - retried_at[i]
        assert waited >= delay * 1000, f"retry {i + 1} came {waited} ms after retry_later"


def test_max_attempts_dead_letters_once_and_other_groups_see_it_once(cluster):
    topic = engine_topic(cluster, "dlq")
    failing, other = f"g-fail-{cluster.engine}", f"g-other-{cluster.engine}"
    with Producer(cluster.namesrv) as p:
        sent = p.send(topic, b"poison", key="k-p", tags="TagP", properties={"src": "t"})
        bad = p.send(topic, b"bad", key="k-b", tags="TagB")
    attempts: dict[str, list[int]] = {sent.msg_id: [], bad.msg_id: []}
    with Consumer(cluster.namesrv, topic, failing, retry_delays=[1], max_attempts=2) as c:

        def handle(m: ReceivedMessage) -> None:
            attempts[m.msg_id].append(m.attempt)
            if m.msg_id == bad.msg_id:
                c.dead_letter(m, "bad payload")
            else:
                c.retry_later(m)  # dead-letters at attempt 2

        _poll_until(c, lambda: len(attempts[sent.msg_id]) >= 2 and attempts[bad.msg_id], 60, handle)
        for m in _drain_for(c, 2.5):
            attempts[m.msg_id].append(m.attempt)
    assert attempts == {sent.msg_id: [1, 2], bad.msg_id: [1]}
    with Consumer(cluster.namesrv, topic, other) as c:
        seen = [m.msg_id for m in _drain_for(c, 0.1)]
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            seen += [m.msg_id for m in c.poll(32, timeout=0.5)]
        seen += [m.msg_id for m in _drain_for(c, 2.0)]
    assert sorted(seen) == sorted([sent.msg_id, bad.msg_id]), "the other group's deliveries"
    dlq: list[ReceivedMessage] = []
    with Consumer(cluster.namesrv, dlq_topic(failing), f"dlq-reader-{cluster.engine}") as d:
        deadline = time.monotonic() + 30
        while len(dlq) < 2 and time.monotonic() < deadline:
            dlq += d.poll(32, timeout=0.5)
        dlq += _drain_for(d, 2.0)
    by_origin = {m.properties.get(PROP_ORIGIN_MSG_ID): m for m in dlq}
    assert len(dlq) == 2 and set(by_origin) == {sent.msg_id, bad.msg_id}, dlq
    poison = by_origin[sent.msg_id]
    assert (poison.body, poison.key, poison.tags) == (b"poison", "k-p", "TagP")
    assert poison.properties[PROP_ORIGIN_TOPIC] == topic
    assert poison.properties[PROP_ATTEMPTS] == "2"
    assert poison.properties[PROP_REASON]
    assert poison.properties["src"] == "t"
    dead = by_origin[bad.msg_id]
    assert dead.properties[PROP_REASON] == "bad payload"
    assert dead.properties[PROP_ATTEMPTS] == "1"
    assert (dead.body, dead.key, dead.tags) == (b"bad", "k-b", "TagB")


def test_member_killed_right_after_retry_later_loses_nothing(cluster):
    topic = engine_topic(cluster, "kill")
    group = f"g-kill-{cluster.engine}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.consumer._retry_member", cluster.namesrv, topic, group],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ready = json.loads(child.stdout.readline())
        assert "ready" in ready, ready
        with Producer(cluster.namesrv) as p:
            sent = p.send(topic, b"keep me", key="k-kill")
        line = json.loads(child.stdout.readline())  # blocks until the retry is durable
        assert line["retried"] == sent.msg_id and line["attempt"] == 1, line
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        got: list[ReceivedMessage] = []
        with Consumer(cluster.namesrv, topic, group, session_timeout=2.0) as c:
            deadline = time.monotonic() + 60
            while not any(m.attempt == 2 for m in got) and time.monotonic() < deadline:
                got += c.poll(32, timeout=0.5)
            got += _drain_for(c, 3.0)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    print(f"after the kill: attempts {[m.attempt for m in got]}")
    assert {m.msg_id for m in got} == {sent.msg_id}
    assert 2 in [m.attempt for m in got], "the retry never came"
    assert len(got) <= 2, f"more than the retry and one duplicate: {[m.attempt for m in got]}"


def test_tag_filtered_group_gets_only_its_tags_while_an_unfiltered_group_gets_all(cluster):
    topic = engine_topic(cluster, "tags")
    tags = ["TagA", "TagB", "TagC", None]
    with Producer(cluster.namesrv) as p:
        sent = {
            p.send(topic, f"m{i}".encode(), tags=tags[i % 4]).msg_id: tags[i % 4] for i in range(40)
        }
    want = {i for i, t in sent.items() if t in ("TagA", "TagB")}
    results: dict[str, list[ReceivedMessage]] = {}
    for group, expr, expect in (
        (f"g-ab-{cluster.engine}", "TagA || TagB", want),
        (f"g-all-{cluster.engine}", None, set(sent)),
    ):
        got: list[ReceivedMessage] = []
        with Consumer(cluster.namesrv, topic, group, tags=expr) as c:
            deadline = time.monotonic() + 40
            while not expect <= {m.msg_id for m in got} and time.monotonic() < deadline:
                got += c.poll(64, timeout=0.5)
            got += _drain_for(c, 1.5)
        results[group] = got
    ab = results[f"g-ab-{cluster.engine}"]
    assert sorted(m.msg_id for m in ab) == sorted(want)
    assert {m.tags for m in ab} == {"TagA", "TagB"}
    every = results[f"g-all-{cluster.engine}"]
    assert sorted(m.msg_id for m in every) == sorted(sent)
