"""Broker benchmark: accepted msgs/s and firing lateness, one broker, fsync before ack.

    python benchmarks/broker_bench.py [--seconds 5] [--rate 5000] [--due-seconds 10] [--json]

1. accept: concurrent clients post batches of 256 x 100 B messages (msgpack) straight to
   one broker for ``--seconds``; every acknowledgement is after the group fsync.
2. firing: ``rate x due-seconds`` messages are scheduled to come due evenly over
   ``--due-seconds``; after they fired, the consume log is read back and
   ``fired_at - deliver_at`` gives the lateness (and early count, which must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import httpx
import psutil

from qclient import LocalCluster
from qclient.protocol import wire

BATCH = 256
BODY = b"x" * 100


def _pct(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def _encode_batches(prefix: str, n_batches: int, topic: str, deliver_at: list[int] | None
                    ) -> list[bytes]:
    out = []
    for b in range(n_batches):
        msgs = []
        for i in range(BATCH):
            k = b * BATCH + i
            msgs.append(wire.WireMessage(
                topic=topic, queue_id=k % 4, msg_id=f"{prefix}-{k}", body=BODY,
                deliver_at_ms=deliver_at[k] if deliver_at else None,
                delay_ms=None if deliver_at else 3_600_000))
        out.append(wire.encode(wire.SendRequest(msgs), wire.MSGPACK))
    return out


async def _post_all(addr: str, bodies: list[bytes], concurrency: int,
                    deadline: float | None) -> tuple[int, float]:
    """Post bodies with ``concurrency`` connections; returns (messages acked, seconds)."""
    queue = list(reversed(bodies))
    acked = 0
    headers = {"content-type": wire.MSGPACK}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=f"http://{addr}", limits=limits, timeout=30,
                                 trust_env=False) as client:

        async def worker() -> None:
            nonlocal acked
            while queue and (deadline is None or time.monotonic() < deadline):
                body = queue.pop()
                r = await client.post(wire.BROKER_SEND, content=body, headers=headers)
                r.raise_for_status()
                resp = wire.decode(r.content, wire.SendResponse, wire.MSGPACK)
                acked += sum(1 for x in resp.results if x.status == wire.SEND_OK)

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return acked, time.monotonic() - t0


def bench_accept(addr: str, pid: int, seconds: float, concurrency: int) -> dict[str, float]:
    est = int(seconds * 80_000 / BATCH) + 8  # enough batches for ~80k msgs/s
    bodies = _encode_batches(f"acc{os.getpid()}", est, "bench-accept", None)
    proc = psutil.Process(pid)
    cpu0 = sum(proc.cpu_times()[:2])
    acked, elapsed = asyncio.run(_post_all(addr, bodies, concurrency,
                                           time.monotonic() + seconds))
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    stats = httpx.get(f"http://{addr}{wire.BROKER_STATS}").json()["store"]
    return {
        "accepted_msgs_per_s": acked / elapsed,
        "accepted": acked,
        "seconds": elapsed,
        "broker_cpu_us_per_msg": cpu / max(1, acked) * 1e6,
        "fsyncs": stats.get("fsyncs", 0),
        "avg_group_size": stats.get("avg_group_size", 0),
    }


def bench_firing(addr: str, rate: int, due_seconds: float) -> dict[str, float]:
    total = int(rate * due_seconds)
    n_batches = (total + BATCH - 1) // BATCH
    total = n_batches * BATCH
    lead_ms = 4000 + int(total / 30)  # time to send them all before the first is due
    start = int(time.time() * 1000) + lead_ms
    step = due_seconds * 1000 / total
    deliver = [start + int(i * step) for i in range(total)]
    bodies = _encode_batches(f"fire{os.getpid()}", n_batches, "bench-fire", deliver)
    acked, send_s = asyncio.run(_post_all(addr, bodies, 4, None))
    if time.time() * 1000 > start:
        print(f"warning: sending took {send_s:.1f} s, past the first due time", file=sys.stderr)
    # wait until all are due (+ a margin), then read the consume log back
    time.sleep(max(0.0, (deliver[-1] - time.time() * 1000) / 1000) + 1.0)
    lateness: list[int] = []
    early = 0
    commits: dict[int, int] = {}
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=f"http://{addr}", timeout=30, trust_env=False) as client:
        while len(lateness) < acked and time.monotonic() < deadline:
            req = wire.PullRequest("bench-fire", "bench", 1024, 200, commits)
            r = client.post(wire.BROKER_PULL, content=wire.encode(req, wire.MSGPACK),
                            headers={"content-type": wire.MSGPACK})
            r.raise_for_status()
            resp = wire.decode(r.content, wire.PullResponse, wire.MSGPACK)
            commits = dict(resp.next_offsets)
            for m in resp.messages:
                late = m.fired_at_ms - m.deliver_at_ms
                early += late < 0
                lateness.append(late)
    return {
        "due_rate_msgs_per_s": total / due_seconds,
        "scheduled": acked,
        "fired_read_back": len(lateness),
        "lateness_p50_ms": _pct(lateness, 0.50),
        "lateness_p99_ms": _pct(lateness, 0.99),
        "lateness_max_ms": float(max(lateness, default=0)),
        "early": early,
    }


def run(seconds: float = 5.0, rate: int = 5000, due_seconds: float = 10.0,
        concurrency: int = 4) -> dict[str, object]:
    with LocalCluster(brokers=1) as cluster:
        broker = cluster.brokers[0]
        assert broker.pid is not None
        accept = bench_accept(broker.addr, broker.pid, seconds, concurrency)
        firing = bench_firing(broker.addr, rate, due_seconds)
    return {"scenario": "broker", "accept": accept, "firing": firing,
            "targets": {"accepted_msgs_per_s>=": 30_000, "lateness_p99_ms<=": 10, "early==": 0}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="accept phase length")
    p.add_argument("--rate", type=int, default=5000, help="due msgs/s in the firing phase")
    p.add_argument("--due-seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--smoke", action="store_true", help="tiny run: seconds, not minutes")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    a = p.parse_args()
    if a.smoke:
        a.seconds, a.rate, a.due_seconds = 0.5, 500, 1.0
    res = run(a.seconds, a.rate, a.due_seconds, a.concurrency)
    acc, fire = res["accept"], res["firing"]
    assert isinstance(acc, dict) and isinstance(fire, dict)
    print(f"accept : {acc['accepted_msgs_per_s']:,.0f} msgs/s accepted (batches of {BATCH} x "
          f"100 B, fsync before ack; {acc['avg_group_size']:.0f} msgs per fsync; broker "
          f"{acc['broker_cpu_us_per_msg']:.1f} CPU us/msg)  [target >= 30,000]")
    print(f"firing : {fire['due_rate_msgs_per_s']:,.0f} due msgs/s: lateness p50 "
          f"{fire['lateness_p50_ms']:.0f} ms, p99 {fire['lateness_p99_ms']:.0f} ms, max "
          f"{fire['lateness_max_ms']:.0f} ms, early {fire['early']} "
          f"({fire['fired_read_back']}/{fire['scheduled']} read back)  "
          "[target p99 <= 10 ms, 0 early]")
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
