"""Helpers of the RocketMQ consumer tests: member processes, sending, draining, waiting."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qclient import Message, Producer
from qclient.engines.rocketmq import message as msg
from qclient.engines.rocketmq.codes import RequestCode
from qclient.engines.rocketmq.connection import Connection
from qclient.engines.rocketmq.consumer import RocketMQConsumer
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.engines.rocketmq.remoting import request
from qclient.errors import BatchSendError

_MEMBER = Path(__file__).with_name("_consumer_member.py")
_ROOT = Path(__file__).resolve().parents[3]


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``cond`` every 20 ms until true; the seconds it took. Fails after ``timeout``."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def send(
    cluster: RocketMQCluster,
    topic: str,
    n: int,
    prefix: str = "m",
    retried: set[str] | None = None,
) -> list[str]:
    """``n`` immediate messages through qclient's Producer, in batches of 25 (a batch
    goes to one queue: many batches spread over all 8); their ids. Ids sent again after a
    failed attempt (which may have stored them too) are added to ``retried``."""
    ids = [uuid.uuid4().hex for _ in range(n)]
    # a long attempt: an attempt that timed out on a busy host and was retried elsewhere
    # may have been stored too (RocketMQ keeps both), which these tests do not count
    with Producer(cluster.namesrv, send_timeout=15) as p:
        for lo in range(0, n, 25):
            batch = [
                Message(topic, f"{prefix}-{i}", msg_id=ids[i]) for i in range(lo, min(n, lo + 25))
            ]
            send_batch(p, batch, retried)
    return ids


def send_batch(p: Producer, batch: list[Message], retried: set[str] | None = None) -> None:
    """``p.send_batch(batch)`` (ids pinned), sending what was not acknowledged again (a
    busy machine times sends out), at most 5 times; re-sent ids go to ``retried``."""
    for _ in range(5):
        try:
            p.send_batch(batch)
            return
        except BatchSendError as exc:
            batch = [batch[i] for i, _ in exc.failed]
            if retried is not None:
                retried.update(str(m.msg_id) for m in batch)
    raise AssertionError(f"{len(batch)} messages not acknowledged after 5 attempts")


class Member:
    """A ``_consumer_member.py`` child: what it printed, read by a thread."""

    def __init__(self, cluster: RocketMQCluster, topic: str, group: str, log: Path) -> None:
        self._err = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, str(_MEMBER), cluster.namesrv_addr, topic, group],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            cwd=_ROOT,
            text=True,
        )
        self.client_id = ""
        self.assignment: list[tuple[str, int]] = []
        self.got: list[str] = []
        self.stats: dict[str, int] | None = None
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            ev: dict[str, Any] = json.loads(line)
            with self._lock:
                if "started" in ev:
                    self.client_id = ev["started"]
                if "assignment" in ev:
                    self.assignment = [tuple(k) for k in ev["assignment"]]  # type: ignore[misc]
                if "got" in ev:
                    self.got += [g[0] for g in ev["got"]]
                if "closed" in ev:
                    self.stats = ev["stats"]

    def held(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self.assignment)

    def received(self) -> list[str]:
        with self._lock:
            return list(self.got)

    def close(self, timeout: float = 30.0) -> None:
        """Ask it to close its consumer and exit; wait for that."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write("close\n")
            self.proc.stdin.flush()
        self.proc.wait(timeout)
        self._reader.join(5)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._err.close()


def drain(c: RocketMQConsumer, want: set[str], timeout: float) -> list[Any]:
    """Poll until every id in ``want`` came; (message, local epoch ms at return) pairs."""
    out: list[Any] = []
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while not want <= seen:
        assert time.monotonic() < deadline, f"{len(want - seen)} of {len(want)} not read"
        for m in c.poll(64, 0.5):
            out.append((m, time.time_ns() // 1_000_000))
            seen.add(m.msg_id)
    return out


def send_delayed_while_polling(
    cluster: RocketMQCluster, c: RocketMQConsumer, topic: str, delays: list[float], gap: float
) -> tuple[dict[str, int], list[Any]]:
    """Send one message per delay (``gap`` s apart) on a thread while ``c`` polls, so each
    is returned when it comes due; (id -> deliver ms, (message, local ms at return))."""
    deliver: dict[str, int] = {}
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with Producer(cluster.namesrv) as p:
                for i, d in enumerate(delays):
                    r = p.send_delayed(topic, f"d-{i}", delay=d)
                    deliver[r.msg_id] = r.deliver_at_ms
                    time.sleep(gap)
        except BaseException as exc:
            errors.append(exc)

    sender = threading.Thread(target=produce)
    sender.start()
    got: list[Any] = []
    deadline = time.monotonic() + 60
    try:
        while sender.is_alive() or len({m.msg_id for m, _ in got} & set(deliver)) < len(deliver):
            assert time.monotonic() < deadline, "delayed messages not read within 60 s"
            for m in c.poll(64, 0.2):
                got.append((m, time.time_ns() // 1_000_000))
    finally:
        sender.join(60)
    assert not errors, errors
    return deliver, [(m, at) for m, at in got if m.msg_id in deliver]


def pct(values: list[int], q: float) -> int:
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))]


def send_batch_raw(
    cluster: RocketMQCluster, topic: str, props: dict[str, str], body: bytes
) -> None:
    """One message by SEND_BATCH_MESSAGE to broker-a, queue 0, built by hand: the broker's
    batch path skips the timer hook, so a TIMER_DELIVER_MS in it is stored as is and the
    message is readable at once -- a broker handing a message over before its time."""
    pbytes = msg.encode_properties(props).encode()
    one = struct.pack(">iiiii", 20 + len(body) + 2 + len(pbytes), 0, 0, 0, len(body))
    one += body + struct.pack(">h", len(pbytes)) + pbytes
    now = time.time_ns() // 1_000_000
    header = msg.send_header(
        group="qclient-test",
        topic=topic,
        queue_id=0,
        sys_flag=0,
        born_ms=now,
        flag=0,
        properties="",
        batch=True,
        broker_name="broker-a",
    )
    with Connection(cluster.brokers[0].addr) as conn:
        answer = conn.call(request(RequestCode.SEND_BATCH_MESSAGE, header, one), 10)
    assert answer.code == 0, answer.remark
