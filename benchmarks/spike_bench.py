"""A spike: many delayed messages due at one instant, read by a consumer group of two.

    python -m benchmarks.spike_bench [--engine qclient|rocketmq] [--count N] [--lead S]
                                     [--wait S] [--broker-heap-mb M] [--option KEY=VALUE ...]
                                     [--keep DIR] [--json] [--smoke]

A 2-broker ``LocalCluster`` of the engine; two members of one group (a thread and a
``Consumer`` each) poll from before the first send. ``--count`` messages (100-byte bodies,
``send_async``) are all due at one millisecond, ``--lead`` seconds after the first send
(the sends must be acknowledged before it). Reported: acknowledged, received (distinct
ids), copies received beyond the first, early (received before the instant), lost
(acknowledged, not received ``--wait`` seconds after the instant), seconds from the
instant to the last receipt, lateness p50/p99/max, and the brokers' CPU seconds and peak
RSS. On RocketMQ, each broker's log is searched for the timer's failure lines, and a
duplicate's copies are compared by their ``TIMER_ENQUEUE_MS`` / ``TIMER_DEQUEUE_MS``
(the same enqueue time: one wheel entry fired twice; different: enqueued twice).
``--broker-heap-mb`` and ``--option`` (a broker.conf key) change RocketMQ's brokers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from benchmarks.peers.workload import percentile

#: failure lines of RocketMQ's timer (store/timer/TimerMessageStore) and store
TIMER_LINES = {
    "dequeue_error": "Unknown error in dequeue process",
    "latch_failed": "Check latch failed",
    "put_dropped": "failed after",
    "put_retry": "Retrying to process message",
    "skipped": "Skipping message",
    "read_miss": "Fail to read msg from commitLog",
    "oom": "OutOfMemoryError",
    "mmap_timeout": "create mmap timeout",
    "page_cache_busy": "OS_PAGE_CACHE_BUSY",
}


def _parse_option(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    if not key or not _:
        raise argparse.ArgumentTypeError(f"--option takes KEY=VALUE, got {text!r}")
    return key, int(value) if value.lstrip("-").isdigit() else value


def _cluster(engine: str, heap_mb: int | None, options: dict[str, Any], keep: Path | None) -> Any:
    from qclient import LocalCluster

    if engine == "qclient":
        return LocalCluster(brokers=2, data_dir=str(keep) if keep else None)
    heap = {} if heap_mb is None else {"broker_heap_mb": heap_mb}
    return LocalCluster(
        brokers=2,
        engine="rocketmq",
        data_dir=str(keep) if keep else None,
        broker_options=options,
        **heap,
    )


def run(
    engine: str,
    count: int,
    lead: float,
    wait: float,
    heap_mb: int | None = None,
    options: dict[str, Any] | None = None,
    keep: Path | None = None,
) -> dict[str, Any]:
    from qclient import Consumer, Message, Producer

    topic = f"spike_{os.getpid()}_{int(time.time())}"
    group = f"{topic}_g"
    with _cluster(engine, heap_mb, options or {}, keep) as cluster:
        brokers = [psutil.Process(b.pid) for b in cluster.brokers if b.pid]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in brokers)
        peak_rss = [0]
        seen: dict[str, float] = {}  # id -> first receipt (epoch ms)
        copies: Counter[str] = Counter()
        dup_times: dict[str, list[tuple[str, str]]] = {}
        lock = threading.Lock()
        stop = threading.Event()
        ready = threading.Barrier(3)

        def member(i: int) -> None:
            with Consumer(cluster.namesrv, topic, group, client_id=f"m{i}") as c:
                c.poll(timeout=0.5)  # joins the group before the first send
                ready.wait(120)
                while not stop.is_set():
                    got = c.poll(max_messages=256, timeout=0.5)
                    now = time.time() * 1000
                    with lock:
                        for m in got:
                            copies[m.msg_id] += 1
                            stamps = (
                                m.properties.get("TIMER_ENQUEUE_MS", ""),
                                m.properties.get("TIMER_DEQUEUE_MS", ""),
                            )
                            if m.msg_id in seen:
                                dup_times.setdefault(m.msg_id, []).append(stamps)
                            else:
                                seen[m.msg_id] = now
                                dup_times[m.msg_id] = [stamps]

        def sample_rss() -> None:
            while not stop.is_set():
                with contextlib.suppress(psutil.NoSuchProcess):
                    peak_rss[0] = max(peak_rss[0], sum(p.memory_info().rss for p in brokers))
                stop.wait(0.5)

        threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(2)]
        threads.append(threading.Thread(target=sample_rss, daemon=True))
        for t in threads:
            t.start()
        ready.wait(120)
        body = b"x" * 100
        with Producer(cluster.namesrv, send_timeout=30) as p:
            t_send = time.time()
            instant_ms = int((t_send + lead) * 1000)
            futures = [
                p.send_async(Message(topic, body, deliver_at=instant_ms / 1000))
                for _ in range(count)
            ]
            p.flush(timeout=lead)
            send_s = time.time() - t_send
            acked = {f.result().msg_id for f in futures if f.done() and f.exception() is None}
        del futures
        failed = count - len(acked)
        deadline = instant_ms / 1000 + wait
        while time.time() < deadline:
            with lock:
                if acked <= seen.keys():
                    break
            time.sleep(0.2)
        time.sleep(1.0)  # a late copy of the last ones
        stop.set()
        for t in threads:
            t.join(30)
        cpu = sum(sum(p.cpu_times()[:2]) for p in brokers if p.is_running()) - cpu0
        with lock:
            received = {k: v for k, v in seen.items() if k in acked}
            lateness = sorted(v - instant_ms for v in received.values())
            dups = {k: v for k, v in copies.items() if v > 1}
            same_enqueue = sum(1 for k in dups if len({e for e, _ in dup_times.get(k, [])}) == 1)
            sample = {k: dup_times[k] for k in list(dups)[:3]}
        logs: dict[str, dict[str, int]] = {}
        if engine == "rocketmq":
            for b in cluster.brokers:
                text = Path(b.log_path).read_text(errors="replace")
                logs[b.name] = {k: text.count(v) for k, v in TIMER_LINES.items()}
    return {
        "engine": engine,
        "count": count,
        "acknowledged": len(acked),
        "send_failed": failed,
        "send_seconds": round(send_s, 2),
        "received": len(received),
        "lost": len(acked) - len(received),
        "early": sum(1 for x in lateness if x < 0),
        "duplicates": len(dups),
        "extra_copies": sum(v - 1 for v in dups.values()),
        "duplicates_same_enqueue": same_enqueue,
        "duplicate_sample": sample,
        "last_after_instant_s": round(lateness[-1] / 1000, 2) if lateness else None,
        "lateness_ms": {
            "p50": round(percentile(lateness, 50)) if lateness else None,
            "p99": round(percentile(lateness, 99)) if lateness else None,
            "max": round(lateness[-1]) if lateness else None,
        },
        "broker_cpu_s": round(cpu, 1),
        "broker_peak_rss_mb": round(peak_rss[0] / 2**20),
        "broker_log_lines": logs,
        "settings": {"heap_mb": heap_mb, "options": options or {}},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("qclient", "rocketmq"), default="qclient")
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--lead", type=float, default=60.0, help="first send to the instant, s")
    ap.add_argument("--wait", type=float, default=180.0, help="seconds after the instant")
    ap.add_argument("--broker-heap-mb", type=int, default=None)
    ap.add_argument("--option", type=_parse_option, action="append", default=[])
    ap.add_argument("--keep", type=Path, default=None, help="keep the cluster's data dir here")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="2,000 messages, 3 s lead")
    args = ap.parse_args(argv)
    if args.smoke:
        args.count, args.lead, args.wait = 2_000, 3.0, 30.0
    res = run(
        args.engine,
        args.count,
        args.lead,
        args.wait,
        args.broker_heap_mb,
        dict(args.option),
        args.keep,
    )
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:24} {v}")
    sys.exit(0 if res["lost"] == 0 and res["early"] == 0 else 1)


if __name__ == "__main__":
    main()
