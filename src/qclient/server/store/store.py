"""DelayStore: the delay broker's durable storage engine, wired from its stages.

docs/STORAGE.md is the map. In short: ``submit()`` -> intake (check, encode) ->
committer (group write + one fsync, then replay into the schedule log and wheel) ->
loader (buckets due soon into the wheel) -> firing (due entries into the consume logs)
-> syncer (fsync, make visible, dispatch log; checkpoint and retention). Recovery
rebuilds everything derived from the message log at open. Each stage owns its state;
:class:`~qclient.server.store._shared.Shared` holds what they share, and
:class:`~qclient.server.store.files.StoreFiles` every file on disk; ``datadir`` locks
the directory and keeps its ``meta.json``, ``stats`` reads what the store reports.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, cast

from qclient.server.store import cancel as _cancel
from qclient.server.store import stats as _stats
from qclient.server.store._files import check_name, check_queue_id
from qclient.server.store._shared import Shared
from qclient.server.store.checkpoint import Checkpoint
from qclient.server.store.committer import Committer
from qclient.server.store.datadir import lock_data_dir, read_bucket_ms
from qclient.server.store.due import DUE_BOUNDS_S, DueCounts, count_at_open
from qclient.server.store.files import StoreFiles
from qclient.server.store.firing import Firing
from qclient.server.store.histogram import Histogram
from qclient.server.store.intake import Intake
from qclient.server.store.lifecycle import Lifecycle
from qclient.server.store.loader import Loader
from qclient.server.store.record import WireFields
from qclient.server.store.recovery import recover
from qclient.server.store.replay import Replayer
from qclient.server.store.retention import Retention
from qclient.server.store.syncer import Syncer
from qclient.server.store.types import (
    CancelOutcome,
    FiredMessage,
    MessageStatus,
    NewMessage,
    RescheduleOutcome,
    StoreConfig,
    StoreError,
    StoreResult,
)

log = logging.getLogger(__name__)

_DELIVER_AT_MS = operator.attrgetter("deliver_at_ms")


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def accept_clock_ms() -> int:
    """Milliseconds since the epoch, rounded up: the base a relative delay is added to.
    Rounded down, ``now + delay_ms`` could fall up to 1 ms before the moment the broker
    accepted the message plus its delay, and it would be visible early."""
    return -(-time.time_ns() // 1_000_000)


class DelayStore:
    """Durable store of delayed messages that fires each at its time (see docs/STORAGE.md).

    Blocking calls: submit/cancel/pull do small preads in the caller's thread; cancel of
    an id no longer in the dedupe table reads its bucket's schedule file.
    """

    _sh: Shared
    _files: StoreFiles
    _committer: Committer
    _firing: Firing
    _syncer: Syncer
    _loader: Loader
    _lifecycle: Lifecycle

    def __init__(self, config: StoreConfig, *, clock_ms: Callable[[], int] = wall_clock_ms):
        self.config = config
        self._clock = clock_ms
        self._state = "new"
        self._state_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._lock_fd = -1
        self.bucket_ms = config.bucket_ms
        self._intake = Intake(config)
        self._scheduled_at_open = 0
        self._fire_wake: Callable[[], None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Recover the data directory, then start the background threads."""
        with self._state_lock:
            if self._state != "new":
                raise StoreError("a DelayStore can be opened once")
            self._state = "opening"
        d = self.config.data_dir
        try:
            self._lock_fd = lock_data_dir(d)
        except StoreError:
            self._state = "closed"
            raise
        t0 = time.monotonic()
        files: StoreFiles | None = None
        try:
            self.bucket_ms = read_bucket_ms(self.config)
            files = self._files = StoreFiles(self.config)
            self._wire(files)
            files.open()
            recover(self._sh, self._replayer, self._checkpoint, self._retention, self._loader)
        except BaseException as exc:
            log.error("opening the store at %s failed: %s", d, exc)
            if files is not None:
                try:
                    files.close()
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
            files.mlog.end,
            len(self._sh.dedupe),
            len(self._sh.wheel.heap),
        )
        self._scheduled_at_open = _stats.count_scheduled(self._sh, files)
        due = DueCounts()
        count_at_open(due, self._sh.wheel, files)
        self._sh.due = due
        for name, target in (
            ("committer", self._committer.run),
            ("firing", self._firing.run if self.config.firing_thread else None),
            ("syncer", self._syncer.run),
            ("loader", self._loader.run),
        ):
            if target is None:
                continue
            t = threading.Thread(target=target, name=f"store-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self._state = "open"

    def _wire(self, files: StoreFiles) -> None:
        """Build the stages over the shared state."""
        sh = self._sh = Shared(self.config, self._clock, self.bucket_ms, files)
        sh.fire_wake = self._fire_wake
        self._loader = Loader(sh)
        self._replayer = Replayer(sh, self._loader.wake)
        self._checkpoint = Checkpoint(sh, self._replayer)
        self._retention = Retention(sh, self._replayer, self._checkpoint)
        self._syncer = Syncer(sh, self._checkpoint, self._retention)
        self._firing = Firing(sh, self._syncer)
        self._committer = Committer(sh, self._replayer, self._check_open)
        self._lifecycle = Lifecycle(sh, self._committer)

    def close(self) -> None:
        """Stop cleanly: drain the group commit and the firing pipeline, checkpoint, fsync.
        Idempotent."""
        with self._state_lock:
            if self._state in ("closed", "closing", "new"):
                self._state = "closed" if self._state == "new" else self._state
                return
            self._state = "closing"
        by_name = {t.name: t for t in self._threads}
        # upstream first: each stage drains what the one before it handed over
        for name, stop in (
            ("loader", self._loader.stop),
            ("committer", self._committer.stop),
            ("firing", self._firing.stop),
            ("syncer", self._syncer.stop),
        ):
            stop()
            t = by_name.get(f"store-{name}")
            if t is not None:
                t.join()
        try:
            self._checkpoint.write()
            self._files.flush()
        finally:
            try:
                self._files.close()
            finally:
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
        if self._sh.broken is not None:
            raise StoreError(f"store failed: {self._sh.broken}")

    # ------------------------------------------------------------------ producing
    def submit(
        self,
        msgs: Sequence[NewMessage] | Sequence[WireFields],
        *,
        validated: bool = False,
        topics: Iterable[str] | None = None,
        defer: bool = False,
        refuse_after_ms: int | None = None,
        deliver_ats: list[int] | None = None,
    ) -> Future[list[StoreResult]]:
        """Store messages; the future completes once they are durable.

        ``validated``: the caller has checked queue ids (0..65535), ids (non-empty str of
        at most 1024 chars), bodies (bytes) and deliver times (0..now + max_delay_ms)
        already; the store then skips those checks (topic names and record sizes are
        still checked). ``topics`` (with ``validated``): the distinct topics of ``msgs``
        when the caller has collected them already (exactly those, no others). Raises
        InvalidRecordError (nothing of the call is stored), StoreBusyError, StoreError.
        ``defer``: queue without waking the committer thread; the caller then calls
        :meth:`commit_pending` (or :meth:`wake_committer`) soon. ``refuse_after_ms``: the
        store's clock time (ms) after which nothing of the call may be written; a group
        commit starting later fails it with DeadlineExceededError, storing none of it.
        ``deliver_ats`` (with ``validated``): the messages' deliver times, ``msgs`` being
        the caller's own objects with a NewMessage's other fields (not its deliver_at_ms
        and received_ms: the store's clock); stored as those NewMessages would be.
        """
        self._check_open()
        msgs, datas, deliver_ats = self._encode(msgs, validated, topics, deliver_ats)
        return self._committer.submit(
            msgs, datas, deliver_ats=deliver_ats, defer=defer, refuse_after_ms=refuse_after_ms
        )

    def _encode(
        self,
        msgs: Sequence[NewMessage] | Sequence[WireFields],
        validated: bool,
        topics: Iterable[str] | None,
        deliver_ats: list[int] | None,
    ) -> tuple[Sequence[Any], list[bytes], list[int]]:
        """The messages' records: ``(msgs, datas, deliver_ats)`` for the committer (the
        messages as NewMessages when those given with ``deliver_ats`` need the full
        checks; the deliver times from the NewMessages when not given)."""
        now = self._clock()
        if deliver_ats is not None:
            if not validated:
                raise ValueError("deliver_ats is for validated messages")
            plain = self._intake.encode_plain(msgs, deliver_ats, now, topics)
            if plain is not None:
                return msgs, plain, deliver_ats
            msgs = [
                NewMessage(
                    m.topic,
                    m.queue_id,
                    m.msg_id,
                    m.body,
                    d,
                    m.key,
                    m.tags,
                    m.properties,
                    m.flag,
                    now,
                )
                for m, d in zip(msgs, deliver_ats, strict=True)
            ]
        news = cast(list[NewMessage], msgs)
        datas = self._intake.encode(news, now, validated=validated, topics=topics)
        return news, datas, list(map(_DELIVER_AT_MS, news))

    def commit_pending(self) -> None:
        """Commit what is queued as one group on the calling thread (blocks for its write
        and fdatasync); every submit made before the call is complete on return."""
        self._committer.commit_pending()

    def store_now(
        self,
        msgs: Sequence[NewMessage] | Sequence[WireFields],
        *,
        validated: bool = False,
        topics: Iterable[str] | None = None,
        refuse_after_ms: int | None = None,
        deliver_ats: list[int] | None = None,
    ) -> list[StoreResult]:
        """``submit(defer=True)`` then :meth:`commit_pending`, returning the results once
        durable (no future is made); raises what submit raises, or the group's error."""
        self._check_open()
        msgs, datas, deliver_ats = self._encode(msgs, validated, topics, deliver_ats)
        return self._committer.store_now(msgs, datas, deliver_ats, refuse_after_ms)

    def wake_committer(self) -> None:
        """Hand what ``submit(defer=True)`` queued to the committer thread."""
        self._committer.wake()

    def cancel(self, topic: str, msg_id: str, deliver_at_ms: int) -> Future[CancelOutcome]:
        """Cancel a scheduled message (durable tombstone) if it has not fired yet."""
        self._check_open()
        return _cancel.cancel(self._sh, self._committer, topic, msg_id, deliver_at_ms)

    def lookup(self, topic: str, msg_id: str) -> MessageStatus | None:
        """The state and times of a message id (None if unknown); blocking, small reads."""
        self._check_open()
        return self._lifecycle.lookup(topic, msg_id)

    def cancel_id(self, topic: str, msg_id: str, hint_ms: int | None = None) -> CancelOutcome:
        """Cancel a message found by id (``hint_ms``: its deliver time, if known); blocks
        until the tombstone is durable."""
        self._check_open()
        return self._lifecycle.cancel(topic, msg_id, hint_ms)

    def reschedule(self, topic: str, msg_id: str, deliver_at_ms: int) -> RescheduleOutcome:
        """Move a scheduled message to ``deliver_at_ms`` atomically (one durable record);
        blocks until it is durable."""
        self._check_open()
        return self._lifecycle.reschedule(topic, msg_id, deliver_at_ms)

    # ------------------------------------------------------------------ consuming
    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int) -> list[FiredMessage]:
        """Fired messages of a queue from ``offset`` (only durable ones are visible)."""
        check_name(topic)
        check_queue_id(queue_id)
        if max_messages <= 0:
            return []
        q = self._files.consume.get(topic, queue_id, create=False)
        return q.read(offset, max_messages) if q is not None else []

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next offset to be made visible in the queue."""
        check_name(topic)
        check_queue_id(queue_id)
        q = self._files.consume.get(topic, queue_id, create=False)
        return q.visible if q is not None else 0

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._files.offsets.commit(group, topic, queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        check_name(group, "group")
        check_name(topic)
        check_queue_id(queue_id)
        return self._files.offsets.get(group, topic, queue_id)

    def add_fire_listener(self, cb: Callable[[dict[str, int]], None]) -> None:
        """``cb(topics)`` runs when messages become pullable (``topics``: topic -> the
        earliest deliver time among them): on the thread that fired
        them (with ``visible_before_sync``), else on the syncer thread."""
        self._syncer.add_listener(cb)

    # ------------------------------------------------------------------ driven firing
    def set_fire_wake(self, cb: Callable[[], None] | None) -> None:
        """With ``firing_thread`` off: ``cb()`` runs (any thread, under the store's
        scheduler lock: it must only schedule a call) when an entry due sooner than the
        earliest arrives; then call :meth:`fire_due`."""
        self._fire_wake = cb
        if self._state != "new":
            self._sh.fire_wake = cb

    def fire_due(self) -> float | None:
        """With ``firing_thread`` off: fire what is due now (never before its time);
        returns the seconds until the next call is wanted (0: more is due now), or None
        once the store is closing."""
        if self._state != "open":
            return None if self._state in ("closing", "closed") else 0.05
        return self._firing.fire_due()

    # ------------------------------------------------------------------ stats
    def consume_lag(self) -> dict[tuple[str, str], int]:
        """Visible messages past each group's committed offsets, per ``(topic, group)``
        (the queues a group has committed on)."""
        return _stats.consume_lag(self._files)

    def due_within(self, bounds_s: Sequence[int] = DUE_BOUNDS_S) -> list[int]:
        """Scheduled messages due within each of ``bounds_s`` seconds from now (by the
        second; overdue ones in every bound), then all of them: cumulative counts."""
        due = self._sh.due if self._state == "open" else None
        if due is None:
            return [0] * (len(bounds_s) + 1)
        return due.within(self._clock(), bounds_s)

    def histograms(self) -> dict[str, Histogram]:
        """Fire lateness (ms) and fsync durations (seconds, ``fsync_<file>``)."""
        return _stats.histograms(self._sh)

    def stats(self) -> dict[str, int | float]:
        """Counters and gauges (see :func:`~qclient.server.store.stats.stats`)."""
        return _stats.stats(
            self._sh, self._files, self._committer, self._firing, self._scheduled_at_open
        )
