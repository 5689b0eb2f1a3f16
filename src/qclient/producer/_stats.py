"""A producer's counters: what ``stats()`` returns."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

__all__ = ["Stats"]


class _BrokerStats:
    __slots__ = ("errors", "max_ms", "recent", "requests", "total_ms")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.total_ms = 0.0
        self.max_ms = 0.0
        self.recent: deque[float] = deque(maxlen=2048)


class Stats:
    """Counters of a producer; ``snapshot()`` is what ``stats()`` returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self.retried = 0
        self.requests = 0
        self._brokers: dict[str, _BrokerStats] = {}

    def request(self, broker: str, latency_ms: float, ok: bool) -> None:
        with self._lock:
            self.requests += 1
            b = self._brokers.get(broker)
            if b is None:
                b = self._brokers[broker] = _BrokerStats()
            b.requests += 1
            b.errors += not ok
            b.total_ms += latency_ms
            b.max_ms = max(b.max_ms, latency_ms)
            b.recent.append(latency_ms)

    def done(self, sent: int, failed: int) -> None:
        with self._lock:
            self.sent += sent
            self.failed += failed

    def retry(self, n: int) -> None:
        with self._lock:
            self.retried += n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            brokers = {}
            for name, b in sorted(self._brokers.items()):
                recent = sorted(b.recent)

                def pct(p: float, recent: list[float] = recent) -> float:
                    return (
                        round(recent[min(len(recent) - 1, int(p * len(recent)))], 3)
                        if recent
                        else 0.0
                    )

                brokers[name] = {
                    "requests": b.requests,
                    "errors": b.errors,
                    "avg_ms": round(b.total_ms / b.requests, 3) if b.requests else 0.0,
                    "p50_ms": pct(0.5),
                    "p99_ms": pct(0.99),
                    "max_ms": round(b.max_ms, 3),
                }
            return {
                "sent": self.sent,
                "failed": self.failed,
                "retried": self.retried,
                "requests": self.requests,
                "brokers": brokers,
            }
