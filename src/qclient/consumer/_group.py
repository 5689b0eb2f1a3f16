"""One member of a consumer group: its state and its side of the group protocol.

A member reads the group's topic and the group's retry topic ``%RETRY%<group>`` (where
``retry_later`` puts messages back), each a :class:`Subscription` of its own. Every
heartbeat interval it heartbeats each broker of each topic with the queues it wants
there, learns the group's live members, and takes its contiguous share of that topic's
queues (:func:`allocate_averagely`). Commits ride on pulls and heartbeats; a queue no
longer held is forgotten with what was fetched from it and not returned.
:class:`~qclient.consumer.Consumer` adds polling on top.

The retry topic exists once some member retried a message (brokers create it on that
first send): until then its route is looked up every :data:`_ROUTE_TTL`, and a member
that sent a retry itself reads it from that broker at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import TypeVar

from .._config import NEW_TOPIC_WATCH_S
from ..engines import parse_namesrv
from ..errors import AuthError, QClientError
from ..protocol import wire
from ..routing.nameserver import NameServerClient
from ..routing.publish_info import master_addrs
from ..transport.http import Credentials, SyncHttp
from ._allocate import allocate_averagely
from ._failures import MAX_ATTEMPTS, failure_policy, retry_topic
from ._hold import ClockOffset
from ._lane import Lane
from ._member import check_member
from ._received import from_pulled
from ._retry import from_retry
from ._rpc import call
from ._sub import Subscription

__all__ = ["DeliveryKey", "GroupMember"]

log = logging.getLogger(__name__)

_ROUTE_TTL = 5.0  # seconds between route look-ups while polling
_CONVERGE_S = 0.1  # heartbeat this often while the queues held differ from the share

T = TypeVar("T")
#: one delivery of one message as poll() returned it: the hash of (the object's id,
#: broker, queue id, offset, msg id, attempt) -- the object's own id, so that another
#: consumer's copy of the same delivery is not taken for this one's; a hash, not the
#: tuple, as tens of thousands are kept
DeliveryKey = int


def _client_id() -> str:
    host = "".join(c for c in socket.gethostname() if "!" <= c <= "~")[:64] or "host"
    return f"{host}@{os.getpid()}@{uuid.uuid4().hex[:12]}"


class GroupMember:
    """A member's subscriptions (route, share, leases, offsets, held messages per topic)
    and its requests: heartbeats, leaving, commits, and the rebalance that follows each
    heartbeat round."""

    def __init__(
        self,
        namesrv: str | Sequence[str],
        topic: str,
        group: str,
        *,
        tags: str | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        retry_delays: Sequence[float | timedelta] | None = None,
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
        self.policy = failure_policy(tags, max_attempts, retry_delays)
        self.topic = topic
        self.group = group
        self.client_id = cid
        self.auto_commit = auto_commit
        #: the tags the group receives (None: all), as pulls carry them; and as a set
        #: the consumer checks again (empty: all)
        self._tags = None if self.policy.tags is None else sorted(self.policy.tags)
        self._keep = self.policy.tags or frozenset()
        self._lease_ms = int(session_timeout * 1000)
        self._interval = session_timeout / 3
        creds = Credentials(access_key, secret_key) if access_key and secret_key else None
        self._http = SyncHttp(content_type=wire.MSGPACK, credentials=creds, verify=verify)
        _engine, addrs = parse_namesrv(namesrv)  # qclient:// or none: ours (see Consumer)
        self._namesrv = NameServerClient(addrs, timeout=request_timeout, http=self._http)
        self._timeout = request_timeout
        clocks: dict[str, ClockOffset] = {}  # per broker, shared by the subscriptions
        self._main = Subscription(topic, retry=False, convert=from_pulled, clocks=clocks)
        subs = [self._main]
        retries = retry_topic(group)
        # (a group consuming its own retry topic, or a name too long for one, has none)
        if retries != topic and wire.valid_topic(retries):
            subs.append(Subscription(retries, retry=True, convert=from_retry, clocks=clocks))
        self._subs = tuple(subs)
        #: brokers this member sent retries to: their retry topic exists
        self._retry_brokers: dict[str, str] = {}
        self._next_hb = 0.0
        #: the deliveries poll() returned (the newest ones): handed back already?
        self._returned: OrderedDict[DeliveryKey, bool] = OrderedDict()
        #: hand-backs by (broker, address): concurrent ones share requests
        self._lanes: dict[tuple[str, str], Lane] = {}
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="qclient-consumer")
        self._lock = threading.RLock()
        self._closed = False

    # --- requests -------------------------------------------------------------------

    def _request(
        self,
        sub: Subscription,
        broker: str,
        addr: str,
        path: str,
        req: object,
        typ: type[T],
        wait_ms: int = 0,
        timeout: float | None = None,
    ) -> T | None:
        limit = (self._timeout if timeout is None else timeout) + wait_ms / 1000
        return call(self._http, broker, addr, path, req, typ, topic=sub.topic, timeout=limit)

    def _leave(self, sub: Subscription, name: str, addr: str) -> None:
        commits = sub.pending_commits(name)
        req = wire.GroupHeartbeat(
            sub.topic, self.group, self.client_id, self._lease_ms, [], commits, leave=True
        )
        self._request(sub, name, addr, wire.BROKER_GROUP_HEARTBEAT, req, wire.GroupState)

    def _heartbeat_one(
        self, sub: Subscription, name: str, addr: str, commits: dict[int, int]
    ) -> tuple[wire.GroupState | None, int]:
        """The answer, and our monotonic clock (ns) when it came (for its ``clock_ns``)."""
        want = sorted(sub.target.get(name, set()))
        req = wire.GroupHeartbeat(
            sub.topic, self.group, self.client_id, self._lease_ms, want, commits
        )
        # a hung broker must not hold up the heartbeats (and pulls) that keep the other
        # brokers' leases alive: wait at most a heartbeat interval
        state = self._request(
            sub,
            name,
            addr,
            wire.BROKER_GROUP_HEARTBEAT,
            req,
            wire.GroupState,
            timeout=min(self._timeout, self._interval),
        )
        got_ns = time.monotonic_ns()
        if state is not None:
            sub.committed_ok(name, commits, [])
        return state, got_ns

    # --- rebalance ------------------------------------------------------------------

    def _route_due(self, sub: Subscription) -> bool:
        """Whether the topic's route is looked up again now."""
        return not (sub.brokers or sub.retry) or time.monotonic() - sub.route_at >= _ROUTE_TTL

    def _refresh_route(self, sub: Subscription, force: bool = False) -> None:
        if not force and not self._route_due(sub):
            return
        now = time.monotonic()
        try:
            route = self._namesrv.get_route(sub.topic)
        except QClientError:
            if sub.retry:  # not there (yet), or no answer: keep what is known
                sub.route_at = now
                sub.brokers.update(dict(self._retry_brokers))  # (a hand-back may add one)
                return
            if sub.brokers:  # keep using the brokers we know
                return
            raise
        if sub.retry and route.auto_create:  # no broker has it yet
            brokers: dict[str, str] = {}
        else:
            brokers = master_addrs(route)
        if sub.retry:
            for name, addr in dict(self._retry_brokers).items():
                brokers.setdefault(name, addr)
        sub.brokers = brokers
        sub.route_at = now

    def _rebalance(self) -> None:
        """Heartbeat every broker of every topic, then recompute this member's shares."""
        subs = [s for s in self._subs if not s.refused]
        due = [s for s in subs if self._route_due(s)]
        if len(due) > 1:  # at once: each is a name-server round trip on the poll's time
            for f in [self._pool.submit(self._refresh_route, s) for s in due]:
                f.result()
        elif due:
            self._refresh_route(due[0])
        futs = {
            (sub, name): self._pool.submit(
                self._heartbeat_one, sub, name, addr, sub.pending_commits(name)
            )
            for sub in subs
            for name, addr in dict(sub.brokers).items()
        }
        changed = False
        converged = True
        for sub in subs:
            mine = {name: f for (s, name), f in futs.items() if s is sub}
            sub_changed, sub_converged = self._rebalance_topic(sub, mine)
            changed |= sub_changed
            converged &= sub_converged
        if changed:  # claim the new share (and release the old) right away
            self._next_hb = time.monotonic()
        else:
            wait = self._interval if converged else _CONVERGE_S
            if any(not s.retry and (s.missing_on or not s.brokers) for s in subs):
                # the topic is not on every broker yet: its first message there creates
                # it, and the member should read it at once (a retry topic is created
                # by a member's hand-back and read at once by that member)
                wait = min(wait, NEW_TOPIC_WATCH_S)
            self._next_hb = time.monotonic() + wait

    def _rebalance_topic(
        self, sub: Subscription, futs: dict[str, Future[tuple[wire.GroupState | None, int]]]
    ) -> tuple[bool, bool]:
        """Take one topic's heartbeat answers; returns (share changed, queues held are
        the share)."""
        members: set[str] = {self.client_id}
        errors: list[QClientError] = []
        for name, fut in futs.items():
            try:
                state, got_ns = fut.result()
            except QClientError as exc:
                errors.append(exc)
                continue
            if state is None:  # the topic is not on this broker (yet)
                sub.counts[name] = 0
                sub.set_owned(name, set())
                sub.missing_on.add(name)
                continue
            sub.missing_on.discard(name)
            if state.clock_ns:  # small answers: the best samples of the broker's clock
                sub.held.clock(name).add(state.clock_ns, got_ns)
            sub.counts[name] = state.queues
            members.update(state.members)
            sub.set_owned(name, set(state.owned))
        for name in list(sub.counts):
            if name not in futs:
                del sub.counts[name]
                sub.set_owned(name, set())
        sub.missing_on &= futs.keys()
        refused = [e for e in errors if isinstance(e, AuthError)]
        if refused and sub.retry:
            # the account may not read the retry topic: the group reads its topic only
            log.warning("%s: not reading %s: %s", self.group, sub.topic, refused[0])
            sub.refused = True
            for name in list(sub.owned):
                sub.set_owned(name, set())
            return False, True
        if refused:  # refused credentials do not change by waiting: say so at once
            raise refused[0]
        if errors and len(errors) == len(futs):
            self._refresh_route(sub, force=True)
        elif errors:
            log.debug("group heartbeat failed on %d broker(s): %s", len(errors), errors[0])
        sub.members = sorted(members)
        queues = sorted((b, q) for b, n in sub.counts.items() for q in range(n))
        share = allocate_averagely(queues, sub.members, self.client_id)
        target: dict[str, set[int]] = {}
        for b, q in share:
            target.setdefault(b, set()).add(q)
        changed = target != sub.target
        sub.target = target
        converged = not changed and all(
            sub.owned.get(b, set()) == target.get(b, set()) for b in sub.counts
        )
        return changed, converged
