"""A RocketMQ group's failure handling, sans-I/O: the send that hands a message back to
its group through ``%RETRY%<group>``, the one that dead-letters it to ``%DLQ%<group>``,
and the tag subscription the brokers filter on.

RocketMQ's own send-back (``CONSUMER_SEND_MSG_BACK``) schedules a retry only by delay
*level*; a retry here is instead what the Java consumer sends when that request fails
(``DefaultMQPushConsumerImpl.sendMessageBackAsNormalMessage``): a new message to the
group's retry topic, carrying the original's ``UNIQ_KEY``, ``RETRY_TOPIC`` = its topic,
``ORIGIN_MESSAGE_ID`` and, in the SEND_MESSAGE_V2 header, its reconsume times and the
group's maximum, made a timer message (``TIMER_DELIVER_MS``) for any delay. The broker
stores it on the retry topic as attempt ``reconsumeTimes + 1``; its ``handleRetryAndDLQ``
puts a message sent there with ``reconsumeTimes > maxReconsumeTimes`` on ``%DLQ%<group>``
instead (creating that topic with one queue), which is how a message is dead-lettered
here too, with the dead-letter properties. Java consumers of the group read both topics
the same way. Decision record: docs/decisions/0027-rocketmq-consumer-retries.md.

The tag filter is RocketMQ's: the heartbeat's ``SubscriptionData`` and the pull's
``subscription`` carry the expression, the broker keeps the messages whose consume-queue
tag code (Java ``String.hashCode`` of the tag) is in the set, and the client checks the
tag itself again (two tags may share a hash), as the Java client does.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..._models import ReceivedMessage
from ...consumer._failures import dlq_properties, parse_tags, retry_topic
from ...errors import BrokerUnavailableError, QClientError
from ...protocol.wire import TopicRoute
from . import message as msg
from .codes import RequestCode, ResponseCode, error_for, send_outcome
from .remoting import RemotingCommand, request
from .route import PERM_WRITE

__all__ = [
    "COMPRESS_OVER",
    "SendTarget",
    "dead_letter_request",
    "java_string_hash",
    "origin_msg_id",
    "read_send",
    "retry_properties",
    "retry_request",
    "send_targets",
    "subscription_data",
]

#: bodies longer than this are sent zlib-compressed, as the Java producer does
#: (``compressMsgBodyOverHowmuch``): the application got them decompressed
COMPRESS_OVER = 4096
_COMPRESS_LEVEL = 5  # the Java producer's ``compressLevel``


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` of ``text`` (over its UTF-16 code units, as an int32):
    the tag code RocketMQ stores in the consume queue and filters on."""
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def subscription_data(topic: str, expression: str, sub_version: int) -> dict[str, Any]:
    """A heartbeat's ``SubscriptionData`` of ``topic`` with a tag ``expression`` (``"*"``:
    every message), as ``FilterAPI.buildSubscriptionData`` builds it: the tags and their
    Java hash codes. Raises ValueError for a bad expression (``parse_tags``)."""
    tags = parse_tags(expression)
    ordered = sorted(tags) if tags is not None else []
    return {
        "topic": topic,
        "subString": "*" if tags is None else expression,
        "tagsSet": ordered,
        "codeSet": [java_string_hash(t) for t in ordered],
        "subVersion": sub_version,
        "expressionType": "TAG",
        "classFilterMode": False,
    }


def origin_msg_id(m: ReceivedMessage) -> str:
    """The ``ORIGIN_MESSAGE_ID`` a retry of ``m`` carries: the one ``m`` already had (it is
    a retry itself), else ``m``'s offset message id, as the broker's send-back sets it."""
    extra = m.extra
    return str(extra.get("origin_msg_id") or extra.get("offset_msg_id") or m.msg_id)


def retry_properties(m: ReceivedMessage, deliver_ms: int | None = None) -> dict[str, str]:
    """The properties of a copy of ``m`` sent back to its group: the application's, its
    id, keys and tags, where it came from, and ``TIMER_DELIVER_MS`` when it is delayed."""
    props = dict(m.properties)
    props[msg.UNIQ_KEY] = m.msg_id
    props[msg.WAIT] = "true"
    if m.key:
        props[msg.KEYS] = m.key
    if m.tags:
        props[msg.TAGS] = m.tags
    props[msg.RETRY_TOPIC] = m.topic
    props[msg.ORIGIN_MESSAGE_ID] = origin_msg_id(m)
    if deliver_ms is not None:
        props[msg.TIMER_DELIVER_MS] = str(deliver_ms)
    return props


