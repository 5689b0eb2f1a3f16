"""A pull consumer in a consumer group: at-least-once, offsets kept on the brokers.

Members of one group share the topic's queues (RocketMQ's clustering mode): every
heartbeat interval a member heartbeats each broker of the topic with the queues it wants
there, learns the group's live members, and takes its contiguous share of all queues
(:func:`allocate_averagely`). A broker hands a queue to a member only once the previous
owner released it (after committing) or stopped renewing its lease, and serves and
commits a queue only for its owner. Offsets of what ``poll()`` returned are committed by
the next ``poll()`` (or ``commit()``, or ``close()``), so a member that dies re-delivers
only what it had not committed. The group's retry topic is read the same way, beside
the topic (``_handback.py``: ``retry_later`` and ``dead_letter``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from types import TracebackType
from typing import Any

from .. import _tracing
from .._models import ReceivedMessage
from ..engines import ROCKETMQ, parse_namesrv
from ..errors import AuthError, ConsumerClosedError, QClientError
from ..protocol import wire
from ._handback import HandBack
from ._member import iter_messages
from ._sub import Subscription

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

_MAX_PULL = 1024  # messages per pull at most (the broker's default limit)


class Consumer(HandBack):
    """``Consumer(namesrv, topic, group)``; ``poll()`` returns delivered messages.

    ``tags``: a tag expression (``"TagA || TagB"``; None or ``"*"``: all): the group gets
    only messages with one of these tags, the brokers skip (and commit) the others.
    ``max_attempts`` and ``retry_delays``: see :meth:`retry_later`.
    ``session_timeout``: seconds after its last heartbeat or poll that a member counts as
    dead and its queues move to the others (heartbeats go every third of it).
    ``auto_commit=False``: only ``commit()`` commits (``poll()`` does not).

    Brokers hand messages over up to ``fire_ahead_ms`` (40 ms) before their time; the
    consumer holds each and ``poll()`` returns it at its deliver time by the broker's clock,
    never earlier, earliest first.
    """

    def __new__(cls, namesrv: Any, *args: Any, **kwargs: Any) -> Any:
        # the engine is the address's: on RocketMQ, its own group consumer with this API
        engine, addrs = parse_namesrv(namesrv)
        if engine == ROCKETMQ:
            from ..engines.rocketmq.consumer import RocketMQConsumer

            return RocketMQConsumer(addrs, *args, **kwargs)
        return super().__new__(cls)

    def __repr__(self) -> str:
        return f"Consumer(topic={self.topic!r}, group={self.group!r}, client_id={self.client_id!r})"

    # --- public ---------------------------------------------------------------------

    def poll(self, max_messages: int = 32, timeout: float = 1.0) -> list[ReceivedMessage]:
        """Up to ``max_messages`` delivered messages from the queues this member owns,
        waiting up to ``timeout`` seconds; commits what earlier polls returned."""
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        start_ns = time.time_ns()
        with self._lock:
            if self._closed:
                raise ConsumerClosedError("consumer is closed")
            if self.auto_commit:
                for sub in self._subs:
                    sub.ack.update(sub.delivered)
            out = self._release(max_messages)
            if not out:
                self._fetch(timeout, max_messages)
                out = self._release(max_messages)
        _tracing.receive(self.topic, self.group, out, start_ns)
        return out

    def _release(self, limit: int) -> list[ReceivedMessage]:
        """Held messages that are due, up to ``limit``, the earliest topic's first."""
        ready = [s for s in self._subs if s.held.next_release_ns() is not None]
        if not ready:
            return []
        if len(ready) > 1:
            ready.sort(key=lambda s: s.held.next_release_ns() or 0)
        out = ready[0].release(limit)
        for sub in ready[1:]:
            if len(out) < limit:
                out += sub.release(limit - len(out))
        if out:
            self._note_returned(out)
        return out

    def _next_release_ns(self) -> int | None:
        times = [t for s in self._subs if (t := s.held.next_release_ns()) is not None]
        return min(times) if times else None

    def messages(
        self, timeout: float | None = None, *, max_messages: int = 32
    ) -> Iterator[ReceivedMessage]:
        """Yield messages as they arrive; stop after ``timeout`` seconds without one
        (``None``: never) or when the consumer is closed. A message counts as processed
        (and is committed) once the next one is asked for."""
        return iter_messages(self.poll, lambda: self._closed, timeout, max_messages)

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return self.messages()

    def commit(self) -> None:
        """Commit now everything ``poll()`` returned so far."""
        with self._lock:
            for sub in self._subs:
                sub.ack.update(sub.delivered)
                for name, addr in list(sub.brokers.items()):
                    commits = sub.pending_commits(name)
                    if commits and name not in sub.inflight:
                        req = wire.PullRequest(
                            sub.topic, self.group, 0, 0, commits, client_id=self.client_id
                        )
                        resp = self._request(
                            sub, name, addr, wire.BROKER_PULL, req, wire.PullResponse
                        )
                        if resp is not None:
                            sub.committed_ok(name, commits, resp.lost)
                    elif commits:
                        self._heartbeat_one(sub, name, addr, commits)

    def close(self) -> None:
        """Commit what was returned, leave the group (its queues move to the others at
        once), release connections. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.auto_commit:
                for sub in self._subs:
                    sub.ack.update(sub.delivered)
            try:
                futs = [
                    self._pool.submit(self._leave, sub, name, addr)
                    for sub in self._subs
                    for name, addr in sub.brokers.items()
                ]
                for f in futs:
                    try:
                        f.result()
                    except QClientError as exc:
                        log.warning("leaving the group failed: %s", exc)
            finally:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._namesrv.close()
                self._http.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def assignment(self) -> list[tuple[str, int]]:
        """The (broker name, queue id) pairs of the group's topic this member holds now,
        sorted."""
        # no lock (a poll may hold it for its whole timeout): copies are atomic in CPython
        owned = dict(self._main.owned)
        return sorted((b, q) for b, qs in owned.items() for q in list(qs))

    def committed(self) -> dict[tuple[str, int], int]:
        """The next offset the brokers acknowledged as committed for this member, per
        (broker name, queue id) of the group's topic: what a new owner of the queue would
        start from. It moves when the pull or heartbeat carrying a commit is answered,
        not when ``commit()`` or ``poll()`` is called."""
        return dict(self._main.committed)  # no lock, as assignment(): the copy is atomic

    # --- fetching -------------------------------------------------------------------

    def _pull(
        self,
        sub: Subscription,
        name: str,
        addr: str,
        queues: dict[int, int],
        commits: dict[int, int],
        wait_ms: int,
        size: int,
    ) -> tuple[wire.PullResponse, int]:
        """The answer, and our monotonic clock (ns) when it came (for its ``clock_ns``)."""
        req = wire.PullRequest(
            sub.topic,
            self.group,
            size,
            wait_ms,
            commits,
            client_id=self.client_id,
            queues=queues,
            hold=True,
            tags=self._tags,
        )
        resp = self._request(sub, name, addr, wire.BROKER_PULL, req, wire.PullResponse, wait_ms)
        got_ns = time.monotonic_ns()
        if resp is None:
            resp = wire.PullResponse(name, [], {}, sorted(queues))
        return resp, got_ns

    def _fetch(self, timeout: float, max_messages: int) -> None:
        """Pull until a held message is due or ``timeout`` passed. While messages are
        held, pulls go on the pool (the due ones are released on time, whatever a pull
        waits for); the brokers answer them every ~10 ms at a steady rate."""
        # a pull asks for at least 256 (what one poll does not take stays held)
        size = max(256, min(max_messages, _MAX_PULL))
        deadline = time.monotonic() + max(0.0, timeout)
        subs = self._subs
        while True:
            now = time.monotonic()
            if now >= self._next_hb:
                self._rebalance()
                now = time.monotonic()
            remaining = deadline - now
            wait_s = max(0.0, min(remaining, self._next_hb - now))
            release_ns = self._next_release_ns()
            holding = release_ns is not None
            sleep_s = wait_s
            if release_ns is not None:
                sleep_s = max(0.0, min(sleep_s, (release_ns - time.monotonic_ns()) / 1e9))
            todo = [
                (sub, name)
                for sub in subs
                if not sub.refused
                for name, owned in sub.owned.items()
                if owned and name in sub.brokers and name not in sub.inflight
            ]
            in_flight = [f for sub in subs for f in sub.inflight.values()]
            # One broker to pull, none in flight, nothing held: pull on this thread
            direct = len(todo) == 1 and not in_flight and not holding
            for sub, name in todo:
                queues = {q: sub.pos.get((name, q), -1) for q in sub.owned[name]}
                commits = sub.pending_commits(name)
                args = (sub, name, sub.brokers[name], queues, commits, int(wait_s * 1000), size)
                if direct:
                    fut: Future[tuple[wire.PullResponse, int]] = Future()
                    try:
                        fut.set_result(self._pull(*args))
                    except QClientError as exc:
                        fut.set_exception(exc)
                else:
                    fut = self._pool.submit(self._pull, *args)
                sub.inflight[name] = fut
                sub.sent[name] = (queues, commits)
                in_flight.append(fut)
            if direct:
                done = set(in_flight)
            elif in_flight:
                # a long poll may answer at its end: allow it that, unless something
                # held comes due first
                grace = 0.05 if remaining > 0 and not holding else 0.0
                done, _ = wait(in_flight, timeout=sleep_s + grace, return_when=FIRST_COMPLETED)
            else:
                done = set()
                time.sleep(sleep_s)
            errors = self._collect(done)
            nxt = self._next_release_ns()
            if nxt is not None and nxt <= time.monotonic_ns():
                return
            refused = [e for e in errors if isinstance(e, AuthError)]
            if refused:  # refused credentials do not change by waiting: say so at once
                raise refused[0]
            if errors:
                log.debug("pull failed on %d broker(s): %s", len(errors), errors[0])
                if len(errors) >= sum(len(sub.owned) for sub in subs):
                    self._next_hb = 0.0  # re-check route and leases before pulling again
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                return

    def _collect(self, done: set[Future[tuple[wire.PullResponse, int]]]) -> list[QClientError]:
        errors: list[QClientError] = []
        for sub in self._subs:
            for name, fut in list(sub.inflight.items()):
                if fut not in done:
                    continue
                del sub.inflight[name]
                queues, commits = sub.sent.pop(name)
                try:
                    resp, got_ns = fut.result()
                except AuthError as exc:
                    if not sub.retry:
                        errors.append(exc)
                        continue
                    log.warning("%s: not reading %s: %s", self.group, sub.topic, exc)
                    sub.refused = True  # the account may not read it: the topic only
                    for broker in list(sub.owned):
                        sub.set_owned(broker, set())
                    continue
                except QClientError as exc:
                    errors.append(exc)
                    continue
                if resp.clock_ns:
                    sub.held.clock(name).add(resp.clock_ns, got_ns)
                sub.committed_ok(name, commits, resp.lost)
                for q in resp.lost:
                    sub.drop(name, q)
                sub.accept(name, resp, queues, self._keep)
        return errors
