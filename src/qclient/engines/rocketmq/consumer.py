"""``RocketMQConsumer``: qclient's group consumer on Apache RocketMQ 5 (the classic
clustering pull model), with the public surface and semantics of
:class:`qclient.consumer.Consumer`.

Members of one group -- in any process, RocketMQ's own Java consumers of the group
included -- share the topic's queues, each message going to one member; on a join, a
close or a member's death (its connections close) the brokers tell the others, which
rebalance within about a second. Different groups each get every message. A message is
never returned before its deliver time (see :mod:`.state`), and ``poll()`` commits what
the previous polls returned (at-least-once).

The work happens on one background thread running an asyncio loop (:mod:`.member`):
heartbeats, rebalancing, one long-polling pull per owned queue, commits. ``poll()`` only
waits for what the pulls bring; it never waits on the network itself.

Failures (:mod:`.retry`): the group also reads its retry topic ``%RETRY%<group>``;
``retry_later`` sends a copy of the message there, due after its delay, and returns once
a broker stored it; ``dead_letter`` (and ``retry_later`` at ``max_attempts``) sends one
that the broker puts on ``%DLQ%<group>``. ``tags`` is filtered by the brokers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from ... import _tracing
from ..._models import ReceivedMessage
from ...consumer._failures import MAX_ATTEMPTS, failure_policy, retry_topic
from ...consumer._member import check_member, iter_messages
from ...errors import (
    ConsumerClosedError,
    QClientError,
    SendTimeoutError,
    UnsupportedByEngineError,
)
from .member import MemberLoop
from .rebalance import Key
from .remoting import RemotingCommand
from .retry import SendTarget, dead_letter_request, retry_request
from .state import ConsumeState, release_merged

__all__ = ["RocketMQConsumer"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: heartbeat / rebalance rounds at least this often (RocketMQ's broker itself forgets a
#: member 120 s after its last heartbeat, or at once when its connection closes)
_MAX_INTERVAL_S = 1.0


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The consumer's thread (it holds no reference to the consumer: see ``_abandon``)."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _abandon(loop: asyncio.AbstractEventLoop, member: MemberLoop) -> None:
    """A consumer garbage-collected unclosed: leave the group and stop its thread, in
    the background (a finalizer must not block)."""
    if loop.is_closed():
        return
    fut = asyncio.run_coroutine_threadsafe(member.shutdown(), loop)
    fut.add_done_callback(lambda _: loop.call_soon_threadsafe(loop.stop))


def _client_id() -> str:
    """Like the Java client's ``ip@instance``: unique per consumer object."""
    return f"127.0.0.1@{os.getpid()}@{uuid.uuid4().hex[:12]}"


