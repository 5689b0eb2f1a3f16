"""The producer's route cache: fresh routes in a TTL cache, the last good ones as fallback."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cachetools import TLRUCache

from ..protocol.wire import MASTER_ID, PERM_WRITE, BrokerData, TopicRoute
from .publish_info import TopicPublishInfo

__all__ = ["RouteCache"]

log = logging.getLogger(__name__)

#: how long a route that lost a broker keeps being re-checked at ``recheck_interval``, and
#: how long a broker group listed without a master keeps its last master address
_LOST_WATCH = 300.0


class RouteCache:
    """Routes by topic.

    A route is *fresh* for ``refresh_interval`` seconds (a cachetools time-aware cache,
    ``TLRUCache``, so that a route that just lost brokers can be re-checked sooner:
    ``recheck_interval``, to notice a broker that comes back); after that, or after
    ``mark_stale`` (a send failed), it is still served from the last-good table while a
    refresh is due. Only a topic never resolved has no route; so when every name server
    is down, sends go on with the last good route.
    """

    def __init__(
        self,
        refresh_interval: float,
        index_factory: Callable[[], Any],
        *,
        maxsize: int = 4096,
        timer: Callable[[], float] = time.monotonic,
        recheck_interval: float = 5.0,
    ) -> None:
        self.refresh_interval = refresh_interval
        self.recheck_interval = min(recheck_interval, refresh_interval)
        self._index_factory = index_factory
        self._timer = timer
        self._fresh: TLRUCache[str, TopicPublishInfo] = TLRUCache(
            maxsize, ttu=lambda _topic, info, _now: info.fresh_until, timer=timer
        )
        self._last_good: dict[str, TopicPublishInfo] = {}
        self._addrs: dict[str, str] = {}
        self._last_addrs: dict[str, str] = {}  # every broker's last known address
        self._lock = threading.Lock()
        self._on_stale: Callable[[str], None] | None = None

    def after_fork_in_child(self) -> None:
        """A fresh lock in a forked child (the parent's threads may have held it)."""
        self._lock = threading.Lock()

    def set_on_stale(self, callback: Callable[[str], None] | None) -> None:
        """Called (outside the lock) when a served route is due for a refresh."""
        self._on_stale = callback

    def get(self, topic: str) -> tuple[TopicPublishInfo | None, bool]:
        """``(info, fresh)``: the best route known for ``topic`` and whether it is fresh."""
        info = self._last_good.get(topic)
        if info is not None and self._timer() < info.fresh_until:
            return info, True  # the hot path: no lock
        with self._lock:
            info = self._fresh.get(topic)
            if info is not None:
                return info, True
            info = self._last_good.get(topic)
        if info is not None and self._on_stale is not None:
            self._on_stale(topic)
        return info, False

    def put(self, topic: str, route: TopicRoute) -> TopicPublishInfo:
        """Store a freshly fetched route; keeps the topic's round-robin counter."""
        with self._lock:
            old = self._last_good.get(topic)
            # Brokers the new route lacks but may only not have registered yet: after a
            # name-server restart (a partial route), and right after a topic's first sends
            # (the auto-create route listed every broker; each registers the topic once it
            # stored its first message, not all at once).
            if old is not None and (
                route.partial or (old.route.auto_create and not route.auto_create)
            ):
                route = _with_missing(route, old.route)
            now = self._timer()
            headless: dict[str, float] = {}
            if old is not None:
                route, headless = _keep_masters(route, old, now)
            index = old.index if old is not None else self._index_factory()
            info = TopicPublishInfo.from_route(topic, route, index=index)
            info.headless = headless
            lost: dict[str, float] = {}
            if old is not None:
                if old.queues != info.queues:
                    log.info(
                        "route of %s changed: %d -> %d queues on %s",
                        topic,
                        len(old.queues),
                        len(info.queues),
                        info.brokers,
                    )
                lost = {
                    b: t
                    for b, t in old.lost.items()
                    if b not in info.by_broker and now - t < _LOST_WATCH
                }
                lost.update((b, now) for b in old.by_broker if b not in info.by_broker)
            # while brokers are missing, look again soon so one that returns gets traffic
            info.lost = lost
            soon = lost or route.partial
            info.fresh_until = now + (self.recheck_interval if soon else self.refresh_interval)
            self._fresh[topic] = info
            self._last_good[topic] = info
            self._rebuild_addrs()
        return info

    def mark_stale(self, topic: str) -> None:
        """Forget freshness (after a send failure) so the next lookup triggers a refresh."""
        with self._lock:
            self._fresh.pop(topic, None)
            info = self._last_good.get(topic)
            if info is not None:
                info.fresh_until = 0.0

    def stale_topics(self) -> list[str]:
        """Known topics whose route is due for a refresh."""
        with self._lock:
            self._fresh.expire()
            return [t for t in self._last_good if t not in self._fresh]

    def resolve(self, broker_name: str) -> str | None:
        """Master address of a broker in any current route; None if it left every route."""
        return self._addrs.get(broker_name)

    def last_addr(self, broker_name: str) -> str | None:
        """Master address of a broker in any current route, else the last one it had: a
        broker that left the routes (expired while down) usually comes back there."""
        return self._addrs.get(broker_name) or self._last_addrs.get(broker_name)

    def _rebuild_addrs(self) -> None:
        addrs: dict[str, str] = {}
        for info in self._last_good.values():
            addrs.update(info.broker_addrs)
        self._addrs = addrs  # replaced whole: readers without the lock see old or new
        self._last_addrs = {**self._last_addrs, **addrs}


def _keep_masters(
    new: TopicRoute, old: TopicPublishInfo, now: float
) -> tuple[TopicRoute, dict[str, float]]:
    """``new`` with each writable broker group it lists without a master given the master
    address ``old`` had (marked partial, so it is asked again soon), and since when each
    kept one has had none. A group has no master in a route while its replicas elect one
    (0.1-15 s after the master died; the first send to the dead address is refused and the
    fault table avoids it meanwhile) and after a name server restart, where slaves may
    register before their masters (up to a 30 s registration period): leaving the group
    out then made every send fail with no master anywhere. After ``_LOST_WATCH`` without
    one the group is left out."""
    writable = {q.broker_name for q in new.queue_datas if q.perm & PERM_WRITE}
    kept: dict[str, float] = {}
    datas: list[BrokerData] = []
    for bd in new.broker_datas:
        name = bd.broker_name
        addr = old.broker_addrs.get(name)
        since = old.headless.get(name, now)
        if MASTER_ID in bd.addrs or name not in writable or addr is None:
            datas.append(bd)
        elif now - since < _LOST_WATCH:
            kept[name] = since
            datas.append(BrokerData(name, {**bd.addrs, MASTER_ID: addr}, bd.cluster))
        else:
            datas.append(bd)
    if not kept:
        return new, kept
    log.info("route of %s lists %s without a master: their last one is kept", new.topic, kept)
    route = TopicRoute(new.topic, new.queue_datas, datas, auto_create=new.auto_create, partial=True)
    return route, kept


def _with_missing(new: TopicRoute, old: TopicRoute) -> TopicRoute:
    """``new`` with the brokers of the last route that it lacks, marked partial (so it is
    asked again soon): they may not have registered (again) yet. One that is gone is
    avoided by the fault table and leaves at the next complete route."""
    have = {q.broker_name for q in new.queue_datas}
    queues = [q for q in old.queue_datas if q.broker_name not in have]
    if not queues:
        return new
    missing = {q.broker_name for q in queues}
    brokers = [b for b in old.broker_datas if b.broker_name in missing]
    return TopicRoute(
        new.topic,
        [*new.queue_datas, *queues],
        [*new.broker_datas, *brokers],
        auto_create=new.auto_create and old.auto_create,
        partial=True,
    )
