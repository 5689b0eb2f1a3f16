"""Recovery at open: everything derived is rebuilt from the message log.

The schedule files are replayed from the checkpointed replay offset (a duplicated entry
is harmless: loading dedupes by position), a torn tail (bad length or CRC) is cut off, the
dedupe table is rebuilt from the newest segments, the id index gets the messages past the
checkpoint, the consume logs' last seconds are reconciled into the dispatch log (and the
id index's fired times) (so a ``kill -9`` mid-fire rarely re-fires), and the
buckets due soon are loaded into the wheel. Runs before the store's threads start.
"""

from __future__ import annotations

import collections
import logging
from array import array

from qclient.server.store import record as rec
from qclient.server.store._shared import Shared
from qclient.server.store.checkpoint import Checkpoint
from qclient.server.store.dedupe import id_hash
from qclient.server.store.id_index import FIRED, id_key
from qclient.server.store.loader import Loader
from qclient.server.store.replay import Item, Replayer
from qclient.server.store.retention import Retention
from qclient.server.store.schedule_log import ENTRY

log = logging.getLogger(__name__)

_MSG = rec.KIND_MESSAGE
_CANCEL = rec.KIND_CANCEL
_RESCHEDULE = rec.KIND_RESCHEDULE
_SCHEDULING = rec.SCHEDULING_KINDS
_REPLAY_BATCH = 4096  # records replayed per call


def recover(
    sh: Shared, replayer: Replayer, checkpoint: Checkpoint, retention: Retention, loader: Loader
) -> None:
    """Rebuild the schedule files, wheel, dedupe table and dispatch log of an open store."""
    files = sh.files
    mlog, slog, dlog = files.mlog, files.slog, files.dlog
    now = sh.clock()
    replay_from = min(checkpoint.read(), mlog.end)
    buckets = slog.recover()
    for b in buckets:
        sh.wheel.add_unloaded(b)
    for b in buckets:
        head = slog.read(b, ENTRY.size)
        if head:
            replayer.note_first(b, min(ENTRY.unpack(head)[1], replay_from))
    retention.recover_orphans(dlog.recover())
    ids = files.ids
    index_from = replay_from
    if ids is not None and not ids.recover() and mlog.end:
        index_from = 0  # an index newer than the data: built from the whole log once
    segs = mlog.segments()
    last_base = segs[-1][0] if segs else 0
    batch: list[Item] = []
    indexed: list[tuple[str, int, int]] = []
    torn_at = None
    for pos, r, n in mlog.scan(min(index_from, replay_from)):
        if r is None:
            if pos >= last_base:
                torn_at = pos
                break
            log.error("corrupt record at position %d in a sealed segment; rest skipped", pos)
            sh.stats["corrupt_records"] += 1
            continue
        if r.kind in _SCHEDULING:
            indexed.append((r.msg_id, pos, r.deliver_at_ms))
            if ids is not None and len(indexed) >= _REPLAY_BATCH:
                ids.add_stored(indexed)
                indexed = []
        if pos < replay_from:
            continue  # only indexed: the schedule files have it already
        if r.kind == _RESCHEDULE:
            batch.append((pos, n, _MSG, r.deliver_at_ms, 0))
            batch.append((pos, n, _CANCEL, r.qoffset, r.ref))
        else:
            batch.append((pos, n, r.kind, r.deliver_at_ms, r.ref))
        if len(batch) >= _REPLAY_BATCH:
            if ids is not None:  # indexed before replayed, as the committer does
                ids.add_stored(indexed)
            indexed = []
            replayer.replay(batch, pos + n)
            batch = []
    if torn_at is not None:
        log.warning(
            "message log: cutting a torn tail of %d bytes at %d", mlog.end - torn_at, torn_at
        )
        sh.stats["torn_bytes_cut"] += mlog.end - torn_at
        mlog.truncate(torn_at)
    if ids is not None:
        ids.add_stored(indexed)
    replayer.replay(batch, mlog.end)
    _rebuild_dedupe(sh, now - sh.config.dedupe_window_ms)
    sh.dedupe.expire(now)
    _reconcile_dispatch(sh)
    _clamp_offsets(sh)
    checkpoint.write()
    while loader.step():
        pass


def _clamp_offsets(sh: Shared) -> None:
    """Committed offsets past a queue's recovered end (its unsynced tail was lost after a
    consumer had pulled it) go back to that end, where the re-fired copies will land."""
    consume = sh.files.consume

    def end(topic: str, queue_id: int) -> int:
        q = consume.get(topic, queue_id, create=False)
        return q.next if q is not None else 0

    clamped = sh.files.offsets.clamp(end)
    if clamped:
        log.warning("%d committed consumer offsets were past their queue's end: lowered", clamped)
        sh.stats["offsets_clamped"] += clamped


def _reconcile_dispatch(sh: Shared) -> None:
    """Add fired copies whose dispatch record may not have been written before the stop."""
    files = sh.files
    by_bucket: dict[int, list[int]] = collections.defaultdict(list)
    recent = files.consume.open_all()
    for r in recent:
        by_bucket[r.deliver_at_ms // sh.bucket_ms].append(r.ref)
    if files.ids is not None:  # fired times the index may have missed (repeats are harmless)
        files.ids.add(FIRED, ((id_key(r.msg_id), r.ref, r.fired_at_ms) for r in recent))
    for b, positions in by_bucket.items():
        if files.slog.size(b):
            known = files.dlog.positions(b)
            missing = [p for p in positions if p not in known]
            if missing:
                files.dlog.add(b, missing)
                sh.stats["dispatch_reconciled"] += len(missing)


def _rebuild_dedupe(sh: Shared, cutoff: int) -> None:
    """Remember the ids of the newest messages received after ``cutoff``: segments are
    read newest first and only until ``dedupe_max_ids`` ids are found, so a restart after
    a busy hour does not read the whole hour back."""
    mlog = sh.files.mlog
    need = sh.config.dedupe_max_ids
    found: list[tuple[array[int], array[int], array[int]]] = []
    total = 0
    for base, size, mtime in reversed(mlog.segments()):
        if mtime * 1000 < cutoff or total >= need:
            break  # last written before the window: it cannot hold a remembered id
        hs, ps, ts = array("q"), array("q"), array("q")
        for pos, r, _n in mlog.scan(base):
            if r is None or pos >= base + size:
                break
            if r.kind in _SCHEDULING and r.received_ms >= cutoff:
                hs.append(id_hash(r.msg_id))
                ps.append(pos)
                ts.append(r.received_ms)
        found.append((hs, ps, ts))
        total += len(hs)
    add = sh.dedupe.add
    for hs, ps, ts in reversed(found):
        for h, p, t in zip(hs, ps, ts, strict=True):
            add(h, p, t)
