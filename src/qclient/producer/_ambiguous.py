"""Extra copies of one message on other brokers, cancelled before they fire.

Two ways leave a message stored on two brokers:

- an attempt that timed out, or lost its connection after the request went out, may
  still have been stored by that broker (it was slow, or crashed after its fsync); the
  retry acknowledged by another broker is a second copy;
- a caller-chosen id belongs to one broker (``select_for_id``), which deduplicates its
  re-sends; while that broker is down a send goes to another one, which cannot know the
  id: a copy stored before the outage and the re-sent one both fire -- and so do the
  one stored during the outage and a re-send after it, back on the id's own broker.

A delayed message is invisible until it fires, so the extra copy can be removed in time:
the producer remembers ``(topic, id, broker)`` with the broker that acknowledged it and,
once the other broker answers again, looks both copies up and cancels one by id (the
broker finds it through its dedupe table). Only a copy due before the cancel gets
through still fires twice.

Never both copies: of two scheduled copies, the one on the broker ranked lower in the
id's rendezvous order (``id_order``) goes, so every producer's clean-up keeps the same
one, and the best-ranked broker holding a copy is never cancelled on -- even when
another producer's clean-up of the same id (a caller's re-send of it) runs at once. A
copy whose counterpart is gone (cancelled by the application, or by such a clean-up)
stays; one whose counterpart fired goes.

A caller that chose the id may send it again after an error (the idempotent retry). When
the failed send had ambiguous attempts, their brokers are remembered (``Unsettled``) until
the copy they may hold would have fired: if the re-send is acknowledged elsewhere, those
brokers are asked about as if the attempts had been part of it.

A broker may answer before it has stored the late request (both were queued while it
hung), so "not found" is asked again a few times before an ambiguous copy is dropped. The
id's own broker is asked once when it answers again and, if it had no copy, once more
shortly before the message is due (a re-send may have reached it since).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx
from cachetools import TLRUCache

from .._models import SendResult, SendStatus
from ..fault.strategy import id_order
from ..protocol.wire import STATE_FIRED, STATE_SCHEDULED

__all__ = ["AmbiguousCopies", "Unsettled", "is_ambiguous", "settle_budget"]

log = logging.getLogger(__name__)

_RETRY_S = 0.5  # between rounds of cancels
#: a broker that did not answer is asked again this soon: a copy due shortly after it is
#: back is cancelled in time (a refused connection costs little; a hung broker's worker
#: is still waiting for its answer, and answers as it resumes)
_DOWN_RETRY_S = 0.1
_NOT_FOUND_ASKS = 4  # "not found" answers, _RETRY_S apart, before a copy is dropped
#: the same for the id's own broker after a re-send elsewhere: a copy there was stored
#: before the outage (found at once); a late request there is its sender's ambiguous copy
_AWAY_ASKS = 1
#: the id's own broker is asked again this long before the message is due (time for the
#: lookups and the cancel to get there before it fires); a message due sooner than that
#: from its last "not found" is asked again two rounds on, if that is at least a round
#: before it is due
_LATE_ASK_MS = 2000
_PARALLEL = 4  # threads asking one broker at once
_PER_THREAD = 16  # copies per thread before another one helps
_MAX_PENDING = 100_000  # memory bound: beyond it the oldest are dropped (they may fire twice)
_SETTLE_POLL_S = 0.02  # how often ``settle`` looks at what is left
#: failed sends' ambiguous brokers are kept this long past the copy's due time (a clock
#: step or a slow timer on the broker), at most ``_MAX_PENDING`` of them
_UNSETTLED_SLACK_S = 60.0


def settle_budget(send_timeout: float, timeout: float | None, start: float) -> float:
    """How long a producer's ``close`` waits for extra copies to be cancelled: one
    ``send_timeout`` (the time one message may take), or what is left of the caller's
    ``timeout`` since ``start`` (monotonic) when that is less."""
    if timeout is None:
        return send_timeout
    return max(0.0, min(send_timeout, timeout - (time.monotonic() - start)))


def is_ambiguous(exc: BaseException | None) -> bool:
    """Whether a failed attempt may have been stored: the request may have reached the
    broker (a read timeout, a dropped connection), unlike a refused connection."""
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout | httpx.ConnectError):
        return False
    return isinstance(
        exc,
        httpx.TimeoutException
        | httpx.ReadError
        | httpx.WriteError
        | httpx.RemoteProtocolError
        | TimeoutError,  # the drivers' hard cap on a whole exchange
    )


class Unsettled:
    """Caller-chosen ids whose send failed after ambiguous attempts, with the brokers
    those attempts went to, until the copy they may have stored would have fired."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: TLRUCache[tuple[str, str], tuple[tuple[str, ...], float]] = TLRUCache(
            maxsize=_MAX_PENDING, ttu=lambda _key, value, _now: value[1], timer=time.monotonic
        )
        #: whether any id may be remembered, set under the lock: the hot path reads this
        #: flag without it (the cache itself may not be read while another thread writes)
        self._any = False

    def __bool__(self) -> bool:
        return self._any

    def remember(self, topic: str, msg_id: str, brokers: Iterable[str], due_in_s: float) -> None:
        """The send of ``msg_id`` failed after ambiguous attempts on ``brokers``; a copy
        there would fire ``due_in_s`` from now."""
        until = time.monotonic() + max(0.0, due_in_s) + _UNSETTLED_SLACK_S
        with self._lock:
            known = self._ids.get((topic, msg_id), ((), 0.0))
            merged = tuple(dict.fromkeys((*known[0], *brokers)))
            self._ids[(topic, msg_id)] = (merged, max(until, known[1]))
            self._any = True

    def take(self, topic: str, msg_id: str) -> tuple[str, ...]:
        """The brokers remembered for ``msg_id`` (forgotten now: its re-send was
        acknowledged), or ``()``."""
        with self._lock:
            brokers = self._ids.pop((topic, msg_id), ((), 0.0))[0]
            self._any = len(self._ids) > 0  # expired ones are not counted
            return brokers


