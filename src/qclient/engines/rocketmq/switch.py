"""A consumer group member's queues while a broker group switches masters (sans-I/O).

When a controller-mode group's master dies, the NameServer drops its address at once and
routes the group with its slaves only until the controller elects one (0.1-2 s here, up to
~15 s with RocketMQ's defaults; for good when no slave is electable). ``readable_queues``
leaves such a broker out, so every member lets go of its queues (the commit to the dead
master fails), the group divides the others anew, and when the new master is routed the
queues are taken again from the offsets it holds. Those are stale: RocketMQ copies a
group's commits to a slave only periodically, and 5.5.0 slaves not at all once the group
has pulled (apache/rocketmq#10284). Every message read since is delivered again.

``follow_switch`` keeps such a broker's queues and its last master address for as long
as the route still lists the broker and its queues: the members keep their share and
their positions, their pulls and commits fail fast at the dead address (which makes them
look the route up again), and they read on from the new master once it is routed.

A ``partial`` route (from a NameServer that may have restarted and not heard from every
broker yet: ``nameserver``) may also lack a group altogether; the member keeps that
group's queues and address too, until a complete route leaves it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...protocol.wire import TopicRoute
from .rebalance import Key, readable_queues
from .route import PERM_READ

__all__ = ["follow_switch"]


def follow_switch(
    route: TopicRoute, masters: Mapping[str, str], queues: Sequence[Key]
) -> tuple[dict[str, str], list[Key]]:
    """``readable_queues(route)``, plus each broker of the previous ``masters`` /
    ``queues`` that the route lists (a replica and readable queues) without a master
    now, or that a partial route does not list at all: its previous address and queues.
    A broker a complete route no longer lists, or lists without read permission, is left
    out as before."""
    new_masters, new_queues = readable_queues(route)
    replicas = {b.broker_name for b in route.broker_datas if b.addrs}
    readable = {q.broker_name for q in route.queue_datas if q.perm & PERM_READ}
    listed = {b.broker_name for b in route.broker_datas} | {
        q.broker_name for q in route.queue_datas
    }
    kept = [
        name
        for name in masters
        if name not in new_masters
        and ((name in replicas and name in readable) or (route.partial and name not in listed))
    ]
    if not kept:
        return new_masters, new_queues
    for name in kept:
        new_masters[name] = masters[name]
    held = [k for k in queues if k[0] in kept]
    return new_masters, sorted({*new_queues, *held})
