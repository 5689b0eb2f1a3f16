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
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from types import TracebackType
from typing import TypeVar

from .. import _tracing
from .._models import ReceivedMessage
from ..errors import AuthError, ConsumerClosedError, InvalidMessageError, QClientError
from ..protocol import wire
from ..routing.nameserver import NameServerClient
from ..routing.publish_info import master_addrs
from ..transport.http import Credentials, SyncHttp
from ._allocate import allocate_averagely
from ._hold import HeldMessages
from ._rpc import call

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

_ROUTE_TTL = 5.0  # seconds between route look-ups while polling
_MAX_PULL = 1024  # messages per pull at most (the broker's default limit)
_CONVERGE_S = 0.1  # heartbeat this often while the queues held differ from the share
_MIN_SESSION_S = wire.MIN_GROUP_LEASE_MS / 1000
_MAX_SESSION_S = wire.MAX_GROUP_LEASE_MS / 1000

T = TypeVar("T")
Key = tuple[str, int]  # (broker name, queue id)


def _client_id() -> str:
    host = "".join(c for c in socket.gethostname() if "!" <= c <= "~")[:64] or "host"
    return f"{host}@{os.getpid()}@{uuid.uuid4().hex[:12]}"


class Consumer:
    """``Consumer(namesrv, topic, group)``; ``poll()`` returns delivered messages.

    ``session_timeout``: seconds after its last heartbeat or poll that a member counts as
    dead and its queues move to the others (heartbeats go every third of it).
    ``auto_commit=False``: only ``commit()`` commits (``poll()`` does not).

    Brokers hand messages over up to ``fire_ahead_ms`` (40 ms) before their time; the
    consumer holds each and ``poll()`` returns it at its deliver time by the broker's clock,
    never earlier, earliest first.
    """

    def __init__(
        self,
        namesrv: str | Sequence[str],
        topic: str,
        group: str,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        request_timeout: float = 5.0,
        verify: bool | str = True,
        session_timeout: float = 6.0,
        auto_commit: bool = True,
        client_id: str | None = None,
    ) -> None:
        if not wire.valid_topic(topic):
            raise InvalidMessageError(f"invalid topic name {topic!r}")
        if not wire.GROUP_RE.match(group):
            raise InvalidMessageError(f"invalid group name {group!r}")
        if not _MIN_SESSION_S <= session_timeout <= _MAX_SESSION_S:
            raise ValueError(f"session_timeout must be {_MIN_SESSION_S}..{_MAX_SESSION_S} s")
        cid = client_id or _client_id()
        if not wire.PRINTABLE_128_RE.match(cid):
            raise ValueError("client_id must be 1-128 printable ASCII characters")
        self.topic = topic
        self.group = group
        self.client_id = cid
        self.auto_commit = auto_commit
        self._lease_ms = int(session_timeout * 1000)
        self._interval = session_timeout / 3
        creds = Credentials(access_key, secret_key) if access_key and secret_key else None
        self._http = SyncHttp(content_type=wire.MSGPACK, credentials=creds, verify=verify)
        self._namesrv = NameServerClient(namesrv, timeout=request_timeout, http=self._http)
        self._timeout = request_timeout
        self._brokers: dict[str, str] = {}  # name -> addr
        self._route_at = 0.0
        self._counts: dict[str, int] = {}  # broker -> read queues
        self._members: list[str] = []
        self._target: dict[str, set[int]] = {}  # this member's share
        self._owned: dict[str, set[int]] = {}  # what the brokers granted
        self._next_hb = 0.0
        self._pos: dict[Key, int] = {}  # next offset to fetch
        self._delivered: dict[Key, int] = {}  # next offset after what poll() returned
        self._ack: dict[Key, int] = {}  # may be committed
        self._committed: dict[Key, int] = {}
        self._inflight: dict[str, Future[tuple[wire.PullResponse, int]]] = {}
        self._sent: dict[str, tuple[dict[int, int], dict[int, int]]] = {}  # queues, commits
        # fetched, not returned: each message until its deliver time (brokers fire a few
        # ms ahead, see _hold.py), and what may be committed
        self._held = HeldMessages()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="qclient-consumer")
        self._lock = threading.RLock()
        self._closed = False

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
        idle_since = time.monotonic()
        while not self._closed:
            wait_s = 1.0
            if timeout is not None:
                wait_s = min(wait_s, timeout - (time.monotonic() - idle_since))
                if wait_s <= 0:
                    return
            try:
                batch = self.poll(max_messages, timeout=wait_s)
            except ConsumerClosedError:
                return
            if batch:
                yield from batch
                idle_since = time.monotonic()

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

    # --- requests -------------------------------------------------------------------

    def _request(
        self,
        broker: str,
        addr: str,
        path: str,
        req: object,
        typ: type[T],
        wait_ms: int = 0,
        timeout: float | None = None,
    ) -> T | None:
        limit = (self._timeout if timeout is None else timeout) + wait_ms / 1000
        return call(self._http, broker, addr, path, req, typ, topic=self.topic, timeout=limit)

    def _pending_commits(self, broker: str) -> dict[int, int]:
        owned = self._owned.get(broker, set())
        out = {}
        for q in owned:
            off = self._ack.get((broker, q))
            if off is not None and off > self._committed.get((broker, q), -1):
                out[q] = off
        return out

    def _committed_ok(self, broker: str, commits: dict[int, int], lost: Sequence[int]) -> None:
        for q, off in commits.items():
            if q not in lost:
                key = (broker, q)
                self._committed[key] = max(self._committed.get(key, 0), off)

    def _leave(self, name: str, addr: str) -> None:
        commits = self._pending_commits(name)
        req = wire.GroupHeartbeat(
            self.topic, self.group, self.client_id, self._lease_ms, [], commits, leave=True
        )
        self._request(name, addr, wire.BROKER_GROUP_HEARTBEAT, req, wire.GroupState)

    def _heartbeat_one(
        self, name: str, addr: str, commits: dict[int, int]
    ) -> tuple[wire.GroupState | None, int]:
        """The answer, and our monotonic clock (ns) when it came (for its ``clock_ns``)."""
        want = sorted(self._target.get(name, set()))
        req = wire.GroupHeartbeat(
            self.topic, self.group, self.client_id, self._lease_ms, want, commits
        )
        # a hung broker must not hold up the heartbeats (and pulls) that keep the other
        # brokers' leases alive: wait at most a heartbeat interval
        state = self._request(
            name,
            addr,
            wire.BROKER_GROUP_HEARTBEAT,
            req,
            wire.GroupState,
            timeout=min(self._timeout, self._interval),
        )
        got_ns = time.monotonic_ns()
        if state is not None:
            self._committed_ok(name, commits, [])
        return state, got_ns

    # --- rebalance ------------------------------------------------------------------

    def _refresh_route(self, force: bool = False) -> None:
        if not force and self._brokers and time.monotonic() - self._route_at < _ROUTE_TTL:
            return
        try:
            route = self._namesrv.get_route(self.topic)
        except QClientError:
            if self._brokers:  # keep using the brokers we know
                return
            raise
        self._brokers = master_addrs(route)
        self._route_at = time.monotonic()

    def _rebalance(self) -> None:
        """Heartbeat every broker, then recompute this member's share."""
        self._refresh_route()
        brokers = dict(self._brokers)
        sent = {name: self._pending_commits(name) for name in brokers}
        futs = {
            name: self._pool.submit(self._heartbeat_one, name, addr, sent[name])
            for name, addr in brokers.items()
        }
        members: set[str] = {self.client_id}
        errors: list[QClientError] = []
        for name, fut in futs.items():
            try:
                state, got_ns = fut.result()
            except QClientError as exc:
                errors.append(exc)
                continue
            if state is None:
                self._counts[name] = 0
                self._set_owned(name, set())
                continue
            if state.clock_ns:  # small answers: the best samples of the broker's clock
                self._held.clock(name).add(state.clock_ns, got_ns)
            self._counts[name] = state.queues
            members.update(state.members)
            self._set_owned(name, set(state.owned))
        for name in list(self._counts):
            if name not in brokers:
                del self._counts[name]
                self._set_owned(name, set())
        refused = [e for e in errors if isinstance(e, AuthError)]
        if refused:  # refused credentials do not change by waiting: say so at once
            raise refused[0]
        if errors and len(errors) == len(brokers):
            self._refresh_route(force=True)
        elif errors:
            log.debug("group heartbeat failed on %d broker(s): %s", len(errors), errors[0])
        self._members = sorted(members)
        queues = sorted((b, q) for b, n in self._counts.items() for q in range(n))
        share = allocate_averagely(queues, self._members, self.client_id)
        target: dict[str, set[int]] = {}
        for b, q in share:
            target.setdefault(b, set()).add(q)
        changed = target != self._target
        self._target = target
        converged = not changed and all(
            self._owned.get(b, set()) == target.get(b, set()) for b in self._counts
        )
        if changed:  # claim the new share (and release the old) right away
            self._next_hb = time.monotonic()
        else:
            self._next_hb = time.monotonic() + (self._interval if converged else _CONVERGE_S)

    def _set_owned(self, broker: str, owned: set[int]) -> None:
        for q in self._owned.get(broker, set()) - owned:
            self._drop(broker, q)
        if owned:
            self._owned[broker] = owned
        else:
            self._owned.pop(broker, None)

    def _drop(self, broker: str, q: int) -> None:
        """Forget a queue no longer held: its held (not returned) messages go back, and
        so do offsets not committed yet -- committing them later could move the group's
        offset backwards, or past copies a crashed broker fires again."""
        key = (broker, q)
        for d in (self._pos, self._delivered, self._ack, self._committed):
            d.pop(key, None)
        self._owned.get(broker, set()).discard(q)
        self._held.drop(broker, q)

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
