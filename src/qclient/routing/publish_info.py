"""``MessageQueue`` and ``TopicPublishInfo``: a topic route as the producer uses it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..protocol.wire import MASTER_ID, PERM_WRITE, TopicRoute

__all__ = ["MessageQueue", "TopicPublishInfo", "master_addrs"]


def master_addrs(route: TopicRoute) -> dict[str, str]:
    """Broker name -> master address, for each broker of ``route`` that has a master."""
    return {
        bd.broker_name: bd.addrs[MASTER_ID] for bd in route.broker_datas if MASTER_ID in bd.addrs
    }


class MessageQueue(NamedTuple):
    """One writable queue: ``(topic, broker_name, queue_id)``."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass(slots=True)
class TopicPublishInfo:
    """The writable queues of a topic over every broker that has a master, sorted by broker.

    ``index`` is the per-thread (or per-task) round-robin counter of this topic; it is
    carried over when the route is refreshed so that the rotation does not restart.
    """

    topic: str
    queues: tuple[MessageQueue, ...]
    broker_addrs: dict[str, str]
    route: TopicRoute
    fresh_until: float = 0.0
    #: brokers that left this topic's route recently -> when (set by RouteCache)
    lost: dict[str, float] = field(default_factory=dict)
    #: broker groups the route lists without a master, kept at their last master
    #: address -> since when (set by RouteCache)
    headless: dict[str, float] = field(default_factory=dict)
    index: Any = None
    by_broker: dict[str, tuple[MessageQueue, ...]] = field(default_factory=dict)

    @classmethod
    def from_route(cls, topic: str, route: TopicRoute, index: Any = None) -> TopicPublishInfo:
        """RocketMQ's ``topicRouteData2TopicPublishInfo`` for a normal topic."""
        masters = master_addrs(route)
        queues: list[MessageQueue] = []
        by_broker: dict[str, tuple[MessageQueue, ...]] = {}
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if not qd.perm & PERM_WRITE or qd.broker_name not in masters:
                continue  # read-only, or no master to write to
            mqs = tuple(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
            by_broker[qd.broker_name] = by_broker.get(qd.broker_name, ()) + mqs
            queues.extend(mqs)
        addrs = {name: masters[name] for name in by_broker}
        return cls(
            topic=topic,
            queues=tuple(queues),
            broker_addrs=addrs,
            route=route,
            index=index,
            by_broker=by_broker,
        )

    @property
    def brokers(self) -> list[str]:
        return list(self.by_broker)
