"""Retention: remove what nothing needs any more.

- A bucket fully fired ``retain_fired_ms`` ago (and covered by the checkpoint) loses its
  schedule file; a bucket holding cancels is kept a dedupe window longer, so that a
  repeated cancel still answers "already_cancelled" (not "already_fired") for as long as
  the id can be found.
- Its dispatch file stays one dedupe window longer (an orphan), for the same reason.
- Message-log segments go oldest first once wholly before the checkpoint and every
  schedule file's lowest position, and older than the dedupe window. Prefix only: one
  long-delayed message keeps every later segment (QMQ copies messages into its schedule
  log to avoid that). Consume logs are kept.
"""

from __future__ import annotations

import logging
import os
import time

from qclient.server.store._shared import Shared
from qclient.server.store.checkpoint import Checkpoint
from qclient.server.store.replay import Replayer

log = logging.getLogger(__name__)


class Retention:
    """Owns the orphaned dispatch files; runs on the syncer thread."""

    def __init__(self, sh: Shared, replayer: Replayer, checkpoint: Checkpoint):
        self._sh = sh
        self._replayer = replayer
        self._checkpoint = checkpoint
        self._orphans: dict[int, float] = {}  # cleaned bucket -> wall time to drop its dispatch

    def recover_orphans(self, buckets: list[int]) -> None:
        """At open: dispatch files whose bucket was cleaned before the stop are orphans."""
        files = self._sh.files
        window_s = self._sh.config.dedupe_window_ms / 1000
        for b in buckets:
            if not files.slog.size(b):
                mt = files.dlog.mtime(b) or time.time()
                self._orphans[b] = mt + window_s

    def cleanup(self) -> None:
        """Remove fully fired buckets, expired orphans, and unneeded log segments."""
        sh = self._sh
        if sh.broken is not None:
            return
        now = sh.clock()
        w = sh.wheel
        slog, dlog = sh.files.slog, sh.files.dlog
        removed = 0
        retain = sh.config.retain_fired_ms
        retain_cancels = retain + sh.config.dedupe_window_ms
        ckpt = self._checkpoint.written
        with sh.sched:
            for b in list(w.state):
                st = w.state[b]
                end = (b + 1) * sh.bucket_ms
                if (
                    st.outstanding <= 0
                    and not w.is_loading(b)
                    and w.is_loaded(b)
                    and end + (retain_cancels if w.cancelled.get(b) else retain) < now
                    and st.max_pos < ckpt
                ):
                    slog.remove(b)
                    self._replayer.forget(b)
                    if dlog.size(b):
                        dlog.touch(b)
                        self._orphans[b] = time.time() + sh.config.dedupe_window_ms / 1000
                    w.drop(b)
                    removed += 1
            self._sweep_orphans()
            pins = [ckpt, *self._replayer.lowest_positions()]
        sh.stats["buckets_removed"] += removed
        self._retain_segments(min(pins))

    def _retain_segments(self, limit: int) -> None:
        """Delete the oldest message-log segments wholly before ``limit`` and not written
        within the dedupe window (ids there can still be looked up)."""
        sh = self._sh
        mlog = sh.files.mlog
        cutoff_s = (sh.clock() - sh.config.dedupe_window_ms) / 1000
        for base, end in mlog.segment_bounds():
            if end > limit:
                break
            try:
                if os.path.getmtime(mlog.segment_path(base)) >= cutoff_s:
                    limit = base
                    break
            except FileNotFoundError:
                continue
        n = mlog.delete_segments_before(limit)
        if n:
            sh.stats["segments_removed"] += n
            log.info("message log: removed %d old segment(s) before position %d", n, limit)
            ids = sh.files.ids
            if ids is not None:  # entries pointing into the deleted segments are dead
                sh.stats["id_index_compacted"] += ids.compact(mlog.segments()[0][0])

    def _sweep_orphans(self) -> None:
        """Remove dispatch files whose bucket was cleaned more than a dedupe window ago
        (called with ``sched`` held)."""
        files = self._sh.files
        wall = time.time()
        for b, expiry in list(self._orphans.items()):
            if files.slog.size(b) or b in self._sh.wheel.state:
                del self._orphans[b]  # recreated by a late message: live again
            elif wall > expiry:
                files.dlog.remove(b)
                del self._orphans[b]
