"""What a store reports: counters, gauges, lateness samples, histograms, consume lag.

Read by ``DelayStore.stats()`` and friends for the broker's ``/metrics`` and the
benchmarks; nothing here changes the store.
"""

from __future__ import annotations

from qclient.server.store._shared import Shared
from qclient.server.store.committer import Committer
from qclient.server.store.files import StoreFiles
from qclient.server.store.firing import Firing
from qclient.server.store.histogram import Histogram
from qclient.server.store.schedule_log import ENTRY as SCHEDULE_ENTRY

__all__ = ["consume_lag", "count_scheduled", "histograms", "stats"]

#: counters reported as 0 before their first event
_STATS_ZERO = (
    "appended",
    "stored",
    "duplicates",
    "fsyncs",
    "groups",
    "fired",
    "cancelled",
    "loaded_buckets",
    "consume_fsyncs",
    "busy_rejections",
    "deadline_refusals",
    "corrupt_records",
)


def count_scheduled(sh: Shared, files: StoreFiles) -> int:
    """Messages waiting to fire, at open: the loaded wheel plus the schedule entries
    of the buckets not loaded yet (cancel entries of earlier runs count as well
    until their bucket loads: an estimate, as exact as a file-size sum can be)."""
    slog = files.slog
    with sh.sched:
        unloaded = sum(slog.size(b) for b in sh.wheel.unloaded) // SCHEDULE_ENTRY.size
        return len(sh.wheel.heap) + unloaded


def consume_lag(files: StoreFiles) -> dict[tuple[str, str], int]:
    """Visible messages past each group's committed offsets, per ``(topic, group)``
    (the queues a group has committed on)."""
    lag: dict[tuple[str, str], int] = {}
    consume = files.consume
    for (group, topic, qid), offset in files.offsets.snapshot().items():
        q = consume.get(topic, qid, create=False)
        behind = max(0, q.visible - offset) if q is not None else 0
        lag[(topic, group)] = lag.get((topic, group), 0) + behind
    return lag


def histograms(sh: Shared) -> dict[str, Histogram]:
    """Fire lateness (ms) and fsync durations (seconds, ``fsync_<file>``)."""
    out = {"lateness_ms": sh.lateness}
    for kind, h in sh.fsync_seconds.items():
        out[f"fsync_{kind}"] = h
    return out


def stats(
    sh: Shared,
    files: StoreFiles,
    committer: Committer,
    firing: Firing,
    scheduled_at_open: int,
) -> dict[str, int | float]:
    """Every counter and gauge of an open store, with lateness percentiles (ms) of the
    newest fired messages once there are any."""
    s: dict[str, int | float] = dict.fromkeys(_STATS_ZERO, 0)
    s.update(sh.stats)
    # what recovery found, then exact: every change since open is counted
    s["scheduled"] = scheduled_at_open + s["stored"] - s["fired"] - s["cancelled"]
    with sh.sched:
        s["wheel_size"] = len(sh.wheel.heap)
        s["active_buckets"] = len(sh.wheel.state)
        s["unloaded_buckets"] = len(sh.wheel.unloaded)
    s["pending"] = committer.pending
    s["pending_bytes"] = committer.pending_bytes
    s["dedupe_ids"] = len(sh.dedupe)
    s["log_bytes"] = files.mlog.end
    s["avg_group_size"] = s["appended"] / s["groups"] if s["groups"] else 0.0
    lat = sorted(firing.lateness)
    if lat:
        s["lateness_p50_ms"] = lat[len(lat) // 2]
        s["lateness_p99_ms"] = lat[min(len(lat) - 1, len(lat) * 99 // 100)]
        s["lateness_max_ms"] = lat[-1]
    return s
