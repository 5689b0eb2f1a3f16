"""New-topic benchmark: how late a consumer subscribed before its topic existed receives
the first messages of each broker the topic reaches.

    python -m benchmarks.new_topic_bench [--engine qclient|rocketmq] [--rate 100]
        [--seconds 5] [--rounds 3] [--json] [--smoke]

A real ``LocalCluster`` of the engine (2 brokers). Each round: a consumer group member on
a topic nobody has sent to polls for a second (the topic does not exist); then a producer
sends ``--rate`` messages/s for ``--seconds``, each for immediate delivery, its body the
wall-clock ms of the send. The topic is created on each broker by its first message there
(the name server learns of it from that broker), so the member must find each broker
while messages already wait on it.

Reported per round and over all rounds, p50 / p99 / max in ms of receipt (``poll``
returned it here) minus the send's start, per broker and in all; the lateness of each
broker's first message; received, lost and duplicates. Goal (both engines): p99 <= 250 ms
from the first message on.

Bounded: ``--rounds`` x (``--seconds`` + 1 s + at most 30 s for the last receipts) after
the cluster starts; ``--smoke`` is one round of 1 s at 50 msgs/s. ``--engine rocketmq``
needs Java and the jars ``make setup`` fetched; without them the result is ``skipped``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from typing import Any

from benchmarks._suite.report import target
from benchmarks.peers.workload import percentile
from qclient import Consumer, LocalCluster, Producer, ReceivedMessage

SUBSCRIBED_S = 1.0  # the member polls this long before the topic's first message
DRAIN_S = 30.0  # bound on the wait for the last receipts


def _now_ms() -> float:
    return time.time() * 1000


def _missing(engine: str) -> str | None:
    if engine != "rocketmq":
        return None
    from qclient.engines.rocketmq.local import runtime

    return runtime.missing()


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    s = sorted(values)
    return {
        "p50": round(percentile(s, 50), 1),
        "p99": round(percentile(s, 99), 1),
        "max": round(s[-1], 1),
    }


def one_round(namesrv: str, rate: float, seconds: float) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    topic, group = f"new-topic-{tag}", f"new-topic-g-{tag}"
    got: list[tuple[float, ReceivedMessage]] = []
    stop = threading.Event()
    ready = threading.Event()

    def consume() -> None:
        with Consumer(namesrv, topic, group) as c:
            ready.set()
            while not stop.is_set():
                for m in c.poll(max_messages=64, timeout=0.05):
                    got.append((_now_ms(), m))

    reader = threading.Thread(target=consume, name="new-topic-consumer", daemon=True)
    reader.start()
    ready.wait(30)
    time.sleep(SUBSCRIBED_S)
    n = max(1, round(rate * seconds))
    sent: dict[str, tuple[float, str]] = {}  # msg id -> (send start ms, broker)
    with Producer(namesrv) as p:
        t0 = time.monotonic()
        for i in range(n):
            pause = t0 + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            start = _now_ms()
            r = p.send(topic, str(start))
            sent[r.msg_id] = (start, r.broker_name)
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and len({m.msg_id for _, m in got}) < len(sent):
        time.sleep(0.05)
    stop.set()
    reader.join(30)
    late: dict[str, list[float]] = {}
    first: dict[str, tuple[float, float]] = {}  # broker -> (send ms, lateness) of its first
    seen: set[str] = set()
    dups = 0
    for at, m in got:
        if m.msg_id in seen:
            dups += 1
            continue
        seen.add(m.msg_id)
        if m.msg_id not in sent:
            continue
        start, broker = sent[m.msg_id]
        late.setdefault(broker, []).append(at - start)
        if broker not in first or start < first[broker][0]:
            first[broker] = (start, at - start)
    every = [v for vs in late.values() for v in vs]
    return {
        "sent": len(sent),
        "received": len(seen & sent.keys()),
        "lost": len(sent.keys() - seen),
        "duplicates": dups,
        "brokers": sorted({b for _, b in sent.values()}),
        "lateness_ms": _summary(every),
        "per_broker_ms": {b: _summary(vs) for b, vs in sorted(late.items())},
        "first_message_ms": {b: round(v, 1) for b, (_, v) in sorted(first.items())},
        "samples": every,
    }


def run(engine: str, rate: float, seconds: float, rounds: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    with LocalCluster(brokers=2, engine=engine) as cluster:
        for _ in range(rounds):
            out.append(one_round(cluster.namesrv, rate, seconds))
    every = [v for r in out for v in r.pop("samples")]
    overall = _summary(every)
    lost = sum(r["lost"] for r in out)
    return {
        "status": "ok",
        "engine": engine,
        "rate": rate,
        "seconds": seconds,
        "rounds": out,
        "lateness_ms": overall,
        "lost": lost,
        "targets": [
            target("new topic, lateness p99 (ms)", overall["p99"], "<= 250", overall["p99"] <= 250),
            target("lost", lost, "== 0", lost == 0),
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("qclient", "rocketmq"), default="qclient")
    p.add_argument("--rate", type=float, default=100.0, help="msgs/s sent")
    p.add_argument("--seconds", type=float, default=5.0, help="how long each round sends")
    p.add_argument("--rounds", type=int, default=3, help="topics, one after another")
    p.add_argument("--smoke", action="store_true", help="one round of 1 s at 50 msgs/s")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    a = p.parse_args()
    if a.smoke:
        a.rate, a.seconds, a.rounds = 50.0, 1.0, 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds the cluster
    why = _missing(a.engine)
    if why:
        res: dict[str, Any] = {"status": "skipped", "engine": a.engine, "reason": why}
    else:
        t = time.monotonic()
        res = run(a.engine, a.rate, a.seconds, max(1, a.rounds))
        res["run_s"] = round(time.monotonic() - t, 1)
    print(json.dumps(res) if a.json else json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
