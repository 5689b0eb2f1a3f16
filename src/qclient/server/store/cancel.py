"""Cancel: a durable tombstone record that the replayer turns into a cancel entry in the
message's bucket; the firing thread skips cancelled positions.

"Has it fired?" is answered without per-message state: in flight (popped, not yet
dispatched) or in the bucket's dispatch log (an aligned ``bytes.find``); the wheel's
dispatch generation makes that check atomic with the syncer. An id no longer in the
dedupe table is found by reading its bucket's schedule file (``deliver_at_ms`` names it).
"""

from __future__ import annotations

from concurrent.futures import Future

from qclient.server.store import record as rec
from qclient.server.store._files import check_name
from qclient.server.store._shared import Shared
from qclient.server.store.batch import Batch, Entry
from qclient.server.store.committer import Committer
from qclient.server.store.dedupe import id_hash
from qclient.server.store.types import CancelOutcome, InvalidRecordError, StoreError

_MSG = rec.KIND_MESSAGE
_CANCEL = rec.KIND_CANCEL


def _is_the_message(r: rec.Record, topic: str, msg_id: str) -> bool:
    """``r`` is a scheduling record of this message (an id-hash or bucket hit can be
    another message's)."""
    return r.kind in rec.SCHEDULING_KINDS and r.msg_id == msg_id and r.topic == topic


def locate(
    sh: Shared, topic: str, msg_id: str, deliver_at_ms: int
) -> tuple[int, rec.Record] | None:
    mlog, slog = sh.files.mlog, sh.files.slog
    with sh.submit_lock:
        pos = sh.dedupe.get(id_hash(msg_id))
    if pos is not None:
        r = mlog.read_record(pos)
        if r is not None and _is_the_message(r, topic, msg_id):
            return pos, r
    b = deliver_at_ms // sh.bucket_ms
    for d, p, size, kind in slog.find(b, deliver_at_ms=deliver_at_ms):
        if kind == _MSG and d == deliver_at_ms:
            r = mlog.read_record(p, size)
            if r is not None and _is_the_message(r, topic, msg_id):
                return p, r
    return None


def cancel(
    sh: Shared, committer: Committer, topic: str, msg_id: str, deliver_at_ms: int
) -> Future[CancelOutcome]:
    """Cancel a scheduled message (durable tombstone) if it has not fired yet."""
    try:
        check_name(topic)
    except ValueError as exc:
        raise InvalidRecordError(str(exc)) from None
    if not isinstance(deliver_at_ms, int) or deliver_at_ms < 0:
        raise InvalidRecordError("deliver_at_ms out of range")
    done: Future[CancelOutcome] = Future()
    found = locate(sh, topic, msg_id, deliver_at_ms)
    if found is None:
        done.set_result(CancelOutcome(False, "not_found"))
        return done
    pos, r = found
    reason = claim(sh, r, pos)
    if reason is not None:
        done.set_result(CancelOutcome(False, reason))
        return done
    return tombstone(sh, committer, topic, r, pos)


def claim(sh: Shared, r: rec.Record, pos: int, *, mark: bool = True) -> str | None:
    """Why the message ``r`` at ``pos`` can no longer be cancelled ("already_cancelled",
    "already_fired"), or None: it is scheduled, and (``mark``) from now on the firing
    thread skips it -- the caller must then write its tombstone (or ``uncancel``)."""
    w = sh.wheel
    slog, dlog = sh.files.slog, sh.files.dlog
    b = r.deliver_at_ms // sh.bucket_ms

    def cancel_on_disk() -> bool:
        return any(k == _CANCEL for *_, k in slog.find(b, position=pos))

    gen = w.dispatch_gen
    on_disk_cancel = cancel_on_disk()  # usually without the lock ...
    on_disk_fired = dlog.contains(b, pos)
    with sh.sched:
        if w.dispatch_gen != gen:
            # ... but a dispatch write raced with the reads: read the dispatch log again,
            # now that nothing can leave ``firing`` before we decide. A cancel entry
            # appended since the first read came with ``w.cancel`` in the same lock hold,
            # so ``is_cancelled`` below covers it without re-reading the whole schedule
            # file; only a cancel seen before is read again (the bucket may have been
            # cleaned up meanwhile)
            on_disk_fired = dlog.contains(b, pos)
            if on_disk_cancel:
                on_disk_cancel = cancel_on_disk()
        if on_disk_cancel or w.is_cancelled(b, pos):
            return "already_cancelled"
        if on_disk_fired or pos in w.firing or not slog.size(b):
            return "already_fired"  # (no schedule file left: fired, cleaned up)
        if mark:
            w.cancel(b, pos)  # from now on the firing thread skips it
    return None


def tombstone(
    sh: Shared, committer: Committer, topic: str, r: rec.Record, pos: int
) -> Future[CancelOutcome]:
    """Write the cancel record of the message ``r`` at ``pos`` (claimed by :func:`claim`)."""
    data = rec.encode(
        _CANCEL,
        r.msg_id,
        topic,
        b"",
        queue_id=r.queue_id,
        received_ms=sh.clock(),
        deliver_at_ms=r.deliver_at_ms,
        ref=pos,
    )
    batch = Batch(1, cancel=True)
    batch.entries.append(Entry(_CANCEL, r.msg_id, 0, data, r.queue_id, r.deliver_at_ms, ref=pos))
    batch.nbytes = len(data)
    try:
        committer.enqueue(batch)
    except StoreError:
        with sh.sched:
            sh.wheel.uncancel(r.deliver_at_ms // sh.bucket_ms, pos)
        raise
    sh.stats["cancelled"] += 1
    return batch.fut  # type: ignore[return-value]
