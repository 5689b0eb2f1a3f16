"""A consumer-group member of the rebalance bench, in its own process (the bench kills it
with SIGKILL, or asks it to ``close()``). It prints, flushed after each poll:

- ``ready <client_id> <mono_s>`` once, before the first poll;
- ``A <mono_s> <broker>:<queue>,...`` when the queues it holds change (``-`` for none);
- ``R <mono_s> <wall_ms> <msg_id> <broker> <queue> <offset> <deliver_at_ms>`` for each
  message a poll returned (``mono_s``: when that poll returned);
- ``C <mono_s> <broker> <queue> <offset>`` when the consumer's record of what the broker
  acknowledged as committed moves (it moves with the pull or heartbeat after the poll
  that returned the messages): a message ``R``-printed at or past its queue's last ``C``
  offset is one the member held uncommitted, as far as it knew;
- ``closing <mono_s>`` and ``closed <mono_s>`` around ``close()`` when ``close`` is
  read on stdin (between two polls, so everything returned was processed).

``mono_s`` is ``time.monotonic()``: one clock for every process of the machine. After
printing a batch it spends ``WORK_MS`` per message (a sleep) before the next poll, as an
application processing what it received would: a member killed then still holds that
batch uncommitted.

    python -m benchmarks._rebalance_member NAMESRV TOPIC GROUP SESSION_S [WORK_MS]
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from qclient import Consumer
from qclient.errors import QClientError

POLL_MAX = 256
POLL_TIMEOUT_S = 0.2


def main() -> None:
    namesrv, topic, group, session = sys.argv[1:5]
    work_s = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    close_asked = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                close_asked.set()
                return

    threading.Thread(target=read_stdin, daemon=True).start()
    parent = os.getppid()
    out = sys.stdout
    with Consumer(namesrv, topic, group, session_timeout=float(session)) as consumer:
        out.write(f"ready {consumer.client_id} {time.monotonic():.6f}\n")
        out.flush()
        held: list[tuple[str, int]] = []
        committed: dict[tuple[str, int], int] = {}
        while os.getppid() == parent:  # the bench died (even by SIGKILL): so do we
            if close_asked.is_set():
                out.write(f"closing {time.monotonic():.6f}\n")
                out.flush()
                consumer.close()
                out.write(f"closed {time.monotonic():.6f}\n")
                out.flush()
                return
            try:
                batch = consumer.poll(POLL_MAX, timeout=POLL_TIMEOUT_S)
            except QClientError as exc:
                print(f"E {type(exc).__name__}", file=sys.stderr, flush=True)
                time.sleep(0.1)
                continue
            mono, wall = time.monotonic(), time.time_ns() // 1_000_000
            lines = [
                f"R {mono:.6f} {wall} {m.msg_id} {m.broker_name} {m.queue_id} {m.offset} "
                f"{m.deliver_at_ms}"
                for m in batch
            ]
            now_held = consumer.assignment()
            if now_held != held:
                held = now_held
                queues = ",".join(f"{b}:{q}" for b, q in held) or "-"
                lines.append(f"A {mono:.6f} {queues}")
            for key, off in consumer.committed().items():
                if committed.get(key) != off:
                    committed[key] = off
                    lines.append(f"C {mono:.6f} {key[0]} {key[1]} {off}")
            if lines:
                out.write("\n".join(lines) + "\n")
                out.flush()
            if batch and work_s:
                time.sleep(len(batch) * work_s)


if __name__ == "__main__":
    main()
