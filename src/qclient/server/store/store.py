"""DelayStore: the delay broker's durable storage engine.

Design (QMQ delay-server, seeds 000/002, adapted)::

    submit() --encode, dedupe--> queue --committer: write + ONE fdatasync per group-->
        message log (segmented, CRC'd) --replay--> schedule log (file per time bucket)
                                              \\--> wheel (if the bucket is loaded)
    loader: load_ahead_ms before a bucket starts, schedule log - dispatch log -> wheel
    firing thread: sleeps until the earliest due entry (woken early by a sooner one),
        pops due entries, preads the records, appends them to the consume logs
    syncer: group-fdatasync of the consume logs (>= sync_interval_ms apart), then makes
        the new offsets visible to pull(), then writes the dispatch log, then wakes
        listeners; every checkpoint_interval_ms: fsync schedule/dispatch files, write the
        replay checkpoint (tmp + fsync + rename), flush consumer offsets, remove buckets
        fully fired ``retain_fired_ms`` ago.

Durability: a submit's future completes only after its records are fdatasync'd (when
``config.fsync``; one fsync per group: while one runs, new submissions queue up for the
next). Everything derived (schedule entries, wheel, dedupe table, consume index) is
rebuilt on open from the message log, from the checkpointed replay offset (schedule files
are fsync'd before the checkpoint advances); a torn tail (bad length or CRC) is cut off.
Write order on fire -- consume record, its fsync, then the dispatch record -- means a crash
can only re-fire, never lose; on open, the consume logs' last seconds are reconciled into
the dispatch log, so even a ``kill -9`` mid-fire rarely duplicates (0 in our tests).

Cancel writes a tombstone record (durable like a message) that the replayer turns into a
cancel entry in the message's bucket; the firing thread skips cancelled positions. "Has
it fired?" is answered without per-message state: in flight (popped, not yet dispatched)
or in the bucket's dispatch log (an aligned ``bytes.find``); a generation counter makes
that check atomic with the syncer.

Dedupe: ``msg_id`` -> position of the original record (see dedupe.py, ~130 B per id); a
hit returns the original result read back from the log. On open it is rebuilt from the
newest segments, at most ``dedupe_max_ids`` ids within ``dedupe_window_ms``.

Memory: the dedupe table, plus ~50 B per wheel entry (only loaded buckets, i.e. messages
due within about ``load_ahead_ms + bucket_ms``), plus small per-bucket bookkeeping. No
message body stays in memory after its group commit. For sustained high rates prefer
small buckets (e.g. ``bucket_ms=60_000, load_ahead_ms=30_000``) over QMQ's hour.

Locks: ``_submit_lock`` (queue, in-flight ids, dedupe table) may be taken before
``_sched`` (wheel, schedule log appends, bucket states; see wheel.py for the loading
discipline), never after; ``_sync_cv`` (fired work for the syncer) is never held with
either. Big groups are handled in chunks so no lock is held long (the firing thread
needs ``_sched``). Blocking calls: submit/cancel/pull do small preads in the caller's
thread; cancel of an id no longer in the dedupe table reads its bucket's schedule file.

GIL note for the lead: firing lateness is dominated by how fast the firing thread gets
the GIL back when it wakes. With the default ``sys.setswitchinterval(0.005)`` a busy
thread (e.g. the asyncio loop decoding a big batch) can delay it up to ~5 ms; setting
``sys.setswitchinterval(0.001)`` in the broker process trades a little throughput for
lower p99 lateness. The store does not change it (it is process-global).

Retention: message-log segments are removed oldest first once nothing needs them (see
``_retain_segments``; one long-delayed message pins the segments after it). Not done:
consume-log retention (kept forever); a record is limited to 16 MiB and the log to 1 TiB
(wheel entry packing); each consume queue keeps two fds open.
"""

from __future__ import annotations

import collections
import fcntl
import json
import logging
import operator
import os
import threading
import time
from array import array
from collections.abc import Callable, Iterable
from concurrent.futures import Future

import msgspec

from qclient.server.store import record as rec
from qclient.server.store._files import atomic_write, check_name, check_queue_id, sync_fds
from qclient.server.store.consume_log import ConsumeLogs, ConsumeQueue
from qclient.server.store.dedupe import _MASK60, DedupeTable, id_hash
from qclient.server.store.dispatch_log import DispatchLog
from qclient.server.store.message_log import MessageLog
from qclient.server.store.offsets import OffsetStore
from qclient.server.store.schedule_log import ENTRY, ScheduleLog
from qclient.server.store.types import (
    CancelOutcome,
    FiredMessage,
    InvalidRecordError,
    NewMessage,
    StoreBusyError,
    StoreConfig,
    StoreError,
    StoreResult,
)
from qclient.server.store.wheel import MAX_POSITION, MAX_SIZE, Wheel

log = logging.getLogger(__name__)

