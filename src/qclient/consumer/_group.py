"""One member of a consumer group: its state and its side of the group protocol.

Every heartbeat interval a member heartbeats each broker of the topic with the queues it
wants there, learns the group's live members, and takes its contiguous share of all
queues (:func:`allocate_averagely`). Commits ride on pulls and heartbeats; a queue no
longer held is forgotten with what was fetched from it and not returned.
:class:`~qclient.consumer.Consumer` adds polling on top.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from ..engines import parse_namesrv
from ..errors import AuthError, QClientError
from ..protocol import wire
from ..routing.nameserver import NameServerClient
from ..routing.publish_info import master_addrs
from ..transport.http import Credentials, SyncHttp
from ._allocate import allocate_averagely
from ._hold import HeldMessages
from ._member import check_member
from ._rpc import call

__all__ = ["GroupMember"]

log = logging.getLogger(__name__)

_ROUTE_TTL = 5.0  # seconds between route look-ups while polling
_CONVERGE_S = 0.1  # heartbeat this often while the queues held differ from the share

T = TypeVar("T")
Key = tuple[str, int]  # (broker name, queue id)


def _client_id() -> str:
    host = "".join(c for c in socket.gethostname() if "!" <= c <= "~")[:64] or "host"
    return f"{host}@{os.getpid()}@{uuid.uuid4().hex[:12]}"


class GroupMember:
    """A member's state (route, share, leases, offsets, held messages) and its requests:
    heartbeats, leaving, commits, and the rebalance that follows each heartbeat round."""

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
        cid = client_id or _client_id()
        check_member(topic, group, session_timeout, cid)
        self.topic = topic
        self.group = group
        self.client_id = cid
        self.auto_commit = auto_commit
        self._lease_ms = int(session_timeout * 1000)
        self._interval = session_timeout / 3
        creds = Credentials(access_key, secret_key) if access_key and secret_key else None
        self._http = SyncHttp(content_type=wire.MSGPACK, credentials=creds, verify=verify)
        _engine, addrs = parse_namesrv(namesrv)  # qclient:// or none: ours (see Consumer)
        self._namesrv = NameServerClient(addrs, timeout=request_timeout, http=self._http)
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
