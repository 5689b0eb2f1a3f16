"""What the stages of one open store share: configuration, clock, files, wheel, locks.

Lock order: ``submit_lock`` (the committer's queue and in-flight ids, the dedupe table)
may be taken before ``sched`` (wheel, schedule-file appends, bucket states), never after;
the syncer's own lock is never held with either. Big groups are handled in chunks so no
lock is held long (the firing thread needs ``sched``).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from qclient.server.store.dedupe import DedupeTable
from qclient.server.store.due import DueCounts
from qclient.server.store.files import StoreFiles
from qclient.server.store.histogram import FSYNC_BOUNDS_S, LATENESS_BOUNDS_MS, Histogram
from qclient.server.store.types import StoreConfig
from qclient.server.store.wheel import Wheel

MAX_WAIT_S = 0.05  # the firing and loader threads re-check the clock at least this often
LOCK_CHUNK = 2048  # records handled per hold of a lock the firing thread may need


class Shared:
    """The state every stage reads; each stage keeps its own state to itself."""

    def __init__(
        self,
        config: StoreConfig,
        clock: Callable[[], int],
        bucket_ms: int,
        files: StoreFiles,
    ):
        self.config = config
        self.clock = clock
        self.bucket_ms = bucket_ms
        self.files = files
        self.wheel = Wheel(bucket_ms)
        self.dedupe = DedupeTable(config.dedupe_window_ms, config.dedupe_max_ids)
        self.submit_lock = threading.Lock()
        self.sched = threading.Lock()
        self.fire_cv = threading.Condition(self.sched)  # notified when a sooner entry is due
        #: called (``sched`` held, any thread) when a sooner entry is due, for an owner
        #: that drives firing itself (``StoreConfig.firing_thread`` off); must not block
        self.fire_wake: Callable[[], None] | None = None
        self.stats: collections.Counter[str] = collections.Counter()
        #: fired_at - deliver_at of every fired message (ms), for /metrics
        self.lateness = Histogram(LATENESS_BOUNDS_MS)
        #: duration of the fsyncs that make messages durable, per file kind (seconds)
        self.fsync_seconds = {
            "message_log": Histogram(FSYNC_BOUNDS_S),
            "consume_log": Histogram(FSYNC_BOUNDS_S),
        }
        #: scheduled messages by deliver second; None until open has counted what
        #: recovery left (replays during recovery are in that count)
        self.due: DueCounts | None = None
        # set when a background step fails in a way that may lose derived state: the
        # store then refuses new work, keeps its last good checkpoint, and a restart
        # rebuilds everything from the message log
        self.broken: BaseException | None = None

    def sooner_due(self) -> None:
        """A wheel entry due sooner than the earliest was pushed (``sched`` held)."""
        self.fire_cv.notify()
        wake = self.fire_wake
        if wake is not None:
            wake()