def _send_back(
    m: ReceivedMessage,
    *,
    group: str,
    broker: str,
    queue_id: int,
    properties: Mapping[str, str],
    reconsume_times: int,
    max_reconsume_times: int,
    now_ms: int,
) -> RemotingCommand:
    body = m.body
    sys_flag = 0
    if len(body) > COMPRESS_OVER:
        body, sys_flag = zlib.compress(body, _COMPRESS_LEVEL), msg.SysFlag.COMPRESSED_ZLIB
    header = msg.send_header(
        # the producer group of a send-back is the consumer group: the broker's dead-letter
        # metric (rocketmq_send_to_dlq_messages_total) labels it as such
        group=group,
        topic=retry_topic(group),
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_ms=now_ms,
        flag=0,
        properties=properties,
        reconsume_times=reconsume_times,
        max_reconsume_times=max_reconsume_times,
        broker_name=broker,
    )
    # a broker that has no retry topic yet creates it with one queue, as its send-back does
    header["d"] = "1"
    return request(RequestCode.SEND_MESSAGE_V2, header, body)


def retry_request(
    m: ReceivedMessage,
    *,
    group: str,
    broker: str,
    queue_id: int,
    deliver_ms: int,
    max_attempts: int,
    now_ms: int,
) -> RemotingCommand:
    """SEND_MESSAGE_V2 of a copy of ``m`` to ``%RETRY%<group>``, delivered again at
    ``deliver_ms`` (epoch ms; at once when not after ``now_ms``) as attempt
    ``m.attempt + 1``. The broker dead-letters it instead when ``m.attempt`` is over
    ``max_attempts - 1``."""
    deliver = deliver_ms if deliver_ms > now_ms else None
    return _send_back(
        m,
        group=group,
        broker=broker,
        queue_id=queue_id,
        properties=retry_properties(m, deliver),
        reconsume_times=m.attempt,
        max_reconsume_times=max_attempts - 1,
        now_ms=now_ms,
    )


def dead_letter_request(
    m: ReceivedMessage, *, group: str, broker: str, queue_id: int, reason: str, now_ms: int
) -> RemotingCommand:
    """SEND_MESSAGE_V2 that puts a copy of ``m`` on ``%DLQ%<group>`` at once, with the
    dead-letter properties (original topic and id, attempts, ``reason``): sent to the
    retry topic with its reconsume times over the maximum, so the broker moves it (and
    creates the dead-letter topic as it does for its own)."""
    props = dlq_properties(retry_properties(m), m.topic, m.msg_id, m.attempt, reason)
    return _send_back(
        m,
        group=group,
        broker=broker,
        queue_id=queue_id,
        properties=props,
        reconsume_times=m.attempt,
        max_reconsume_times=m.attempt - 1,
        now_ms=now_ms,
    )


@dataclass(frozen=True, slots=True)
class SendTarget:
    """Where a send-back goes: a broker, its master's address, a queue of the retry topic."""

    broker: str
    addr: str
    queue_id: int


def send_targets(
    route: TopicRoute | None, prefer: str, known: Mapping[str, str], spread: int = 0
) -> list[SendTarget]:
    """The brokers to try, in order, for a send-back of a message read from broker
    ``prefer``: that one first (the Java client sends a message back to its broker), then
    every other master with a writable queue of the retry topic's ``route``; ``spread``
    picks among a broker's queues. Without a route (the topic is not routed yet), the
    message's broker and queue 0 (the broker creates the topic). ``known``: broker name
    -> master address, for brokers the route does not give an address for."""
    out: list[SendTarget] = []
    if route is not None and not route.auto_create:
        masters = {b.broker_name: b.addrs.get(0) for b in route.broker_datas}
        for q in route.queue_datas:
            addr = masters.get(q.broker_name) or known.get(q.broker_name)
            if addr and q.perm & PERM_WRITE and q.write_queue_nums > 0:
                out.append(SendTarget(q.broker_name, addr, spread % q.write_queue_nums))
    out.sort(key=lambda t: (t.broker != prefer, t.broker))
    if not any(t.broker == prefer for t in out) and prefer in known:
        out.insert(0, SendTarget(prefer, known[prefer], 0))
    return out


def read_send(
    answer: RemotingCommand | BaseException, *, broker: str, topic: str
) -> tuple[QClientError | None, bool]:
    """``(error, try another broker)`` of a send-back's answer: ``(None, False)`` when the
    broker stored it."""
    if not isinstance(answer, RemotingCommand):
        err = BrokerUnavailableError(
            f"broker {broker}: send-back failed: {type(answer).__name__}: {answer}",
            broker_name=broker,
        )
        return err, True
    if answer.code == ResponseCode.SUCCESS:
        return None, False
    _, again = send_outcome(answer.code, answer.remark)
    return error_for(answer.code, answer.remark, broker=broker, topic=topic), again
