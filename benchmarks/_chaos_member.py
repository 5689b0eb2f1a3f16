"""A consumer-group member of the chaos bench, in its own process (the nemesis kills it
with SIGKILL): prints one line per received message,
``R <msg_id> <broker> <queue> <offset> <deliver_at_ms> <fired_at_ms> <received_ms> <body ok>``.

    python -m benchmarks._chaos_member NAMESRV TOPIC GROUP SESSION_S
"""

from __future__ import annotations

import os
import signal
import sys
import time

from qclient import Consumer
from qclient.errors import QClientError


def body_for(msg_id: str) -> bytes:
    """The body every chaos message carries: its id, so content can be checked."""
    return f"chaos|{msg_id}|".encode().ljust(64, b".")


def main() -> None:
    namesrv, topic, group, session = sys.argv[1:5]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    parent = os.getppid()
    with Consumer(namesrv, topic, group, session_timeout=float(session)) as consumer:
        print("ready", consumer.client_id, flush=True)
        while os.getppid() == parent:  # the bench died (even by SIGKILL): so do we
            try:
                batch = consumer.poll(256, timeout=0.3)
            except QClientError as exc:  # a broker or the name server is down: go on
                print(f"E {type(exc).__name__}", flush=True)
                time.sleep(0.2)
                continue
            now = time.time_ns() // 1_000_000
            lines = [
                f"R {m.msg_id} {m.broker_name} {m.queue_id} {m.offset} {m.deliver_at_ms} "
                f"{m.fired_at_ms} {now} {int(m.body == body_for(m.msg_id))}"
                for m in batch
            ]
            if lines:
                print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
