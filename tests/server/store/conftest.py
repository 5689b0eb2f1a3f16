"""Fixtures for the store tests: stores on real files under tmp_path, always closed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from qclient.server.store import DelayStore, FiredMessage, NewMessage, StoreConfig, wall_clock_ms


class FakeClock:
    """A settable millisecond clock."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def wait_until(cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01) -> Any:
    """Poll ``cond`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def pull_all(store: DelayStore, topic: str, queues: int = 4) -> list[FiredMessage]:
    out: list[FiredMessage] = []
    for q in range(queues):
        off = 0
        while True:
            got = store.pull(topic, q, off, 1000)
            if not got:
                break
            out.extend(got)
            off = got[-1].offset + 1
    return out


def visible(store: DelayStore, topic: str, queues: int = 4) -> int:
    return sum(store.max_offset(topic, q) for q in range(queues))


def msg(
    i: int, deliver_at: int, topic: str = "t", body: bytes = b"x" * 100, **kw: Any
) -> NewMessage:
    return NewMessage(topic, i % 4, f"m{i}", body, deliver_at, **kw)


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[..., DelayStore]]:
    """``make_store(clock=None, data_dir=None, **config)`` -> an opened store, closed at
    teardown. Defaults: small buckets, fsync off unless asked."""
    stores: list[DelayStore] = []

    def factory(
        clock: Callable[[], int] | None = None, data_dir: Path | None = None, **cfg: Any
    ) -> DelayStore:
        cfg.setdefault("bucket_ms", 1000)
        cfg.setdefault("load_ahead_ms", 500)
        cfg.setdefault("fsync", False)
        config = StoreConfig(data_dir=data_dir or tmp_path / "data", **cfg)
        s = DelayStore(config, clock_ms=clock or wall_clock_ms)
        s.open()
        stores.append(s)
        return s

    try:
        yield factory
    finally:
        for s in stores:
            s.close()
