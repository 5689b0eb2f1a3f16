"""Loader: ``load_ahead_ms`` before a bucket starts, its schedule file minus its dispatch
log goes into the wheel (see wheel.py for the loading cursor that loses nothing).

A load that fails part-way (its file read raises) is not given up: the bucket stays
*loading* with the same cursor and the next step resumes it. Giving the bucket back as
unloaded would make the retry read a new cursor, and with it the entries the replayer
pushed meanwhile (the bucket counted as loaded): those would sit in the wheel twice, and
one that fired and was dispatched between the two pushes would fire again.
"""

from __future__ import annotations

import logging
import threading

from qclient.server.store import record as rec
from qclient.server.store._shared import MAX_WAIT_S, Shared

log = logging.getLogger(__name__)

_MSG = rec.KIND_MESSAGE
_CANCEL = rec.KIND_CANCEL
_LOAD_CHUNK = 20_000  # entries merged per hold of the scheduler lock


class _Load:
    """One bucket's load in progress, kept across failed attempts."""

    __slots__ = ("bucket", "cursor", "done", "entries", "fired", "seen")

    def __init__(self, bucket: int, cursor: int):
        self.bucket = bucket
        self.cursor = cursor  # schedule-file bytes this load reads (the rest is pushed)
        self.entries: list[tuple[int, int, int, int]] | None = None  # None: not read yet
        self.fired: set[int] = set()
        self.done = 0  # entries merged so far
        self.seen: set[int] = set()  # positions pushed (a replayed entry may repeat)


class Loader:
    """The loader thread's loop; woken early when a record lands in a bucket due soon."""

    def __init__(self, sh: Shared):
        self._sh = sh
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._load: _Load | None = None

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
        """Load (or go on loading) the earliest unloaded bucket that starts within
        load_ahead_ms; False if none."""
        sh = self._sh
        w = sh.wheel
        slog, dlog = sh.files.slog, sh.files.dlog
        load = self._load
        if load is None:
            with sh.sched:
                target = (sh.clock() + sh.config.load_ahead_ms) // sh.bucket_ms
                b = w.start_load(target)
                if b is None:
                    return False
                load = self._load = _Load(b, slog.size(b))
        b = load.bucket
        if load.entries is None:
            entries = slog.entries(b, load.cursor)
            load.fired = dlog.positions(b)
            with sh.sched:
                w.note_entries(b, entries, _CANCEL)
            load.entries = entries
        entries, fired, seen = load.entries, load.fired, load.seen
        while load.done < len(entries):
            with sh.sched:
                notify = False
                end = load.done + _LOAD_CHUNK
                for d, pos, size, kind in entries[load.done : end]:
                    if kind != _MSG or pos in seen or pos in fired or w.is_cancelled(b, pos):
                        continue
                    seen.add(pos)
                    notify |= w.push(d, pos, size)
                load.done = end
                if notify:
                    sh.sooner_due()
        with sh.sched:
            w.finish_load(b)
        self._load = None
        sh.stats["loaded_buckets"] += 1
        sh.stats["loaded_entries"] += len(seen)
        return True
