"""Helpers for tests against a real LocalCluster."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import pytest

from qclient import Consumer, ReceivedMessage

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
    seconds more so duplicates and strays show up too. Commits on close."""
    got: list[ReceivedMessage] = []
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    with Consumer(namesrv, topic, group) as consumer:
        while len(seen) < expected and time.monotonic() < deadline:
            for m in consumer.poll(max_messages=512, timeout=0.5):
                got.append(m)
                seen.add(m.msg_id)
        end = time.monotonic() + settle
        while time.monotonic() < end:
            got.extend(consumer.poll(max_messages=512, timeout=min(0.5, settle)))
    return got


def duplicates(messages: list[ReceivedMessage]) -> int:
    return sum(n - 1 for n in Counter(m.msg_id for m in messages).values())
