"""Syncer: makes fired messages durable and visible, and runs the periodic checkpoint.

For each group of fired work: fdatasync the consume logs (at least ``sync_interval_ms``
apart, so fired messages accumulate into one fsync), make the new offsets visible to
``pull()`` (with ``visible_before_sync`` the firing thread already did, and woke the
listeners), write the dispatch log, then wake the fire listeners. The dispatch record
follows the fsync, so a crash can only re-fire a message, never lose one. Every
``checkpoint_interval_ms``: the checkpoint, the consumer offsets, then retention.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from qclient.server.store._files import NO_SPACE
from qclient.server.store._shared import Shared
from qclient.server.store.checkpoint import Checkpoint
from qclient.server.store.consume_log import ConsumeQueue
from qclient.server.store.retention import Retention

log = logging.getLogger(__name__)

#: topic -> the earliest deliver time (ms) among the messages fired in it: what the fire
#: listeners are told
FiredTopics = dict[str, int]
# (consume queues appended to, bucket -> fired positions, topics) of one firing step
Work = tuple[list[ConsumeQueue], dict[int, list[int]], FiredTopics]


class Syncer:
    """The syncer thread's loop, the fired work it is handed, and the fire listeners."""

    def __init__(self, sh: Shared, checkpoint: Checkpoint, retention: Retention):
        self._sh = sh
        self._checkpoint = checkpoint
        self._retention = retention
        self._cv = threading.Condition(threading.Lock())  # never held with another lock
        self._work: list[Work] = []
        self._stop = False
        self._listeners: list[Callable[[FiredTopics], None]] = []

    def add_listener(self, cb: Callable[[FiredTopics], None]) -> None:
        self._listeners.append(cb)

    def notify(self, topics: FiredTopics) -> None:
        """Tell the fire listeners that ``topics`` have new pullable messages."""
        for cb in list(self._listeners):
            try:
                cb(topics)
            except Exception:
                log.exception("fire listener failed")

    def hand(
        self, queues: list[ConsumeQueue], dispatch: dict[int, list[int]], topics: FiredTopics
    ) -> None:
        """Fired work from the firing thread, to be made durable and visible."""
        with self._cv:
            self._work.append((queues, dispatch, topics))
            self._cv.notify()

    def stop(self) -> None:
        """Let the loop finish the work handed so far, then return."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    def run(self) -> None:
        """The syncer thread."""
        sh = self._sh
        cfg = sh.config
        period = cfg.checkpoint_interval_ms / 1000
        next_ckpt = time.monotonic() + period
        offsets_period = cfg.offsets_write_ms / 1000
        next_offsets = time.monotonic() + offsets_period
        last_sync = 0.0
        while True:
            with self._cv:
                while not self._work and not self._stop:
                    left = min(next_ckpt, next_offsets) - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                stopping = self._stop
            gap = cfg.sync_interval_ms / 1000 - (time.monotonic() - last_sync)
            if gap > 0 and cfg.fsync and not stopping:
                time.sleep(gap)  # let a group of fired messages accumulate
            with self._cv:
                work, self._work = self._work, []
            try:
                if work:
                    self._sync_fired(work)
                    work = []
                    last_sync = time.monotonic()
                if time.monotonic() >= next_offsets:
                    next_offsets = time.monotonic() + offsets_period
                    sh.files.offsets.flush(durable=False)
                if time.monotonic() >= next_ckpt:
                    next_ckpt = time.monotonic() + period
                    self._checkpoint.write()
                    sh.files.flush()
                    self._retention.cleanup()
            except OSError as exc:
                if exc.errno not in NO_SPACE or stopping:
                    self._fail(exc)
                else:
                    # nothing half-written (appends are cut back on failure): keep the
                    # fired work not yet synced and try again once space returns
                    log.error("syncer: %s; retrying", exc)
                    sh.stats["no_space_errors"] += 1
                    with self._cv:
                        self._work = work + self._work
                    time.sleep(0.5)
            except Exception as exc:
                self._fail(exc)
            if stopping:
                with self._cv:
                    if not self._work:
                        return

    def _fail(self, exc: Exception) -> None:
        # fired copies may not be durable or dispatched: they fire again after a
        # restart (at-least-once); refuse new work rather than guess
        log.exception("syncer step failed; the store stops accepting work")
        sh = self._sh
        sh.stats["sync_errors"] += 1
        sh.broken = exc
        time.sleep(0.1)

    def _sync_fired(self, work: list[Work]) -> None:
        sh = self._sh
        queues = {id(q): q for qs, _, _ in work for q in qs}
        timing = sh.fsync_seconds["consume_log"] if sh.config.fsync else None
        synced = []
        for q in queues.values():
            started = time.perf_counter()
            synced.append((q, q.sync()))
            if timing is not None:
                timing.observe(time.perf_counter() - started)
        if synced and sh.config.fsync:
            sh.stats["consume_fsyncs"] += len(synced)
        if not sh.config.visible_before_sync:  # else published on append (one writer)
            for q, upto in synced:
                q.publish(upto)
        merged: dict[int, list[int]] = collections.defaultdict(list)
        topics: FiredTopics = {}
        for _, dispatch, ts in work:
            for t, first in ts.items():
                topics[t] = min(first, topics.get(t, first))
            for b, positions in dispatch.items():
                merged[b].extend(positions)
        dlog = sh.files.dlog
        for b, positions in merged.items():
            dlog.add(b, positions)
        with sh.sched:
            for b, positions in merged.items():
                sh.wheel.dispatched(b, positions)
        if topics and not sh.config.visible_before_sync:
            self.notify(topics)
