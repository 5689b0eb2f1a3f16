"""The phases of ``benchmarks.engines_bench``, each the same on both engines: the RocketMQ
bare request (the floor of one ``send_delayed``), ``send_async`` and ``send_batch`` rates,
and lateness at a due rate with the brokers' CPU and RSS meanwhile.

Every phase is bounded in count and in time.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import psutil

from benchmarks._suite.steal import StealMeter
from benchmarks.consume_bench import _harness_heap_frozen
from benchmarks.one_call_bench import BODY, DELAY_S, TOPIC, pct
from benchmarks.producer_bench import measure
from qclient import Consumer, Message, MessageBatch, Producer
from qclient.engines.rocketmq import message as rmsg
from qclient.engines.rocketmq.codes import RequestCode, ResponseCode
from qclient.engines.rocketmq.connection import parse_addr
from qclient.engines.rocketmq.engine import PRODUCER_GROUP
from qclient.engines.rocketmq.remoting import FrameDecoder, RemotingCommand, encode, request

__all__ = [
    "BrokerMeter",
    "bare_request",
    "lateness",
    "rocketmq_bare",
    "send_async_rate",
    "send_batch_rate",
]

_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SUCCESS = int(ResponseCode.SUCCESS)
_DELAY_MS = int(DELAY_S * 1000)
#: queues per broker of every topic the bench creates
QUEUES = 4
#: messages per ``send_batch`` call
BATCH = 256
#: lateness samples kept per label for the report's CDF
MAX_SAMPLES = 5000


def _now_ms() -> float:
    return time.time() * 1000


# --- the RocketMQ floor: one bare SEND_MESSAGE_V2 per round trip -------------------------


def bare_request(prefix: str, i: int, broker_name: str) -> RemotingCommand:
    """The ``SEND_MESSAGE_V2`` of ``send_delayed(TOPIC, BODY, delay=DELAY_S)``: UNIQ_KEY
    ``prefix`` (24 hex chars) + ``i`` (12), WAIT, TIMER_DELIVER_MS; queue ``i % 4``."""
    now = time.time_ns() // 1_000_000
    props = rmsg.encode_properties(
        {
            rmsg.UNIQ_KEY: f"{prefix}{i:012X}",
            rmsg.WAIT: "true",
            rmsg.TIMER_DELIVER_MS: str(now + _DELAY_MS),
        }
    )
    header = rmsg.send_header(
        group=PRODUCER_GROUP,
        topic=TOPIC,
        queue_id=i % QUEUES,
        sys_flag=0,
        born_ms=now,
        flag=0,
        properties=props,
        broker_name=broker_name,
    )
    return request(_SEND_V2, header, BODY)


def rocketmq_bare(
    brokers: Sequence[tuple[str, str, int]], n: int, seconds: float
) -> dict[str, float]:
    """One thread, a plain blocking socket to each of ``brokers`` ((address, name, pid)),
    request ``i`` to broker ``i % len(brokers)``: build the same 100 B message
    ``send_delayed`` sends (UNIQ_KEY of 36 hex chars, WAIT, TIMER_DELIVER_MS an hour ahead;
    queue ``i % 4``), ``send_header`` + ``encode``, ``sendall``, read the answer with
    ``FrameDecoder``. No reader thread, no opaque matching, no routes, no retries.
    Round trip p50/p99, this process's CPU and the brokers' (psutil) per request."""
    prefix = uuid.uuid4().hex[:24]
    conns: list[tuple[socket.socket, FrameDecoder, str]] = []

    def one(i: int) -> None:
        sock, dec, name = conns[i % len(conns)]
        sock.sendall(encode(bare_request(prefix, i, name)))
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"{name} closed the connection")
            got = dec.feed(data)
            if got:
                if got[0].code != _SUCCESS:
                    raise RuntimeError(f"broker answered {got[0].code}: {got[0].remark}")
                return

    procs = [psutil.Process(pid) for _, _, pid in brokers]

    def brokers_cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    try:
        for addr, name, _ in brokers:
            sock = socket.create_connection(parse_addr(addr), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conns.append((sock, FrameDecoder(), name))
        for i in range(50):  # warm-up: connection, topic, code paths
            one(i)
        lat: list[float] = []
        c0, cpu0, t0 = brokers_cpu(), time.process_time(), time.perf_counter()
        deadline = time.monotonic() + seconds
        for i in range(50, 50 + n):
            t = time.perf_counter()
            one(i)
            lat.append((time.perf_counter() - t) * 1000)
            if time.monotonic() > deadline:
                break
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        bcpu = brokers_cpu() - c0
    finally:
        for sock, _, _ in conns:
            sock.close()
    reqs = len(lat)
    return {
        "requests": reqs,
        "requests_per_s": round(reqs / wall, 1),
        "p50_ms": round(pct(lat, 0.5), 3),
        "p99_ms": round(pct(lat, 0.99), 3),
        "client_cpu_us_per_request": round(cpu / reqs * 1e6, 1),
        "broker_cpu_us_per_request": round(bcpu / reqs * 1e6, 1),
    }


# --- throughput of the SDK's other send paths ---------------------------------------------


def send_async_rate(p: Producer, n: int, seconds: float) -> dict[str, float]:
    """``send_async`` of ``n`` delayed messages (submitted while within ``seconds``), then
    ``flush``: msgs/s acknowledged and client CPU per message (``producer_bench.measure``)."""

    def run() -> int:
        deadline = time.monotonic() + seconds
        futures = []
        for _ in range(n):
            futures.append(p.send_async(Message(TOPIC, BODY, delay=DELAY_S)))
            if time.monotonic() > deadline:
                break
        p.flush(seconds + 30)
        bad = sum(f.exception(0) is not None for f in futures)
        if bad:
            raise RuntimeError(f"send_async: {bad} of {len(futures)} failed")
        return len(futures)

    return measure(run)


def send_batch_rate(p: Producer, n: int, seconds: float) -> dict[str, float]:
    """``send_batch`` of ``BATCH`` delayed ``Message`` objects at a time, ``n`` in all (fewer
    past ``seconds``)."""

    def run() -> int:
        deadline = time.monotonic() + seconds
        sent = 0
        while sent < n and time.monotonic() < deadline:
            k = min(BATCH, n - sent)
            sent += len(p.send_batch([Message(TOPIC, BODY, delay=DELAY_S) for _ in range(k)]))
        return sent

    return measure(run)


# --- brokers' CPU and RSS over a window -------------------------------------------------------


class BrokerMeter:
    """``with BrokerMeter(pids) as m: ...``: the brokers' CPU over the window as % of one
    core (all brokers summed, and each) and each one's peak RSS (sampled every 0.2 s)."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._procs = [psutil.Process(pid) for pid in pids]
        self._stop = threading.Event()
        self._peak = [0] * len(self._procs)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._cpu0: list[float] = []
        self._t0 = 0.0
        self.result: dict[str, Any] = {}

    def _rss(self) -> None:
        for i, proc in enumerate(self._procs):
            with contextlib.suppress(psutil.Error):
                self._peak[i] = max(self._peak[i], proc.memory_info().rss)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self._rss()

    def __enter__(self) -> BrokerMeter:
        self._rss()
        self._cpu0 = [sum(p.cpu_times()[:2]) for p in self._procs]
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        cpu = [sum(p.cpu_times()[:2]) - c0 for p, c0 in zip(self._procs, self._cpu0, strict=True)]
        self._stop.set()
        self._thread.join(5)
        self._rss()
        self.result = {
            "cpu_pct_of_core": round(100 * sum(cpu) / wall, 1),
            "cpu_pct_of_core_each": [round(100 * c / wall, 1) for c in cpu],
            "rss_mb_each": [round(r / 2**20, 1) for r in self._peak],
            "rss_mb": round(sum(self._peak) / 2**20, 1),
        }


