"""A group member in its own process (killed by the tests): prints one line per poll,
``<monotonic s> <id> <id> ...``, flushed before the next poll."""

from __future__ import annotations

import sys
import time

from qclient import Consumer


def main() -> None:
    namesrv, topic, group, session = sys.argv[1:5]
    with Consumer(namesrv, topic, group, session_timeout=float(session)) as consumer:
        print("ready", consumer.client_id, flush=True)
        while True:
            batch = consumer.poll(64, timeout=0.3)
            if batch:
                ids = " ".join(m.msg_id for m in batch)
                print(f"{time.monotonic():.3f} {ids}", flush=True)


if __name__ == "__main__":
    main()
