"""RocketMQ route and cluster bodies from the NameServer -> qclient's route structs.

GET_ROUTEINFO_BY_TOPIC answers in standard JSON only to requests with version >= V4_9_4
(or ``acceptStandardJsonOnly``); otherwise, and always for GET_BROKER_CLUSTER_INFO,
fastjson writes integer map keys bare: ``"brokerAddrs":{0:"127.0.0.1:10911"}``. Both parse
here: standard JSON first, then again with bare numeric keys quoted (outside strings).
References (apache/rocketmq): ``TopicRouteData``, ``QueueData``, ``BrokerData``,
``ClusterInfo``, ``ClientRequestProcessor.getRouteInfoByTopic``; Go ``route.go``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from ...protocol.wire import BrokerData, QueueData, TopicRoute

__all__ = [
    "PERM_READ",
    "PERM_WRITE",
    "ClusterInfo",
    "RouteParseError",
    "parse_cluster_info",
    "parse_route",
    "quote_bare_keys",
]

PERM_WRITE = 0x2  # PermName.PERM_WRITE
PERM_READ = 0x4  # PermName.PERM_READ


class RouteParseError(ValueError):
    """A route or cluster body that is not the JSON RocketMQ sends."""


class _QueueData(msgspec.Struct):
    brokerName: str  # the wire names
    readQueueNums: int = 0
    writeQueueNums: int = 0
    perm: int = 0
    topicSysFlag: int = 0


class _BrokerData(msgspec.Struct):
    brokerName: str
    cluster: str | None = None
    brokerAddrs: dict[int, str] | None = None


class _TopicRouteData(msgspec.Struct):
    queueDatas: list[_QueueData] | None = None
    brokerDatas: list[_BrokerData] | None = None


class _ClusterInfo(msgspec.Struct):
    brokerAddrTable: dict[str, _BrokerData] | None = None
    clusterAddrTable: dict[str, list[str]] | None = None


_T = TypeVar("_T")

_route_decoder = msgspec.json.Decoder(_TopicRouteData)
_cluster_decoder = msgspec.json.Decoder(_ClusterInfo)

# a JSON string, or a bare (possibly negative) integer used as an object key
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|(?<=[{,])(\s*)(-?\d+)(\s*:)')


def quote_bare_keys(body: bytes) -> bytes:
    """``body`` with every bare integer object key quoted (``{0:"a"}`` -> ``{"0":"a"}``);
    text inside JSON strings is left alone."""

    def fix(m: re.Match[bytes]) -> bytes:
        if m.group(2) is None:
            return m.group(0)  # a string: unchanged
        return m.group(1) + b'"' + m.group(2) + b'"' + m.group(3)

    return _TOKEN.sub(fix, body)


def _decode(decoder: msgspec.json.Decoder[_T], body: bytes, what: str) -> _T:
    try:
        return decoder.decode(body)
    except msgspec.DecodeError:
        pass  # bare integer keys (fastjson's default): quote them and try again
    except msgspec.ValidationError as exc:
        raise RouteParseError(f"{what}: {exc}") from None
    try:
        return decoder.decode(quote_bare_keys(body))
    except msgspec.MsgspecError as exc:
        raise RouteParseError(f"{what} is not JSON RocketMQ sends: {exc}") from None


def _broker(b: _BrokerData) -> BrokerData:
    return BrokerData(
        broker_name=b.brokerName,
        addrs=dict(b.brokerAddrs or {}),
        cluster=b.cluster or "DefaultCluster",
    )


def parse_route(topic: str, body: bytes) -> TopicRoute:
    """The ``TopicRoute`` of a GET_ROUTEINFO_BY_TOPIC body (standard or fastjson JSON);
    unknown fields are ignored."""
    data = _decode(_route_decoder, bytes(body), f"route of {topic!r}")
    return TopicRoute(
        topic=topic,
        queue_datas=[
            QueueData(
                broker_name=q.brokerName,
                read_queue_nums=q.readQueueNums,
                write_queue_nums=q.writeQueueNums,
                perm=q.perm,
            )
            for q in data.queueDatas or ()
        ],
        broker_datas=[_broker(b) for b in data.brokerDatas or ()],
    )


@dataclass(slots=True)
class ClusterInfo:
    """A GET_BROKER_CLUSTER_INFO body: brokers by name, broker names by cluster."""

    brokers: dict[str, BrokerData]
    clusters: dict[str, list[str]]

    def masters(self, cluster: str | None = None) -> dict[str, str]:
        """Broker name -> master address (broker id 0), of one cluster or all."""
        names = self.brokers.keys() if cluster is None else self.clusters.get(cluster, [])
        out: dict[str, str] = {}
        for name in names:
            b = self.brokers.get(name)
            if b is not None and 0 in b.addrs:
                out[name] = b.addrs[0]
        return out


def parse_cluster_info(body: bytes) -> ClusterInfo:
    """The ``ClusterInfo`` of a GET_BROKER_CLUSTER_INFO body (always fastjson style)."""
    data = _decode(_cluster_decoder, bytes(body), "cluster info")
    return ClusterInfo(
        brokers={name: _broker(b) for name, b in (data.brokerAddrTable or {}).items()},
        clusters={name: sorted(v) for name, v in (data.clusterAddrTable or {}).items()},
    )
