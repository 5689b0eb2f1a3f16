"""Randomised consistency check of the store against a tiny model, across clean restarts."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from tests.server.store.conftest import FakeClock, pull_all, wait_until

from qclient.server.store import DelayStore, NewMessage, StoreConfig

# more seeds for a bug hunt:
#   STORE_MODEL_SEEDS=$(seq -s, 1 100) pytest tests/server/store/test_model.py
SEEDS = [int(s) for s in os.environ.get("STORE_MODEL_SEEDS", "1,2,3").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_ops_match_the_model(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(11_000_000_000 + rng.randrange(1000))
    config = StoreConfig(
        data_dir=tmp_path / "d",
        bucket_ms=rng.choice([50, 200, 1000]),
        load_ahead_ms=rng.choice([0, 100, 500]),
        fsync=False,
        checkpoint_interval_ms=50,
        retain_fired_ms=0,
    )
    stored: dict[str, int] = {}  # msg_id -> deliver_at
    cancelled: set[str] = set()
    fired_per_cancel: set[str] = set()  # cancel said already_fired
    store = DelayStore(config, clock_ms=clock)
    store.open()
    try:
        for _step in range(60):
            op = rng.random()
            if op < 0.45:
                batch = []
                for _ in range(rng.randrange(1, 30)):
                    mid = f"id{rng.randrange(400)}"  # collisions exercise dedupe
                    at = clock.now + rng.randrange(-500, 3000)
                    batch.append(NewMessage("t", rng.randrange(4), mid, mid.encode(), at))
                for m, r in zip(batch, store.submit(batch).result(10), strict=True):
                    if r.duplicate:
                        assert m.msg_id in stored and r.deliver_at_ms == stored[m.msg_id]
                    else:
                        assert m.msg_id not in stored
                        stored[m.msg_id] = m.deliver_at_ms
            elif op < 0.65 and stored:
                mid = rng.choice(sorted(stored))
                out = store.cancel("t", mid, stored[mid]).result(10)
                if out.cancelled:
                    assert mid not in cancelled and mid not in fired_per_cancel
                    cancelled.add(mid)
                elif out.reason == "already_cancelled":
                    assert mid in cancelled
                else:
                    assert out.reason == "already_fired", out
                    assert mid not in cancelled
                    fired_per_cancel.add(mid)
            elif op < 0.9:
                clock.advance(rng.randrange(0, 800))
                time.sleep(rng.choice([0, 0.01, 0.05]))
            else:
                store.close()
                store = DelayStore(config, clock_ms=clock)
                store.open()
        clock.advance(10_000)
        want = set(stored) - cancelled
        wait_until(lambda: {f.msg_id for f in pull_all(store, "t")} >= want, timeout=10)
        time.sleep(0.1)
        delivered = Counter(f.msg_id for f in pull_all(store, "t"))
        assert set(delivered) == want
        assert max(delivered.values(), default=1) == 1
        assert fired_per_cancel <= want
        for f in pull_all(store, "t"):
            assert f.deliver_at_ms == stored[f.msg_id] and f.body == f.msg_id.encode()
            assert f.fired_at_ms >= f.deliver_at_ms
    finally:
        store.close()
