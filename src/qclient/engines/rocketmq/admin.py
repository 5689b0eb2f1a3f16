"""Operator calls on a RocketMQ cluster: its brokers, and creating a topic on every master
(what ``mqadmin updateTopic`` does), for the CLI and for local test clusters."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import NameServerUnavailableError, QClientError
from .codes import RequestCode, ResponseCode, error_for
from .connection import RemotingError
from .pool import ConnectionPool
from .remoting import request
from .route import ClusterInfo, parse_cluster_info

__all__ = ["cluster_info", "create_topic", "topic_fields"]

#: PermName.PERM_READ | PERM_WRITE
_PERM_READ_WRITE = 6


def cluster_info(pool: ConnectionPool, namesrv: Sequence[str], timeout: float = 3.0) -> ClusterInfo:
    """The brokers every NameServer knows (the first that answers)."""
    errors: list[str] = []
    for addr in namesrv:
        try:
            answer = pool.get(addr).call(request(RequestCode.GET_BROKER_CLUSTER_INFO), timeout)
        except RemotingError as exc:
            errors.append(f"{addr}: {exc}")
            continue
        if answer.code != ResponseCode.SUCCESS:
            errors.append(f"{addr}: {error_for(answer.code, answer.remark, broker=None)}")
            continue
        return parse_cluster_info(answer.body)
    raise NameServerUnavailableError(f"cluster info: no NameServer answered ({'; '.join(errors)})")


def topic_fields(topic: str, queues: int) -> dict[str, str]:
    """The UPDATE_AND_CREATE_TOPIC fields of a read-write topic with ``queues`` queues."""
    return {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": str(_PERM_READ_WRITE),
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }


def create_topic(
    pool: ConnectionPool,
    namesrv: Sequence[str],
    topic: str,
    queues: int = 4,
    *,
    timeout: float = 5.0,
) -> dict[str, str]:
    """Create (or update) ``topic`` with ``queues`` read and write queues on every master;
    returns broker name -> address. Each broker registers the topic with the NameServers at
    once, so it routes right after."""
    masters = cluster_info(pool, namesrv, timeout).masters()
    if not masters:
        raise NameServerUnavailableError("no broker is registered with the NameServers")
    fields = topic_fields(topic, queues)
    for name, addr in sorted(masters.items()):
        try:
            answer = pool.get(addr).call(
                request(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(fields)), timeout
            )
        except RemotingError as exc:
            raise QClientError(f"broker {name} at {addr}: {exc}") from None
        if answer.code != ResponseCode.SUCCESS:
            raise error_for(answer.code, answer.remark, broker=name, topic=topic)
    return masters
