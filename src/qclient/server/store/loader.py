"""Loader: ``load_ahead_ms`` before a bucket starts, its schedule file minus its dispatch
log goes into the wheel (see wheel.py for the loading cursor that loses nothing)."""

from __future__ import annotations

import logging
import threading

from qclient.server.store import record as rec
from qclient.server.store._shared import MAX_WAIT_S, Shared

log = logging.getLogger(__name__)

_MSG = rec.KIND_MESSAGE
_CANCEL = rec.KIND_CANCEL
_LOAD_CHUNK = 20_000  # entries merged per hold of the scheduler lock


class Loader:
    """The loader thread's loop; woken early when a record lands in a bucket due soon."""

    def __init__(self, sh: Shared):
        self._sh = sh
        self._stop = threading.Event()
        self._wake = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        """The loader thread."""
        while not self._stop.is_set():
            try:
                while self.step() and not self._stop.is_set():
                    pass
            except Exception:
                log.exception("bucket loading failed; retrying")
            self._wake.wait(MAX_WAIT_S)
            self._wake.clear()

    def step(self) -> bool:
        """Load the earliest unloaded bucket that starts within load_ahead_ms; False if none."""
        sh = self._sh
        w = sh.wheel
        slog, dlog = sh.files.slog, sh.files.dlog
        with sh.sched:
            target = (sh.clock() + sh.config.load_ahead_ms) // sh.bucket_ms
            b = w.start_load(target)
            if b is None:
                return False
            cursor = slog.size(b)
        try:
            entries = slog.entries(b, cursor)
            fired = dlog.positions(b)
        except BaseException:
            with sh.sched:
                w.abort_load(b)
            raise
        with sh.sched:
            w.note_entries(b, entries, _CANCEL)
        seen: set[int] = set()
        for i in range(0, len(entries), _LOAD_CHUNK):
            with sh.sched:
                notify = False
                for d, pos, size, kind in entries[i : i + _LOAD_CHUNK]:
                    if kind != _MSG or pos in seen or pos in fired or w.is_cancelled(b, pos):
                        continue
                    seen.add(pos)
                    notify |= w.push(d, pos, size)
                if notify:
                    sh.fire_cv.notify()
        with sh.sched:
            w.finish_load(b)
        sh.stats["loaded_buckets"] += 1
        sh.stats["loaded_entries"] += len(seen)
        return True
