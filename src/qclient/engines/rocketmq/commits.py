"""A RocketMQ group member's commits: UPDATE_CONSUMER_OFFSET of what the application
acknowledged, per topic and broker, one at a time per (topic, broker).

The broker runs requests on a thread pool, so two commits of one queue in flight could
land out of order and move the group's offset back: each broker's commits of a topic wait
their turn, and each reads the offsets to commit when its turn comes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from ...errors import BrokerResponseError, BrokerUnavailableError, QClientError
from .aio import AsyncConnection
from .codes import ResponseCode, code_name
from .connection import RemotingError
from .rebalance import Key, update_offset_request
from .remoting import RemotingCommand

if TYPE_CHECKING:
    from .member import Subscription

__all__ = ["Committer"]


class Committer:
    """Commits of one member: ``commit_all(subs)`` and ``commit(sub, broker, offsets)``
    on the member's loop; the subscriptions' states are read under ``cond``."""

    def __init__(
        self,
        group: str,
        cond: threading.Condition,
        addrs: Mapping[str, str],
        connection: Callable[[str], Awaitable[AsyncConnection]],
        timeout: float,
    ) -> None:
        self._group = group
        self._cond = cond
        self._addrs = addrs  # every broker address seen (a queue let go after its route)
        self._connection = connection
        self._timeout = timeout
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def commit_all(self, subs: Iterable[Subscription]) -> list[QClientError]:
        """Commit every acknowledged offset the brokers have not confirmed; the errors."""
        jobs = []
        for sub in subs:
            with self._cond:
                brokers = {k[0] for k in sub.state.pending_commits()}
            jobs += [self.commit(sub, b) for b in sorted(brokers)]
        results = await asyncio.gather(*jobs)
        return [e for errs in results for e in errs]

    async def commit(
        self, sub: Subscription, broker: str, offsets: dict[Key, int] | None = None
    ) -> list[QClientError]:
        """UPDATE_CONSUMER_OFFSET of ``sub``'s topic for ``offsets`` (default: the broker's
        pending ones)."""
        lock = self._locks.setdefault((sub.topic, broker), asyncio.Lock())
        async with lock:
            if offsets is None:
                with self._cond:
                    offsets = sub.state.pending_commits(broker)
            if not offsets:
                return []
            addr = sub.masters.get(broker) or self._addrs.get(broker)
            if addr is None:
                return [
                    BrokerUnavailableError(f"broker {broker} has no address", broker_name=broker)
                ]
            items = sorted(offsets.items())
            topic = sub.topic
            cmds = [update_offset_request(self._group, topic, q, off, b) for (b, q), off in items]
            try:
                conn = await self._connection(addr)
                answers = await conn.call_many(cmds, self._timeout)
            except RemotingError as exc:
                return [
                    BrokerUnavailableError(
                        f"broker {broker}: commit failed: {exc}", broker_name=broker
                    )
                ]
            return self._read(sub, broker, items, answers)

    def _read(
        self,
        sub: Subscription,
        broker: str,
        items: list[tuple[Key, int]],
        answers: list[RemotingCommand | RemotingError],
    ) -> list[QClientError]:
        errors: list[QClientError] = []
        for (key, off), a in zip(items, answers, strict=True):
            if isinstance(a, RemotingCommand) and a.code == ResponseCode.SUCCESS:
                with self._cond:
                    sub.state.committed_ok(key, off)
            elif isinstance(a, RemotingCommand):
                name = code_name(a.code)
                errors.append(
                    BrokerResponseError(
                        f"broker {broker}: commit of {sub.topic} queue {key[1]}: {name} {a.remark}",
                        code=name,
                        broker_name=broker,
                    )
                )
            else:
                errors.append(BrokerUnavailableError(f"broker {broker}: {a}", broker_name=broker))
        return errors