# --- lateness at a due rate -------------------------------------------------------------------


def _ready(consumer: Any, queues: int, seconds: float = 30.0) -> None:
    """Poll until the consumer owns ``queues`` queues (a group of one takes them all)."""
    deadline = time.monotonic() + seconds
    while len(consumer.assignment()) < queues and time.monotonic() < deadline:
        consumer.poll(1, timeout=0.1)
    if len(consumer.assignment()) < queues:
        raise RuntimeError(f"consumer owns {consumer.assignment()} of {queues} queues")


def _schedule(p: Producer, topic: str, rate: int, seconds: float, lead_s: float) -> list[int]:
    """Send ``rate x seconds`` messages (``send_batch`` of ``MessageBatch`` columns) due
    evenly from ``lead_s`` from now; returns their deliver times (epoch ms)."""
    total = max(BATCH, int(rate * seconds))
    start = int(_now_ms() + lead_s * 1000)
    deliver = [start + int(i * 1000 / rate) for i in range(total)]
    for i in range(0, total, BATCH):
        chunk = deliver[i : i + BATCH]
        p.send_batch(MessageBatch(topic, [BODY] * len(chunk), deliver_at_ms=chunk))
    return deliver


def _sampled(values: list[float]) -> list[float]:
    step = max(1, len(values) // MAX_SAMPLES)
    return [round(x, 3) for x in values[::step]]


@contextlib.contextmanager
def _consumer(namesrv: str, topic: str, queues: int) -> Iterator[Any]:
    with Consumer(namesrv, topic, "engines-bench") as c:
        _ready(c, queues)
        c.poll(1024, timeout=0.2)
        yield c


def lateness(
    p: Producer,
    namesrv: str,
    topic: str,
    broker_pids: Sequence[int],
    rate: int,
    seconds: float,
    send_msgs_per_s: float,
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """``rate x seconds`` messages due evenly at ``rate``/s (all sent before the first is
    due: the lead is the send time at ``send_msgs_per_s``, x1.5, + 2 s), one group
    ``Consumer`` polling. Fire lateness = ``fired_at_ms - deliver_at_ms``; receive lateness
    = wall time when ``poll`` returned - ``deliver_at_ms``; after fire = when ``poll``
    returned - ``fired_at_ms`` (the pull path, and the consumer's hold of what fired
    ahead). The brokers' CPU and RSS from the first due time to the last message
    received. Returns the figures and the samples."""
    total = max(BATCH, int(rate * seconds))
    lead_s = total / max(1.0, send_msgs_per_s) * 1.5 + 2.0
    queues = QUEUES * len(broker_pids)
    with _consumer(namesrv, topic, queues) as consumer:
        t_send = time.perf_counter()
        deliver = _schedule(p, topic, rate, seconds, lead_s)
        send_s = time.perf_counter() - t_send
        late_start = _now_ms() > deliver[0]
        if late_start:
            print(f"warning: {topic}: sending ended past the first due time", file=sys.stderr)
        first, last = deliver[0], deliver[-1]
        wanted = set(deliver)
        time.sleep(max(0.0, (first - _now_ms()) / 1000 - 0.2))
        fire: list[float] = []
        recv: list[float] = []
        pulled: list[float] = []  # poll return - fired_at: the pull path and the hold
        ids: Counter[str] = Counter()
        until = last + 15_000
        with _harness_heap_frozen(), StealMeter() as steal, BrokerMeter(broker_pids) as meter:
            cpu0 = time.process_time()
            while len(ids) < total and _now_ms() < until:
                batch = consumer.poll(1024, timeout=0.5)
                now = _now_ms()
                for m in batch:
                    if m.deliver_at_ms not in wanted:  # an earlier phase's stray
                        continue
                    recv.append(now - m.deliver_at_ms)
                    fire.append(m.fired_at_ms - m.deliver_at_ms)
                    pulled.append(now - m.fired_at_ms)
                    ids[m.msg_id] += 1
            client_cpu = time.process_time() - cpu0
    fire.sort()
    recv.sort()
    pulled.sort()
    res: dict[str, Any] = {
        "due_rate_msgs_per_s": rate,
        "messages": total,
        "send_seconds": round(send_s, 2),
        "lead_s": round(lead_s, 2),
        "sent_past_first_due": late_start,
        "received_distinct": len(ids),
        "lost": total - len(ids),
        "duplicates": sum(k - 1 for k in ids.values()),
        "early": sum(1 for x in recv if x < 0),
        "fire_p50_ms": round(pct(fire, 0.5), 1),
        "fire_p99_ms": round(pct(fire, 0.99), 1),
        "receive_p50_ms": round(pct(recv, 0.5), 1),
        "receive_p99_ms": round(pct(recv, 0.99), 1),
        "receive_max_ms": round(recv[-1], 1) if recv else None,
        "after_fire_p50_ms": round(pct(pulled, 0.5), 1),
        "after_fire_p99_ms": round(pct(pulled, 0.99), 1),
        "consumer_cpu_us_per_msg": round(client_cpu / max(1, len(recv)) * 1e6, 1),
        "broker": meter.result,
        "steal_pct": steal.pct,
        "loadavg_1m": round(os.getloadavg()[0], 1),
    }
    return res, {"fire": _sampled(fire), "receive": _sampled(recv)}
