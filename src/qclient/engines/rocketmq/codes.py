"""RocketMQ request and response codes, and what a response code means for a send.

Values from ``RequestCode.java``, ``ResponseCode.java`` and ``RemotingSysResponseCode.java``
(apache/rocketmq). The retry rule follows the Java producer's ``retryResponseCodes``
(``DefaultMQProducer``); the flush/slave codes are answers for a message that *was*
stored on the master, so they are ambiguous rather than failures.
"""

from __future__ import annotations

import enum
import re

from ...errors import (
    AuthError,
    BrokerResponseError,
    BrokerUnavailableError,
    InvalidMessageError,
    MessageTooLargeError,
    QClientError,
    RouteNotFoundError,
)
from ...transport.errors import Outcome

__all__ = [
    "RequestCode",
    "ResponseCode",
    "code_name",
    "error_for",
    "is_acl_remark",
    "is_ambiguous_code",
    "send_outcome",
]


class RequestCode(enum.IntEnum):
    """Request codes the client sends, or receives from a broker."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39  # broker -> client
    NOTIFY_CONSUMER_IDS_CHANGED = 40  # broker -> client
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    REGISTER_BROKER = 103
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_CONSUMER_RUNNING_INFO = 307  # broker -> client
    CONSUME_MESSAGE_DIRECTLY = 309  # broker -> client
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    GET_TOPIC_CONFIG = 351
    GET_SUBSCRIPTIONGROUP_CONFIG = 352
    RECALL_MESSAGE = 370
    QUERY_ASSIGNMENT = 400
    GET_BROKER_MEMBER_GROUP = 901
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053


class ResponseCode(enum.IntEnum):
    """Response codes (``ResponseCode`` extends ``RemotingSysResponseCode`` in Java)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    BROKER_DISPATCH_NOT_COMPLETE = 212
    BROADCAST_CONSUMPTION = 213
    FLOW_CONTROL = 215
    NOT_LEADER_FOR_QUEUE = 501
    ILLEGAL_OPERATION = 604
    GO_AWAY = 1500  # the server is shutting down
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_NOT_LEADER = 2007
    USER_NOT_EXIST = 3001
    POLICY_NOT_EXIST = 3002


#: Stored on the master, durability (disk flush or slave copy) not confirmed: a retry may
#: duplicate the message, giving up may lose it.
_AMBIGUOUS = frozenset(
    {
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
    }
)

#: Refused for now by this broker: another broker (or this one later) may take it. The
#: Java producer's ``retryResponseCodes`` plus FLOW_CONTROL; NO_PERMISSION there means a
#: slave or a broker / topic without the write permission, TOPIC_NOT_EXIST a stale route.
_RETRY_ELSEWHERE = frozenset(
    {
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.NO_PERMISSION,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
        ResponseCode.FLOW_CONTROL,
        ResponseCode.GO_AWAY,
    }
)

# NO_PERMISSION remarks of the authentication / authorization pipelines (rocketmq-auth:
# AuthenticationException, AuthorizationException) and of 4.x plain ACL; the send path's
# own NO_PERMISSION remarks ("... sending message is forbidden") match none of these.
_AUTHN = re.compile(
    r"signature|authenticat|access ?key|credential|user:?\s*\S*\s*(?:is )?(?:not found|disabled)"
    r"|datetime is null",
    re.IGNORECASE,
)
_AUTHZ = re.compile(r"\bacl\b|authoriz|has no permission to access|policy", re.IGNORECASE)

# MESSAGE_ILLEGAL remarks about size: the store's "msg body length limit %dB" (body over
# maxMessageSize or properties over 32 KiB) and "msg body must be less 64KB".
_TOO_LARGE = re.compile(r"body (?:length|size)|body must be less|too large|exceed", re.IGNORECASE)


def code_name(code: int) -> str:
    """``ResponseCode`` name of ``code``, or ``CODE_<n>`` for a code we do not know."""
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"CODE_{code}"


def is_ambiguous_code(code: int) -> bool:
    """True when the broker stored the message but could not confirm its durability."""
    return code in _AMBIGUOUS


def is_acl_remark(remark: str | None) -> bool:
    """True when a NO_PERMISSION remark is about credentials or ACLs, not a read-only
    broker or topic."""
    return bool(remark) and bool(_AUTHN.search(remark or "") or _AUTHZ.search(remark or ""))


def send_outcome(code: int, remark: str | None = None) -> tuple[Outcome, bool]:
    """``(outcome, retry_elsewhere)`` of a send answered with ``code``.

    The ambiguous codes (``is_ambiguous_code``) give ``(BROKER, True)``: the caller decides
    whether a possible duplicate is better than a possible loss. A NO_PERMISSION whose
    ``remark`` is about credentials is final: every broker would refuse it.
    """
    if code == ResponseCode.SUCCESS:
        return Outcome.OK, False
    if code in _AMBIGUOUS:
        return Outcome.BROKER, True
    if code == ResponseCode.NO_PERMISSION and is_acl_remark(remark):
        return Outcome.FINAL, False
    if code in _RETRY_ELSEWHERE:
        return Outcome.BROKER, True
    return Outcome.FINAL, False


def _one_line(remark: str | None, limit: int = 300) -> str:
    if not remark:
        return "(no remark)"
    text = " ".join(remark.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_for(
    code: int, remark: str | None, *, broker: str | None, topic: str = ""
) -> QClientError:
    """The typed error of a response ``code`` with ``remark`` from ``broker``."""
    name = code_name(code)
    where = f"broker {broker}" if broker else "name server"
    text = f"{where}: {name}({code}): {_one_line(remark)}"
    if code == ResponseCode.MESSAGE_ILLEGAL:
        if remark and _TOO_LARGE.search(remark):
            return MessageTooLargeError(text)
        return InvalidMessageError(text)
    if code == ResponseCode.TOPIC_NOT_EXIST:
        return RouteNotFoundError(text, topic=topic)
    if code == ResponseCode.NO_PERMISSION and is_acl_remark(remark):
        kind = "UNAUTHORIZED" if _AUTHN.search(remark or "") else "FORBIDDEN"
        return AuthError(text, code=kind)
    if send_outcome(code, remark)[1]:
        return BrokerUnavailableError(text, broker_name=broker)
    return BrokerResponseError(text, code=name, broker_name=broker)
