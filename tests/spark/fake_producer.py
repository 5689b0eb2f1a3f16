"""A stand-in for ``qclient.Producer`` used by the Spark mechanics tests: it records every
message it is given (one JSON line each) under ``$QCLIENT_FAKE_SINK_DIR`` and
acknowledges them as if two brokers had. Importable in Spark workers (PYTHONPATH)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qclient._models import Message, SendResult, SendStatus
from qclient.errors import BatchSendError, BrokerUnavailableError, QClientError

BROKERS = ("fake-a", "fake-b")


class FakeProducer:
    """Records messages and acknowledges them, alternating two broker names."""

    fail_every = 0  # FlakyProducer: every N-th message fails once, retryably

    def __init__(self, namesrv: str, **kwargs: Any) -> None:
        self.namesrv = namesrv
        self.kwargs = kwargs
        self._lock = threading.Lock()
        root = Path(os.environ["QCLIENT_FAKE_SINK_DIR"])
        self._file = open(root / f"sent-{os.getpid()}-{id(self)}.jsonl", "a")  # noqa: SIM115
        self._fail_every = self.fail_every
        self._failed_once: set[str] = set()
        self._n = 0
        self.retried = 0

    def send_batch(self, messages: Iterable[Message]) -> list[SendResult]:
        results: list[SendResult | QClientError] = []
        with self._lock:
            for m in messages:
                self._n += 1
                broker = BROKERS[self._n % 2]
                if (
                    self._fail_every
                    and self._n % self._fail_every == 0
                    and m.msg_id not in self._failed_once
                ):
                    self._failed_once.add(str(m.msg_id))
                    results.append(
                        BrokerUnavailableError("connection refused (fake)", broker_name=broker)
                    )
                    continue
                body = m.body.decode() if isinstance(m.body, bytes) else m.body
                delay = m.delay.total_seconds() if hasattr(m.delay, "total_seconds") else m.delay
                self._file.write(
                    json.dumps(
                        {
                            "msg_id": m.msg_id,
                            "topic": m.topic,
                            "body": body,
                            "key": m.key,
                            "tags": m.tags,
                            "properties": m.properties,
                            "delay": delay,
                            "deliver_at": m.deliver_at,
                            "broker": broker,
                            "pid": os.getpid(),
                        }
                    )
                    + "\n"
                )
                results.append(SendResult(str(m.msg_id), SendStatus.SEND_OK, broker, 0, 0))
            self._file.flush()
        if any(isinstance(r, QClientError) for r in results):
            raise BatchSendError("some messages failed (fake)", results)
        return results  # type: ignore[return-value]

    def stats(self) -> dict[str, Any]:
        return {"sent": self._n, "retried": self.retried}

    def close(self, timeout: float | None = None) -> None:
        self._file.close()


class FlakyProducer(FakeProducer):
    """Every 7th message fails once with a retryable BrokerUnavailableError."""

    fail_every = 7


class DownProducer(FakeProducer):
    """Every send fails: broker-x refuses connections."""

    def send_batch(self, messages: Iterable[Message]) -> list[SendResult]:
        batch = list(messages)
        err = BrokerUnavailableError("connection refused (fake)", broker_name="broker-x")
        raise BatchSendError("all failed (fake)", [err] * len(batch))


def read_sent(root: Path) -> list[dict[str, Any]]:
    """Every message the fakes under ``root`` recorded (duplicates included)."""
    out = []
    for f in sorted(root.glob("sent-*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def fake_sent(topic: str) -> list[dict[str, Any]]:
    """What the fake producers of every worker recorded for ``topic``."""
    return [m for m in read_sent(Path(os.environ["QCLIENT_FAKE_SINK_DIR"])) if m["topic"] == topic]


class CrashOnceProducer:
    """A real ``qclient.Producer`` whose worker process dies (``os._exit``) in the first
    attempt of a task, once ``crash-<topic>`` under ``$QCLIENT_FAKE_SINK_DIR`` names how
    many of the topic's messages to send first; it renames that file to
    ``crashed-<topic>`` as it dies. A worker lost mid-partition, as a crash would lose it."""

    def __init__(self, namesrv: str, **kwargs: Any) -> None:
        from qclient import Producer

        self._producer = Producer(namesrv, **kwargs)
        self._root = Path(os.environ["QCLIENT_FAKE_SINK_DIR"])
        self._sent: dict[str, int] = {}

    def _crash_due(self, topic: str) -> bool:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        marker = self._root / f"crash-{topic}"
        if ctx is None or ctx.attemptNumber() != 0 or not marker.exists():
            return False
        return self._sent.get(topic, 0) >= int(marker.read_text())

    def send_batch(self, messages: Iterable[Message]) -> list[SendResult]:
        batch = list(messages)
        topic = batch[0].topic if batch else ""
        if batch and self._crash_due(topic):
            (self._root / f"crash-{topic}").rename(self._root / f"crashed-{topic}")
            os._exit(1)
        results = self._producer.send_batch(batch)
        self._sent[topic] = self._sent.get(topic, 0) + len(batch)
        return results

    def stats(self) -> dict[str, Any]:
        return self._producer.stats()

    def close(self, timeout: float | None = None) -> None:
        self._producer.close(timeout=timeout)


class _AnswerLost:
    """The producer's transport, but the answers to the first attempts of its first
    ``count`` send calls to ``broker`` are dropped after the broker gave them: the call
    raises the engine's read timeout instead (httpx.ReadTimeout / TimeoutError), as when an
    answer comes too late. The broker has stored what it acknowledged; the producer sees
    an ambiguous attempt. Only a call none of whose messages went out before counts (a
    first attempt), so which calls lose their answers does not depend on how the chunks'
    attempts interleave: a retry's answer is never dropped."""

    def __init__(self, inner: Any, broker: str, count: int, record: Path) -> None:
        self._inner = inner
        self._broker = broker
        self._left = count
        self._record = record
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def perform(self, call: Any, on_write: Any = None) -> Any:
        ids = [it.wire.msg_id for it in call.items] if call.items else []
        with self._lock:
            first = self._seen.isdisjoint(ids)
            self._seen.update(ids)
        answer = self._inner.perform(call, on_write)
        if not ids or call.broker != self._broker or not first:
            return answer
        with self._lock:
            if self._left <= 0:
                return answer
            self._left -= 1
        with self._record.open("a") as f:
            f.write(json.dumps({"broker": call.broker, "ids": ids, "pid": os.getpid()}) + "\n")
        if hasattr(call, "path"):  # qclient's engine: an HTTP call
            import httpx

            raise httpx.ReadTimeout("the answer was dropped (test)")
        raise TimeoutError("the answer was dropped (test)")  # RocketMQ's remoting


