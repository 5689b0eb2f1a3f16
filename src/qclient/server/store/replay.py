"""Replay: message-log records -> schedule-log entries, and wheel entries when loaded.

Runs on the committer thread after each group's fsync, and at open over the log past the
checkpoint. It owns the replay offset (how far the log has been replayed) and each
bucket's lowest referenced log position (what segment retention must keep).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import repeat

from qclient.server.store import record as rec
from qclient.server.store._shared import LOCK_CHUNK, Shared
from qclient.server.store.schedule_log import ENTRY
from qclient.server.store.types import StoreError
from qclient.server.store.wheel import MAX_POSITION

_MSG = rec.KIND_MESSAGE
_CANCEL = rec.KIND_CANCEL

# (position, size, kind, deliver_at_ms, ref) of one message-log record
Item = tuple[int, int, int, int, int]


class Replayer:
    """Appends schedule entries for new records and pushes loaded ones into the wheel."""

    def __init__(self, sh: Shared, wake_loader: Callable[[], None]):
        self._sh = sh
        self._wake_loader = wake_loader
        self.replayed = 0  # log position replayed up to (read under ``sched``)
        self._bucket_first: dict[int, int] = {}  # bucket -> lowest log position it refers to

    def note_first(self, b: int, position: int) -> None:
        """Bucket ``b`` refers to log ``position`` (call under ``sched`` once threads run)."""
        fp = self._bucket_first.get(b)
        if fp is None or position < fp:
            self._bucket_first[b] = position

    def forget(self, b: int) -> None:
        """Bucket ``b``'s files are removed: it pins no log position (under ``sched``)."""
        self._bucket_first.pop(b, None)

    def lowest_positions(self) -> Iterable[int]:
        """Each bucket's lowest referenced position (under ``sched``)."""
        return self._bucket_first.values()

    def replay_new(
        self, positions: list[int], sizes: list[int], deliver_ats: list[int], end: int
    ) -> None:
        """:meth:`replay` of new messages only (``(position, size, KIND_MESSAGE,
        deliver_at, 0)`` items, given as columns), with the same result. A group whose
        messages share one bucket (a batch sent with one delay) is replayed in C loops:
        one packed append, and wheel pushes only when the bucket is loaded."""
        n = len(positions)
        bucket_ms = self._sh.bucket_ms
        b = deliver_ats[0] // bucket_ms if n else 0
        if (
            not 0 < n <= LOCK_CHUNK
            or end > MAX_POSITION
            or any(d // bucket_ms != b for d in deliver_ats)
        ):
            self.replay(list(zip(positions, sizes, repeat(_MSG), deliver_ats, repeat(0))), end)
            return
        sh = self._sh
        w = sh.wheel
        data = b"".join(map(ENTRY.pack, deliver_ats, positions, sizes, repeat(_MSG)))
        first = self._bucket_first
        low = min(positions)
        with sh.sched:
            fp = first.get(b)
            if fp is None or low < fp:
                first[b] = low
            loaded = w.is_loaded(b)
            if not loaded:
                w.add_unloaded(b)
            notify = False
            if loaded:
                push = w.push
                for d, pos, size in zip(deliver_ats, positions, sizes, strict=True):
                    notify |= push(d, pos, size)
            sh.files.slog.append(b, data)
            self.replayed = end
            if notify:
                sh.sooner_due()
        if sh.due is not None:
            sh.due.add(deliver_ats)
        if not loaded and min(deliver_ats) <= sh.clock() + sh.config.load_ahead_ms:
            self._wake_loader()

    def replay(self, items: list[Item], end: int) -> None:
        """Append schedule entries for new log records; push loaded ones into the wheel;
        the replay offset becomes ``end``.

        Works in chunks so that a huge group never holds the scheduler lock for long (the
        firing thread needs it); each chunk's file appends and wheel pushes are atomic with
        respect to the loader's cursor."""
        if end > MAX_POSITION:
            raise StoreError("message log beyond 1 TiB: segment retention is not implemented")
        sh = self._sh
        horizon = -1  # when a due bucket starts loading: read once, if an entry needs it
        wake_loader = False
        w = sh.wheel
        slog = sh.files.slog
        bucket_ms = sh.bucket_ms
        pack = ENTRY.pack
        first = self._bucket_first
        for i in range(0, max(1, len(items)), LOCK_CHUNK):
            bufs: dict[int, list[bytes]] = {}
            loaded: dict[int, bool] = {}  # bucket -> is_loaded (fixed while sched is held)
            notify = False
            chunk = items if len(items) <= LOCK_CHUNK else items[i : i + LOCK_CHUNK]
            with sh.sched:
                for pos, size, kind, deliver_at, ref in chunk:
                    b = deliver_at // bucket_ms
                    p = pos if kind == _MSG else ref
                    fp = first.get(b)
                    if fp is None or p < fp:
                        first[b] = p
                    if kind != _MSG and kind != _CANCEL:
                        continue
                    buf = bufs.get(b)
                    if buf is None:
                        buf = bufs[b] = []
                        loaded[b] = w.is_loaded(b)
                        if not loaded[b]:
                            w.add_unloaded(b)
                    if kind == _MSG:
                        buf.append(pack(deliver_at, pos, size, _MSG))
                        if loaded[b]:
                            notify |= w.push(deliver_at, pos, size)
                        elif not wake_loader:
                            if horizon < 0:
                                horizon = sh.clock() + sh.config.load_ahead_ms
                            wake_loader = deliver_at <= horizon
                    elif kind == _CANCEL:
                        buf.append(pack(deliver_at, ref, size, _CANCEL))
                        w.cancel(b, ref)
                        if loaded[b]:
                            w.note_position(b, pos)
                for b, chunks in bufs.items():
                    slog.append(b, b"".join(chunks))
                if i + LOCK_CHUNK >= len(items):
                    self.replayed = end
                if notify:
                    sh.sooner_due()
        due = sh.due
        if due is not None:  # scheduled, and cancelled (a reschedule is both)
            due.add([d for _p, _s, kind, d, _r in items if kind == _MSG])
            due.add([d for _p, _s, kind, d, _r in items if kind == _CANCEL], -1)
        if wake_loader:
            self._wake_loader()
