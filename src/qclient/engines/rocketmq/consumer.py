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
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from ... import _tracing
from ..._models import ReceivedMessage
from ...consumer._member import check_member, iter_messages
from ...errors import (
    ConsumerClosedError,
    QClientError,
    UnsupportedByEngineError,
)
from .member import MemberLoop
from .rebalance import Key
from .state import ConsumeState

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
        self.topic = topic
        self.group = group
        self.client_id = cid
        self.auto_commit = auto_commit
        self._timeout = request_timeout
        self._state = ConsumeState()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._member = MemberLoop(
            namesrv=addrs,
            topic=topic,
            group=group,
            client_id=cid,
            request_timeout=request_timeout,
            interval=min(_MAX_INTERVAL_S, session_timeout / 3),
            state=self._state,
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
        state, cond = self._state, self._cond
        with cond:
            if self._closed:
                raise ConsumerClosedError("consumer is closed")
            if self.auto_commit and state.ack():
                self._loop.call_soon_threadsafe(self._member.wake_committer)
            while True:
                out = state.release(max_messages, time.time_ns() // 1_000_000)
                if out or self._closed:
                    break
                member = self._member
                if not member.routed and member.error is not None:
                    raise member.error
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                due = state.next_due_ms()
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

    def _on_loop(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def commit(self) -> None:
        """Commit now everything ``poll()`` returned so far; raises the first broker's
        error when a commit failed."""
        with self._cond:
            if self._closed:
                raise ConsumerClosedError("consumer is closed")
            self._state.ack()
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
                self._state.ack()
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

    def stats(self) -> dict[str, int]:
        """Counters: ``duplicates_dropped`` (a UNIQ_KEY returned recently came again),
        ``early`` / ``max_early_ms`` (messages the broker handed over before their deliver
        time, held until it; by how much at most), ``fetched``, ``returned``, ``held``."""
        with self._cond:
            s = self._state.stats
            return {
                "duplicates_dropped": s.duplicates_dropped,
                "early": s.early,
                "max_early_ms": s.max_early_ms,
                "fetched": s.fetched,
                "returned": s.returned,
                "held": self._state.total_held,
            }