class HookedProducer:
    """A real ``qclient.Producer`` with test hooks, each switched on by a file under
    ``$QCLIENT_FAKE_SINK_DIR`` named after the topic (read once per process and topic):

    - ``lose-<topic>`` = ``"<broker> <n>"``: the first attempts of this process's first
      ``n`` send calls to that broker are stored there but their answers are dropped
      (``_AnswerLost``); the calls are listed in ``lost-<topic>.jsonl``;
    - ``hold-<topic>`` = ``"<rows>"``: once this process has sent that many rows of the
      topic, it creates ``held-<topic>`` and waits (up to 120 s) for ``go-<topic>``
      before sending more (a test acts while a write is certainly in progress).
    """

    def __init__(self, namesrv: str, **kwargs: Any) -> None:
        from qclient import Producer

        self._producer = Producer(namesrv, **kwargs)
        self._root = Path(os.environ["QCLIENT_FAKE_SINK_DIR"])
        self._sent: dict[str, int] = {}
        self._lock = threading.Lock()
        self._lose_checked: set[str] = set()

    def _hooks(self, topic: str) -> None:
        with self._lock:
            if topic in self._lose_checked:
                return
            self._lose_checked.add(topic)
            lose = self._root / f"lose-{topic}"
            if lose.exists():
                broker, n = lose.read_text().split()
                self._producer._http = _AnswerLost(
                    self._producer._http, broker, int(n), self._root / f"lost-{topic}.jsonl"
                )

    def _hold(self, topic: str) -> None:
        import time

        hold = self._root / f"hold-{topic}"
        if not hold.exists() or self._sent.get(topic, 0) < int(hold.read_text()):
            return
        (self._root / f"held-{topic}").touch()
        deadline = time.monotonic() + 120
        while not (self._root / f"go-{topic}").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"hold-{topic}: no go-{topic} within 120 s")
            time.sleep(0.02)

    def send_batch(self, messages: Any) -> list[SendResult]:
        topic = messages.topic if hasattr(messages, "topic") else next(iter(messages)).topic
        assert isinstance(topic, str), "HookedProducer: one topic per batch"
        self._hooks(topic)
        self._hold(topic)
        results: list[SendResult] = self._producer.send_batch(messages)
        with self._lock:
            self._sent[topic] = self._sent.get(topic, 0) + len(results)
        return results

    def settle(self, timeout: float | None = None) -> int:
        left: int = self._producer.settle(timeout)
        return left

    def stats(self) -> dict[str, Any]:
        return self._producer.stats()

    def close(self, timeout: float | None = None) -> None:
        self._producer.close(timeout=timeout)
