"""PULL_MESSAGE requests and answers, and pulled messages as the application sees them
(sans-I/O).

References (apache/rocketmq): ``PullMessageRequestHeader``, ``PullSysFlag``,
``PullAPIWrapper.processPullResult`` and ``MQClientAPIImpl.processPullResponse`` (the
answer codes), ``MessageConst.STRING_HASH_SET`` (the system property names).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..._models import ReceivedMessage
from ...consumer._failures import RETRY_PREFIX
from . import message as msg
from .codes import RequestCode, ResponseCode
from .message import StoredMessage, decode_messages
from .remoting import RemotingCommand, request

__all__ = [
    "FLAG_COMMIT_OFFSET",
    "FLAG_SUBSCRIPTION",
    "FLAG_SUSPEND",
    "SYSTEM_PROPERTIES",
    "PullResult",
    "PullStatus",
    "deliver_at_ms",
    "parse_pull",
    "pull_request",
    "to_received",
    "user_properties",
]

#: ``PullSysFlag`` bits: commit ``commitOffset`` with the pull; hold the pull until a
#: message arrives (long polling); the subscription comes with the request (so a pull
#: needs no heartbeat-registered subscription, and a stale one cannot refuse it)
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

#: ``MessageConst.STRING_HASH_SET`` (the properties RocketMQ itself sets or reads) plus the
#: ``MessageConst`` names outside that set (TIMER_DELAY_MS, TRACE_CONTEXT, INNER_NUM ...):
#: none of these is the application's
SYSTEM_PROPERTIES = frozenset(
    {
        "TRACE_ON",
        "MSG_REGION",
        "KEYS",
        "TAGS",
        "WAIT",
        "DELAY",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "UNIQ_KEY",
        "EXTEND_UNIQ_INFO",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "INNER_NUM",
        "INNER_BASE",
        "POP_CK",
        "POP_CK_OFFSET",
        "1ST_POP_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "DUP_INFO",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "__transactionId__",
        "TRANSACTION_CHECK_TIMES",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "PUSH_REPLY_TIME",
        "CLUSTER",
        "MSG_TYPE",
        "__SHARDINGKEY",
        "PROPERTY_FORWARD_QUEUE_ID",
        "REDIRECT",
        "INNER_MULTI_DISPATCH",
        "INNER_MULTI_QUEUE_OFFSET",
        "TRACE_CONTEXT",
        "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS",
        "TIMER_DELIVER_MS",
        "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES",
        "TIMER_OUT_MS",
        "TIMER_DEL_UNIQKEY",
        "TIMER_DELAY_LEVEL",
        "__BORNHOST",
        "BORN_TIMESTAMP",
    }
)
#: properties under this prefix are never stored (``PROPERTY_TRANSIENT_PREFIX``)
_TRANSIENT_PREFIX = "__RMQ.TRANSIENT."


class PullStatus(enum.Enum):
    """What a pull answer means for the queue."""

    FOUND = "found"  # messages; continue at next_offset
    NO_NEW = "no_new"  # nothing (yet) at the offset; continue at next_offset
    RETRY = "retry"  # nothing matched the filter; continue at next_offset at once
    MOVED = "moved"  # the offset is out of range; continue at next_offset
    ERROR = "error"  # refused (code, remark): try again later


@dataclass(slots=True)
class PullResult:
    """A PULL_MESSAGE answer. ``next_offset`` is -1 when the answer carries none."""

    status: PullStatus
    next_offset: int = -1
    min_offset: int = -1
    max_offset: int = -1
    messages: list[StoredMessage] = field(default_factory=list)
    code: int = 0
    remark: str | None = None


def pull_request(
    *,
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_messages: int,
    suspend_ms: int,
    sub_version: int,
    broker_name: str,
    commit_offset: int | None = None,
    subscription: str = "*",
) -> RemotingCommand:
    """A PULL_MESSAGE of ``topic``/``queue_id`` from ``offset`` with the tag expression
    ``subscription`` (``*``: all; the broker then skips messages of other tags): held by
    the broker up to ``suspend_ms`` while nothing is there (long polling); with
    ``commit_offset`` the broker also stores that offset for the group."""
    flags = FLAG_SUBSCRIPTION | (FLAG_SUSPEND if suspend_ms > 0 else 0)
    if commit_offset is not None:
        flags |= FLAG_COMMIT_OFFSET
    return request(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "queueOffset": str(offset),
            "maxMsgNums": str(max_messages),
            "sysFlag": str(flags),
            "commitOffset": str(commit_offset if commit_offset is not None else 0),
            "suspendTimeoutMillis": str(max(0, suspend_ms)),
            "subscription": subscription,
            "subVersion": str(sub_version),
            "expressionType": "TAG",
            "bname": broker_name,
        },
    )


def _int(ext: dict[str, str], name: str) -> int:
    try:
        return int(ext.get(name, "-1"))
    except ValueError:
        return -1


_STATUS: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.RETRY,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.MOVED,
}


def parse_pull(answer: RemotingCommand, queue_id: int, offset: int) -> PullResult:
    """The result of a pull of ``queue_id`` from ``offset``. A FOUND body's messages are
    decoded and those of another queue or below ``offset`` left out (the broker answers
    a queue's messages in offset order from the requested one).

    Raises ``message.MessageDecodeError`` for a body that does not decode."""
    status = _STATUS.get(answer.code, PullStatus.ERROR)
    ext = answer.ext_fields
    result = PullResult(
        status,
        _int(ext, "nextBeginOffset"),
        _int(ext, "minOffset"),
        _int(ext, "maxOffset"),
        code=answer.code,
        remark=answer.remark,
    )
    if status is PullStatus.FOUND:
        result.messages = [
            m
            for m in decode_messages(answer.body)
            if m.queue_id == queue_id and m.queue_offset >= offset
        ]
        if result.next_offset < 0 and result.messages:
            result.next_offset = result.messages[-1].queue_offset + 1
    return result


def deliver_at_ms(m: StoredMessage) -> int | None:
    """The message's TIMER_DELIVER_MS (epoch ms, the producer's clock), None if it has
    none (or one that is not a number)."""
    raw = m.properties.get(msg.TIMER_DELIVER_MS)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def user_properties(props: dict[str, str]) -> dict[str, str]:
    """The application's properties: every one RocketMQ does not define for itself."""
    system = SYSTEM_PROPERTIES
    return {
        k: v for k, v in props.items() if k not in system and not k.startswith(_TRANSIENT_PREFIX)
    }


