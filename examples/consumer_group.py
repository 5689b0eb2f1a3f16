"""Two members of one consumer group share a topic's queues; each message goes to one.

    python examples/consumer_group.py

Starts a local cluster, sends 200 delayed messages, and consumes them with two
``Consumer``s of group "billing" on two threads (they could as well be processes on other
hosts), then one ``AsyncConsumer`` of another group, which gets every message again.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from qclient import AsyncConsumer, Consumer, LocalCluster, Message, Producer

N = 200


def member(namesrv: str, got: Counter[str], name: str, done: threading.Event) -> None:
    with Consumer(namesrv, "orders", "billing") as consumer:
        for _m in consumer.messages(timeout=3.0):  # stops after 3 s without a message
            got[name] += 1
            if sum(got.values()) >= N:
                done.set()
            if done.is_set():
                break


async def audit(namesrv: str) -> int:
    seen = 0
    async with AsyncConsumer(namesrv, "orders", "audit") as consumer:
        async for _m in consumer.messages(timeout=3.0):
            seen += 1
            if seen == N:
                break
    return seen


def main() -> None:
    with LocalCluster(brokers=2) as cluster, Producer(cluster.namesrv) as producer:
        producer.send_batch(Message("orders", f"order {i}", delay=1.0) for i in range(N))
        got: Counter[str] = Counter()
        done = threading.Event()
        threads = [
            threading.Thread(target=member, args=(cluster.namesrv, got, f"member-{i}", done))
            for i in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"group billing: {dict(got)} (total {sum(got.values())} of {N})")
        print(f"group audit (AsyncConsumer): {asyncio.run(audit(cluster.namesrv))} of {N}")


if __name__ == "__main__":
    main()
