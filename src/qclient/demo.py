"""``qclient demo``: the main job on an embedded cluster, shown as a table.

Starts a name server and brokers (free loopback ports, temp dir), schedules a few hundred
delayed messages over a few seconds, consumes them, and prints what arrived when:
scheduled vs fired vs received, and the lateness of each step.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass

from ._models import Message
from .cluster import LocalCluster
from .consumer import Consumer
from .producer import Producer
from .protocol.wire import firing_time_ms


@dataclass
class _Row:
    msg_id: str
    deliver_at_ms: int
    fired_at_ms: int = 0
    received_ms: int = 0
    broker: str = ""


def _pct(values: list[int], q: float) -> int:
    if not values:
        return 0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _say(text: str = "") -> None:
    print(text, flush=True)


def run_demo(messages: int = 300, spread: float = 4.0, brokers: int = 2) -> int:
    """Run the demo; returns the exit status (0 when every message arrived, none early)."""
    _say(f"Starting a local cluster: 1 name server, {brokers} brokers ...")
    t0 = time.monotonic()
    with LocalCluster(brokers=brokers) as cluster:
        _say(
            f"  name server {cluster.namesrv}; brokers "
            + ", ".join(f"{b.name}@{b.addr}" for b in cluster.brokers)
            + f" (up in {time.monotonic() - t0:.1f} s)"
        )
        topic = "demo-reminders"
        rng = random.Random(7)
        batch = [
            Message(
                topic,
                f"reminder #{i}".encode(),
                key=f"user-{i % 17}",
                delay=0.5 + rng.random() * spread,
            )
            for i in range(messages)
        ]
        with (
            Producer(cluster.namesrv) as producer,
            Consumer(cluster.namesrv, topic, "demo-group") as consumer,
        ):
            t_send = time.monotonic()
            results = producer.send_batch(batch)
            send_s = time.monotonic() - t_send
            rows = {
                r.msg_id: _Row(r.msg_id, r.deliver_at_ms, broker=r.broker_name) for r in results
            }
            per_broker: dict[str, int] = {}
            for r in results:
                per_broker[r.broker_name] = per_broker.get(r.broker_name, 0) + 1
            _say(
                f"Scheduled {len(results)} messages with delays of 0.5-{0.5 + spread:.1f} s "
                f"in {send_s * 1000:.0f} ms ("
                + ", ".join(f"{k}: {v}" for k, v in sorted(per_broker.items()))
                + ")"
            )
            _say("Waiting for them to fire ...")
            deadline = time.monotonic() + spread + 15
            received = 0
            dupes = 0
            last_report = 0.0
            while received < len(rows) and time.monotonic() < deadline:
                for m in consumer.poll(max_messages=256, timeout=0.5):
                    now_ms = int(time.time() * 1000)
                    row = rows.get(m.msg_id)
                    if row is None:
                        continue
                    if row.received_ms:
                        dupes += 1
                        continue
                    row.fired_at_ms, row.received_ms = m.fired_at_ms, now_ms
                    received += 1
                if time.monotonic() - last_report > 1.0:
                    _say(f"  received {received}/{len(rows)}")
                    last_report = time.monotonic()
    _print_table(list(rows.values()), spread)
    done = [r for r in rows.values() if r.received_ms]
    early = [r for r in done if r.received_ms < r.deliver_at_ms]
    fired_late = [_fired_late(r) for r in done]
    recv_late = [r.received_ms - r.deliver_at_ms for r in done]
    lost = len(rows) - len(done)
    _say(
        f"{len(rows)} scheduled, {len(done)} delivered, {lost} missing, {len(early)} early, "
        f"{dupes} duplicates; fired lateness p50 {_pct(fired_late, 0.5)} ms, "
        f"p99 {_pct(fired_late, 0.99)} ms, max {max(fired_late, default=0)} ms; "
        f"received p50 {_pct(recv_late, 0.5)} ms, p99 {_pct(recv_late, 0.99)} ms"
    )
    return 0 if not lost and not early else 1


def _fired_late(r: _Row) -> int:
    """Against the firing time: brokers fire ahead, the consumer holds until due."""
    return r.fired_at_ms - firing_time_ms(r.deliver_at_ms)


def _print_table(rows: list[_Row], spread: float) -> None:
    """One line per half-second of scheduled time, then a sample of single messages."""
    if not rows:
        return
    start = min(r.deliver_at_ms for r in rows)
    width = 500
    groups: dict[int, list[_Row]] = {}
    for r in rows:
        groups.setdefault((r.deliver_at_ms - start) // width, []).append(r)
    _say("")
    _say(
        f"{'scheduled at':>12} {'msgs':>5} {'delivered':>9} {'early':>5} "
        f"{'fired late p50/max':>19} {'received late p50/max':>22}"
    )
    for k in sorted(groups):
        g = groups[k]
        done = [r for r in g if r.received_ms]
        fired = [_fired_late(r) for r in done]
        recv = [r.received_ms - r.deliver_at_ms for r in done]
        early = sum(1 for r in done if r.received_ms < r.deliver_at_ms)
        label = f"+{k * width / 1000:.1f}s"
        _say(
            f"{label:>12} {len(g):>5} {len(done):>9} {early:>5} "
            f"{_pct(fired, 0.5):>8} / {max(fired, default=0):>4} ms "
            f"{_pct(recv, 0.5):>11} / {max(recv, default=0):>4} ms"
        )
    _say("")
    sample = sorted(rows, key=lambda r: r.deliver_at_ms)[:: max(1, len(rows) // 8)][:8]
    _say(
        f"{'msg_id':<38} {'broker':<9} {'scheduled':>12} {'fired':>12} {'received':>12} {'late':>6}"
    )
    for r in sample:

        def clock(ms: int) -> str:
            if not ms:
                return "-"
            return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"

        late = f"{r.received_ms - r.deliver_at_ms} ms" if r.received_ms else "-"
        _say(
            f"{r.msg_id:<38} {r.broker:<9} {clock(r.deliver_at_ms):>12} "
            f"{clock(r.fired_at_ms):>12} {clock(r.received_ms):>12} {late:>6}"
        )
    _say("")


if __name__ == "__main__":
    sys.exit(run_demo())