_MAX_WAIT_S = 0.05  # firing/loader threads re-check the clock at least this often
_FIRE_BATCH = 4096
_LOAD_CHUNK = 20_000
_LOCK_CHUNK = 2048  # entries handled per lock hold in the committer
_RECOVER_REPLAY_BATCH = 4096
_DELAY_SLACK_MS = 60_000
_MSG = rec.KIND_MESSAGE
_CANCEL = rec.KIND_CANCEL
_TOPIC = operator.attrgetter("topic")
_DELIVER_AT = operator.attrgetter("deliver_at_ms")


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class _Entry(msgspec.Struct, eq=False):
    """One record on its way through the group commit (a msgspec Struct: built in C, ~3x
    cheaper than a slotted class with an ``__init__``; ``eq=False``: compared by identity)."""

    kind: int
    msg_id: str
    h: int
    data: bytes
    queue_id: int
    deliver_at: int
    ref: int = 0
    index: int = 0  # the record's place in its submit() call
    position: int = -1
    error: BaseException | None = None


class _Batch:
    """One submit() (or cancel) call: its future and how to build its results."""

    __slots__ = ("cancel", "deps", "entries", "fut", "nbytes", "results")

    def __init__(self, n: int, *, cancel: bool = False):
        self.fut: Future[object] = Future()
        self.results: list[StoreResult | None] = [None] * n
        self.entries: list[_Entry] = []  # new records, each knowing its index
        self.deps: list[tuple[int, _Entry]] = []  # duplicates of in-flight entries
        self.cancel = cancel
        self.nbytes = 0  # encoded bytes counted in the store's pending bytes

    def complete(self) -> None:
        entries, deps = self.entries, self.deps
        self.entries, self.deps = [], []  # the future's result outlives the batch's entries
        for e in entries:
            if e.error is not None:
                self.fut.set_exception(e.error)
                return
        for _, e in deps:
            if e.error is not None:
                self.fut.set_exception(e.error)
                return
        if self.cancel:
            self.fut.set_result(CancelOutcome(True, None))
            return
        res = self.results
        if len(entries) == len(res):  # the common case: every message new
            self.results = []
            res = [StoreResult(e.msg_id, e.queue_id, e.deliver_at, False) for e in entries]
        else:
            for e in entries:
                res[e.index] = StoreResult(e.msg_id, e.queue_id, e.deliver_at, False)
        for i, e in deps:
            res[i] = StoreResult(e.msg_id, e.queue_id, e.deliver_at, True)
        self.fut.set_result(res)


