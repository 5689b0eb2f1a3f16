"""Firing: sleep until the earliest due wheel entry (woken early by a sooner one), pop
what is due, read the records back and append them to the consume logs, and (with
``visible_before_sync``) make them pullable and wake the fire listeners at once; the
syncer then makes them durable. An entry never fires before its ``deliver_at_ms``
minus ``StoreConfig.fire_ahead_ms`` (0 unless the owner holds messages until their time).

Two drivers: the store's own firing thread (:meth:`Firing.run`), or, with
``StoreConfig.firing_thread`` off, the store's owner calling :meth:`Firing.fire_due` at
the times it returns (the broker does so on its event loop: a pull waiting for the
fired messages is then answered in the same loop iteration, without a second thread's
wake-up, a cross-thread call and the GIL changing hands every millisecond).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from qclient.server.store import record as rec
from qclient.server.store._files import check_name
from qclient.server.store._shared import MAX_WAIT_S, Shared
from qclient.server.store.consume_log import ConsumeQueue
from qclient.server.store.syncer import Syncer

log = logging.getLogger(__name__)

_SCHEDULING = rec.SCHEDULING_KINDS
_FIRE_BATCH = 4096  # entries popped per wake-up
# entries fired per fire_due() call: the caller's event loop serves nothing meanwhile,
# so a backlog is fired in short steps with the loop's other work in between
_DRIVEN_BATCH = 256
_RETRY_S = 0.1  # a failed step is retried after this long
_READ_RUN_BYTES = 1 << 20  # adjacent records read together, at most this much at once
_LATENESS_KEPT = 8192  # the newest lateness samples kept for the stats


def _read_all(
    read: Callable[[int, int], bytes], due: list[tuple[int, int, int]]
) -> dict[int, bytes]:
    """The record at each due entry's position, read with one pread per run of adjacent
    records (messages sent together and due together lie side by side in the log): each
    pread releases and retakes the GIL, and with the event loop busy each retake can wait
    a switch interval, so a step of many single reads fired late."""
    out: dict[int, bytes] = {}
    spans = sorted((pos, size) for _, pos, size in due)
    i = 0
    while i < len(spans):
        start, size = spans[i]
        end = start + size
        j = i + 1
        while j < len(spans) and spans[j][0] == end and end - start < _READ_RUN_BYTES:
            end += spans[j][1]
            j += 1
        data = read(start, end - start) if j > i + 1 else b""
        if len(data) == end - start:  # one read served the run
            for pos, size in spans[i:j]:
                out[pos] = data[pos - start : pos - start + size]
        else:  # a single entry, or a run across a segment end: entry by entry
            for pos, size in spans[i:j]:
                out[pos] = read(pos, size)
        i = j
    return out


class Firing:
    """The firing thread's loop and its lateness samples."""

    def __init__(self, sh: Shared, syncer: Syncer):
        self._sh = sh
        self._syncer = syncer
        self._ahead = sh.config.fire_ahead_ms
        self._stop = False
        # held through each fire_due() call, so stop() returns only after the step in
        # progress (the store closes its files next)
        self._driven = threading.Lock()
        # positions of the failed step not in any consume log: the only ones retried (a
        # copy already appended was delivered; firing it again would deliver it twice);
        # None: nothing was appended
        self._unsent: set[int] | None = None
        self.lateness: collections.deque[int] = collections.deque(maxlen=_LATENESS_KEPT)

    def stop(self) -> None:
        with self._sh.fire_cv:
            self._stop = True
            self._sh.fire_cv.notify_all()
        with self._driven:
            pass

    def fire_due(self) -> float | None:
        """Fire what is due now, without blocking on the clock; returns the seconds until
        the next call is wanted (0: more is due now; at most ``MAX_WAIT_S``), or None once
        stopped. For an owner that drives firing itself (no firing thread)."""
        sh = self._sh
        with self._driven:
            if self._stop:
                return None
            with sh.sched:
                now = sh.clock()
                due = sh.wheel.pop_due(now + self._ahead, _DRIVEN_BATCH)
                if not due:
                    return self._wait_s(now)
            if not self._fire_or_retry(due, now):
                return _RETRY_S
            return 0.0 if len(due) == _DRIVEN_BATCH else self._wait_s(sh.clock(), lock=True)

    def _wait_s(self, now: int, *, lock: bool = False) -> float:
        """Seconds from the clock's ``now`` until the earliest wheel entry is due: its
        millisecond's start, not up to 1 ms into it (the clock counts whole ms, the wait
        need not: wall clock ms start on time_ns's ms boundaries; with another clock this
        only wakes early). At most ``MAX_WAIT_S``; 0 if something is due."""
        if lock:
            with self._sh.sched:
                nxt = self._sh.wheel.next_due()
        else:
            nxt = self._sh.wheel.next_due()
        if nxt is None:
            return MAX_WAIT_S
        nxt -= self._ahead
        t_ms, into_ns = divmod(time.time_ns(), 1_000_000)
        into_ms = into_ns / 1e6 + (1 if t_ms == now + 1 else 0)  # just ticked
        return max(0.0, min(MAX_WAIT_S, (nxt - now - into_ms) / 1000))

    def run(self) -> None:
        """The firing thread."""
        while not self._stop:
            try:
                self._step()
            except Exception:  # a bug must not silently stop all firing
                log.exception("firing loop error")
                self._sh.stats["fire_errors"] += 1
                time.sleep(0.1)

    def _step(self) -> None:
        """Wait until something is due (or a sooner entry arrives), then fire it."""
        sh = self._sh
        w = sh.wheel
        with sh.fire_cv:
            while True:
                if self._stop:
                    return
                now = sh.clock()
                due = w.pop_due(now + self._ahead, _FIRE_BATCH)
                if due:
                    break
                timeout = self._wait_s(now)
                if timeout > 0:
                    sh.fire_cv.wait(timeout)
        if not self._fire_or_retry(due, now):
            time.sleep(_RETRY_S)

    def _fire_or_retry(self, due: list[tuple[int, int, int]], now: int) -> bool:
        """Fire ``due``; on failure put back what was not fired (retried later): False."""
        sh = self._sh
        self._unsent = None
        try:
            self._fire(due, now)
        except Exception:
            unsent = self._unsent
            retry = due if unsent is None else [e for e in due if e[1] in unsent]
            log.exception("firing %d messages failed; %d will be retried", len(due), len(retry))
            sh.stats["fire_errors"] += 1
            with sh.sched:
                for d, pos, size in retry:
                    sh.wheel.unfire(d, pos, size)
            if sh.due is not None and len(retry) < len(due):
                again = {pos for _d, pos, _s in retry}
                sh.due.add([d for d, pos, _s in due if pos not in again], -1)
            return False
        if sh.due is not None:  # fired (or dropped as corrupt): no longer scheduled
            sh.due.add([d for d, _p, _s in due], -1)
        return True

    def _fire(self, due: list[tuple[int, int, int]], now: int) -> None:
        sh = self._sh
        fired_at = max(now, sh.clock())
        by_q: dict[tuple[str, int], list[tuple[bytes, int, int]]] = collections.defaultdict(list)
        dispatch: dict[int, list[int]] = collections.defaultdict(list)
        lateness = self.lateness
        late: list[int] = []  # this batch's lateness samples
        raws = _read_all(sh.files.mlog.read, due)
        bucket_ms = sh.bucket_ms
        verify = rec.verify_route
        topics: dict[bytes, str] = {}  # topic bytes -> its name, checked (in this call)
        # topic -> the earliest deliver time fired in it (a holding pull that has
        # messages wakes only for something due before them: server/broker/waiters.py);
        # ``due`` pops off the wheel's heap in deliver order, so a topic's first is it
        earliest: dict[str, int] = {}
        for d, pos, _size in due:
            raw = raws[pos]
            dispatch[d // bucket_ms].append(pos)
            try:
                kind, qid, deliver, topic_b = verify(raw)
                if kind not in _SCHEDULING or deliver != d:
                    raise rec.CorruptRecord("not the scheduled message")
                topic = topics.get(topic_b)
                if topic is None:
                    topic = topics[topic_b] = check_name(topic_b.decode())
            except (rec.CorruptRecord, ValueError) as exc:  # (UnicodeDecodeError too)
                log.error("schedule entry at %d: %s; dropped", pos, exc)
                sh.stats["corrupt_records"] += 1
                continue
            by_q[(topic, qid)].append((raw, pos, fired_at))
            late.append(fired_at - d if fired_at > d else 0)  # fired ahead: not late
            earliest.setdefault(topic, d)
        lateness.extend(late)
        sh.lateness.observe_many(late)
        queues = []
        consume = sh.files.consume
        try:
            for (topic, qid), items in by_q.items():
                q = consume.get(topic, qid, create=True)
                assert q is not None
                q.append(items)  # all or nothing (raises before appending any)
                queues.append(q)
        except BaseException:
            if queues:  # some queues have their copies: those are fired, the rest retried
                done = set(list(by_q)[: len(queues)])  # appended in by_q's order
                self._unsent = {pos for k, v in by_q.items() if k not in done for _, pos, _ in v}
                by_q = {k: v for k, v in by_q.items() if k in done}
                dispatch = collections.defaultdict(list)
                for d, pos, _size in due:
                    if pos not in self._unsent:
                        dispatch[d // bucket_ms].append(pos)
                self._delivered(queues, by_q, dispatch, earliest)
            raise
        self._unsent = set()
        self._delivered(queues, by_q, dispatch, earliest)

    def _delivered(
        self,
        queues: list[ConsumeQueue],
        by_q: dict[tuple[str, int], list[tuple[bytes, int, int]]],
        dispatch: dict[int, list[int]],
        earliest: dict[str, int],
    ) -> None:
        """Copies appended to the consume logs ``queues``: count them, index their fired
        time, make them visible (with ``visible_before_sync``) and hand them to the syncer
        (``dispatch``: every position they settle, dropped corrupt entries included;
        ``earliest``: per topic, the earliest deliver time among them)."""
        sh = self._sh
        sh.stats["fired"] += sum(len(v) for v in by_q.values())
        ids = sh.files.ids
        if ids is not None:
            # the fired time, for lookups (the state itself is the dispatch log's)
            for items in by_q.values():
                ids.add_fired(items)
        topics = {t: earliest[t] for t, _q in by_q}
        if sh.config.visible_before_sync:
            # Visible before the fsync: a crash can lose these copies only together with
            # their dispatch records (written after the fsync), so they fire again, and
            # recovery clamps committed offsets to the durable end of each queue.
            for q in queues:
                q.publish(q.next)
            self._syncer.notify(topics)
        self._syncer.hand(queues, dispatch, topics)