class RocketMQConsumer:
    """``RocketMQConsumer(namesrv_addrs, topic, group)``; ``poll()`` returns messages.

    ``session_timeout``: heartbeats (and rebalance rounds) go every third of it or every
    second, whichever is more often. RocketMQ's brokers decide when a silent member is
    dead (120 s after its last heartbeat, or at once when its connections close, as when
    its process dies).
    ``auto_commit=False``: only ``commit()`` commits (``poll()`` does not).
    ``request_timeout``: seconds for each request to a NameServer or broker.
    ``client_id``: the member id (default ``127.0.0.1@<pid>@<random>``).
    A topic the NameServers do not route yet reads nothing until they do (its route is
    looked up every few seconds); while no route was ever read because no NameServer
    answers, ``poll()`` raises ``NameServerUnavailableError``.
    ``access_key`` / ``secret_key`` are not supported on this engine (use RocketMQ's ACL
    outside the client and leave them unset); ``verify`` is accepted and ignored (the
    remoting protocol here is plain TCP).

    ``tags``: a tag expression (``"TagA || TagB"``, ``"*"`` / None for all); the brokers
    skip the other messages (committed as consumed). ``max_attempts`` /
    ``retry_delays``: see :meth:`retry_later`. All members of a group should give the
    same three: RocketMQ keeps one subscription per group.
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        topic: str,
        group: str,
        *,
        session_timeout: float = 6.0,
        auto_commit: bool = True,
        request_timeout: float = 3.0,
        client_id: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        verify: bool | str = True,
        tags: str | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        retry_delays: Sequence[float | timedelta] | None = None,
    ) -> None:
        if access_key or secret_key:
            raise UnsupportedByEngineError(
                "rocketmq",
                "access control (access_key / secret_key)",
                "use RocketMQ's own ACL on the cluster and leave the keys unset",
            )
        addrs = (namesrv_addrs,) if isinstance(namesrv_addrs, str) else tuple(namesrv_addrs)
        addrs = tuple(a.removeprefix("rocketmq://") for a in addrs)
        if not addrs:
            raise ValueError("namesrv_addrs is empty")
        cid = client_id or _client_id()
        check_member(topic, group, session_timeout, cid)
        if request_timeout <= 0:
            raise ValueError("request_timeout must be > 0")
        policy = failure_policy(tags, max_attempts, retry_delays)
        self.topic = topic
        self.group = group
        self.client_id = cid
        self.auto_commit = auto_commit
        self.policy = policy
        self._timeout = request_timeout
        self._retry_topic = retry_topic(group)
        self._state = ConsumeState(accepts=policy.accepts if policy.tags is not None else None)
        self._retry_state = ConsumeState()
        self._states = [self._state, self._retry_state]
        #: (store topic, key, offset) of messages whose retry_later failed (not committed)
        self._reopened: set[tuple[str, Key, int]] = set()
        self._sent = {"retried": 0, "dead_lettered": 0}
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._member = MemberLoop(
            namesrv=addrs,
            group=group,
            client_id=cid,
            request_timeout=request_timeout,
            interval=min(_MAX_INTERVAL_S, session_timeout / 3),
            subscriptions=[
                (topic, policy.tag_expression, self._state),
                (self._retry_topic, "*", self._retry_state),
            ],
            cond=self._cond,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=_run_loop,
            args=(self._loop,),
            name=f"qclient-rocketmq-consumer-{cid}",
            daemon=True,
        )
        self._thread.start()
        self._main: Future[None] = asyncio.run_coroutine_threadsafe(self._member.run(), self._loop)
        # dropped without close(): leave the group all the same, or the brokers would
        # keep its queues with a member that never reads them
        self._finalizer = weakref.finalize(self, _abandon, self._loop, self._member)
        self._finalizer.atexit = False  # at exit the closing sockets say it

    def __repr__(self) -> str:
        return (
            f"RocketMQConsumer(topic={self.topic!r}, group={self.group!r}, "
            f"client_id={self.client_id!r})"
        )

    # --- public ---------------------------------------------------------------------

    def poll(self, max_messages: int = 32, timeout: float = 1.0) -> list[ReceivedMessage]:
        """Up to ``max_messages`` delivered messages from the queues this member owns,
        earliest deliver time first, waiting up to ``timeout`` seconds; commits what
        earlier polls returned."""
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        start_ns = time.time_ns()
        deadline = time.monotonic() + max(0.0, timeout)
        states, cond = self._states, self._cond
        with cond:
            if self._closed:
                raise ConsumerClosedError("consumer is closed")
            if self.auto_commit and self._ack():
                self._loop.call_soon_threadsafe(self._member.wake_committer)
            while True:
                out = release_merged(states, max_messages, time.time_ns() // 1_000_000)
                if out or self._closed:
                    break
                member = self._member
                if not member.routed and member.error is not None:
                    raise member.error
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                due = min((d for s in states if (d := s.next_due_ms()) is not None), default=None)
                if due is not None:
                    # a held message's time: wake for it (1 ms past, so it is due)
                    left = min(left, max(0.001, (due + 1) / 1000 - time.time()))
                cond.wait(left)
        _tracing.receive(self.topic, self.group, out, start_ns)
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

    def _ack(self) -> bool:
        """Acknowledge what every state returned (the caller holds the lock)."""
        return any([s.ack() for s in self._states])

    def _on_loop(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- failures -------------------------------------------------------------------

    def retry_later(self, message: ReceivedMessage, delay: float | timedelta | None = None) -> None:
        """Hand ``message`` back to the group: it is delivered again (to this group only)
        no earlier than ``delay`` seconds from now, or after the group's backoff for its
        attempt (``retry_delays``, by default RocketMQ's 10 s ... 2 h) when ``delay`` is
        None, as attempt ``message.attempt + 1``. Returns once a broker stored the retry
        (a timer message on ``%RETRY%<group>``); the message itself then counts as
        processed and is committed as usual. At ``max_attempts`` the message is
        dead-lettered instead (see :meth:`dead_letter`).

        Raises ValueError for a bad delay or a message of another topic, and the broker's
        error when no broker stored the retry: the message then counts as not processed
        (its offset is not committed) until a later ``retry_later`` / ``dead_letter`` of
        it succeeds."""
        self._check(message)
        policy = self.policy
        seconds = policy.delay_after(message.attempt, delay)
        if policy.dead_letters(message.attempt):
            reason = f"max_attempts ({policy.max_attempts}) reached at attempt {message.attempt}"
            self.dead_letter(message, reason)
            return
        now = time.time_ns() // 1_000_000
        deliver = now + math.ceil(seconds * 1000)  # never sooner than asked
        group, limit = self.group, policy.max_attempts

        def build(t: SendTarget) -> RemotingCommand:
            return retry_request(
                message,
                group=group,
                broker=t.broker,
                queue_id=t.queue_id,
                deliver_ms=deliver,
                max_attempts=limit,
                now_ms=now,
            )

        self._send_back(message, build, "retried")

    def dead_letter(self, message: ReceivedMessage, reason: str) -> None:
        """Put ``message`` on the group's dead-letter topic ``%DLQ%<group>`` at once, with
        body, key, tags and properties, plus ``DLQ_ORIGIN_TOPIC``,
        ``DLQ_ORIGIN_MESSAGE_ID``, the attempts and ``reason``; returns once a broker stored
        it, and the message then counts as processed. Errors as :meth:`retry_later`."""
        self._check(message)
        if not isinstance(reason, str):
            raise ValueError(f"reason must be a string, got {type(reason).__name__}")
        now = time.time_ns() // 1_000_000
        group = self.group

        def build(t: SendTarget) -> RemotingCommand:
            return dead_letter_request(
                message,
                group=group,
                broker=t.broker,
                queue_id=t.queue_id,
                reason=reason,
                now_ms=now,
            )

        self._send_back(message, build, "dead_lettered")

    def _check(self, m: ReceivedMessage) -> None:
        if not isinstance(m, ReceivedMessage) or m.topic != self.topic:
            raise ValueError(f"not a message of this consumer's topic {self.topic!r}: {m!r}")

    def _send_back(
        self, m: ReceivedMessage, build: Callable[[SendTarget], RemotingCommand], counter: str
    ) -> None:
        store_topic = str(m.extra.get("store_topic") or m.topic)
        state = self._retry_state if store_topic == self._retry_topic else self._state
        where = (store_topic, (m.broker_name, m.queue_id), m.offset)
        with self._cond:
            if self._closed:
                raise ConsumerClosedError("consumer is closed")
        fut = asyncio.run_coroutine_threadsafe(
            self._member.send_back(m.broker_name, build), self._loop
        )
        try:
            # every broker once, one request timeout each, and the connection to open
            fut.result(3 * self._timeout + 1)
        except BaseException as exc:
            fut.cancel()
            with self._cond:
                if state.reopen(where[1], m.offset):
                    self._reopened.add(where)
            if isinstance(exc, concurrent.futures.TimeoutError):
                raise SendTimeoutError(
                    f"message {m.msg_id}: no broker stored its send-back in time"
                ) from None
            raise
        with self._cond:
            self._sent[counter] += 1
            if where in self._reopened:
                self._reopened.discard(where)
                state.returned_again(where[1], m.offset)

    def commit(self) -> None:
        """Commit now everything ``poll()`` returned so far; raises the first broker's
        error when a commit failed."""
        with self._cond:
            if self._closed:
                raise ConsumerClosedError("consumer is closed")
            self._ack()
        errors: list[QClientError] = self._on_loop(self._member.commit_all(), 2 * self._timeout)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Commit what was returned (with ``auto_commit``), leave the group (its queues
        move to the others at once), release connections. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            if self.auto_commit:
                self._ack()
            self._cond.notify_all()
        self._finalizer.detach()
        try:
            errors = self._on_loop(self._member.shutdown(), 3 * self._timeout + 2)
            for err in errors:
                log.warning("consumer %s: commit on close failed: %s", self.client_id, err)
        except Exception as exc:  # closing goes on whatever the brokers answered
            log.warning("consumer %s: leaving the group failed: %r", self.client_id, exc)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)

    def __enter__(self) -> RocketMQConsumer:
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

    def assignment(self) -> list[Key]:
        """The (broker name, queue id) pairs this member reads now, sorted."""
        with self._cond:
            return self._state.assignment()

    def committed(self) -> dict[Key, int]:
        """The next offset the brokers confirmed as committed for this member, per
        (broker name, queue id) it owns: what a new owner of the queue starts from."""
        with self._cond:
            return self._state.committed()

    def members(self) -> list[str]:
        """The group's member ids as of the last rebalance round, sorted."""
        return list(self._member.members)

    def retry_assignment(self) -> list[Key]:
        """The queues of the group's retry topic this member reads now, sorted."""
        with self._cond:
            return self._retry_state.assignment()

    def stats(self) -> dict[str, int]:
        """Counters over the topic and the retry topic: ``duplicates_dropped`` (a message
        returned recently came again), ``early`` / ``max_early_ms`` (messages the broker
        handed over before their deliver time, held until it; by how much at most),
        ``fetched``, ``returned``, ``held``, ``filtered`` (fetched, of a tag not
        subscribed: the broker filters by tag hash, this counts what only the client's
        check caught), ``retries_fetched`` (of ``fetched``, from the retry topic),
        ``retried`` / ``dead_lettered`` (send-backs stored)."""
        with self._cond:
            a, b = self._state.stats, self._retry_state.stats
            return {
                "duplicates_dropped": a.duplicates_dropped + b.duplicates_dropped,
                "early": a.early + b.early,
                "max_early_ms": max(a.max_early_ms, b.max_early_ms),
                "fetched": a.fetched + b.fetched,
                "returned": a.returned + b.returned,
                "held": self._state.total_held + self._retry_state.total_held,
                "filtered": a.filtered + b.filtered,
                "retries_fetched": b.fetched,
                **self._sent,
            }
