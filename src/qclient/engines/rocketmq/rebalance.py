"""A RocketMQ clustering consumer group's side of the protocol, sans-I/O: heartbeats,
membership, offsets, and which queues this member takes and when.

References (apache/rocketmq): ``HeartbeatData`` / ``ConsumerData`` / ``SubscriptionData``
(the heartbeat body), ``UnregisterClientRequestHeader``, ``QueryConsumerOffsetRequestHeader``,
``UpdateConsumerOffsetRequestHeader``, ``GetConsumerListByGroupResponseBody``,
``RebalanceImpl`` and ``AllocateMessageQueueAveragely`` (the share); Go
``internal/model.go`` and ``internal/request.go``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from ...consumer._allocate import allocate_averagely
from ...protocol.wire import TopicRoute
from .codes import RequestCode, ResponseCode
from .remoting import RemotingCommand, request
from .retry import subscription_data
from .route import PERM_READ

__all__ = [
    "Handover",
    "Key",
    "consumer_list_request",
    "heartbeat_request",
    "min_offset_request",
    "parse_consumer_list",
    "query_offset_request",
    "read_offset",
    "readable_queues",
    "unregister_request",
    "update_offset_request",
]

Key = tuple[str, int]  # (broker name, queue id)


class _ConsumerList(msgspec.Struct):
    consumerIdList: list[str] | None = None  # the wire name


_consumer_list = msgspec.json.Decoder(_ConsumerList)


def heartbeat_request(
    client_id: str, group: str, topic: str | Mapping[str, str], sub_version: int
) -> RemotingCommand:
    """HEART_BEAT registering ``client_id`` as a member of ``group`` (clustering, pull
    model, from the first offset) subscribed to all of ``topic``, or to each topic of a
    mapping topic -> tag expression (``"*"``: all) with its tags and their hash codes."""
    topics = {topic: "*"} if isinstance(topic, str) else topic
    body = {
        "clientID": client_id,
        "consumerDataSet": [
            {
                "groupName": group,
                "consumeType": "CONSUME_ACTIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                "subscriptionDataSet": [
                    subscription_data(t, expression, sub_version)
                    for t, expression in topics.items()
                ],
                "unitMode": False,
            }
        ],
        "producerDataSet": [],
    }
    return request(RequestCode.HEART_BEAT, {}, msgspec.json.encode(body))


def unregister_request(client_id: str, group: str) -> RemotingCommand:
    """UNREGISTER_CLIENT: ``client_id`` leaves ``group`` (the broker tells the others)."""
    return request(RequestCode.UNREGISTER_CLIENT, {"clientID": client_id, "consumerGroup": group})


def consumer_list_request(group: str) -> RemotingCommand:
    return request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})


def parse_consumer_list(answer: RemotingCommand) -> list[str] | None:
    """The group's member ids, sorted; ``[]`` when the broker knows none (it answers
    SYSTEM_ERROR "no consumer for this group"); None for any other refusal or a body
    that does not parse."""
    if answer.code == ResponseCode.SUCCESS:
        try:
            ids = _consumer_list.decode(answer.body).consumerIdList or []
        except msgspec.MsgspecError:
            return None
        return sorted(set(ids))
    if answer.code == ResponseCode.SYSTEM_ERROR and "no consumer" in (answer.remark or ""):
        return []
    return None


def query_offset_request(group: str, topic: str, queue_id: int, broker: str) -> RemotingCommand:
    """QUERY_CONSUMER_OFFSET: the group's committed offset of a queue."""
    fields = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "bname": broker}
    return request(RequestCode.QUERY_CONSUMER_OFFSET, fields)


def min_offset_request(topic: str, queue_id: int, broker: str) -> RemotingCommand:
    """GET_MIN_OFFSET: the queue's first offset still stored."""
    fields = {"topic": topic, "queueId": str(queue_id), "bname": broker}
    return request(RequestCode.GET_MIN_OFFSET, fields)


