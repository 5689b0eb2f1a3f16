"""Group commit: queued submissions are written together and made durable by one fsync.

While one group's ``fdatasync`` runs, new submissions queue up for the next group; a
submission's future completes only after its records are durable (when ``config.fsync``).
Groups are committed by the committer thread, or by a caller that queued its submissions
with ``defer`` and commits them itself (:meth:`Committer.commit_pending`: the broker's
event loop, which saves the thread hand-offs); one group at a time either way.
After the fsync the group's messages are added to the id index, then the records are
replayed into the schedule log and wheel and remembered in the dedupe table (a reschedule's
copy replays as the new schedule entry plus a cancel of the replaced one).
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from qclient.server.store import record as rec
from qclient.server.store._files import NO_SPACE
from qclient.server.store._shared import LOCK_CHUNK, Shared
from qclient.server.store.batch import Batch, Entry, NowBatch, too_late
from qclient.server.store.replay import Item, Replayer
from qclient.server.store.types import (
    DiskFullError,
    NewMessage,
    StoreBusyError,
    StoreError,
    StoreResult,
)

log = logging.getLogger(__name__)

_MSG = rec.KIND_MESSAGE
_CANCEL = rec.KIND_CANCEL
_RESCHEDULE = rec.KIND_RESCHEDULE
_SCHEDULING = rec.SCHEDULING_KINDS
_MSG_ID = operator.attrgetter("msg_id")
_DATA = operator.attrgetter("data")
_DELIVER_AT = operator.attrgetter("deliver_at")
_HASH = operator.attrgetter("h")
_POSITION = operator.attrgetter("position")
#: what a submit takes: NewMessages, or messages given with their deliver times
_Message = NewMessage | rec.WireFields


class Committer:
    """The submission queue, the in-flight ids and the committer thread's loop."""

    def __init__(self, sh: Shared, replayer: Replayer, check_open: Callable[[], None]):
        self._sh = sh
        self._replayer = replayer
        self._check_open = check_open
        self._cv = threading.Condition(sh.submit_lock)
        self._queue: list[Batch] = []
        # one group commit at a time, whichever thread runs it; taken before the queue
        # is emptied, so a group taken first is also committed (and completed) first
        self._commit_lock = threading.Lock()
        self._inflight: dict[str, Entry] = {}
        self._stop = False
        self.pending = 0  # records queued or being committed
        self.pending_bytes = 0
        self._max_pending = sh.config.max_pending_messages
        self._max_pending_bytes = sh.config.max_pending_bytes

    def submit(
        self,
        msgs: Sequence[_Message],
        datas: list[bytes],
        *,
        deliver_ats: list[int],
        defer: bool = False,
        refuse_after_ms: int | None = None,
    ) -> Future[list[StoreResult]]:
        """Queue the encoded records ``datas`` of ``msgs``, answering duplicates (in flight
        or in the dedupe table) with the original's result. ``defer``: do not wake the
        committer thread; the caller commits soon (:meth:`commit_pending`) or wakes it
        (:meth:`wake`). ``refuse_after_ms``: see ``DelayStore.submit``. ``deliver_ats``:
        the messages' deliver times."""
        batch = Batch(len(msgs))
        batch.refuse_after = refuse_after_ms
        self._queue_batch(batch, msgs, datas, defer, deliver_ats)
        return batch.fut  # type: ignore[return-value]

    def store_now(
        self,
        msgs: Sequence[_Message],
        datas: list[bytes],
        deliver_ats: list[int],
        refuse_after_ms: int | None = None,
    ) -> list[StoreResult]:
        """:meth:`submit` and :meth:`commit_pending` on the calling thread in one: the
        results once durable; raises what submit raises, or the group's error."""
        if len(msgs) == 1:
            one = self._store_one(msgs[0], deliver_ats[0], datas[0], refuse_after_ms)
            if one is not None:
                return one
        batch = NowBatch(len(msgs))
        batch.refuse_after = refuse_after_ms
        self._queue_batch(batch, msgs, datas, True, deliver_ats)
        if not batch.done():
            self.commit_pending()
        outcome = batch.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]

    def _store_one(
        self, m: _Message, deliver_at: int, data: bytes, refuse_after: int | None
    ) -> list[StoreResult] | None:
        """:meth:`store_now` of one message in one pass, as its own group: the same
        checks, tables, counters, file writes and outcome as the general path, without
        its batch, queue and per-group lists. None (nothing done): the id is in flight,
        let the general path make it wait for that record."""
        sh = self._sh
        inflight = self._inflight
        mid = m.msg_id
        n = len(data)
        # the commit lock first, so that no other thread can complete a duplicate waiting
        # on this record (see _queue_batch) before the record is written
        with self._commit_lock:
            with sh.submit_lock:
                self._check_open()
                if mid in inflight:
                    return None
                h, pos = sh.dedupe.find(mid)
                if pos is not None:
                    r = sh.files.mlog.read_record(pos)
                    if r is not None and r.kind in _SCHEDULING and r.msg_id == mid:
                        sh.stats["duplicates"] += 1
                        return [StoreResult(mid, r.queue_id, r.deliver_at_ms, True)]
                if self.pending + 1 > self._max_pending or (
                    self.pending_bytes and self.pending_bytes + n > self._max_pending_bytes
                ):
                    sh.stats["busy_rejections"] += 1
                    raise StoreBusyError("too many messages pending the group commit")
                e = Entry(_MSG, mid, h, data, m.queue_id, deliver_at)
                inflight[mid] = e
                self.pending += 1
                self.pending_bytes += n
            error = self._write_one(e, refuse_after)
            if error is not None:
                with sh.submit_lock:
                    e.error = error
                    if inflight.get(mid) is e:
                        del inflight[mid]
                    self.pending -= 1
                    self.pending_bytes -= n
                raise error
            pos = e.position
            stats = sh.stats
            stats["fsyncs"] += 1
            stats["groups"] += 1
            stats["appended"] += 1
            try:
                if sh.files.ids is not None:
                    sh.files.ids.add_stored([(mid, pos, deliver_at)])
                self._replayer.replay([(pos, n, _MSG, deliver_at, 0)], sh.files.mlog.end)
            except Exception as exc:
                log.exception("schedule replay failed; the store stops accepting work")
                sh.broken = exc
            stats["stored"] += 1
            now = sh.clock()
            with sh.submit_lock:
                if inflight.get(mid) is e:
                    del inflight[mid]
                sh.dedupe.add(h, pos, now)
                self.pending -= 1
                sh.dedupe.expire(now)
                self.pending_bytes -= n
        return [StoreResult(mid, e.queue_id, deliver_at, False)]

    def _write_one(self, e: Entry, refuse_after: int | None) -> BaseException | None:
        """Append and sync one record (the commit lock held): sets its position, or
        returns the error that fails it (nothing of it kept)."""
        sh = self._sh
        if refuse_after is not None:
            now = sh.clock()
            if now > refuse_after:
                sh.stats["deadline_refusals"] += 1
                return too_late(now - refuse_after)
        mlog = sh.files.mlog
        start = mlog.end
        try:
            (e.position,) = mlog.append([e.data])
            synced = time.perf_counter()
            mlog.sync()
            if sh.config.fsync:
                sh.fsync_seconds["message_log"].observe(time.perf_counter() - synced)
        except OSError as exc:
            return self._write_failed(exc, start)
        return None

    def _write_failed(self, exc: OSError, start: int) -> StoreError:
        """Cut the message log back to ``start`` after a failed write; the error."""
        sh = self._sh
        log.error("message log write failed: %s", exc)
        try:
            sh.files.mlog.truncate(start)
        except OSError as exc2:
            sh.broken = exc2
        if exc.errno in NO_SPACE:
            return DiskFullError(f"no space left for the message log: {exc}")
        return StoreError(f"message log write failed: {exc}")

    def _queue_batch(
        self,
        batch: Batch,
        msgs: Sequence[_Message],
        datas: list[bytes],
        defer: bool,
        deliver_ats: list[int],
    ) -> None:
        sh = self._sh
        entries = batch.entries
        inflight = self._inflight
        read_record = sh.files.mlog.read_record
        with sh.submit_lock:
            self._check_open()
            hashes, found = sh.dedupe.find_many(map(_MSG_ID, msgs))
            rows = zip(msgs, deliver_ats, datas, hashes, found, strict=True)
            for i, (m, at, data, h, pos) in enumerate(rows):
                mid = m.msg_id
                e = inflight.get(mid)
                if e is not None:
                    batch.deps.append((i, e))
                    continue
                if pos is not None:
                    r = read_record(pos)
                    if r is not None and r.kind in _SCHEDULING and r.msg_id == mid:
                        batch.results[i] = StoreResult(mid, r.queue_id, r.deliver_at_ms, True)
                        continue
                e = Entry(_MSG, mid, h, data, m.queue_id, at, 0, i)
                inflight[mid] = e
                entries.append(e)
            n = len(entries)
            nbytes = sum(map(len, datas)) if n == len(datas) else sum(len(e.data) for e in entries)
            if n and (
                self.pending + n > self._max_pending
                or (self.pending_bytes and self.pending_bytes + nbytes > self._max_pending_bytes)
            ):
                for e in entries:
                    del inflight[e.msg_id]
                sh.stats["busy_rejections"] += 1
                raise StoreBusyError("too many messages pending the group commit")
            sh.stats["duplicates"] += len(msgs) - n
            if n or batch.deps:
                batch.nbytes = nbytes
                self._queue.append(batch)
                self.pending += n
                self.pending_bytes += nbytes
                if not defer:
                    self._cv.notify()
        if not (n or batch.deps):
            batch.complete()

    def in_flight(self, msg_id: str) -> bool:
        """Whether a submit of ``msg_id`` is being committed (not yet indexed/replayed)."""
        with self._sh.submit_lock:
            return msg_id in self._inflight

    def enqueue(self, batch: Batch) -> None:
        """Queue a batch built by the caller (a cancel's tombstone); raises StoreError if
        the store is no longer open (what is queued before it stops is still committed)."""
        with self._sh.submit_lock:
            self._check_open()
            self._queue.append(batch)
            self.pending += len(batch.entries)
            self.pending_bytes += batch.nbytes
            self._cv.notify()

    def stop(self) -> None:
        """Let the loop commit what is queued, then return."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    def wake(self) -> None:
        """Hand what deferred submits queued to the committer thread."""
        with self._cv:
            if self._queue:
                self._cv.notify()

    def commit_pending(self) -> None:
        """Commit everything queued as one group on the calling thread; on return every
        submit made before the call is complete (durable, or failed)."""
        with self._commit_lock:
            with self._cv:
                group, self._queue = self._queue, []
            if group:
                self._commit_group(group)

    def run(self) -> None:
        """The committer thread."""
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if not self._queue:
                    return
            self.commit_pending()

    def _commit_group(self, group: list[Batch]) -> None:
        try:
            self._commit(group)
        except BaseException as exc:  # never leave a future hanging
            log.exception("group commit failed")
            self._fail(group, StoreError(f"commit failed: {exc}"))

    def _fail(self, group: list[Batch], error: BaseException) -> None:
        with self._sh.submit_lock:
            for b in group:
                for e in b.entries:
                    if e.position < 0:
                        e.error = error
                        if self._inflight.get(e.msg_id) is e:
                            del self._inflight[e.msg_id]
                        self.pending -= 1
                self.pending_bytes -= b.nbytes
                b.nbytes = 0
        for b in group:
            if not b.done():
                b.complete()

    def _expire(self, group: list[Batch]) -> list[Batch]:
        """The group without its batches whose ``refuse_after`` has passed (checked right
        before the append: they were queued behind a stall and their senders gave up on
        them); those fail with DeadlineExceededError, none of their records written.
        A duplicate waiting on one of their records fails with it (it was not stored
        either)."""
        now = self._sh.clock()
        keep: list[Batch] = []
        late: list[tuple[Batch, int]] = []
        for b in group:
            t = b.refuse_after
            if t is not None and now > t:
                late.append((b, now - t))
            else:
                keep.append(b)
        if not late:
            return group
        with self._sh.submit_lock:
            for b, past in late:
                err = too_late(past)
                for e in b.entries:
                    e.error = err
                    if self._inflight.get(e.msg_id) is e:
                        del self._inflight[e.msg_id]
                self.pending -= len(b.entries)
                self.pending_bytes -= b.nbytes
                b.nbytes = 0
                self._sh.stats["deadline_refusals"] += 1
        for b, _ in late:
            if not b.done():
                b.complete()
        return keep

    @staticmethod
    def _columns(
        entries: list[Entry], positions: list[int]
    ) -> tuple[list[Item], list[tuple[str, int, int]], int]:
        """Replay items, index entries and the count of new messages of a group's
        records (any kinds), each record's position set."""
        items: list[Item] = []
        indexed = []  # (msg_id, position, deliver_at) of the records the index keeps
        stored = 0
        for e, pos in zip(entries, positions, strict=True):
            e.position = pos
            kind = e.kind
            if kind == _RESCHEDULE:
                items.append((pos, len(e.data), _MSG, e.deliver_at, 0))
                items.append((pos, len(e.data), _CANCEL, e.prev_deliver_at, e.ref))
            else:
                items.append((pos, len(e.data), kind, e.deliver_at, e.ref))
                stored += kind == _MSG
            if kind != _CANCEL:
                indexed.append((e.msg_id, pos, e.deliver_at))
        return items, indexed, stored

    def _commit(self, group: list[Batch]) -> None:
        sh = self._sh
        group = self._expire(group)
        mlog = sh.files.mlog
        stats = sh.stats
        entries = [e for b in group for e in b.entries]
        if entries:
            start = mlog.end
            try:
                datas = list(map(_DATA, entries))
                sizes = list(map(len, datas))
                positions = mlog.append(datas, sizes)
                synced = time.perf_counter()
                mlog.sync()
                if sh.config.fsync:
                    sh.fsync_seconds["message_log"].observe(time.perf_counter() - synced)
            except OSError as exc:
                self._fail(group, self._write_failed(exc, start))
                return
            n = len(entries)
            stats["fsyncs"] += 1
            stats["groups"] += 1
            stats["appended"] += n
            deliver_ats = list(map(_DELIVER_AT, entries))
            new_only = all(not b.cancel for b in group)
            items: list[Item] = []
            if new_only:
                # only submit()s: every record a new message (no cancel, no reschedule),
                # so the replay and the index entries take columns
                for e, pos in zip(entries, positions, strict=True):
                    e.position = pos
                indexed = list(zip(map(_MSG_ID, entries), positions, deliver_ats, strict=True))
                stored = n
                scheduling = entries
            else:
                items, indexed, stored = self._columns(entries, positions)
                scheduling = [e for e in entries if e.kind in _SCHEDULING]
            try:
                # indexed before the replay offset passes them, so the checkpoint's fsync
                # of the index covers everything it has replayed
                if sh.files.ids is not None and indexed:
                    sh.files.ids.add_stored(indexed)
                if new_only:
                    self._replayer.replay_new(positions, sizes, deliver_ats, mlog.end)
                else:
                    self._replayer.replay(items, mlog.end)
            except Exception as exc:
                # the records are durable: a restart replays them (the checkpoint stops here)
                log.exception("schedule replay failed; the store stops accepting work")
                sh.broken = exc
            stats["stored"] += stored
            now = sh.clock()
            nbytes = 0
            for b in group:
                nbytes += b.nbytes
                b.nbytes = 0
            inflight = self._inflight
            dedupe = sh.dedupe
            m = len(scheduling)
            last = max(m, 1)
            for i in range(0, last, LOCK_CHUNK):
                chunk = scheduling if m <= LOCK_CHUNK else scheduling[i : i + LOCK_CHUNK]
                hashes = list(map(_HASH, chunk))
                where = list(map(_POSITION, chunk))
                with sh.submit_lock:
                    for e in chunk:
                        if inflight.get(e.msg_id) is e:
                            del inflight[e.msg_id]
                    dedupe.add_many(hashes, where, now)
                    if i + LOCK_CHUNK >= last:  # the last chunk
                        self.pending -= n
                        dedupe.expire(now)
                        self.pending_bytes -= nbytes
        for b in group:
            b.complete()
