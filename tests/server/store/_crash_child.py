"""Child process for the kill -9 tests: stores messages, prints what was acknowledged.

Usage: python -m tests.server.store._crash_child DATA_DIR N DELAY_SPREAD_MS [stream|buffered]
(``stream``: message j is due ``j % DELAY_SPREAD_MS`` ms after the start, so a long run
keeps submitting while earlier messages fire; ``buffered``: no checkpoint after the one at
open, so the schedule and id-index entries stay in memory, unwritten, until the kill.)
Prints ``ACK <first> <count>`` after each acknowledged batch, ``ACKED`` after all, then
``FIRED <n>`` as messages become visible, and waits to be killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from qclient.server.store import DelayStore, NewMessage, StoreConfig, wall_clock_ms


def main() -> None:
    data_dir, n, spread = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    stream = sys.argv[4:] == ["stream"]
    ckpt = 600_000 if sys.argv[4:] == ["buffered"] else 1000
    store = DelayStore(
        StoreConfig(
            data_dir=data_dir,
            bucket_ms=1000,
            load_ahead_ms=500,
            fsync=True,
            checkpoint_interval_ms=ckpt,
        )
    )
    store.open()
    base = wall_clock_ms() + 300
    for i in range(0, n, 100):
        batch = [
            NewMessage(
                "t", j % 4, f"m{j}", b"x" * 100, base + (j % spread if stream else j * spread // n)
            )
            for j in range(i, min(n, i + 100))
        ]
        store.submit(batch).result()
        print(f"ACK {i} {len(batch)}", flush=True)
    print("ACKED", flush=True)
    last = -1
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fired = sum(store.max_offset("t", q) for q in range(4))
        if fired != last:
            print(f"FIRED {fired}", flush=True)
            last = fired
        time.sleep(0.005)


if __name__ == "__main__":
    main()
