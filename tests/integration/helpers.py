"""Helpers for tests against a real LocalCluster."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pytest

from qclient import Consumer, ReceivedMessage, SendResult
from qclient.protocol import wire

T = TypeVar("T")


def wait_until(
    cond: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll ``cond`` until it returns a truthy value; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def now_ms() -> int:
    """The wall clock in ms, as brokers stamp ``deliver_at_ms`` and ``fired_at_ms``."""
    return time.time_ns() // 1_000_000


def poll_stamped(consumer: Consumer, max_messages: int, timeout: float) -> list[ReceivedMessage]:
    """``consumer.poll``, each message's ``extra["received_ms"]`` set to when it returned
    (see :func:`not_early`)."""
    batch = consumer.poll(max_messages=max_messages, timeout=timeout)
    received_ms = now_ms()
    for m in batch:
        m.extra["received_ms"] = received_ms
    return batch


def drain(
    namesrv: str, topic: str, group: str, expected: int, timeout: float, settle: float = 0.0
) -> list[ReceivedMessage]:
    """Consume until ``expected`` distinct ids arrived (or ``timeout``), then ``settle``
    seconds more so duplicates and strays show up too. Commits on close. Each message's
    ``extra["received_ms"]`` is when its poll returned (see :func:`not_early`)."""
    got: list[ReceivedMessage] = []
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    with Consumer(namesrv, topic, group) as consumer:
        while len(seen) < expected and time.monotonic() < deadline:
            for m in poll_stamped(consumer, 512, 0.5):
                got.append(m)
                seen.add(m.msg_id)
        end = time.monotonic() + settle
        while time.monotonic() < end:
            got.extend(poll_stamped(consumer, 512, min(0.5, settle)))
    return got


def not_early(m: ReceivedMessage) -> bool:
    """Received (by :func:`drain`) at or after its deliver time, and fired no earlier
    than the broker's fire-ahead allows (it holds such messages until their time)."""
    return m.extra["received_ms"] >= m.deliver_at_ms and m.fired_at_ms >= wire.firing_time_ms(
        m.deliver_at_ms
    )


def duplicates(messages: list[ReceivedMessage]) -> int:
    return sum(n - 1 for n in Counter(m.msg_id for m in messages).values())


def drain_ids(
    namesrv: str, topic: str, group: str, want: set[str], timeout: float, settle: float = 1.0
) -> list[ReceivedMessage]:
    """Consume until every id of ``want`` arrived (or ``timeout``), then ``settle`` s more
    so duplicates show up too; each message's ``extra["received_ms"]`` is when its poll
    returned. Prints the consumer's counters when it has them (RocketMQ's drops the
    duplicates of a UNIQ_KEY it returned recently)."""
    got: list[ReceivedMessage] = []
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    with Consumer(namesrv, topic, group) as consumer:
        while not want <= seen and time.monotonic() < deadline:
            for m in poll_stamped(consumer, 512, 0.5):
                got.append(m)
                seen.add(m.msg_id)
        end = time.monotonic() + settle
        while time.monotonic() < end:
            got.extend(poll_stamped(consumer, 512, 0.25))
        stats = getattr(consumer, "stats", None)
        if callable(stats):
            print(f"drain consumer counters: {stats()}")
    return got


def check_delivered(got: list[ReceivedMessage], acked: dict[str, SendResult]) -> None:
    """Every acknowledged message arrived, none before its deliver time; prints the
    duplicates and the copies of messages that were never acknowledged."""
    ids = Counter(m.msg_id for m in got)
    missing = set(acked) - set(ids)
    dups = sum(n - 1 for n in ids.values())
    strays = len(set(ids) - set(acked))
    print(f"delivered {len(ids)} ids for {len(acked)} acked: {dups} duplicates, {strays} unacked")
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages never arrived"
    early = [
        m
        for m in got
        if m.msg_id in acked
        and m.extra["received_ms"] < max(acked[m.msg_id].deliver_at_ms, m.deliver_at_ms)
    ]
    assert not early, f"{len(early)} received before their deliver time, first {early[0]}"


def engine_topic(cluster: Any, name: str) -> str:
    """A topic of this test on ``cluster``'s engine (``name-<engine>``), with 4 queues on
    each broker: the two-engine modules share one cluster per engine."""
    topic = f"{name}-{cluster.engine}"
    cluster.create_topic(topic, 4)
    return topic


class StoredThenHung:
    """A producer's transport (its ``_http``), but the first send call carrying ``msg_id``
    to ``broker`` is really made -- the broker stores the message and answers -- and then
    ``node`` (that broker's process) is paused (SIGSTOP) and the call raises
    ``httpx.ReadTimeout``: the broker hung after storing the message, before its answer
    got out. The producer sees an ambiguous attempt whose copy certainly exists, on a
    broker that stays hung (its detector's probes fail too) until the test resumes it."""

    def __init__(self, inner: Any, broker: str, msg_id: str, node: Any) -> None:
        self._inner = inner
        self._broker = broker
        self._msg_id = msg_id
        self._node = node
        self.stored = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def perform(self, call: Any, on_write: Any = None) -> Any:
        answer = self._inner.perform(call, on_write)
        if (
            self.stored
            or call.broker != self._broker
            or self._msg_id not in {it.wire.msg_id for it in call.items}
        ):
            return answer
        sent = wire.decode(answer.content, wire.SendResponse, answer.media_type)
        if any(r.status != wire.SEND_OK for r in sent.results):
            return answer  # not stored: the test sees ``stored`` False
        self.stored = True
        self._node.pause()
        raise httpx.ReadTimeout(f"{self._broker} stored {self._msg_id} and hung (test)")