@dataclass(slots=True)
class _Copy:
    topic: str
    msg_id: str
    broker: str  # where the extra copy may be
    deliver_at_ms: int
    keep: str  # the broker that acknowledged the copy that stays
    asks: int  # "not found" answers before it is dropped
    not_found: int = 0
    asked_at: float = 0.0  # time.monotonic() of the last "not found"
    late_ask: bool = False  # owed one more ask shortly before it is due


#: ``lookup(topic, msg_id, broker)``: the state of that broker's copy, None if it has none
Lookup = Callable[[str, str, str], "str | None"]


class AmbiguousCopies:
    """Pending extra copies, and the thread that cancels them with ``cancel(result) ->
    bool`` (the producer's own cancel on one broker) after ``lookup`` has shown the
    acknowledged copy still there (without ``lookup``, cancels at once)."""

    def __init__(
        self,
        cancel: Callable[[SendResult], bool],
        lookup: Lookup | None = None,
        clock_ms: Callable[[], float] | None = None,
    ) -> None:
        self._cancel = cancel
        self._lookup = lookup
        self._clock_ms = clock_ms or (lambda: time.time() * 1000)
        self._pending: dict[tuple[str, str, str], _Copy] = {}
        #: copies owed a late ask, and the heap of (time of that ask, key)
        self._deferred: dict[tuple[str, str, str], _Copy] = {}
        self._later: list[tuple[float, tuple[str, str, str]]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._busy: set[str] = set()  # brokers whose worker is running
        self._failed_at: dict[str, float] = {}  # broker -> monotonic time it last failed
        self._rounds: dict[str, int] = {}  # broker -> rounds it finished
        self.counts = {
            "noted": 0,
            "noted_away": 0,
            "cancelled": 0,
            "not_found": 0,
            "asked_late": 0,
            "too_late": 0,
            "gone": 0,
            "kept": 0,
            "dropped": 0,
        }

    def note(
        self, acked: SendResult, brokers: Iterable[str], away_from: Iterable[str] = ()
    ) -> None:
        """``acked`` was acknowledged after ambiguous attempts on ``brokers``, and (a
        caller-chosen id) by a broker after ``away_from`` in the id's order of brokers:
        its own, then those that stand in for it."""
        with self._lock:
            if self._closed:
                return
            keep = acked.broker_name
            for b in brokers:
                if b == keep:
                    continue  # retried where it went first: that broker deduplicated it
                key = (acked.topic, acked.msg_id, b)
                if key not in self._pending:
                    self._pending[key] = _Copy(
                        acked.topic, acked.msg_id, b, acked.deliver_at_ms, keep, _NOT_FOUND_ASKS
                    )
                    self.counts["noted"] += 1
            for home in away_from:
                if home == keep:
                    continue
                key = (acked.topic, acked.msg_id, home)
                asked = self._pending.get(key)
                if asked is not None:
                    # also a broker an ambiguous attempt went to: asked as such, and owed
                    # the id's late ask too (a re-send may reach it after those answers)
                    asked.late_ask = True
                    continue
                if key not in self._deferred:
                    self._pending[key] = _Copy(
                        acked.topic,
                        acked.msg_id,
                        home,
                        acked.deliver_at_ms,
                        keep,
                        _AWAY_ASKS,
                        late_ask=True,
                    )
                    self.counts["noted_away"] += 1
            while len(self._pending) + len(self._deferred) > _MAX_PENDING:
                held = self._deferred or self._pending  # the late asks go first
                del held[next(iter(held))]
                self.counts["dropped"] += 1
            if self._thread is None and self._pending:
                self._thread = threading.Thread(
                    target=self._run, name="qclient-ambiguous", daemon=True
                )
                self._thread.start()
        self._wake.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def pending(self) -> int:
        """Copies being asked about now (not those waiting for their late ask)."""
        return len(self._pending)

    def late_asks_within(self, seconds: float) -> int:
        """Copies whose late ask comes within ``seconds``."""
        until = self._clock_ms() + seconds * 1000
        with self._lock:
            return sum(1 for at, key in self._later if at <= until and key in self._deferred)

    def _run(self) -> None:
        while not self._closed:
            wait = _RETRY_S
            try:
                wait = self._round()
            except Exception:  # a bug here must not stop later rounds
                log.exception("cancelling extra copies failed")
            self._wake.wait(wait)
            self._wake.clear()

    def _round(self) -> float:
        """Start a worker for each broker with pending copies that has none running and
        did not fail within ``_DOWN_RETRY_S`` (a hung broker holds up only its own
        copies); returns the wait before the next round (shorter while a broker with
        pending copies does not answer)."""
        now = time.monotonic()
        now_ms = self._clock_ms()
        by_broker: dict[str, list[_Copy]] = {}
        with self._lock:
            later, deferred = self._later, self._deferred
            while later and later[0][0] <= now_ms:
                key = heapq.heappop(later)[1]
                c = deferred.pop(key, None)
                if c is not None:
                    self._pending.setdefault(key, c)
                    self.counts["asked_late"] += 1
            for c in self._pending.values():
                by_broker.setdefault(c.broker, []).append(c)
            todo = [
                (b, cs)
                for b, cs in by_broker.items()
                if b not in self._busy
                and now - self._failed_at.get(b, -_DOWN_RETRY_S) >= _DOWN_RETRY_S
            ]
            self._busy.update(b for b, _ in todo)
            down = any(b in self._failed_at for b in by_broker)
        for b, cs in todo:
            threading.Thread(
                target=self._broker_round, args=(b, cs), name=f"qclient-ambiguous-{b}", daemon=True
            ).start()
        return _DOWN_RETRY_S if down else _RETRY_S

    def _broker_round(self, broker: str, copies: list[_Copy]) -> None:
        """Settle one broker's copies, the soonest due first, on up to ``_PARALLEL``
        threads (a broker back from an outage may owe hundreds of answers at once)."""
        copies.sort(key=lambda c: c.deliver_at_ms)
        n = min(_PARALLEL, -(-len(copies) // _PER_THREAD))
        try:
            if n <= 1:
                ok = self._settle(copies)
            else:
                oks = [True] * n

                def part(i: int) -> None:
                    try:
                        oks[i] = self._settle(copies[i::n])
                    except Exception:  # a bug here must not stop later rounds
                        log.exception("cancelling extra copies on %s failed", broker)

                threads = [threading.Thread(target=part, args=(i,), daemon=True) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                ok = all(oks)
            if ok:
                self._failed_at.pop(broker, None)
            else:
                self._failed_at[broker] = time.monotonic()
        except Exception:  # a bug here must not stop later rounds
            log.exception("cancelling extra copies on %s failed", broker)
        finally:
            with self._lock:
                self._busy.discard(broker)
                self._rounds[broker] = self._rounds.get(broker, 0) + 1

    def _settle(self, copies: list[_Copy]) -> bool:
        """Ask about (and cancel) each copy; False if the broker stopped answering."""
        lookup = self._lookup
        for c in copies:
            if self._closed:
                return True
            if self._clock_ms() > c.deliver_at_ms:
                self._done(c, "too_late")
                continue
            if time.monotonic() - c.asked_at < _RETRY_S:
                continue  # a round woken by a new copy: ask again only _RETRY_S apart
            try:
                if lookup is not None:
                    state = lookup(c.topic, c.msg_id, c.broker)
                    if state is None:
                        self._not_found(c)
                        continue
                    if state != STATE_SCHEDULED:
                        self._done(c, "gone")  # fired or cancelled already
                        continue
                    victim = self._victim(c)
                    if victim is None:
                        continue
                else:
                    victim = c.broker
                result = SendResult(
                    c.msg_id, SendStatus.SEND_OK, victim, 0, c.deliver_at_ms, c.topic
                )
                cancelled = self._cancel(result)
            except Exception as exc:  # the broker does not answer yet: next round
                log.debug("cancel of copy %s on %s: %s", c.msg_id, c.broker, exc)
                return False
            if cancelled:
                self._done(c, "cancelled")
                log.info("cancelled the extra copy of %s on %s", c.msg_id, victim)
            else:
                self._not_found(c)
        return True

    def _victim(self, c: _Copy) -> str | None:
        """Which of the two scheduled copies goes (``c.broker``'s was just seen
        scheduled): the one on the broker ranked lower in the id's rendezvous order, so
        that every producer's clean-up keeps the same copy and the best-ranked broker
        holding one is never recalled (two clean-ups keeping opposite copies would
        otherwise each recall the other's, and a RocketMQ recall removes every copy of
        the key in its slot). When the acknowledged copy fired, ``c``'s goes; when it is
        gone (cancelled, perhaps by a clean-up keeping ``c``), ``c``'s stays and is
        forgotten (None); when its broker does not answer, next round (None)."""
        assert self._lookup is not None
        try:
            state = self._lookup(c.topic, c.msg_id, c.keep)
        except Exception as exc:
            log.debug("lookup of kept copy %s on %s: %s", c.msg_id, c.keep, exc)
            return None
        if state == STATE_FIRED:
            return c.broker
        if state == STATE_SCHEDULED:
            return id_order(c.msg_id, (c.broker, c.keep))[1]
        self._done(c, "kept")
        return None

    def _not_found(self, c: _Copy) -> None:
        c.not_found += 1
        c.asked_at = time.monotonic()
        if c.not_found < c.asks:
            return
        round_ms = _RETRY_S * 1000
        at = max(c.deliver_at_ms - _LATE_ASK_MS, self._clock_ms() + 2 * round_ms)
        if c.late_ask and at <= c.deliver_at_ms - round_ms:
            # the late ask is one ask: any late request reached the broker long before, so
            # one "not found" then is final (four, a second apart, would not fit before the
            # message is due, and the copy would end "too late")
            c.late_ask, c.not_found, c.asks = False, 0, 1
            key = (c.topic, c.msg_id, c.broker)
            with self._lock:
                if self._pending.pop(key, None) is not None and not self._closed:
                    self._deferred[key] = c
                    heapq.heappush(self._later, (at, key))
            return
        self._done(c, "not_found")

    def _done(self, c: _Copy, how: str) -> None:
        with self._lock:
            self._pending.pop((c.topic, c.msg_id, c.broker), None)
            self.counts[how] += 1

    def _pending_brokers(self) -> set[str]:
        return {c.broker for c in self._pending.values()}

    def settle(self, timeout: float) -> int:
        """Wait up to ``timeout`` s until no copy is being asked about, or every one left
        is on a broker that failed a round begun since (it does not answer); late asks,
        due shortly before each message, are not waited for. Returns how many are left."""
        deadline = time.monotonic() + timeout
        with self._lock:
            # a round running now may have begun before: it counts only after one more
            since = {b: self._rounds.get(b, 0) + (b in self._busy) for b in self._pending_brokers()}
        while True:
            with self._lock:
                left = self._pending_brokers()
                down = all(
                    b in self._failed_at and self._rounds.get(b, 0) > since.get(b, 0) for b in left
                )
                n = len(self._pending)
            if not n or down:
                return n
            if time.monotonic() >= deadline:
                return n
            self._wake.set()
            time.sleep(_SETTLE_POLL_S)

    def close(self) -> None:
        """Stop trying; copies still pending may fire twice."""
        with self._lock:
            self._closed = True
            left = len(self._pending)
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        if left:
            log.warning("%d possible duplicate copies left uncancelled at close", left)
