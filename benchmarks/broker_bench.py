"""Broker benchmark: accepted msgs/s and firing lateness, one broker, fsync before ack.

    python -m benchmarks.broker_bench [--seconds 5] [--rates 5000,10000,20000,40000]
                                      [--due-seconds 10] [--json]

1. accept: concurrent clients post batches of 256 x 100 B messages (msgpack) straight to
   one broker for ``--seconds``; every acknowledgement is after the group fsync.
2. firing: ``rate x due-seconds`` messages are scheduled to come due evenly over
   ``--due-seconds``; after they fired, the consume log is read back and
   ``fired_at - deliver_at`` gives the lateness (and early count, which must be 0).
   This runs once per due rate of ``--rates`` (each on its own topic); the knee is the
   highest rate whose p99 lateness is still <= 10 ms.
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

from benchmarks._broker_http import post_bodies, store_stats
from qclient import LocalCluster
from qclient.protocol import wire

BATCH = 256
BODY = b"x" * 100


def _pct(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def _encode_batches(
    prefix: str, n_batches: int, topic: str, deliver_at: list[int] | None
) -> list[bytes]:
    out = []
    for b in range(n_batches):
        msgs = []
        for i in range(BATCH):
            k = b * BATCH + i
            msgs.append(
                wire.WireMessage(
                    topic=topic,
                    queue_id=k % 4,
                    msg_id=f"{prefix}-{k}",
                    body=BODY,
                    deliver_at_ms=deliver_at[k] if deliver_at else None,
                    delay_ms=None if deliver_at else 3_600_000,
                )
            )
        out.append(wire.encode(wire.SendRequest(msgs), wire.MSGPACK))
    return out


def bench_accept(addr: str, pid: int, seconds: float, concurrency: int) -> dict[str, float]:
    est = int(seconds * 80_000 / BATCH) + 8  # enough batches for ~80k msgs/s
    bodies = _encode_batches(f"acc{os.getpid()}", est, "bench-accept", None)
    proc = psutil.Process(pid)
    cpu0 = sum(proc.cpu_times()[:2])
    acked, elapsed = asyncio.run(post_bodies(addr, bodies, concurrency, time.monotonic() + seconds))
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    stats = store_stats(addr)
    return {
        "accepted_msgs_per_s": acked / elapsed,
        "accepted": acked,
        "seconds": elapsed,
        "broker_cpu_us_per_msg": cpu / max(1, acked) * 1e6,
        "fsyncs": stats.get("fsyncs", 0),
        "avg_group_size": stats.get("avg_group_size", 0),
    }


def bench_firing(
    addr: str,
    rate: int,
    due_seconds: float,
    samples: list[int] | None = None,
    accept_rate: float | None = None,
) -> dict[str, float]:
    """One firing phase at ``rate`` due msgs/s; ``samples`` receives the lateness values.

    ``accept_rate`` (the accept phase's msgs/s) sizes the lead time before the first due
    message: encoding plus sending all of them must end before it, or the lateness measured
    is the sender's, not the broker's (``sent_past_first_due`` says so).
    """
    topic = f"bench-fire-{rate}"  # own topic per rate: the read-back starts at offset 0
    total = int(rate * due_seconds)
    n_batches = (total + BATCH - 1) // BATCH
    total = n_batches * BATCH
    lead_ms = 4000 + int(total / 30)  # time to send them all before the first is due
    if accept_rate:
        # sending at ~60% of the accept rate (the firing thread competes), encoding ~50k/s
        lead_ms = max(lead_ms, 4000 + int(total * (1000 / (0.6 * accept_rate) + 1000 / 50_000)))
    start = int(time.time() * 1000) + lead_ms
    step = due_seconds * 1000 / total
    deliver = [start + int(i * step) for i in range(total)]
    bodies = _encode_batches(f"fire{os.getpid()}-{rate}", n_batches, topic, deliver)
    acked, send_s = asyncio.run(post_bodies(addr, bodies, 4))
    sent_late = time.time() * 1000 > start
    if sent_late:
        print(f"warning: sending took {send_s:.1f} s, past the first due time", file=sys.stderr)
    # wait until all are due (+ a margin), then read the consume log back
    time.sleep(max(0.0, (deliver[-1] - time.time() * 1000) / 1000) + 1.0)
    lateness: list[int] = []
    early = 0
    commits: dict[int, int] = {}
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=f"http://{addr}", timeout=30, trust_env=False) as client:
        while len(lateness) < acked and time.monotonic() < deadline:
            req = wire.PullRequest(topic, "bench", 1024, 200, commits)
            r = client.post(
                wire.BROKER_PULL,
                content=wire.encode(req, wire.MSGPACK),
                headers={"content-type": wire.MSGPACK},
            )
            r.raise_for_status()
            resp = wire.decode(r.content, wire.PullResponse, wire.MSGPACK)
            commits = dict(resp.next_offsets)
            for m in resp.messages:
                # against its firing time: brokers fire fire_ahead_ms before deliver_at
                late = m.fired_at_ms - wire.firing_time_ms(m.deliver_at_ms, resp.fire_ahead_ms)
                early += late < 0
                lateness.append(late)
    if samples is not None:
        samples.extend(lateness)
    return {
        "due_rate_msgs_per_s": total / due_seconds,
        "scheduled": acked,
        "fired_read_back": len(lateness),
        "lateness_p50_ms": _pct(lateness, 0.50),
        "lateness_p99_ms": _pct(lateness, 0.99),
        "lateness_max_ms": float(max(lateness, default=0)),
        "early": early,
        "sent_past_first_due": int(sent_late),
    }


KNEE_P99_MS = 10.0
MAX_SAMPLES = 5000  # lateness samples kept per rate for the report's CDF


def knee(by_rate: list[dict[str, float]]) -> float | None:
    """The highest due rate whose p99 lateness is <= 10 ms with nothing early, all read back
    and sent before the first was due (None: none)."""
    ok = [
        f["due_rate_msgs_per_s"]
        for f in by_rate
        if f["lateness_p99_ms"] <= KNEE_P99_MS
        and f["early"] == 0
        and f["fired_read_back"] >= f["scheduled"]
        and not f["sent_past_first_due"]
    ]
    return max(ok) if ok else None


def run(
    seconds: float = 5.0,
    rates: tuple[int, ...] = (5000,),
    due_seconds: float = 10.0,
    concurrency: int = 4,
) -> dict[str, object]:
    by_rate: list[dict[str, float]] = []
    samples: dict[str, list[float]] = {}
    with LocalCluster(brokers=1) as cluster:
        broker = cluster.brokers[0]
        assert broker.pid is not None
        accept = bench_accept(broker.addr, broker.pid, seconds, concurrency)
        for rate in rates:
            lat: list[int] = []
            f = bench_firing(broker.addr, rate, due_seconds, lat, accept["accepted_msgs_per_s"])
            by_rate.append(f)
            step = max(1, len(lat) // MAX_SAMPLES)
            samples[f"broker @{f['due_rate_msgs_per_s']:,.0f}/s"] = [float(x) for x in lat[::step]]
            print(
                f"firing @{rate:,}/s: p50 {f['lateness_p50_ms']:.0f} ms, p99 "
                f"{f['lateness_p99_ms']:.0f} ms, early {f['early']}",
                file=sys.stderr,
            )
    notes = [
        f"due rate {f['due_rate_msgs_per_s']:,.0f}/s: sending ended after the first "
        "message was due, so its lateness is the sender's; not counted for the knee"
        for f in by_rate
        if f["sent_past_first_due"]
    ]
    return {
        "scenario": "broker",
        "accept": accept,
        "firing": by_rate[0],
        "firing_by_rate": by_rate,
        "knee_due_rate": knee(by_rate),
        "notes": notes,
        "lateness_samples_ms": samples,
        "targets": {"accepted_msgs_per_s>=": 30_000, "lateness_p99_ms<=": 10, "early==": 0},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="accept phase length")
    p.add_argument(
        "--rates",
        default="5000,10000,20000,40000",
        help="comma-separated due msgs/s, one firing phase each (first = 'firing')",
    )
    p.add_argument("--rate", type=int, default=None, help="one due rate (same as --rates N)")
    p.add_argument("--due-seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--smoke", action="store_true", help="tiny run: seconds, not minutes")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    a = p.parse_args()
    if a.smoke:
        a.seconds, a.rates, a.due_seconds = 0.5, "500", 1.0
    rates = (a.rate,) if a.rate else tuple(int(r) for r in a.rates.split(",") if r.strip())
    if not rates:
        p.error("--rates: at least one rate")
    res = run(a.seconds, rates, a.due_seconds, a.concurrency)
    acc, fire, by_rate = res["accept"], res["firing"], res["firing_by_rate"]
    assert isinstance(acc, dict) and isinstance(fire, dict) and isinstance(by_rate, list)
    print(
        f"accept : {acc['accepted_msgs_per_s']:,.0f} msgs/s accepted (batches of {BATCH} x "
        f"100 B, fsync before ack; {acc['avg_group_size']:.0f} msgs per fsync; broker "
        f"{acc['broker_cpu_us_per_msg']:.1f} CPU us/msg)  [target >= 30,000]"
    )
    print(
        f"firing : {fire['due_rate_msgs_per_s']:,.0f} due msgs/s: lateness p50 "
        f"{fire['lateness_p50_ms']:.0f} ms, p99 {fire['lateness_p99_ms']:.0f} ms, max "
        f"{fire['lateness_max_ms']:.0f} ms, early {fire['early']} "
        f"({fire['fired_read_back']}/{fire['scheduled']} read back)  "
        "[target p99 <= 10 ms, 0 early]"
    )
    print(
        f"{'due msgs/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'early':>6} "
        f"{'read back':>12}"
    )
    for f in by_rate:
        print(
            f"{f['due_rate_msgs_per_s']:>12,.0f} {f['lateness_p50_ms']:>8.0f} "
            f"{f['lateness_p99_ms']:>8.0f} {f['lateness_max_ms']:>8.0f} {f['early']:>6} "
            f"{f['fired_read_back']:>6}/{f['scheduled']:<6}"
            + ("  (sent past first due)" if f["sent_past_first_due"] else "")
        )
    k = res["knee_due_rate"]
    print(
        f"knee   : {'none' if k is None else f'{k:,.0f}'} due msgs/s "
        f"(highest rate with p99 <= {KNEE_P99_MS:.0f} ms, 0 early)"
    )
    for note in res["notes"]:  # type: ignore[attr-defined]
        print(f"note   : {note}")
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
