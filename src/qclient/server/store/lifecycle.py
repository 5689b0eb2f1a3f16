"""A message's lifecycle by id: lookup, cancel and reschedule.

The id index (``id_index.py``) gives every log position ever written for an id; the newest
one whose record really holds the id (and topic) is the message's current schedule. Its
state then comes from the same sources as a cancel's (``cancel.claim``): the bucket's
cancel entries and the wheel's cancelled set, the dispatch log and the firing set.

A reschedule is one durable record (``KIND_RESCHEDULE``: the message with its new deliver
time, pointing at the replaced record); replayed, it becomes the new schedule entry and a
cancel of the old one. Before it is written the old entry is claimed in the wheel (the
firing thread skips it), so the old time never fires even while the record is in the group
commit; if the write fails the claim is undone.

Operations on one id run one at a time (a per-id lock) and wait for a submit of that id
still in the group commit, so a cancel right after an acknowledged send -- or on a broker
resuming with the send's commit half done -- always sees the message.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from qclient.server.store import cancel as _cancel
from qclient.server.store import record as rec
from qclient.server.store._files import check_name
from qclient.server.store._shared import Shared
from qclient.server.store.batch import Batch, Entry
from qclient.server.store.committer import Committer
from qclient.server.store.dedupe import id_hash
from qclient.server.store.id_index import FIRED, STORED
from qclient.server.store.message_log import MessageLog
from qclient.server.store.types import (
    CancelOutcome,
    InvalidRecordError,
    MessageStatus,
    RescheduleOutcome,
    StoreError,
)

__all__ = ["Lifecycle"]

SCHEDULED = "scheduled"
FIRED_STATE = "fired"
CANCELLED = "cancelled"
_STATE_OF_REASON = {"already_fired": FIRED_STATE, "already_cancelled": CANCELLED}
_SETTLE_S = 5.0  # longest wait for a submit of the same id to leave the group commit


class Lifecycle:
    """Lookup / cancel / reschedule by id over one open store (thread-safe, blocking)."""

    def __init__(self, sh: Shared, committer: Committer):
        self._sh = sh
        self._committer = committer
        self._guard = threading.Lock()
        self._held: dict[str, _Slot] = {}

    @contextlib.contextmanager
    def _exclusive(self, msg_id: str) -> Iterator[None]:
        with self._guard:
            slot = self._held.get(msg_id)
            if slot is None:
                slot = self._held[msg_id] = _Slot()
            slot.users += 1
        try:
            with slot.lock:
                deadline = time.monotonic() + _SETTLE_S
                while self._committer.in_flight(msg_id) and time.monotonic() < deadline:
                    time.sleep(0.001)
                yield
        finally:
            with self._guard:
                slot.users -= 1
                if slot.users == 0:
                    del self._held[msg_id]

    def _locate(
        self, topic: str, msg_id: str, hint_ms: int | None
    ) -> tuple[int, rec.Record, int | None] | None:
        """``(position, record, fired_at_ms)`` of the id's current schedule, or None."""
        try:
            check_name(topic)
        except ValueError as exc:
            raise InvalidRecordError(str(exc)) from None
        sh = self._sh
        mlog = sh.files.mlog
        ids = sh.files.ids
        entries = ids.find(msg_id) if ids is not None else []
        for pos in sorted({p for p, kind, _ in entries if kind == STORED}, reverse=True):
            r = _read(mlog, pos)
            if r is not None and r.msg_id == msg_id and r.topic == topic:
                fired = [t for p, kind, t in entries if kind == FIRED and p == pos]
                return pos, r, max(fired) if fired else None
        # no index (or written before it existed): the dedupe window, then the hinted bucket
        with sh.submit_lock:
            recent = sh.dedupe.get(id_hash(msg_id))
        if recent is not None:
            r = _read(mlog, recent)
            if r is not None and r.msg_id == msg_id and r.topic == topic:
                return recent, r, None
        if hint_ms is not None:
            found = _cancel.locate(sh, topic, msg_id, hint_ms)
            if found is not None:
                return found[0], found[1], None
        return None

    def lookup(self, topic: str, msg_id: str) -> MessageStatus | None:
        """The id's state and times; None if this store does not know it."""
        with self._exclusive(msg_id):
            found = self._locate(topic, msg_id, None)
            if found is None:
                return None
            pos, r, fired_at = found
            reason = _cancel.claim(self._sh, r, pos, mark=False)
        state = SCHEDULED if reason is None else _STATE_OF_REASON[reason]
        return MessageStatus(
            state, r.queue_id, r.deliver_at_ms, fired_at if state == FIRED_STATE else None
        )

    def cancel(self, topic: str, msg_id: str, hint_ms: int | None = None) -> CancelOutcome:
        """Cancel the id's schedule (a durable tombstone) if it has not fired."""
        with self._exclusive(msg_id):
            found = self._locate(topic, msg_id, hint_ms)
            if found is None:
                return CancelOutcome(False, "not_found")
            pos, r, _ = found
            reason = _cancel.claim(self._sh, r, pos)
            if reason is not None:
                return CancelOutcome(False, reason)
            fut = _cancel.tombstone(self._sh, self._committer, topic, r, pos)
            self._settle(fut, r, pos)
        return CancelOutcome(True, None)

    def reschedule(self, topic: str, msg_id: str, deliver_at_ms: int) -> RescheduleOutcome:
        """Move the id's schedule to ``deliver_at_ms`` with one durable record."""
        if not isinstance(deliver_at_ms, int) or deliver_at_ms < 0:
            raise InvalidRecordError("deliver_at_ms out of range")
        sh = self._sh
        with self._exclusive(msg_id):
            found = self._locate(topic, msg_id, None)
            if found is None:
                return RescheduleOutcome(False, None)
            pos, r, _ = found
            reason = _cancel.claim(sh, r, pos)
            if reason is not None:
                return RescheduleOutcome(False, _STATE_OF_REASON[reason])
            try:
                data = rec.encode(
                    rec.KIND_RESCHEDULE,
                    msg_id,
                    topic,
                    r.body,
                    flag=r.flag,
                    queue_id=r.queue_id,
                    received_ms=sh.clock(),
                    deliver_at_ms=deliver_at_ms,
                    qoffset=r.deliver_at_ms,
                    ref=pos,
                    key=r.key,
                    tags=r.tags,
                    properties=r.properties,
                )
                batch = Batch(1, cancel=True)
                batch.entries.append(
                    Entry(
                        rec.KIND_RESCHEDULE,
                        msg_id,
                        id_hash(msg_id),
                        data,
                        r.queue_id,
                        deliver_at_ms,
                        ref=pos,
                        prev_deliver_at=r.deliver_at_ms,
                    )
                )
                batch.nbytes = len(data)
                self._committer.enqueue(batch)
            except (StoreError, ValueError):
                with sh.sched:
                    sh.wheel.uncancel(r.deliver_at_ms // sh.bucket_ms, pos)
                raise
            self._settle(batch.fut, r, pos)
            sh.stats["rescheduled"] += 1
        return RescheduleOutcome(True, None, r.queue_id, deliver_at_ms)

    def _settle(self, fut: Future[Any], r: rec.Record, pos: int) -> None:
        """Wait until the record claiming ``pos`` is durable; if its commit failed, give
        the old schedule back (it fires as before) and raise."""
        try:
            fut.result()
        except BaseException:
            sh = self._sh
            with sh.sched:
                sh.wheel.uncancel(r.deliver_at_ms // sh.bucket_ms, pos)
            raise


class _Slot:
    """The lock of one id in use, and how many callers hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


def _read(mlog: MessageLog, pos: int) -> rec.Record | None:
    """The scheduling record at ``pos``, or None (gone with its segment, or another kind)."""
    try:
        r = mlog.read_record(pos)
    except (OSError, ValueError):
        return None
    if r is None or r.kind not in rec.SCHEDULING_KINDS:
        return None
    return r
