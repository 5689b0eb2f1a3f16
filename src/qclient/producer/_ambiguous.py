"""Copies left by ambiguous attempts, cancelled before they fire.

An attempt that timed out, or lost its connection after the request went out, may still
have been stored by that broker: it was slow or crashed after its fsync, not gone. When a
retry is then acknowledged by another broker the message is stored twice and would fire
twice. A delayed message is invisible until it fires, so the extra copy can be removed in
time: the producer remembers ``(topic, id, broker)`` and, once that broker answers again,
cancels its copy by id (the broker finds it through its dedupe table). Only a copy due
before the cancel gets through still fires twice.

A broker may answer the cancel before it has stored the late request (both were queued
while it hung), so "not found" is asked again a few times before the copy is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from .._models import SendResult, SendStatus

__all__ = ["AmbiguousCopies", "is_ambiguous"]

log = logging.getLogger(__name__)

_RETRY_S = 0.5  # between rounds of cancels
_NOT_FOUND_ASKS = 4  # "not found" answers, _RETRY_S apart, before a copy is dropped
_MAX_PENDING = 100_000  # memory bound: beyond it the oldest are dropped (they may fire twice)


def is_ambiguous(exc: BaseException | None) -> bool:
    """Whether a failed attempt may have been stored: the request may have reached the
    broker (a read timeout, a dropped connection), unlike a refused connection."""
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout | httpx.ConnectError):
        return False
    return isinstance(
        exc, httpx.TimeoutException | httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError
    )


@dataclass(slots=True)
class _Copy:
    topic: str
    msg_id: str
    broker: str
    deliver_at_ms: int
    not_found: int = 0


class AmbiguousCopies:
    """Pending copies on brokers whose attempt was ambiguous, and the thread that cancels
    them with ``cancel(result) -> bool`` (the producer's own cancel)."""

    def __init__(
        self, cancel: Callable[[SendResult], bool], clock_ms: Callable[[], float] | None = None
    ) -> None:
        self._cancel = cancel
        self._clock_ms = clock_ms or (lambda: time.time() * 1000)
        self._pending: dict[tuple[str, str, str], _Copy] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.counts = {"noted": 0, "cancelled": 0, "not_found": 0, "too_late": 0, "dropped": 0}

    def note(self, acked: SendResult, brokers: Iterable[str]) -> None:
        """``acked`` was acknowledged after ambiguous attempts on ``brokers``."""
        with self._lock:
            if self._closed:
                return
            for b in brokers:
                if b == acked.broker_name:
                    continue  # retried where it went first: that broker deduplicated it
                key = (acked.topic, acked.msg_id, b)
                if key not in self._pending:
                    self._pending[key] = _Copy(acked.topic, acked.msg_id, b, acked.deliver_at_ms)
                    self.counts["noted"] += 1
            while len(self._pending) > _MAX_PENDING:
                del self._pending[next(iter(self._pending))]
                self.counts["dropped"] += 1
            if self._thread is None and self._pending:
                self._thread = threading.Thread(
                    target=self._run, name="qclient-ambiguous", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def pending(self) -> int:
        return len(self._pending)

    def _run(self) -> None:
        while not self._closed:
            try:
                self._round()
            except Exception:  # a bug here must not stop later rounds
                log.exception("cancelling ambiguous copies failed")
            self._wake.wait(_RETRY_S)
            self._wake.clear()

    def _round(self) -> None:
        """One pass over the pending copies, each broker's in its own thread (a hung
        broker's cancel must not hold up the others' until their copies fire)."""
        with self._lock:
            copies = list(self._pending.values())
        by_broker: dict[str, list[_Copy]] = {}
        for c in copies:
            by_broker.setdefault(c.broker, []).append(c)
        if len(by_broker) == 1:
            self._broker_round(copies)
            return
        threads = [
            threading.Thread(target=self._broker_round, args=(cs,), daemon=True)
            for cs in by_broker.values()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _broker_round(self, copies: list[_Copy]) -> None:
        """Cancel one broker's copies, in order, until it does not answer."""
        for c in copies:
            if self._closed:
                return
            if self._clock_ms() > c.deliver_at_ms:
                self._done(c, "too_late")
                continue
            result = SendResult(c.msg_id, SendStatus.SEND_OK, c.broker, 0, c.deliver_at_ms, c.topic)
            try:
                cancelled = self._cancel(result)
            except Exception as exc:  # the broker does not answer yet: next round
                log.debug("cancel of copy %s on %s: %s", c.msg_id, c.broker, exc)
                return
            if cancelled:
                self._done(c, "cancelled")
            else:
                c.not_found += 1
                if c.not_found >= _NOT_FOUND_ASKS:
                    self._done(c, "not_found")

    def _done(self, c: _Copy, how: str) -> None:
        with self._lock:
            self._pending.pop((c.topic, c.msg_id, c.broker), None)
            self.counts[how] += 1
        if how == "cancelled":
            log.info("cancelled the extra copy of %s on %s", c.msg_id, c.broker)

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
