"""A pull consumer in a consumer group: at-least-once, offsets kept on the brokers.

Members of one group share the topic's queues (RocketMQ's clustering mode): every
heartbeat interval a member heartbeats each broker of the topic with the queues it wants
there, learns the group's live members, and takes its contiguous share of all queues
(:func:`allocate_averagely`). A broker hands a queue to a member only once the previous
owner released it (after committing) or stopped renewing its lease, and serves and
commits a queue only for its owner. Offsets of what ``poll()`` returned are committed by
the next ``poll()`` (or ``commit()``, or ``close()``), so a member that dies re-delivers
only what it had not committed.
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
from ._group import GroupMember
from ._member import iter_messages

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

_MAX_PULL = 1024  # messages per pull at most (the broker's default limit)


class Consumer(GroupMember):
    """``Consumer(namesrv, topic, group)``; ``poll()`` returns delivered messages.

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
                self._ack.update(self._delivered)
            out = self._release(max_messages)
            if not out:
                self._fetch(timeout, max_messages)
                out = self._release(max_messages)
        _tracing.receive(self.topic, self.group, out, start_ns)
        return out

    def _release(self, limit: int) -> list[ReceivedMessage]:
        """Held messages that are due, up to ``limit``; what may be committed moves."""
        out, commit = self._held.release(limit)
        self._delivered.update(commit)
        return out

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
            self._ack.update(self._delivered)
            for name, addr in list(self._brokers.items()):
                commits = self._pending_commits(name)
                if commits and name not in self._inflight:
                    req = wire.PullRequest(
                        self.topic, self.group, 0, 0, commits, client_id=self.client_id
                    )
                    resp = self._request(name, addr, wire.BROKER_PULL, req, wire.PullResponse)
                    if resp is not None:
                        self._committed_ok(name, commits, resp.lost)
                elif commits:
                    self._heartbeat_one(name, addr, commits)

    def close(self) -> None:
        """Commit what was returned, leave the group (its queues move to the others at
        once), release connections. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.auto_commit:
                self._ack.update(self._delivered)
            try:
                futs = [
                    self._pool.submit(self._leave, name, addr)
                    for name, addr in self._brokers.items()
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
        """The (broker name, queue id) pairs this member holds now, sorted."""
        # no lock (a poll may hold it for its whole timeout): copies are atomic in CPython
        return sorted((b, q) for b, qs in dict(self._owned).items() for q in list(qs))

    def committed(self) -> dict[tuple[str, int], int]:
        """The next offset the brokers acknowledged as committed for this member, per
        (broker name, queue id): what a new owner of the queue would start from. It moves
        when the pull or heartbeat carrying a commit is answered, not when ``commit()``
        or ``poll()`` is called."""
        return dict(self._committed)  # no lock, as assignment(): the copy is atomic

    # --- fetching -------------------------------------------------------------------

    def _pull(
        self,
        name: str,
        addr: str,
        queues: dict[int, int],
        commits: dict[int, int],
        wait_ms: int,
        size: int,
    ) -> tuple[wire.PullResponse, int]:
        """The answer, and our monotonic clock (ns) when it came (for its ``clock_ns``)."""
        req = wire.PullRequest(
            self.topic,
            self.group,
            size,
            wait_ms,
            commits,
            client_id=self.client_id,
            queues=queues,
            hold=True,
        )
        resp = self._request(name, addr, wire.BROKER_PULL, req, wire.PullResponse, wait_ms)
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
        held = self._held
        while True:
            now = time.monotonic()
            if now >= self._next_hb:
                self._rebalance()
                now = time.monotonic()
            remaining = deadline - now
            wait_s = max(0.0, min(remaining, self._next_hb - now))
            release_ns = held.next_release_ns()
            holding = release_ns is not None
            sleep_s = wait_s
            if release_ns is not None:
                sleep_s = max(0.0, min(sleep_s, (release_ns - time.monotonic_ns()) / 1e9))
            todo = [
                name
                for name, owned in self._owned.items()
                if owned and name in self._brokers and name not in self._inflight
            ]
            # One broker to pull, none in flight, nothing held: pull on this thread
            direct = len(todo) == 1 and not self._inflight and not holding
            for name in todo:
                queues = {q: self._pos.get((name, q), -1) for q in self._owned[name]}
                commits = self._pending_commits(name)
                args = (name, self._brokers[name], queues, commits, int(wait_s * 1000), size)
                if direct:
                    fut: Future[tuple[wire.PullResponse, int]] = Future()
                    try:
                        fut.set_result(self._pull(*args))
                    except QClientError as exc:
                        fut.set_exception(exc)
                else:
                    fut = self._pool.submit(self._pull, *args)
                self._inflight[name] = fut
                self._sent[name] = (queues, commits)
            if direct:
                done = set(self._inflight.values())
            elif self._inflight:
                # a long poll may answer at its end: allow it that, unless something
                # held comes due first
                grace = 0.05 if remaining > 0 and not holding else 0.0
                done, _ = wait(
                    list(self._inflight.values()),
                    timeout=sleep_s + grace,
                    return_when=FIRST_COMPLETED,
                )
            else:
                done = set()
                time.sleep(sleep_s)
            errors = self._collect(done)
            nxt = held.next_release_ns()
            if nxt is not None and nxt <= time.monotonic_ns():
                return
            refused = [e for e in errors if isinstance(e, AuthError)]
            if refused:  # refused credentials do not change by waiting: say so at once
                raise refused[0]
            if errors:
                log.debug("pull failed on %d broker(s): %s", len(errors), errors[0])
                if len(errors) >= len(self._owned):
                    self._next_hb = 0.0  # re-check route and leases before pulling again
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                return

    def _collect(self, done: set[Future[tuple[wire.PullResponse, int]]]) -> list[QClientError]:
        errors: list[QClientError] = []
        for name, fut in list(self._inflight.items()):
            if fut not in done:
                continue
            del self._inflight[name]
            queues, commits = self._sent.pop(name)
            try:
                resp, got_ns = fut.result()
            except QClientError as exc:
                errors.append(exc)
                continue
            if resp.clock_ns:
                self._held.clock(name).add(resp.clock_ns, got_ns)
            self._committed_ok(name, commits, resp.lost)
            for q in resp.lost:
                self._drop(name, q)
            self._accept(name, resp, queues)
        return errors

    def _accept(self, broker: str, resp: wire.PullResponse, queues: dict[int, int]) -> None:
        owned = self._owned.get(broker, set())
        pos = self._pos
        fetched: list[wire.PulledMessage] = []
        append = fetched.append
        accepted: dict[int, bool] = {}  # per queue, decided at its first message
        last: dict[int, int] = {}  # per queue, the offset of its last message here
        for m in resp.messages:
            q = m.queue_id
            ok = accepted.get(q)
            if ok is None:
                # not owned: released while the pull was in flight (the next owner reads
                # it); position moved: the queue was dropped and taken again meanwhile
                expected = pos.get((broker, q), -1)
                ok = accepted[q] = q in owned and q in queues and expected in (queues[q], m.offset)
            if not ok:
                continue
            append(m)
            last[q] = m.offset
        for q, off in last.items():
            pos[(broker, q)] = off + 1
        self._held.add(broker, fetched)