def _int_prop(props: dict[str, str], name: str, default: int) -> int:
    raw = props.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


def to_received(m: StoredMessage, broker_name: str) -> ReceivedMessage:
    """The ``ReceivedMessage`` of a pulled message: id = UNIQ_KEY (else the offset message
    id), the real topic, KEYS / TAGS, the application's properties only; deliver time =
    TIMER_DELIVER_MS and fire time = TIMER_DEQUEUE_MS for a timed message, else both the
    store time.

    A message read from a group's retry topic (``%RETRY%<group>``) looks like the original:
    its topic is ``RETRY_TOPIC`` and ``attempt`` its reconsume times + 1 (a message of any
    other topic is attempt 1, whatever a producer put there). ``extra`` holds ``attempt``,
    ``offset_msg_id``, ``origin_msg_id`` (ORIGIN_MESSAGE_ID, a retry's), ``store_topic``
    (the topic it was read from), ``born_ms`` and ``store_ms``."""
    props = m.properties
    deliver = deliver_at_ms(m)
    fired = _int_prop(props, msg.TIMER_DEQUEUE_MS, m.store_ms) if deliver is not None else None
    # a timer message that fired keeps REAL_TOPIC (5.5.0): the retry topic for a retry
    topic = props.get(msg.REAL_TOPIC) or m.topic
    attempt = 1
    if m.topic.startswith(RETRY_PREFIX) or topic.startswith(RETRY_PREFIX):
        topic = props.get(msg.RETRY_TOPIC) or topic
        attempt = max(1, m.reconsume_times + 1)
    return ReceivedMessage(
        msg_id=props.get(msg.UNIQ_KEY) or m.msg_id,
        topic=topic,
        body=m.body,
        key=props.get(msg.KEYS),
        tags=props.get(msg.TAGS),
        properties=user_properties(props),
        deliver_at_ms=deliver if deliver is not None else m.store_ms,
        fired_at_ms=fired if fired is not None else m.store_ms,
        broker_name=broker_name,
        queue_id=m.queue_id,
        offset=m.queue_offset,
        attempt=attempt,
        extra={
            "attempt": attempt,
            "offset_msg_id": m.msg_id,
            "origin_msg_id": props.get(msg.ORIGIN_MESSAGE_ID),
            "store_topic": m.topic,
            "born_ms": m.born_ms,
            "store_ms": m.store_ms,
        },
    )
