"""A group member in its own process (killed by the tests): prints one line per poll,
``<monotonic s> <id> <id> ...``, flushed before the next poll.

With a fifth argument, a file path: after each poll that returned messages or saw its
commits move, it also appends a JSON line ``{"got": [[id, broker, queue, offset], ...],
"committed": [[broker, queue, next offset], ...]}`` there, written before the line on stdout.
The commits only move forward while the member holds its queues, so the last line is a
lower bound of what was committed when the member died.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TextIO

from qclient import Consumer


def main() -> None:
    namesrv, topic, group, session = sys.argv[1:5]
    detail: TextIO | None = open(sys.argv[5], "a") if len(sys.argv) > 5 else None  # noqa: SIM115
    with Consumer(namesrv, topic, group, session_timeout=float(session)) as consumer:
        print("ready", consumer.client_id, flush=True)
        committed: dict[tuple[str, int], int] = {}
        while True:
            batch = consumer.poll(64, timeout=0.3)
            if detail is not None:
                now = consumer.committed()
                if batch or now != committed:
                    committed = now
                    got = [[m.msg_id, m.broker_name, m.queue_id, m.offset] for m in batch]
                    done = [[b, q, off] for (b, q), off in sorted(now.items())]
                    detail.write(json.dumps({"got": got, "committed": done}) + "\n")
                    detail.flush()
            if batch:
                ids = " ".join(m.msg_id for m in batch)
                print(f"{time.monotonic():.3f} {ids}", flush=True)


if __name__ == "__main__":
    main()
