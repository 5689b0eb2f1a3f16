"""A RocketMQ group member's background work, on one asyncio event loop: heartbeats and
rebalancing, one long-polling pull per owned queue, and commits.

The member reads its topic and the group's retry topic ``%RETRY%<group>`` (each a
:class:`Subscription` with its own :class:`~.state.ConsumeState`), as RocketMQ's Java
consumers do in clustering mode. Every ``interval`` (and at once when a broker sends
NOTIFY_CONSUMER_IDS_CHANGED) the member heartbeats every master of both with both
subscriptions (the topic's with the group's tag expression; a broker creates the retry
topic on the first one), reads the group's members from one broker, and divides each
topic's sorted queues among them (``AllocateMessageQueueAveragely``, as RocketMQ's own
consumers do, so they can share a group with this one). A queue it stops owning is
committed first, then let go; a new queue is read from the group's committed offset, or
from its first stored offset when the group has none (CONSUME_FROM_FIRST_OFFSET). Each
owned queue has one PULL_MESSAGE in flight that the broker holds until a message arrives
(long polling); what it answers goes to the subscription's state, which the polling
thread reads under the same lock. Commits are in :mod:`.commits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..._config import NEW_TOPIC_WATCH_S, NEW_TOPIC_WINDOW_S
from ...consumer._failures import retry_topic
from ...errors import BrokerUnavailableError, QClientError
from ...protocol.wire import TopicRoute
from .aio import AsyncConnection, AsyncConnectionPool
from .codes import RequestCode, ResponseCode, code_name
from .commits import Committer
from .connection import RemotingConnectionError, RemotingError
from .message import MessageDecodeError
from .nameserver import AsyncRocketMQNameServer
from .pull import PullStatus, parse_pull, pull_request
from .rebalance import (
    Handover,
    Key,
    consumer_list_request,
    heartbeat_request,
    min_offset_request,
    parse_consumer_list,
    query_offset_request,
    read_offset,
    unregister_request,
)
from .remoting import RemotingCommand, response_to
from .retry import SendTarget, read_send, send_targets
from .state import ConsumeState
from .switch import follow_switch

__all__ = ["MemberLoop", "Subscription"]

log = logging.getLogger(__name__)

#: how long a broker may hold a pull while the queue has nothing new (long polling)
SUSPEND_MS = 15_000
#: messages per pull (the broker's default cap for messages in memory)
PULL_BATCH = 32
#: stop fetching a queue / all queues while this many messages are held, not returned
MAX_HELD_PER_QUEUE = 1_000
MAX_HELD = 10_000
#: seconds between route look-ups (sooner after a broker failed)
ROUTE_TTL = 5.0
#: how often a held-back fetch looks again
_FLOW_WAIT = 0.05


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(eq=False)
class Subscription:
    """One topic the member reads: its tag expression (``"*"``: all), what it holds
    (``state``, shared with the polling thread under the member's lock) and which of its
    queues this member owns."""

    topic: str
    expression: str
    state: ConsumeState
    handover: Handover
    #: whether the topic's route failing is the member's error (poll raises it)
    primary: bool = True
    masters: dict[str, str] = field(default_factory=dict)  # broker name -> master address
    queues: list[Key] = field(default_factory=list)
    route: TopicRoute | None = None
    route_at: float = -1e9
    #: when a look-up was last tried, and last found the masters or queues different
    route_tried_at: float = -1e9
    route_changed_at: float = -1e9
    pulls: dict[Key, asyncio.Task[None]] = field(default_factory=dict)


class MemberLoop:
    """The member's coroutines. Built on any thread; ``run`` and ``shutdown`` run on the
    loop; the subscriptions' states are shared with other threads under ``cond``."""

    def __init__(
        self,
        *,
        namesrv: Sequence[str],
        group: str,
        client_id: str,
        request_timeout: float,
        interval: float,
        subscriptions: Sequence[tuple[str, str, ConsumeState]],
        cond: threading.Condition,
    ) -> None:
        """``subscriptions``: (topic, tag expression, state) of each topic read, the
        consumer's own first (its route failing is an error ``poll`` raises)."""
        self.group = group
        self.client_id = client_id
        self._namesrv = tuple(namesrv)
        self._timeout = request_timeout
        self._interval = interval
        self._cond = cond
        self._sub_version = _now_ms()
        # a member letting a queue go waits up to _ack_wait for the application's next
        # poll; the new owner waits for that and for a round of heartbeats (the member
        # may learn of the change only then)
        self._ack_wait = interval / 4
        # a hung broker must not hold up the rounds that keep the other brokers' view
        # (and this member's share) current: its heartbeat waits at most an interval
        self._round_timeout = min(request_timeout, max(interval, 0.5))
        self.subs = [
            Subscription(t, e, s, Handover(client_id, grace=interval * 1.5), primary=i == 0)
            for i, (t, e, s) in enumerate(subscriptions)
        ]
        self.topic = self.subs[0].topic
        self._addrs: dict[str, str] = {}  # every broker address seen (commits on let-go)
        self._spread = itertools.count()  # spreads send-backs over a broker's retry queues
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._commit_wake: asyncio.Event | None = None
        self._pool: AsyncConnectionPool | None = None
        self._ns: AsyncRocketMQNameServer | None = None
        self._committer = Committer(group, cond, self._addrs, self._connection, request_timeout)
        #: whether the topic's route was ever read, and the last round's error (poll
        #: raises it while there has been no route)
        self.routed = False
        self.error: QClientError | None = None
        self.members: list[str] = []

    # --- for the consumer --------------------------------------------------------------

    def wake_committer(self) -> None:
        """Commit what was acknowledged soon (on the loop's thread: the consumer calls it
        through ``call_soon_threadsafe``)."""
        if self._commit_wake is not None:
            self._commit_wake.set()

    async def commit_all(self) -> list[QClientError]:
        """Commit every acknowledged offset the brokers have not confirmed; the errors."""
        return await self._committer.commit_all(self.subs)

    def known_masters(self) -> dict[str, str]:
        """Broker name -> master address of every broker the subscriptions' routes name."""
        out = dict(self._addrs)
        for sub in self.subs:
            out.update(sub.masters)
        return out

    async def send_back(
        self, prefer: str, build: Callable[[SendTarget], RemotingCommand]
    ) -> SendTarget:
        """Send ``build(target)`` to the retry topic's brokers (``send_targets``: broker
        ``prefer`` first) until one stores it; the target that did. Raises the last
        broker's error when none did (a refusal any broker would give stops at once)."""
        topic = retry_topic(self.group)
        route = next((s.route for s in self.subs if s.topic == topic), None)
        targets = send_targets(route, prefer, self.known_masters(), next(self._spread))
        if not targets:
            raise BrokerUnavailableError(f"no broker to send {topic} messages to")
        err: QClientError | None = None
        for target in targets:
            try:
                answer: RemotingCommand | BaseException = await self._call(
                    target.addr, build(target)
                )
            except RemotingError as exc:
                answer = exc
            err, again = read_send(answer, broker=target.broker, topic=topic)
            if err is None:
                return target
            log.warning("consumer %s: send-back to %s failed: %s", self.client_id, target, err)
            if not again:
                break
        assert err is not None
        raise err

    # --- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Heartbeat / rebalance rounds until ``shutdown``."""
        self._task = asyncio.current_task()
        self._wake = asyncio.Event()
        self._commit_wake = asyncio.Event()
        self._pool = AsyncConnectionPool(connect_timeout=self._timeout, on_request=self._serve)
        self._ns = AsyncRocketMQNameServer(self._namesrv, timeout=self._timeout)
        committer = asyncio.create_task(self._commit_loop())
        round_at = 0.0  # when the next full round is due (monotonic)
        woken = True
        try:
            while not self._stopping:
                try:
                    # (between rounds, a watched route that changed: a new topic reached
                    # a broker, whose queues are taken now)
                    if woken or time.monotonic() >= round_at or await self._watch_routes():
                        round_at = time.monotonic() + self._interval
                        await self._round()
                    self.error = None
                except QClientError as exc:
                    self.error = exc
                    log.warning("consumer %s: group round failed: %s", self.client_id, exc)
                    with self._cond:  # a poll waiting may have to raise it
                        self._cond.notify_all()
                except Exception:  # a bug: keep the member alive, say so
                    log.exception("consumer %s: group round failed", self.client_id)
                now = time.monotonic()
                for sub in self.subs:
                    claim = sub.handover.next_claim()
                    if claim is not None:
                        round_at = min(round_at, claim)
                waits = [round_at - now]
                waits += [
                    self._route_due_at(s, now) - now for s in self.subs if self._watching(s, now)
                ]
                woken = False
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.0, min(waits)))
                    woken = True
                except TimeoutError:
                    pass
                self._wake.clear()
        finally:
            committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer

    def _serve(self, conn: AsyncConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        """Requests from a broker: a change of the group's members rebalances at once."""
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            if self._wake is not None:
                self._wake.set()
            return None
        return response_to(
            cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} not supported"
        )

    async def _connection(self, addr: str) -> AsyncConnection:
        assert self._pool is not None
        return await self._pool.get(addr)

    async def _call(
        self, addr: str, cmd: RemotingCommand, timeout: float | None = None
    ) -> RemotingCommand:
        conn = await self._connection(addr)
        return await conn.call(cmd, self._timeout if timeout is None else timeout)

    def _watching(self, sub: Subscription, now: float) -> bool:
        """Whether the topic's route is looked at every NEW_TOPIC_WATCH_S between rounds:
        the member's own topic while it does not exist or changed within
        NEW_TOPIC_WINDOW_S (each broker creates it on its first message there)."""
        return sub.primary and (
            sub.route is None or now - sub.route_changed_at < NEW_TOPIC_WINDOW_S
        )

    def _route_due_at(self, sub: Subscription, now: float) -> float:
        """When the topic's route is looked up next (monotonic); a watched one the
        watch's time after the last try, answered or not (a name server down is not
        asked in a loop)."""
        if self._watching(sub, now):
            return max(sub.route_at, sub.route_tried_at) + NEW_TOPIC_WATCH_S
        return sub.route_at + ROUTE_TTL

    async def _watch_routes(self) -> bool:
        """Look up the watched routes that are due; True if masters or queues changed."""
        now = time.monotonic()
        changed = False
        for sub in self.subs:
            if self._watching(sub, now) and now >= self._route_due_at(sub, now):
                changed |= await self._refresh_route(sub)
        return changed

    async def _refresh_route(self, sub: Subscription) -> bool:
        """Look the route up; True if the masters or queues changed."""
        before = (dict(sub.masters), list(sub.queues))
        try:
            await self._look_up_route(sub)
        finally:
            sub.route_tried_at = time.monotonic()
            changed = (sub.masters, sub.queues) != before
            if changed:
                sub.route_changed_at = sub.route_tried_at
        return changed

    async def _look_up_route(self, sub: Subscription) -> None:
        assert self._ns is not None
        try:
            route = await self._ns.get_route(sub.topic)
        except QClientError:
            if not sub.primary or self.routed:  # keep the brokers we know
                log.warning(
                    "consumer %s: route of %s failed, keeping the last", self.client_id, sub.topic
                )
                return
            raise
        # the retry topic not created yet (before a broker's first heartbeat made it) is
        # asked for again every round, not every ROUTE_TTL
        fresh = sub.primary or not route.auto_create
        sub.route_at = time.monotonic() if fresh else -1e9
        if sub.primary:
            self.routed = True
        if route.auto_create:  # the topic does not exist yet: nothing to read
            sub.masters, sub.queues, sub.route = {}, [], None
            return
        sub.route = route
        # a group between its master's death and the election keeps its queues and
        # positions (switch.py): taken anew, they would read from stale commits
        before = sub.masters
        sub.masters, sub.queues = follow_switch(route, sub.masters, sub.queues)
        self._addrs.update(sub.masters)
        moved = [b for b, addr in sub.masters.items() if before.get(b, addr) != addr]
        if moved:  # a new master: it gets this member's commits again
            with self._cond:
                for broker in moved:
                    sub.state.recommit(broker)
            self.wake_committer()

    async def _round(self) -> None:
        """Heartbeat every master, read the members, let go and take queues, commit."""
        for sub in self.subs:
            now = time.monotonic()
            if now >= self._route_due_at(sub, now):
                await self._refresh_route(sub)
        masters: dict[str, str] = {}
        for sub in self.subs:
            masters.update(sub.masters)
        topics = {sub.topic: sub.expression for sub in self.subs}
        beat = heartbeat_request(self.client_id, self.group, topics, self._sub_version)
        answers = await asyncio.gather(
            *(self._call(addr, beat, self._round_timeout) for addr in masters.values()),
            return_exceptions=True,
        )
        for name, a in zip(masters, answers, strict=True):
            if not isinstance(a, RemotingCommand) or a.code != ResponseCode.SUCCESS:
                log.debug("consumer %s: heartbeat to %s failed: %r", self.client_id, name, a)
                for sub in self.subs:  # look the routes up again next round
                    sub.route_at = -1e9
        members = await self._read_members(masters) if masters else []
        if members is None:
            return  # no broker answered: keep what is held until one does
        self.members = members
        for sub in self.subs:
            with self._cond:
                held = set(sub.state.assignment())
            lose, take = sub.handover.plan(members, sub.queues, held, time.monotonic())
            if lose:
                await asyncio.gather(*(self._let_go(sub, k) for k in lose))
            if take:
                await asyncio.gather(*(self._take(sub, k) for k in take))
        await self.commit_all()

    async def _read_members(self, masters: dict[str, str]) -> list[str] | None:
        """The group's members: every master's list, merged (None when no master
        answered). A master elected a moment ago knows only the members whose heartbeat
        reached it since; read from it alone, a member would take the others' queues."""

        async def one(name: str) -> list[str] | None:
            try:
                answer = await self._call(
                    masters[name], consumer_list_request(self.group), self._round_timeout
                )
            except RemotingError as exc:
                log.debug("consumer %s: member list from %s failed: %s", self.client_id, name, exc)
                return None
            members = parse_consumer_list(answer)
            if members is None:
                why = answer.remark
                log.debug("consumer %s: member list from %s: %s", self.client_id, name, why)
            return members

        lists = await asyncio.gather(*(one(name) for name in sorted(masters)))
        known = [m for m in lists if m is not None]
        if not known:
            return None
        return sorted({m for members in known for m in members})

    async def _let_go(self, sub: Subscription, key: Key) -> None:
        """Stop reading ``key``, give the application a moment to acknowledge what it
        returned of it (the next ``poll`` does), commit, forget it."""
        state = sub.state
        with self._cond:
            state.stop(key)
        task = sub.pulls.pop(key, None)
        if task is not None:
            task.cancel()
        deadline = time.monotonic() + self._ack_wait
        while time.monotonic() < deadline:
            with self._cond:
                if not state.unacked(key):
                    break
            await asyncio.sleep(0.02)
        with self._cond:
            offset = state.drop(key)
        if offset is not None:
            await self._committer.commit(sub, key[0], {key: offset})
        log.debug(
            "consumer %s: let go of %s %s (committed %s)", self.client_id, sub.topic, key, offset
        )

    async def _take(self, sub: Subscription, key: Key) -> None:
        """Start reading ``key`` from the group's committed offset, else its first."""
        broker, qid = key
        addr = sub.masters.get(broker)
        if addr is None:
            return
        try:
            query = query_offset_request(self.group, sub.topic, qid, broker)
            answer = await self._call(addr, query)
            offset = read_offset(answer)
            if offset is None:
                answer = await self._call(addr, min_offset_request(sub.topic, qid, broker))
                offset = read_offset(answer) or 0
        except (RemotingError, ValueError) as exc:
            # not taken: the next round claims it again
            log.warning("consumer %s: offset of %s unknown: %s", self.client_id, key, exc)
            return
        with self._cond:
            gen = sub.state.take(key, offset)
        sub.pulls[key] = asyncio.create_task(self._pull_loop(sub, key, gen))
        log.debug("consumer %s: took %s %s at offset %d", self.client_id, sub.topic, key, offset)

    # --- fetching ------------------------------------------------------------------------

    async def _pull_loop(self, sub: Subscription, key: Key, gen: int) -> None:
        """Keep one long-polling pull of ``key`` in flight while this ownership lasts."""
        broker, qid = key
        state, cond = sub.state, self._cond
        failures = 0
        while not self._stopping:
            with cond:
                if not state.owns(key, gen):
                    return
                full = state.held(key) >= MAX_HELD_PER_QUEUE or state.total_held >= MAX_HELD
                offset = state.position(key)
            addr = sub.masters.get(broker)
            if full or addr is None:
                await asyncio.sleep(_FLOW_WAIT if full else self._interval)
                continue
            cmd = pull_request(
                group=self.group,
                topic=sub.topic,
                queue_id=qid,
                offset=offset,
                max_messages=PULL_BATCH,
                suspend_ms=SUSPEND_MS,
                sub_version=self._sub_version,
                broker_name=broker,
                subscription=sub.expression,
            )
            try:
                answer = await self._call(addr, cmd, SUSPEND_MS / 1000 + self._timeout)
                result = parse_pull(answer, qid, offset)
            except (RemotingError, MessageDecodeError) as exc:
                failures += 1
                if isinstance(exc, RemotingConnectionError):
                    sub.route_at = -1e9
                log.debug("consumer %s: pull of %s failed: %s", self.client_id, key, exc)
                await asyncio.sleep(min(1.0, 0.05 * 2**failures))
                continue
            failures = 0
            now = _now_ms()
            with cond:
                if result.status is PullStatus.FOUND:
                    ok = state.accept(key, gen, result.messages, result.next_offset, now)
                    if ok:
                        cond.notify_all()
                elif result.status is PullStatus.ERROR:
                    ok = state.owns(key, gen)
                else:
                    ok = state.advance(key, gen, result.next_offset)
            if not ok:
                return
            if result.status is PullStatus.ERROR:
                log.warning(
                    "consumer %s: pull of %s %s refused: %s %s",
                    self.client_id,
                    sub.topic,
                    key,
                    code_name(result.code),
                    result.remark,
                )
                await asyncio.sleep(self._interval)

    # --- commits -------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        assert self._commit_wake is not None
        while True:
            await self._commit_wake.wait()
            self._commit_wake.clear()
            for err in await self.commit_all():
                log.debug("consumer %s: commit failed: %s", self.client_id, err)

    # --- leaving -------------------------------------------------------------------------

    async def shutdown(self) -> list[QClientError]:
        """Stop fetching, commit what was acknowledged, leave the group on every broker
        (the others rebalance at once), close the connections; the commit errors."""
        self._stopping = True
        pulls = [t for sub in self.subs for t in sub.pulls.values()]
        tasks = [t for t in (self._task, *pulls) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in self.subs:
            sub.pulls.clear()
        errors: list[QClientError] = []
        try:
            if self._pool is not None:
                errors = await self.commit_all()
                leave = unregister_request(self.client_id, self.group)
                await asyncio.gather(
                    *(self._call(a, leave) for a in self.known_masters().values()),
                    return_exceptions=True,
                )
        finally:
            if self._pool is not None:
                await self._pool.close()
            if self._ns is not None:
                await self._ns.aclose()
        return errors
