"""Retry benchmark: how late a message handed back with ``retry_later`` comes again,
beside how late its first delivery was.

    python -m benchmarks.retry_bench [--engine qclient|rocketmq] [--rate 1000]
        [--seconds 20] [--delay 1] [--workers 16] [--json] [--smoke]

A real ``LocalCluster`` of the engine (2 brokers, a topic of 4 queues on each) and one
consumer group member. Once it holds every queue, ``--rate`` msgs/s are scheduled to come
due evenly for ``--seconds``; the member hands each message back on its first delivery
(``retry_later(m, delay=--delay)``, on ``--workers`` threads: each call waits until its
copy is durable) and takes it on the second. So ``--rate`` retries/s are made while as
many first deliveries and retries come due.

Reported, each p50 / p99 / max in ms, receipt = when ``poll`` returned it here:

- first delivery: receipt - the message's deliver time;
- retry round trip: receipt again - (the ``retry_later`` call's start + ``--delay``), i.e.
  retry_later -> received again, minus the delay: the call, the broker's firing of the
  copy and the pull (negative = early, counted as ``early``);
- retry vs its due time: receipt again - the copy's ``deliver_at_ms`` (the broker's);
- the ``retry_later`` call itself;
- not back (never came again within the run's bound: ``--seconds`` + ``--delay`` + 15 s
  after the first is due), duplicates, the retries/s made;
- the host's 1-minute load before and after, and the steal meanwhile (other work on a
  small machine moves every figure: read them with it).

Bounded: with the defaults ~35 s of workload after the cluster starts (qclient ~2 s,
RocketMQ ~20 s); ``--smoke`` is 2 s at 100 msgs/s. ``--engine rocketmq`` needs Java and
the jars ``make setup`` fetched; without them the result is ``skipped`` with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil

from benchmarks._suite.report import target
from benchmarks._suite.steal import StealMeter
from benchmarks.peers.workload import percentile
from qclient import Consumer, LocalCluster, Message, Producer, ReceivedMessage
from qclient.errors import QClientError

TOPIC = "retry-bench"
GROUP = "retry-bench"
QUEUES = 4  # per broker
SEND_CHUNK = 256
LOAD_SEND_TIMEOUT_S = 15.0
LEAD_S = 2.0  # the first message comes due this long after the sends start


def _now_ms() -> float:
    return time.time_ns() / 1e6


def _stats(values: list[float]) -> dict[str, Any]:
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {
        "n": len(v),
        "p50_ms": round(percentile(v, 50), 2),
        "p99_ms": round(percentile(v, 99), 2),
        "max_ms": round(v[-1], 2),
    }


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _missing(engine: str) -> str | None:
    """Why the engine cannot start here, None if it can."""
    if engine != "rocketmq":
        return None
    from qclient.engines.rocketmq.local import runtime

    return runtime.missing()


class Run:
    """One member handing every first delivery back and recording the receipts."""

    def __init__(self, consumer: Consumer, delay_s: float, workers: int) -> None:
        self.consumer = consumer
        self.delay_s = delay_s
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="retry-bench")
        self.lock = threading.Lock()
        self.first: dict[str, float] = {}  # msg id -> first-delivery lateness ms
        self.called: dict[str, tuple[float, float]] = {}  # msg id -> (call start, took) ms
        self.again: dict[str, tuple[float, int]] = {}  # msg id -> (receipt ms, its deliver_at)
        self.extra = 0  # receipts past these (duplicates)
        self.errors: list[str] = []

    def _retry(self, m: ReceivedMessage) -> None:
        start = _now_ms()
        try:
            self.consumer.retry_later(m, delay=self.delay_s)
        except QClientError as exc:
            with self.lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        with self.lock:
            self.called[m.msg_id] = (start, _now_ms() - start)

    def take(self, batch: list[ReceivedMessage]) -> None:
        got = _now_ms()
        for m in batch:
            if m.attempt == 1 and m.msg_id not in self.first:
                self.first[m.msg_id] = got - m.deliver_at_ms
                self.pool.submit(self._retry, m)
            elif m.attempt == 2 and m.msg_id not in self.again:
                self.again[m.msg_id] = (got, m.deliver_at_ms)
            else:
                self.extra += 1

    def result(self, ids: set[str]) -> dict[str, Any]:
        self.pool.shutdown(wait=True)
        round_trip, vs_due, calls = [], [], []
        for mid, (got, due_ms) in self.again.items():
            call = self.called.get(mid)
            if call is not None:
                round_trip.append(got - (call[0] + self.delay_s * 1000))
                calls.append(call[1])
            vs_due.append(got - due_ms)
        early = sum(1 for x in round_trip if x < 0)
        return {
            "first_delivery": _stats(list(self.first.values())),
            "retry_round_trip": _stats(round_trip),
            "retry_vs_due": _stats(vs_due),
            "retry_later_call": _stats(calls),
            "retried": len(self.called),
            "not_back": len(ids - set(self.again)),
            "early": early,
            "duplicates": self.extra,
            "errors": len(self.errors),
            "first_error": self.errors[0] if self.errors else None,
        }


def run(engine: str, rate: float, seconds: float, delay_s: float, workers: int) -> dict[str, Any]:
    n = max(1, int(rate * seconds))
    with LocalCluster(brokers=2, engine=engine) as cluster:
        cluster.create_topic(TOPIC, QUEUES)
        with Consumer(cluster.namesrv, TOPIC, GROUP) as consumer:
            deadline = time.monotonic() + 60
            while len(consumer.assignment()) < 2 * QUEUES and time.monotonic() < deadline:
                consumer.poll(32, timeout=0.2)
            bench = Run(consumer, delay_s, workers)
            t0 = time.time() + LEAD_S
            ids: set[str] = set()
            # what is measured is the consumer's retries: the load gets a send budget that a
            # loaded host's first seconds after start-up cannot exhaust (3 s did, in a
            # fresh-clone run: both new brokers slow to answer a 200-message batch)
            with Producer(cluster.namesrv, send_timeout=LOAD_SEND_TIMEOUT_S) as producer:
                for lo in range(0, n, SEND_CHUNK):
                    chunk = [
                        Message(TOPIC, b"x" * 100, deliver_at=t0 + i / rate)
                        for i in range(lo, min(n, lo + SEND_CHUNK))
                    ]
                    ids.update(r.msg_id for r in producer.send_batch(chunk))
            sent_s = time.time() - (t0 - LEAD_S)
            end = time.monotonic() + (t0 - time.time()) + seconds + delay_s + 15
            load = [os.getloadavg()[0]]
            procs = [psutil.Process(b.pid) for b in cluster.brokers]
            cpu0 = [_cpu(p) for p in procs], time.process_time()
            with StealMeter() as steal:
                while len(bench.again) < len(ids) and time.monotonic() < end:
                    bench.take(consumer.poll(256, timeout=0.2))
            load.append(os.getloadavg()[0])
            cpu_s = {
                "client": round(time.process_time() - cpu0[1], 2),
                "brokers": round(sum(_cpu(p) for p in procs) - sum(cpu0[0]), 2),
            }
            settle = time.monotonic() + 1.0  # duplicates show up too
            while time.monotonic() < settle:
                bench.take(consumer.poll(256, timeout=0.2))
            res = bench.result(ids)
    res.update(
        engine=engine,
        messages=n,
        rate_msgs_per_s=rate,
        retry_delay_s=delay_s,
        workers=workers,
        send_s=round(sent_s, 2),
        retries_per_s=round(res["retried"] / seconds, 1),
        # the host meanwhile: other work on this 2-core machine moves every figure
        host_load_1m=[round(x, 1) for x in load],
        steal_pct=steal.pct,
        # CPU seconds while the messages came due and back: this process (producer,
        # consumer, the retry_later threads) and the brokers
        cpu_s=cpu_s,
    )
    rt, first = res["retry_round_trip"], res["first_delivery"]
    res["targets"] = [
        target(f"{engine}: retries not back", res["not_back"], "== 0", res["not_back"] == 0),
        target(f"{engine}: retries early", res["early"], "== 0", res["early"] == 0),
        target(
            f"{engine}: retry round trip p99 ms at {rate:g}/s",
            rt.get("p99_ms"),
            "<= 100",
            (rt.get("p99_ms") or 1e9) <= 100,
        ),
    ]
    res["notes"] = [
        f"{engine}: first delivery p50/p99 {first.get('p50_ms')}/{first.get('p99_ms')} ms; "
        f"retry round trip (retry_later -> received again, minus the {delay_s:g} s delay) "
        f"p50/p99 {rt.get('p50_ms')}/{rt.get('p99_ms')} ms at {res['retries_per_s']} retries/s"
    ]
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("qclient", "rocketmq"), default="qclient")
    p.add_argument("--rate", type=float, default=1000.0, help="msgs/s coming due (= retries/s)")
    p.add_argument("--seconds", type=float, default=20.0, help="how long they come due")
    p.add_argument("--delay", type=float, default=1.0, help="retry_later's delay (s)")
    p.add_argument("--workers", type=int, default=16, help="threads calling retry_later")
    p.add_argument("--smoke", action="store_true", help="tiny run: 2 s at 100 msgs/s")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    a = p.parse_args()
    if a.smoke:
        a.rate, a.seconds, a.delay, a.workers = 100.0, 2.0, 0.5, 4
    # SIGTERM (the runner's time limit) unwinds the cluster
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why = _missing(a.engine)
    if why:
        res: dict[str, Any] = {"status": "skipped", "engine": a.engine, "reason": why}
    else:
        t = time.monotonic()
        res = run(a.engine, a.rate, a.seconds, a.delay, max(1, a.workers))
        res["run_s"] = round(time.monotonic() - t, 1)
    print(json.dumps(res) if a.json else json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