class DelayStore:
    """Durable store of delayed messages that fires each at its time (see module doc)."""

    def __init__(self, config: StoreConfig, *, clock_ms: Callable[[], int] = wall_clock_ms):
        self.config = config
        self._clock = clock_ms
        self._state = "new"
        self._state_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._submit_cv = threading.Condition(self._submit_lock)
        self._queue: list[_Batch] = []
        self._pending = 0
        self._pending_bytes = 0
        self._orphans: dict[int, float] = {}  # cleaned bucket -> wall time to drop its dispatch
        self._bucket_first: dict[int, int] = {}  # bucket -> lowest log position it refers to
        self._inflight: dict[str, _Entry] = {}
        self._sched = threading.Lock()
        self._fire_cv = threading.Condition(self._sched)
        self._sync_cv = threading.Condition(threading.Lock())
        self._sync_work: list[tuple[list[ConsumeQueue], dict[int, list[int]], set[str]]] = []
        self._listeners: list[Callable[[set[str]], None]] = []
        self._stats: collections.Counter[str] = collections.Counter()
        self._lateness: collections.deque[int] = collections.deque(maxlen=8192)
        self._stop_load = threading.Event()
        self._load_wake = threading.Event()
        self._stop_commit = False
        self._stop_fire = False
        self._stop_sync = False
        self._broken: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._replayed = 0
        self._ckpt_written = -1
        self._lock_fd = -1
        self.bucket_ms = config.bucket_ms
        self._topics_ok: set[str] = set()
        self._max_ahead_ms = config.max_delay_ms + _DELAY_SLACK_MS
        self._max_record = min(config.max_record_bytes, MAX_SIZE)
        self._max_pending_bytes = config.max_pending_bytes

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Recover the data directory, then start the background threads."""
        with self._state_lock:
            if self._state != "new":
                raise StoreError("a DelayStore can be opened once")
            self._state = "opening"
        cfg = self.config
        d = cfg.data_dir
        d.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(d / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._state = "closed"
            raise StoreError(f"data directory {d} is in use by another store") from None
        t0 = time.monotonic()
        parts: list[MessageLog | ScheduleLog | DispatchLog | ConsumeLogs] = []
        try:
            self._read_meta()
            self._mlog = MessageLog(d / "commitlog", cfg.segment_bytes, fsync=cfg.fsync)
            self._slog = ScheduleLog(d / "schedule", fsync=cfg.fsync)
            self._dlog = DispatchLog(d / "dispatch", fsync=cfg.fsync)
            self._cl = ConsumeLogs(d / "consume", fsync=cfg.fsync)
            parts = [self._mlog, self._slog, self._dlog, self._cl]
            self._offsets = OffsetStore(d / "offsets.json", fsync=cfg.fsync)
            self._wheel = Wheel(self.bucket_ms)
            self._dedupe = DedupeTable(cfg.dedupe_window_ms, cfg.dedupe_max_ids)
            self._mlog.open()
            self._offsets.load()
            self._recover()
        except BaseException as exc:
            log.error("opening the store at %s failed: %s", d, exc)
            for part in parts:
                try:
                    part.close()
                except Exception:
                    log.debug("close after failed open", exc_info=True)
            os.close(self._lock_fd)
            self._state = "closed"
            if isinstance(exc, (OSError, ValueError)):
                raise StoreError(f"cannot open the store at {d}: {exc}") from exc
            raise
        log.info(
            "store %s opened in %.0f ms: log end %d, %d ids remembered, %d due in wheel",
            d,
            (time.monotonic() - t0) * 1000,
            self._mlog.end,
            len(self._dedupe),
            len(self._wheel.heap),
        )
        for name, target in (
            ("committer", self._commit_loop),
            ("firing", self._fire_loop),
            ("syncer", self._sync_loop),
            ("loader", self._load_loop),
        ):
            t = threading.Thread(target=target, name=f"store-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self._state = "open"

    def _read_meta(self) -> None:
        path = self.config.data_dir / "meta.json"
        try:
            meta = json.loads(path.read_bytes())
            if not isinstance(meta, dict) or not isinstance(meta.get("bucket_ms"), int):
                raise ValueError(f"{path} is not a store meta file")
            stored = meta["bucket_ms"]
            if stored <= 0:
                raise ValueError(f"{path}: bad bucket_ms")
            if stored != self.config.bucket_ms:
                log.warning("data dir was created with bucket_ms=%d; keeping it", stored)
            self.bucket_ms = stored
        except FileNotFoundError:
            data = json.dumps({"version": 1, "bucket_ms": self.bucket_ms}).encode()
            atomic_write(path, data, fsync=self.config.fsync)

    def close(self) -> None:
        """Stop cleanly: drain the group commit and the firing pipeline, checkpoint, fsync.
        Idempotent."""
        with self._state_lock:
            if self._state in ("closed", "closing", "new"):
                self._state = "closed" if self._state == "new" else self._state
                return
            self._state = "closing"
        by_name = {t.name: t for t in self._threads}
        self._stop_load.set()
        self._load_wake.set()
        by_name["store-loader"].join()
        with self._submit_cv:
            self._stop_commit = True
            self._submit_cv.notify_all()
        by_name["store-committer"].join()
        with self._fire_cv:
            self._stop_fire = True
            self._fire_cv.notify_all()
        by_name["store-firing"].join()
        with self._sync_cv:
            self._stop_sync = True
            self._sync_cv.notify_all()
        by_name["store-syncer"].join()
        try:
            self._checkpoint()
            self._offsets.flush()
        finally:
            self._mlog.close()
            self._slog.close()
            self._dlog.close()
            self._cl.close()
            os.close(self._lock_fd)
            self._state = "closed"
        log.info("store %s closed", self.config.data_dir)

    def __enter__(self) -> DelayStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._state != "open":
            raise StoreError(f"store is {self._state}")
        if self._broken is not None:
            raise StoreError(f"store failed: {self._broken}")

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        cfg = self.config
        now = self._clock()
        mlog = self._mlog
        replay_from = 0
        try:
            replay_from = int(
                json.loads((cfg.data_dir / "checkpoint.json").read_bytes())["replay_offset"]
            )
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError):
            log.error("unreadable checkpoint.json: replaying the whole message log")
        replay_from = min(replay_from, mlog.end)
        buckets = self._slog.recover()
        for b in buckets:
            self._wheel.add_unloaded(b)
        for b in buckets:
            head = self._slog.read(b, ENTRY.size)
            if head:
                self._bucket_first[b] = min(ENTRY.unpack(head)[1], replay_from)
        for b in self._dlog.recover():
            if not self._slog.size(b):  # bucket cleaned before the stop: orphan
                mt = self._dlog.mtime(b) or time.time()
                self._orphans[b] = mt + cfg.dedupe_window_ms / 1000
        segs = mlog.segments()
        last_base = segs[-1][0] if segs else 0
        batch: list[tuple[int, int, int, int, int]] = []
        torn_at = None
        for pos, r, n in mlog.scan(replay_from):
            if r is None:
                if pos >= last_base:
                    torn_at = pos
                    break
                log.error("corrupt record at position %d in a sealed segment; rest skipped", pos)
                self._stats["corrupt_records"] += 1
                continue
            batch.append((pos, n, r.kind, r.deliver_at_ms, r.ref))
            if len(batch) >= _RECOVER_REPLAY_BATCH:
                self._replay(batch, pos + n)
                batch = []
        if torn_at is not None:
            log.warning(
                "message log: cutting a torn tail of %d bytes at %d", mlog.end - torn_at, torn_at
            )
            self._stats["torn_bytes_cut"] += mlog.end - torn_at
            mlog.truncate(torn_at)
        self._replay(batch, mlog.end)
        self._rebuild_dedupe(now - cfg.dedupe_window_ms)
        self._dedupe.expire(now)
        # fired copies whose dispatch record may not have been written before the stop
        recent = self._cl.open_all()
        by_bucket: dict[int, list[int]] = collections.defaultdict(list)
        for r in recent:
            by_bucket[r.deliver_at_ms // self.bucket_ms].append(r.ref)
        for b, positions in by_bucket.items():
            if self._slog.size(b):
                known = self._dlog.positions(b)
                missing = [p for p in positions if p not in known]
                if missing:
                    self._dlog.add(b, missing)
                    self._stats["dispatch_reconciled"] += len(missing)
        self._checkpoint()
        while self._load_step():
            pass

    def _rebuild_dedupe(self, cutoff: int) -> None:
        """Remember the ids of the newest messages received after ``cutoff``: segments are
        read newest first and only until ``dedupe_max_ids`` ids are found, so a restart
        after a busy hour does not read the whole hour back."""
        mlog = self._mlog
        need = self.config.dedupe_max_ids
        found: list[tuple[array[int], array[int], array[int]]] = []
        total = 0
        for base, size, mtime in reversed(mlog.segments()):
            if mtime * 1000 < cutoff or total >= need:
                break  # last written before the window: it cannot hold a remembered id
            hs, ps, ts = array("q"), array("q"), array("q")
            for pos, r, _n in mlog.scan(base):
                if r is None or pos >= base + size:
                    break
                if r.kind == _MSG and r.received_ms >= cutoff:
                    hs.append(id_hash(r.msg_id))
                    ps.append(pos)
                    ts.append(r.received_ms)
            found.append((hs, ps, ts))
            total += len(hs)
        add = self._dedupe.add
        for hs, ps, ts in reversed(found):
            for h, p, t in zip(hs, ps, ts, strict=True):
                add(h, p, t)

    # ------------------------------------------------------------------ submit
    def _validate(self, m: NewMessage, now: int) -> bytes:
        topic = m.topic
        if topic not in self._topics_ok:
            try:
                check_name(topic)
            except ValueError as exc:
                raise InvalidRecordError(str(exc)) from None
            if len(self._topics_ok) < 10_000:
                self._topics_ok.add(topic)
        q = m.queue_id
        if type(q) is not int or not 0 <= q < 65536:
            raise InvalidRecordError("invalid queue id")
        mid = m.msg_id
        if type(mid) is not str or not 0 < len(mid) <= 1024:
            raise InvalidRecordError("msg_id must be a non-empty string of at most 1024 chars")
        d = m.deliver_at_ms
        if type(d) is not int or not 0 <= d <= now + self._max_ahead_ms:
            raise InvalidRecordError("deliver_at_ms out of range")
        body = m.body
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidRecordError("body must be bytes")
            body = bytes(body)
        try:
            data = rec.encode(
                _MSG,
                mid,
                topic,
                body,
                flag=m.flag,
                queue_id=q,
                received_ms=m.received_ms or now,
                deliver_at_ms=d,
                key=m.key,
                tags=m.tags,
                properties=m.properties,
            )
        except (ValueError, TypeError, AttributeError, UnicodeEncodeError) as exc:
            raise InvalidRecordError(f"bad message: {exc}") from None
        if len(data) > self._max_record:
            raise InvalidRecordError("message too large")
        return data

    def _encode_validated(
        self, msgs: list[NewMessage], now: int, names: Iterable[str] | None = None
    ) -> list[bytes] | None:
        """Records of messages the caller has already validated (``submit(validated=True)``):
        only what the caller's checks do not cover is checked here (topic names, once per
        topic; record size). None when a message needs the full :meth:`_validate` (it has
        key, tags or properties, or something is off: then _validate names the problem).
        ``names``: the messages' distinct topics, if the caller has them."""
        topics: dict[str, bytes] = {}
        for topic in set(map(_TOPIC, msgs)) if names is None else names:
            if topic not in self._topics_ok:
                return None
            topics[topic] = topic.encode()
        try:
            out = rec.encode_messages(msgs, topics, now)
        except Exception:
            return None
        if (
            out is None
            or max(map(len, out)) > self._max_record
            or min(map(_DELIVER_AT, msgs)) < 0  # the codec takes negative times
        ):
            return None
        return out

    def submit(
        self,
        msgs: list[NewMessage],
        *,
        validated: bool = False,
        topics: Iterable[str] | None = None,
    ) -> Future[list[StoreResult]]:
        """Store messages; the future completes once they are durable (see module doc).

        ``validated``: the caller has checked queue ids (0..65535), ids (non-empty str of
        at most 1024 chars), bodies (bytes) and deliver times (0..now + max_delay_ms)
        already; the store then skips those checks (topic names and record sizes are
        still checked). ``topics`` (with ``validated``): the distinct topics of ``msgs``
        when the caller has collected them already (exactly those, no others). Raises
        InvalidRecordError (nothing of the call is stored), StoreBusyError, StoreError.
        """
        self._check_open()
        now = self._clock()
        datas = self._encode_validated(msgs, now, topics) if validated and msgs else None
        if datas is None:
            datas = [self._validate(m, now) for m in msgs]
        batch = _Batch(len(msgs))
        entries = batch.entries
        inflight = self._inflight
        dedupe_get = self._dedupe.get
        with self._submit_lock:
            self._check_open()
            for i, (m, data) in enumerate(zip(msgs, datas, strict=True)):
                mid = m.msg_id
                e = inflight.get(mid)
                if e is not None:
                    batch.deps.append((i, e))
                    continue
                h = hash(mid) & _MASK60  # dedupe.id_hash, inlined
                pos = dedupe_get(h)
                if pos is not None:
                    r = self._mlog.read_record(pos)
                    if r is not None and r.kind == _MSG and r.msg_id == mid:
                        batch.results[i] = StoreResult(mid, r.queue_id, r.deliver_at_ms, True)
                        continue
                e = _Entry(_MSG, mid, h, data, m.queue_id, m.deliver_at_ms, 0, i)
                inflight[mid] = e
                entries.append(e)
            n = len(entries)
            nbytes = sum(map(len, datas)) if n == len(datas) else sum(len(e.data) for e in entries)
            if n and (
                self._pending + n > self.config.max_pending_messages
                or (self._pending_bytes and self._pending_bytes + nbytes > self._max_pending_bytes)
            ):
                for e in entries:
                    del inflight[e.msg_id]
                self._stats["busy_rejections"] += 1
                raise StoreBusyError("too many messages pending the group commit")
            self._stats["duplicates"] += len(msgs) - n
            if n or batch.deps:
                batch.nbytes = nbytes
                self._queue.append(batch)
                self._pending += n
                self._pending_bytes += nbytes
                self._submit_cv.notify()
        if not (n or batch.deps):
            batch.complete()
        return batch.fut  # type: ignore[return-value]

    # ------------------------------------------------------------------ committer
    def _commit_loop(self) -> None:
        while True:
            with self._submit_cv:
                while not self._queue and not self._stop_commit:
                    self._submit_cv.wait()
                if not self._queue:
                    return
                group, self._queue = self._queue, []
            try:
                self._commit(group)
            except BaseException as exc:  # never leave a future hanging
                log.exception("group commit failed")
                self._fail(group, StoreError(f"commit failed: {exc}"))

    def _fail(self, group: list[_Batch], error: BaseException) -> None:
        with self._submit_lock:
            for b in group:
                for e in b.entries:
                    if e.position < 0:
                        e.error = error
                        if self._inflight.get(e.msg_id) is e:
                            del self._inflight[e.msg_id]
                        self._pending -= 1
                self._pending_bytes -= b.nbytes
                b.nbytes = 0
        for b in group:
            if not b.fut.done():
                b.complete()

    def _commit(self, group: list[_Batch]) -> None:
        entries = [e for b in group for e in b.entries]
        if entries:
            start = self._mlog.end
            try:
                positions = self._mlog.append([e.data for e in entries])
                self._mlog.sync()
            except OSError as exc:
                log.error("message log write failed: %s", exc)
                try:
                    self._mlog.truncate(start)
                except OSError as exc2:
                    self._broken = exc2
                self._fail(group, StoreError(f"message log write failed: {exc}"))
                return
            self._stats["fsyncs"] += 1
            self._stats["groups"] += 1
            self._stats["appended"] += len(entries)
            items = []
            for e, pos in zip(entries, positions, strict=True):
                e.position = pos
                items.append((pos, len(e.data), e.kind, e.deliver_at, e.ref))
                e.data = b""
            try:
                self._replay(items, self._mlog.end)
            except Exception as exc:
                # the records are durable: a restart replays them (the checkpoint stops here)
                log.exception("schedule replay failed; the store stops accepting work")
                self._broken = exc
            now = self._clock()
            nbytes = 0
            for b in group:
                nbytes += b.nbytes
                b.nbytes = 0
            inflight = self._inflight
            for i in range(0, len(entries), _LOCK_CHUNK):
                chunk = entries[i : i + _LOCK_CHUNK]
                msgs = [e for e in chunk if e.kind == _MSG]
                hashes = [e.h for e in msgs]
                where = [e.position for e in msgs]
                with self._submit_lock:
                    for e in msgs:
                        if inflight.get(e.msg_id) is e:
                            del inflight[e.msg_id]
                    self._dedupe.add_many(hashes, where, now)
                    self._pending -= len(chunk)
            with self._submit_lock:
                self._dedupe.expire(now)
                self._pending_bytes -= nbytes
        for b in group:
            b.complete()

    def _replay(self, items: list[tuple[int, int, int, int, int]], end: int) -> None:
        """Append schedule entries for new log records; push loaded ones into the wheel.

        Works in chunks so that a huge group never holds the scheduler lock for long (the
        firing thread needs it); each chunk's file appends and wheel pushes are atomic with
        respect to the loader's cursor."""
        if end > MAX_POSITION:
            raise StoreError("message log beyond 1 TiB: segment retention is not implemented")
        horizon = self._clock() + self.config.load_ahead_ms
        wake_loader = False
        w = self._wheel
        bucket_ms = self.bucket_ms
        pack = ENTRY.pack
        for i in range(0, max(1, len(items)), _LOCK_CHUNK):
            bufs: dict[int, list[bytes]] = {}
            loaded: dict[int, bool] = {}  # bucket -> is_loaded (fixed while _sched is held)
            notify = False
            with self._sched:
                first = self._bucket_first
                for pos, size, kind, deliver_at, ref in items[i : i + _LOCK_CHUNK]:
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
                        elif not wake_loader and deliver_at <= horizon:
                            wake_loader = True
                    elif kind == _CANCEL:
                        buf.append(pack(deliver_at, ref, size, _CANCEL))
                        w.cancel(b, ref)
                        if loaded[b]:
                            w.note_position(b, pos)
                for b, chunks in bufs.items():
                    self._slog.append(b, b"".join(chunks))
                if i + _LOCK_CHUNK >= len(items):
                    self._replayed = end
                if notify:
                    self._fire_cv.notify()
        if wake_loader:
            self._load_wake.set()

    # ------------------------------------------------------------------ loader
    def _load_loop(self) -> None:
        while not self._stop_load.is_set():
            try:
                while self._load_step() and not self._stop_load.is_set():
                    pass
            except Exception:
                log.exception("bucket loading failed; retrying")
            self._load_wake.wait(_MAX_WAIT_S)
            self._load_wake.clear()

    def _load_step(self) -> bool:
        """Load the earliest unloaded bucket that starts within load_ahead_ms; False if none."""
        w = self._wheel
        with self._sched:
            target = (self._clock() + self.config.load_ahead_ms) // self.bucket_ms
            first = w.earliest_unloaded()
            if first is None or first > target:
                if target > w.loaded_upto:
                    w.loaded_upto = target
                    w.loaded_extra = {x for x in w.loaded_extra if x > target}
                return False
            b = first
            w.take_unloaded(b)
            w.loading = b
            cursor = self._slog.size(b)
        try:
            entries = self._slog.entries(b, cursor)
            fired = self._dlog.positions(b)
        except BaseException:
            with self._sched:
                w.loading = None
                w.add_unloaded(b)
            raise
        with self._sched:
            st = w.state_for(b)
            for _d, pos, _size, kind in entries:
                if kind == _CANCEL:
                    w.cancel(b, pos)
                if pos > st.max_pos:
                    st.max_pos = pos
        seen: set[int] = set()
        for i in range(0, len(entries), _LOAD_CHUNK):
            with self._sched:
                notify = False
                for d, pos, size, kind in entries[i : i + _LOAD_CHUNK]:
                    if kind != _MSG or pos in seen or pos in fired or w.is_cancelled(b, pos):
                        continue
                    seen.add(pos)
                    notify |= w.push(d, pos, size)
                if notify:
                    self._fire_cv.notify()
        with self._sched:
            w.loaded_extra.add(b)
            w.loading = None
        self._stats["loaded_buckets"] += 1
        self._stats["loaded_entries"] += len(seen)
        return True

    # ------------------------------------------------------------------ firing
    def _fire_loop(self) -> None:
        while not self._stop_fire:
            try:
                self._fire_step()
            except Exception:  # a bug must not silently stop all firing
                log.exception("firing loop error")
                self._stats["fire_errors"] += 1
                time.sleep(0.1)

    def _fire_step(self) -> None:
        """Wait until something is due (or a sooner entry arrives), then fire it."""
        w = self._wheel
        with self._fire_cv:
            while True:
                if self._stop_fire:
                    return
                now = self._clock()
                due = w.pop_due(now, _FIRE_BATCH)
                if due:
                    break
                nxt = w.next_due()
                timeout = _MAX_WAIT_S if nxt is None else min(_MAX_WAIT_S, (nxt - now) / 1000)
                if timeout > 0:
                    self._fire_cv.wait(timeout)
        try:
            self._fire(due, now)
        except Exception:
            log.exception("firing %d messages failed; they will be retried", len(due))
            self._stats["fire_errors"] += 1
            with self._sched:
                for d, pos, size in due:
                    w.unfire(d, pos, size)
            time.sleep(0.1)

    def _fire(self, due: list[tuple[int, int, int]], now: int) -> None:
        fired_at = max(now, self._clock())
        by_q: dict[tuple[str, int], list[tuple[bytes, int, int]]] = collections.defaultdict(list)
        dispatch: dict[int, list[int]] = collections.defaultdict(list)
        lateness = self._lateness
        read = self._mlog.read
        names_ok: set[str] = set()  # topics that passed check_name in this call
        for d, pos, size in due:
            raw = read(pos, size)
            dispatch[d // self.bucket_ms].append(pos)
            try:
                route = rec.verify_route(raw)
                if route.kind != _MSG or route.deliver_at_ms != d:
                    raise rec.CorruptRecord("not the scheduled message")
                if route.topic not in names_ok:
                    names_ok.add(check_name(route.topic))
            except (rec.CorruptRecord, ValueError) as exc:
                log.error("schedule entry at %d: %s; dropped", pos, exc)
                self._stats["corrupt_records"] += 1
                continue
            by_q[(route.topic, route.queue_id)].append((raw, pos, fired_at))
            lateness.append(fired_at - d)
        queues = []
        for (topic, qid), items in by_q.items():
            q = self._cl.get(topic, qid, create=True)
            assert q is not None
            q.append(items)
            queues.append(q)
        self._stats["fired"] += sum(len(v) for v in by_q.values())
        with self._sync_cv:
            self._sync_work.append((queues, dispatch, {t for t, _ in by_q}))
            self._sync_cv.notify()

    # ------------------------------------------------------------------ syncer
    def _sync_loop(self) -> None:
        cfg = self.config
        period = cfg.checkpoint_interval_ms / 1000
        next_ckpt = time.monotonic() + period
        last_sync = 0.0
        while True:
            with self._sync_cv:
                while not self._sync_work and not self._stop_sync:
                    left = next_ckpt - time.monotonic()
                    if left <= 0:
                        break
                    self._sync_cv.wait(left)
                stopping = self._stop_sync
            gap = cfg.sync_interval_ms / 1000 - (time.monotonic() - last_sync)
            if gap > 0 and cfg.fsync and not stopping:
                time.sleep(gap)  # let a group of fired messages accumulate
            with self._sync_cv:
                work, self._sync_work = self._sync_work, []
            try:
                if work:
                    self._sync_fired(work)
                    last_sync = time.monotonic()
                if time.monotonic() >= next_ckpt:
                    next_ckpt = time.monotonic() + period
                    self._checkpoint()
                    self._offsets.flush()
                    self._cleanup()
            except Exception as exc:
                # fired copies may not be durable or dispatched: they fire again after a
                # restart (at-least-once); refuse new work rather than guess
                log.exception("syncer step failed; the store stops accepting work")
                self._stats["sync_errors"] += 1
                self._broken = exc
                time.sleep(0.1)
            if stopping:
                with self._sync_cv:
                    if not self._sync_work:
                        return

    def _sync_fired(
        self, work: list[tuple[list[ConsumeQueue], dict[int, list[int]], set[str]]]
    ) -> None:
        queues = {id(q): q for qs, _, _ in work for q in qs}
        synced = [(q, q.sync()) for q in queues.values()]
        if synced and self.config.fsync:
            self._stats["consume_fsyncs"] += len(synced)
        for q, upto in synced:
            q.publish(upto)
        merged: dict[int, list[int]] = collections.defaultdict(list)
        topics: set[str] = set()
        for _, dispatch, ts in work:
            topics |= ts
            for b, positions in dispatch.items():
                merged[b].extend(positions)
        for b, positions in merged.items():
            self._dlog.add(b, positions)
        with self._sched:
            for b, positions in merged.items():
                self._wheel.dispatched(b, positions)
        if topics:
            for cb in list(self._listeners):
                try:
                    cb(topics)
                except Exception:
                    log.exception("fire listener failed")

    def _checkpoint(self) -> None:
        """fsync schedule/dispatch files, then advance the replay checkpoint."""
        if self._broken is not None:
            return  # keep the last good checkpoint: a restart replays from it
        with self._sched:
            replayed = self._replayed
            fds = self._slog.take_dirty()
        sync_fds(fds)
        sync_fds(self._dlog.take_dirty())
        if replayed != self._ckpt_written:
            data = json.dumps({"version": 1, "replay_offset": replayed}).encode()
            atomic_write(self.config.data_dir / "checkpoint.json", data, fsync=self.config.fsync)
            self._ckpt_written = replayed

    def _cleanup(self) -> None:
        """Remove buckets fully fired long enough ago (and covered by the checkpoint).

        A bucket holding cancels is kept until the dedupe window has passed too, so that a
        repeated cancel still answers "already_cancelled" (not "already_fired") for as long
        as the id can be found."""
        if self._broken is not None:
            return
        now = self._clock()
        w = self._wheel
        removed = 0
        retain = self.config.retain_fired_ms
        retain_cancels = retain + self.config.dedupe_window_ms
        with self._sched:
            for b in list(w.state):
                st = w.state[b]
                end = (b + 1) * self.bucket_ms
                if (
                    st.outstanding <= 0
                    and w.loading != b
                    and w.is_loaded(b)
                    and end + (retain_cancels if w.cancelled.get(b) else retain) < now
                    and st.max_pos < self._ckpt_written
                ):
                    self._slog.remove(b)
                    self._bucket_first.pop(b, None)
                    if self._dlog.size(b):
                        self._dlog.touch(b)
                        self._orphans[b] = time.time() + self.config.dedupe_window_ms / 1000
                    w.drop(b)
                    removed += 1
            self._sweep_orphans()
            pins = [self._ckpt_written, *self._bucket_first.values()]
        self._stats["buckets_removed"] += removed
        self._retain_segments(min(pins))

    def _retain_segments(self, limit: int) -> None:
        """Delete the oldest message-log segments that nothing needs any more: wholly
        before the replay checkpoint and every schedule file's lowest position, and not
        written within the dedupe window (ids there can still be looked up). Prefix only:
        one long-delayed message keeps every later segment (QMQ copies messages into its
        schedule log to avoid that; future work)."""
        cutoff_s = (self._clock() - self.config.dedupe_window_ms) / 1000
        for base, end in self._mlog.segment_bounds():
            if end > limit:
                break
            try:
                if os.path.getmtime(self._mlog.segment_path(base)) >= cutoff_s:
                    limit = base
                    break
            except FileNotFoundError:
                continue
        n = self._mlog.delete_segments_before(limit)
        if n:
            self._stats["segments_removed"] += n
            log.info("message log: removed %d old segment(s) before position %d", n, limit)

    def _sweep_orphans(self) -> None:
        """Remove dispatch files whose bucket was cleaned more than a dedupe window ago
        (called with ``_sched`` held)."""
        wall = time.time()
        for b, expiry in list(self._orphans.items()):
            if self._slog.size(b) or b in self._wheel.state:
                del self._orphans[b]  # recreated by a late message: live again
            elif wall > expiry:
                self._dlog.remove(b)
                del self._orphans[b]

    # ------------------------------------------------------------------ cancel
    def _locate(self, topic: str, msg_id: str, deliver_at_ms: int) -> tuple[int, rec.Record] | None:
        with self._submit_lock:
            pos = self._dedupe.get(id_hash(msg_id))
        if pos is not None:
            r = self._mlog.read_record(pos)
            if r is not None and r.kind == _MSG and r.msg_id == msg_id and r.topic == topic:
                return pos, r
        b = deliver_at_ms // self.bucket_ms
        for d, p, size, kind in self._slog.find(b, deliver_at_ms=deliver_at_ms):
            if kind == _MSG and d == deliver_at_ms:
                r = self._mlog.read_record(p, size)
                if r is not None and r.kind == _MSG and r.msg_id == msg_id and r.topic == topic:
                    return p, r
        return None

    def cancel(self, topic: str, msg_id: str, deliver_at_ms: int) -> Future[CancelOutcome]:
        """Cancel a scheduled message (durable tombstone) if it has not fired yet."""
        self._check_open()
        try:
            check_name(topic)
        except ValueError as exc:
            raise InvalidRecordError(str(exc)) from None
        if not isinstance(deliver_at_ms, int) or deliver_at_ms < 0:
            raise InvalidRecordError("deliver_at_ms out of range")
        done: Future[CancelOutcome] = Future()
        found = self._locate(topic, msg_id, deliver_at_ms)
        if found is None:
            done.set_result(CancelOutcome(False, "not_found"))
            return done
        pos, r = found
        w = self._wheel
        b = r.deliver_at_ms // self.bucket_ms

        def cancel_on_disk() -> bool:
            return any(k == _CANCEL for *_, k in self._slog.find(b, position=pos))

        gen = w.dispatch_gen
        on_disk_cancel = cancel_on_disk()  # usually without the lock ...
        on_disk_fired = self._dlog.contains(b, pos)
        with self._sched:
            if w.dispatch_gen != gen:
                # ... but a dispatch write raced with the reads: read the dispatch log
                # again, now that nothing can leave ``firing`` before we decide. A cancel
                # entry appended since the first read came with ``w.cancel`` in the same
                # lock hold, so ``is_cancelled`` below covers it without re-reading the
                # whole schedule file; only a cancel seen before is read again (the
                # bucket may have been cleaned up meanwhile)
                on_disk_fired = self._dlog.contains(b, pos)
                if on_disk_cancel:
                    on_disk_cancel = cancel_on_disk()
            reason = None
            if on_disk_cancel or w.is_cancelled(b, pos):
                reason = "already_cancelled"
            elif on_disk_fired or pos in w.firing or not self._slog.size(b):
                reason = "already_fired"  # (no schedule file left: fired, cleaned up)
            else:
                w.cancel(b, pos)  # from now on the firing thread skips it
        if reason is not None:
            done.set_result(CancelOutcome(False, reason))
            return done
        data = rec.encode(
            _CANCEL,
            msg_id,
            topic,
            b"",
            queue_id=r.queue_id,
            received_ms=self._clock(),
            deliver_at_ms=r.deliver_at_ms,
            ref=pos,
        )
        batch = _Batch(1, cancel=True)
        e = _Entry(_CANCEL, msg_id, 0, data, r.queue_id, r.deliver_at_ms, ref=pos)
        batch.entries.append(e)
        batch.nbytes = len(data)
        with self._submit_lock:
            try:
                self._check_open()  # the committer drains what is queued before it stops
            except StoreError:
                with self._sched:
                    w.cancelled.get(b, set()).discard(pos)
                raise
            self._queue.append(batch)
            self._pending += 1
            self._pending_bytes += batch.nbytes
            self._submit_cv.notify()
        self._stats["cancelled"] += 1
        return batch.fut  # type: ignore[return-value]

    # ------------------------------------------------------------------ consume
    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int) -> list[FiredMessage]:
        """Fired messages of a queue from ``offset`` (only durable ones are visible)."""
        check_name(topic)
        check_queue_id(queue_id)
        if max_messages <= 0:
            return []
        q = self._cl.get(topic, queue_id, create=False)
        return q.read(offset, max_messages) if q is not None else []

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next offset to be made visible in the queue."""
        check_name(topic)
        check_queue_id(queue_id)
        q = self._cl.get(topic, queue_id, create=False)
        return q.visible if q is not None else 0

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._offsets.commit(group, topic, queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        check_name(group, "group")
        check_name(topic)
        check_queue_id(queue_id)
        return self._offsets.get(group, topic, queue_id)

    def add_fire_listener(self, cb: Callable[[set[str]], None]) -> None:
        """``cb(topics)`` runs on the syncer thread when messages become pullable."""
        self._listeners.append(cb)

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, int | float]:
        s: dict[str, int | float] = dict.fromkeys(
            (
                "appended",
                "duplicates",
                "fsyncs",
                "groups",
                "fired",
                "cancelled",
                "loaded_buckets",
                "consume_fsyncs",
                "busy_rejections",
                "corrupt_records",
            ),
            0,
        )
        s.update(self._stats)
        with self._sched:
            s["wheel_size"] = len(self._wheel.heap)
            s["active_buckets"] = len(self._wheel.state)
            s["unloaded_buckets"] = len(self._wheel.unloaded)
        s["pending"] = self._pending
        s["pending_bytes"] = self._pending_bytes
        s["dedupe_ids"] = len(self._dedupe)
        s["log_bytes"] = self._mlog.end
        s["avg_group_size"] = s["appended"] / s["groups"] if s["groups"] else 0.0
        lat = sorted(self._lateness)
        if lat:
            s["lateness_p50_ms"] = lat[len(lat) // 2]
            s["lateness_p99_ms"] = lat[min(len(lat) - 1, len(lat) * 99 // 100)]
            s["lateness_max_ms"] = lat[-1]
        return s
