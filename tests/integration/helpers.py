"""Helpers for tests against a real LocalCluster."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import pytest

from qclient import Consumer, ReceivedMessage
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
            batch = consumer.poll(max_messages=512, timeout=0.5)
            received_ms = time.time_ns() // 1_000_000
            for m in batch:
                m.extra["received_ms"] = received_ms
                got.append(m)
                seen.add(m.msg_id)
        end = time.monotonic() + settle
        while time.monotonic() < end:
            batch = consumer.poll(max_messages=512, timeout=min(0.5, settle))
            received_ms = time.time_ns() // 1_000_000
            for m in batch:
                m.extra["received_ms"] = received_ms
            got.extend(batch)
    return got


def not_early(m: ReceivedMessage) -> bool:
    """Received (by :func:`drain`) at or after its deliver time, and fired no earlier
    than the broker's fire-ahead allows (it holds such messages until their time)."""
    return m.extra["received_ms"] >= m.deliver_at_ms and m.fired_at_ms >= wire.firing_time_ms(
        m.deliver_at_ms
    )


def duplicates(messages: list[ReceivedMessage]) -> int:
    return sum(n - 1 for n in Counter(m.msg_id for m in messages).values())