def update_offset_request(
    group: str, topic: str, queue_id: int, offset: int, broker: str
) -> RemotingCommand:
    """UPDATE_CONSUMER_OFFSET: commit ``offset`` (the next one to consume) for the group."""
    fields = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": str(queue_id),
        "commitOffset": str(offset),
        "bname": broker,
    }
    return request(RequestCode.UPDATE_CONSUMER_OFFSET, fields)


def read_offset(answer: RemotingCommand) -> int | None:
    """The ``offset`` of a QUERY_CONSUMER_OFFSET / GET_MIN_OFFSET answer; None when there
    is none (QUERY_NOT_FOUND: the group never committed this queue, or a negative one).

    Raises ValueError for any other refusal."""
    if answer.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    if answer.code != ResponseCode.SUCCESS:
        raise ValueError(f"code {answer.code}: {answer.remark}")
    try:
        off = int(answer.ext_fields.get("offset", "-1"))
    except ValueError:
        raise ValueError(f"offset {answer.ext_fields.get('offset')!r} is not a number") from None
    return off if off >= 0 else None


def readable_queues(route: TopicRoute) -> tuple[dict[str, str], list[Key]]:
    """(broker name -> master address, the sorted readable queues of the brokers that
    have a master): the queues every member divides among the group the same way."""
    masters = {b.broker_name: b.addrs[0] for b in route.broker_datas if b.addrs.get(0) is not None}
    queues = sorted(
        (q.broker_name, i)
        for q in route.queue_datas
        if q.broker_name in masters and q.perm & PERM_READ
        for i in range(q.read_queue_nums)
    )
    used = {b for b, _ in queues}
    return {name: addr for name, addr in masters.items() if name in used}, queues


def _owner(queues: Sequence[Key], members: Sequence[str], key: Key) -> str | None:
    """Which of ``members`` the averaging allocation of ``queues`` gives ``key``."""
    for m in members:
        if key in allocate_averagely(queues, members, m):
            return m
    return None


@dataclass(slots=True)
class Handover:
    """Which queues this member should hold, and when to take each new one.

    A queue another live member held until now is taken only after ``grace`` seconds:
    that member learns of the change from the broker's NOTIFY_CONSUMER_IDS_CHANGED (or its
    next heartbeat round), commits what it returned and lets go, so the new owner starts
    from its commit instead of reading again what it already delivered. A queue whose
    owner left or died, or that nobody held, is taken at once.
    """

    me: str
    grace: float
    members: list[str] = field(default_factory=list)
    queues: list[Key] = field(default_factory=list)
    known: bool = False  # whether members/queues come from an earlier round
    claims: dict[Key, float] = field(default_factory=dict)  # key -> when to take it

    def plan(
        self, members: Sequence[str], queues: Sequence[Key], held: set[Key], now: float
    ) -> tuple[list[Key], list[Key]]:
        """(queues to let go now, queues to take now) for the new view; the rest of the
        share waits in ``claims`` (see :meth:`next_claim`)."""
        share = set(allocate_averagely(queues, members, self.me))
        lose = sorted(held - share)
        for key in list(self.claims):
            if key not in share or key in held:
                del self.claims[key]
        alone = list(members) == [self.me]
        for key in sorted(share - held):
            if key in self.claims:
                continue
            if alone:
                self.claims[key] = now
                continue
            # before a first view, any other member may hold it
            prev = _owner(self.queues, self.members, key) if self.known else ""
            free = self.known and (prev is None or prev == self.me or prev not in members)
            self.claims[key] = now if free else now + self.grace
        take = sorted(k for k, at in self.claims.items() if at <= now)
        for key in take:
            del self.claims[key]
        self.members = list(members)
        self.queues = list(queues)
        self.known = True
        return lose, take

    def next_claim(self) -> float | None:
        """When the earliest waiting queue may be taken (the caller's clock), or None."""
        return min(self.claims.values(), default=None)
