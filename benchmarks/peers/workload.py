"""The one workload every peer runs: N random 1-5 s delays, then the same after a kill -9."""

from __future__ import annotations

import logging
import math
import random
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._suite.procs import StartTimeout
from benchmarks.peers.base import Peer, PeerProducer

log = logging.getLogger(__name__)

__all__ = ["Workload", "percentile", "run_peer"]

#: at most this many lateness samples per peer go into the JSON (evenly thinned)
MAX_SAMPLES = 2000


@dataclass(frozen=True, slots=True)
class Workload:
    """What every peer is asked to do."""

    n: int = 5000
    min_delay_s: float = 1.0
    max_delay_s: float = 5.0
    #: how long to wait for stragglers after the last message was due
    grace_s: float = 10.0
    #: messages per ``send_many`` call for peers run in batch mode
    batch: int = 256
    kill_test: bool = True
    seed: int = 7


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of already-sorted values, nearest-rank."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


class _Arrivals:
    """Thread-safe record of (msg_id, arrival time) for the ids of ``due``.

    ``due`` is filled by the sender (each id just before its send) while messages arrive.
    """

    def __init__(self, due: dict[str, float]) -> None:
        self.lock = threading.Lock()
        self.due = due
        self.first: dict[str, float] = {}
        self.total = 0
        self._arrived = 0  # ids of ``due`` in ``first``, counted as they first arrive

    def __call__(self, msg_id: str) -> None:
        now = time.time()
        with self.lock:
            self.total += 1
            if msg_id not in self.first:
                self.first[msg_id] = now
                if msg_id in self.due:
                    self._arrived += 1

    def count(self) -> int:
        """How many distinct ids of ``due`` have arrived."""
        with self.lock:
            return self._arrived


def _enqueue(
    prod: PeerProducer,
    items: list[tuple[str, float]],
    batch: int | None,
    due: dict[str, float],
) -> float:
    """Send every item, recording its due time just before its send; returns seconds taken."""
    t0 = time.perf_counter()
    step = batch or 1
    for i in range(0, len(items), step):
        chunk = items[i : i + step]
        now = time.time()
        for m, d in chunk:
            due[m] = now + d
        if batch:
            prod.send_many(chunk)
        else:
            prod.send(chunk[0][0], chunk[0][1])
    return time.perf_counter() - t0


def _wait_all(arr: _Arrivals, until_epoch: float) -> None:
    """Wait (bounded) until every id of ``arr.due`` arrived or the epoch deadline passes."""
    while time.time() < until_epoch and arr.count() < len(arr.due):
        time.sleep(0.02)


def _items(
    w: Workload, rng: random.Random, prefix: str, offset_s: float = 0.0
) -> list[tuple[str, float]]:
    return [
        (f"{prefix}-{i}", offset_s + rng.uniform(w.min_delay_s, w.max_delay_s)) for i in range(w.n)
    ]


def _thin(values: list[float], k: int) -> list[float]:
    if len(values) <= k:
        return values
    step = len(values) / k
    return [values[int(i * step)] for i in range(k)]


def _timing_phase(
    peer: Peer,
    w: Workload,
    rng: random.Random,
    batch: int | None,
) -> dict[str, Any]:
    chan = f"bench-t-{uuid.uuid4().hex[:8]}"
    items = _items(w, rng, chan)
    due: dict[str, float] = {}
    arr = _Arrivals(due)
    cons = peer.consumer(chan, arr)
    prod = peer.producer(chan)
    try:
        enqueue_s = _enqueue(prod, items, batch, due)
        _wait_all(arr, max(due.values()) + w.grace_s)
    finally:
        prod.close()
        cons.close()
    extra = cons.breakdown()
    with arr.lock:
        lateness = sorted((arr.first[m] - due[m]) * 1000 for m in due if m in arr.first)
        total = arr.total
    got = len(lateness)
    return {
        "n": w.n,
        "enqueue_s": round(enqueue_s, 3),
        "enqueue_msgs_per_s": round(w.n / enqueue_s, 1) if enqueue_s > 0 else None,
        "delivered": got,
        "lost": w.n - got,
        "duplicates": total - got,
        "early": sum(1 for x in lateness if x < 0),
        "lateness_ms": {
            "p50": round(percentile(lateness, 50), 2) if lateness else None,
            "p99": round(percentile(lateness, 99), 2) if lateness else None,
            "max": round(lateness[-1], 2) if lateness else None,
            "min": round(lateness[0], 2) if lateness else None,
        },
        "samples_ms": [round(x, 2) for x in _thin(lateness, MAX_SAMPLES)],
        **({"breakdown": extra} if extra else {}),
    }


def _kill_phase(
    peer: Peer,
    w: Workload,
    rng: random.Random,
    batch: int | None,
    offset_s: float,
) -> dict[str, Any]:
    chan = f"bench-k-{uuid.uuid4().hex[:8]}"
    # Slow senders would see their first messages fire before the kill; shift the delays by
    # the time the timing phase took to send, so nearly all are still pending at the kill.
    items = _items(w, rng, chan, offset_s)
    due: dict[str, float] = {}
    arr = _Arrivals(due)
    cons = peer.consumer(chan, arr)
    prod = peer.producer(chan)
    try:
        enqueue_s = _enqueue(prod, items, batch, due)
        peer.kill9()  # right after the last acknowledgement
    finally:
        prod.close()
        cons.close()
    before = arr.count()
    t0 = time.perf_counter()
    peer.restart()
    restart_s = time.perf_counter() - t0
    cons = peer.consumer(chan, arr)
    try:
        # Overdue messages should fire at once after the restart; give the rest their time.
        _wait_all(arr, max(max(due.values()), time.time()) + w.grace_s)
    finally:
        cons.close()
    with arr.lock:
        survived = sum(1 for m in due if m in arr.first)
        total = arr.total
    return {
        "n": w.n,
        "delivered_before_kill": before,
        "survived": survived,
        "survived_pct": round(100 * survived / w.n, 2),
        "duplicates": total - survived,
        "restart_s": round(restart_s, 3),
        "enqueue_s": round(enqueue_s, 3),
        "delay_offset_s": offset_s,
    }


def run_peer(
    peer: Peer,
    w: Workload,
    *,
    label: str | None = None,
    batch: bool = False,
    keep_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the workload against one peer; never raises (errors become a status)."""
    out: dict[str, Any] = {"peer": label or peer.name, "description": peer.description}
    if batch:
        out["description"] += f"; sent in batches of {w.batch}"
    why = peer.missing()
    if why:
        return {**out, "status": "skipped", "reason": why}
    workdir = Path(tempfile.mkdtemp(prefix=f"qbench-{peer.name}-", dir=keep_dir))
    rng = random.Random(w.seed)
    try:
        t0 = time.perf_counter()
        try:
            peer.start(workdir)
        except StartTimeout as exc:
            return {**out, "status": "skipped", "reason": f"did not start: {exc}"}
        out["start_s"] = round(time.perf_counter() - t0, 2)
        out.update(_timing_phase(peer, w, rng, w.batch if batch else None))
        if w.kill_test:
            offset = round(min(1.2 * out["enqueue_s"], 120.0), 2)
            out["kill9"] = _kill_phase(peer, w, rng, w.batch if batch else None, offset)
        note = peer.note()
        if note:
            out["note"] = note
        out["status"] = "ok"
        return out
    except Exception as exc:
        log.exception("%s failed", peer.name)
        return {**out, "status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    finally:
        try:
            peer.stop()
        except Exception:
            log.exception("%s: stop failed", peer.name)
        if keep_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
