"""Recall (cancel) and lookup by unique key of RocketMQ 5 timer messages, sans-I/O.

**Recall** (``RECALL_MESSAGE`` 370, RocketMQ >= 5.3.2, broker key ``recallMessageEnable``).
A send that the broker scheduled answers with ``recallHandle``: URL-safe base64 (padded) of
``"v1 <topic> <brokerName> <TIMER_OUT_MS + 1> <UNIQ_KEY>"`` (``RecallMessageHandle.HandleV1``,
``SendMessageProcessor.attachRecallHandle``). ``TIMER_OUT_MS`` is the timer wheel slot
(``timer_slot``), so the handle follows from what a ``SendResult`` holds plus the broker's
``timerPrecisionMs``. A recall does not look the message up: the broker checks the handle
(topic, its own name, ``0 < stamp - now < timerMaxDelaySec``) and stores a tombstone
(``TIMER_DEL_UNIQKEY``, tag ``_RECALL_TAG_``, body ``"0"``) with ``TIMER_DELIVER_MS`` = the
stamp, which lands in the same slot; when the slot fires, messages of that slot whose
UNIQ_KEY a tombstone names are dropped (``TimerMessageStore``, 5.5.0: the key is the bare
UNIQ_KEY unless ``appendTopicForTimerDeleteKey``). So SUCCESS means "tombstone stored":
it is also the answer for an unknown id, for a second recall, and for a handle whose
slot is not the message's (which then fires anyway).

**Lookup** (``QUERY_MESSAGE`` 12 with ext ``_UNIQUE_KEY_QUERY=true``): the broker's index
holds ``<stored topic>#<UNIQ_KEY>``. A scheduled message is stored on the timer topic
``rmq_sys_wheel_timer`` (with ``REAL_TOPIC``, ``REAL_QID``, ``TIMER_OUT_MS``), and so is a
recall's tombstone (its UNIQ_KEY is the recalled id); when the slot fires, a copy is put
on the real topic with ``TIMER_ENQUEUE_MS`` / ``TIMER_DEQUEUE_MS`` added (in 5.5.0 it keeps
``REAL_TOPIC`` / ``REAL_QID``: ``convertMessage`` clears them after writing the properties).
One key's state on one broker therefore needs two queries (``lookup_requests``) read
together by ``classify``. The index keeps store times to the second (``IndexFile``), so a
query's ``begin_ms`` should be a second or more before the earliest store time sought;
the broker caps a unique-key query at ``defaultQueryMaxNum`` (32) messages and the index
is a hash, so replies are filtered by UNIQ_KEY here, as the Java client does
(``MQAdminImpl.queryMessage``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from .codes import RequestCode, ResponseCode, error_for
from .message import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_DEL_UNIQKEY,
    TIMER_DELIVER_MS,
    TIMER_DEQUEUE_MS,
    TIMER_OUT_MS,
    StoredMessage,
    decode_messages,
)
from .remoting import RemotingCommand, request

__all__ = [
    "QUERY_MAX_NUM",
    "RECALL_TAG",
    "TIMER_TOPIC",
    "UNIQUE_KEY_QUERY",
    "KeyLookup",
    "KeyState",
    "RecallHandle",
    "RecallOutcome",
    "RecallRefusal",
    "RecallResult",
    "classify",
    "lookup_requests",
    "parse_recall_handle",
    "precision_from_config",
    "query_by_key_request",
    "read_query",
    "read_recall",
    "recall_handle",
    "recall_request",
    "timer_slot",
]

#: the system topic a scheduled message (and a recall's tombstone) is stored on
TIMER_TOPIC = "rmq_sys_wheel_timer"
#: the tag of a recall's tombstone (``RecallMessageProcessor.RECALL_MESSAGE_TAG``)
RECALL_TAG = "_RECALL_TAG_"
#: the QUERY_MESSAGE ext field that makes ``key`` a UNIQ_KEY (``MixAll.UNIQUE_MSG_QUERY_FLAG``)
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
#: what the broker caps a unique-key query at, whatever ``maxNum`` says
#: (``MessageStoreConfig.defaultQueryMaxNum``)
QUERY_MAX_NUM = 32
#: the handle version RocketMQ 5.3.2 - 5.5.0 write and read
_V1 = "v1"
_URLSAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=")


# --- the timer slot ---------------------------------------------------------------------


def timer_slot(deliver_ms: int, precision_ms: int) -> int:
    """The wheel slot (``TIMER_OUT_MS``) of a message due at ``deliver_ms`` on a broker
    with ``timerPrecisionMs`` = ``precision_ms`` (``HookUtils.transformTimerMessage``):
    ``deliver_ms`` rounded down to the precision, one precision less when it is a multiple.

    The slot fires once the broker's clock reaches ``slot + precision_ms`` (its write time
    must pass the slot), which is never before ``deliver_ms``; a recall is accepted until
    ``slot`` (its stamp ``slot + 1`` must be in the future). A message whose time is not
    after the broker's receive time is not scheduled at all.
    """
    if precision_ms <= 0:
        raise ValueError(f"timer precision must be positive, got {precision_ms}")
    if deliver_ms < 0:
        raise ValueError(f"deliver time must be an epoch ms, got {deliver_ms}")
    if deliver_ms % precision_ms == 0:
        return deliver_ms - precision_ms
    return deliver_ms // precision_ms * precision_ms


def precision_from_config(body: bytes) -> int:
    """``timerPrecisionMs`` from a GET_BROKER_CONFIG answer's body (``key=value`` lines,
    ``MixAll.properties2String``). ValueError when it is missing or not a number."""
    for line in body.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "timerPrecisionMs":
            return int(value.strip())
    raise ValueError("the broker config holds no timerPrecisionMs")


# --- recall handles ---------------------------------------------------------------------


class RecallHandle(NamedTuple):
    """The fields of a v1 recall handle; ``timer_out_ms`` is the slot (the handle holds
    ``timer_out_ms + 1``)."""

    topic: str
    broker_name: str
    timer_out_ms: int
    uniq_key: str

    @property
    def stamp_ms(self) -> int:
        """The handle's timestamp: the tombstone's TIMER_DELIVER_MS."""
        return self.timer_out_ms + 1

    @property
    def recall_by_ms(self) -> int:
        """The last broker-clock ms at which a recall with this handle is accepted."""
        return self.timer_out_ms


def _field(kind: str, value: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"recall handle {kind} must be a non-empty string")
    if " " in value:
        # the handle's fields are space-separated: the broker would read a shifted field
        raise ValueError(f"recall handle {kind} {value[:40]!r} holds a space")
    return value


def recall_handle(topic: str, broker_name: str, timer_out_ms: int, uniq_key: str) -> str:
    """The handle the broker returns for a message of ``topic`` stored on ``broker_name``
    in slot ``timer_out_ms`` (``timer_slot``) with UNIQ_KEY ``uniq_key``:
    ``HandleV1.buildHandle(topic, brokerName, str(timer_out_ms + 1), uniqKey)``."""
    raw = " ".join(
        (
            _V1,
            _field("topic", topic),
            _field("broker name", broker_name),
            str(int(timer_out_ms) + 1),
            _field("unique key", uniq_key),
        )
    )
    return base64.urlsafe_b64encode(raw.encode()).decode("ascii")


def parse_recall_handle(handle: str) -> RecallHandle:
    """The fields of ``handle``, read as ``RecallMessageHandle.decodeHandle`` does (URL-safe
    base64, padding optional, ``v1`` and at least five space-separated fields; later
    ones ignored). ValueError for what the broker would refuse as invalid, and for a
    timestamp that is not an integer (the broker reads it as -1: "timestamp invalid")."""
    if not handle:
        raise ValueError("recall handle is empty")
    data = handle.encode("utf-8", "replace")
    if not set(data) <= _URLSAFE:
        raise ValueError("recall handle is not URL-safe base64")
    try:
        raw = base64.urlsafe_b64decode(data.rstrip(b"=") + b"=" * (-len(data.rstrip(b"=")) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("recall handle is not URL-safe base64") from None
    items = raw.decode("utf-8", "replace").split(" ")
    while items and not items[-1]:  # Java's String.split drops trailing empty strings
        items.pop()
    if len(items) < 5 or items[0] != _V1:
        raise ValueError("recall handle is not a v1 handle")
    try:
        stamp = int(items[3])
    except ValueError:
        raise ValueError(f"recall handle timestamp {items[3][:20]!r} is not a number") from None
    return RecallHandle(items[1], items[2], stamp - 1, items[4])


# --- recall -----------------------------------------------------------------------------


def recall_request(topic: str, handle: str, producer_group: str) -> RemotingCommand:
    """RECALL_MESSAGE for ``handle`` (``RecallMessageRequestHeader``: producerGroup, topic,
    recallHandle; ``bname``, the inherited RPC broker name, from the handle when it
    parses, as the Java producer sets it). Send it to the master of the handle's broker."""
    ext = {"producerGroup": producer_group, "topic": topic, "recallHandle": handle}
    # a handle that does not parse goes as is: the broker answers "recall handle is invalid"
    with contextlib.suppress(ValueError):
        ext["bname"] = parse_recall_handle(handle).broker_name
    return request(RequestCode.RECALL_MESSAGE, ext)


class RecallOutcome(enum.StrEnum):
    """What a RECALL_MESSAGE answer says."""

    #: a tombstone for the handle's slot and key is stored (not proof the id exists)
    RECALLED = "recalled"
    #: the handle's slot has begun (or is beyond timerMaxDelaySec): nothing was stored
    TOO_LATE = "too_late"
    #: the broker refused the request (see ``RecallRefusal``)
    REFUSED = "refused"


class RecallRefusal(enum.StrEnum):
    """Why a broker refused a recall (``RecallMessageProcessor``)."""

    DISABLED = "disabled"  # NO_PERMISSION: recallMessageEnable=false
    NOT_MASTER = "not_master"  # SLAVE_NOT_AVAILABLE: sent to a slave
    UNAVAILABLE = "unavailable"  # SERVICE_NOT_AVAILABLE: starting, or not writeable
    TOPIC_NOT_EXIST = "topic_not_exist"  # the broker has no such topic
    INVALID_HANDLE = "invalid_handle"  # not base64, not v1, fewer than 5 fields
    TOPIC_MISMATCH = "topic_mismatch"  # the request's topic is not the handle's
    WRONG_BROKER = "wrong_broker"  # the handle names another broker
    STORE_FAILED = "store_failed"  # SYSTEM_ERROR: the tombstone was not stored
    OTHER = "other"

    @property
    def retriable(self) -> bool:
        """True when the same request may succeed later or on the group's new master."""
        return self in _RETRIABLE


_RETRIABLE = frozenset(
    {RecallRefusal.NOT_MASTER, RecallRefusal.UNAVAILABLE, RecallRefusal.STORE_FAILED}
)


@dataclass(frozen=True, slots=True)
class RecallResult:
    """A RECALL_MESSAGE answer: ``outcome``, the refusal ``reason`` (REFUSED only), the
    broker's ``code`` and ``remark``, and ``msg_id`` (the handle's UNIQ_KEY, on SUCCESS).
    A SUCCESS carries the remark "not set any response code" (the default of
    ``RemotingCommand.createResponseCommand``, left in place): it means nothing."""

    outcome: RecallOutcome
    code: int
    remark: str | None = None
    reason: RecallRefusal | None = None
    msg_id: str | None = None


#: ILLEGAL_OPERATION remarks (``RecallMessageProcessor``, ``RecallMessageHandle``)
_ILLEGAL = (
    ("timestamp invalid", None),
    ("recall handle is invalid", RecallRefusal.INVALID_HANDLE),
    ("topic not match", RecallRefusal.TOPIC_MISMATCH),
    ("broker service not available", RecallRefusal.WRONG_BROKER),
)
_BY_CODE: dict[int, RecallRefusal] = {
    ResponseCode.NO_PERMISSION: RecallRefusal.DISABLED,
    ResponseCode.SLAVE_NOT_AVAILABLE: RecallRefusal.NOT_MASTER,
    ResponseCode.SERVICE_NOT_AVAILABLE: RecallRefusal.UNAVAILABLE,
    ResponseCode.TOPIC_NOT_EXIST: RecallRefusal.TOPIC_NOT_EXIST,
    ResponseCode.SYSTEM_ERROR: RecallRefusal.STORE_FAILED,
}


def read_recall(answer: RemotingCommand) -> RecallResult:
    """The ``RecallResult`` of a RECALL_MESSAGE answer."""
    code, remark = answer.code, answer.remark
    if code == ResponseCode.SUCCESS:
        msg_id = answer.ext_fields.get("msgId") or None
        return RecallResult(RecallOutcome.RECALLED, code, remark, None, msg_id)
    if code == ResponseCode.ILLEGAL_OPERATION:
        text = (remark or "").lower()
        for needle, reason in _ILLEGAL:
            if needle in text:
                if reason is None:
                    return RecallResult(RecallOutcome.TOO_LATE, code, remark)
                return RecallResult(RecallOutcome.REFUSED, code, remark, reason)
    reason = _BY_CODE.get(code, RecallRefusal.OTHER)
    return RecallResult(RecallOutcome.REFUSED, code, remark, reason)


# --- lookup by unique key ---------------------------------------------------------------


def query_by_key_request(
    topic: str, uniq_key: str, begin_ms: int, end_ms: int, max_num: int = QUERY_MAX_NUM
) -> RemotingCommand:
    """QUERY_MESSAGE for the messages of ``topic`` (as stored: the real topic, or
    ``TIMER_TOPIC``) whose UNIQ_KEY is ``uniq_key``, stored within ``[begin_ms, end_ms]``
    (``QueryMessageRequestHeader``; ``_UNIQUE_KEY_QUERY=true``). Ask every master."""
    return request(
        RequestCode.QUERY_MESSAGE,
        {
            "topic": topic,
            "key": uniq_key,
            "maxNum": str(max_num),
            "beginTimestamp": str(begin_ms),
            "endTimestamp": str(end_ms),
            UNIQUE_KEY_QUERY: "true",
        },
    )


def lookup_requests(
    topic: str, uniq_key: str, begin_ms: int, end_ms: int
) -> tuple[RemotingCommand, RemotingCommand]:
    """The two queries ``classify`` reads, for one broker: the real topic (fired copies)
    and the timer topic (scheduled copies and recall tombstones)."""
    return (
        query_by_key_request(topic, uniq_key, begin_ms, end_ms),
        query_by_key_request(TIMER_TOPIC, uniq_key, begin_ms, end_ms),
    )


def read_query(
    answer: RemotingCommand, uniq_key: str, *, broker: str | None = None, topic: str = ""
) -> list[StoredMessage]:
    """The messages of a QUERY_MESSAGE answer whose UNIQ_KEY is ``uniq_key`` (the index is
    a hash: other keys may come along); [] for QUERY_NOT_FOUND. Raises the typed error
    (``codes.error_for``) of any other code, ``MessageDecodeError`` for a bad body."""
    if answer.code == ResponseCode.QUERY_NOT_FOUND:
        return []
    if answer.code != ResponseCode.SUCCESS:
        raise error_for(answer.code, answer.remark, broker=broker, topic=topic)
    return [m for m in decode_messages(answer.body) if m.unique_key == uniq_key]


class KeyState(enum.StrEnum):
    """One UNIQ_KEY's state on one broker, as its index shows it."""

    #: in the timer, no matching tombstone, no fired copy (also: due, not yet put)
    SCHEDULED = "scheduled"
    #: a copy is on the real topic (fired by the timer, or never delayed)
    FIRED = "fired"
    #: in the timer with a tombstone for the same slot, no fired copy
    RECALLED = "recalled"
    #: nothing of this topic with this key (or only tombstones: a recall of an unknown id)
    UNKNOWN = "unknown"


def _int(props: dict[str, str], key: str) -> int | None:
    try:
        return int(props[key])
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class KeyLookup:
    """What ``classify`` found for one key on one broker. Times are epoch ms by the
    broker's clock except ``deliver_ms`` (the sender's TIMER_DELIVER_MS)."""

    state: KeyState
    uniq_key: str
    topic: str
    deliver_ms: int | None = None
    timer_out_ms: int | None = None
    #: when the timer put it on the real topic (TIMER_DEQUEUE_MS, else the store time)
    fired_ms: int | None = None
    queue_id: int | None = None
    scheduled: list[StoredMessage] = field(default_factory=list, repr=False)
    tombstones: list[StoredMessage] = field(default_factory=list, repr=False)
    fired: list[StoredMessage] = field(default_factory=list, repr=False)
    #: the slots (TIMER_OUT_MS) of the scheduled copies no recall covers, tombstone or
    #: ``classify``'s ``recalled`` (the ones still to fire), ascending; empty unless SCHEDULED
    live_slots: tuple[int, ...] = ()


def classify(
    topic: str,
    uniq_key: str,
    real: Iterable[StoredMessage],
    timer: Iterable[StoredMessage],
    recalled: Iterable[int] = (),
) -> KeyLookup:
    """The state of ``uniq_key`` of ``topic`` from what one broker's two queries returned
    (``lookup_requests``, read by ``read_query``): ``real`` from the real topic, ``timer``
    from ``TIMER_TOPIC``; ``recalled``: slots the caller knows it recalled on this broker,
    whose tombstones the broker's index may not show yet (it is built asynchronously).

    FIRED wins (a recall stored too late to be applied leaves a tombstone too). A
    tombstone counts only in its own slot, as the broker applies it, so a key sent again
    for another time (a reschedule: send anew, then recall the old slot) is SCHEDULED while
    any copy has no tombstone in its slot; the times are the latest such copy's. A
    scheduled copy stays on the timer topic after it fired (until the commit log is
    cleaned), so a fired message shows both.
    """
    fired = [m for m in real if m.unique_key == uniq_key and m.topic == topic]
    scheduled: list[StoredMessage] = []
    tombstones: list[StoredMessage] = []
    for m in timer:
        if (
            m.topic != TIMER_TOPIC
            or m.unique_key != uniq_key
            or m.properties.get(REAL_TOPIC) != topic
        ):
            continue
        (tombstones if TIMER_DEL_UNIQKEY in m.properties else scheduled).append(m)
    if fired:
        f = min(fired, key=lambda m: m.store_ms)
        dequeued = _int(f.properties, TIMER_DEQUEUE_MS)
        return KeyLookup(
            KeyState.FIRED,
            uniq_key,
            topic,
            _int(f.properties, TIMER_DELIVER_MS),
            _int(f.properties, TIMER_OUT_MS),
            dequeued if dequeued is not None else f.store_ms,
            f.queue_id,
            scheduled,
            tombstones,
            fired,
        )
    if not scheduled:
        return KeyLookup(KeyState.UNKNOWN, uniq_key, topic, tombstones=tombstones)
    dead = {_int(t.properties, TIMER_OUT_MS) for t in tombstones} | set(recalled)
    live = [m for m in scheduled if _int(m.properties, TIMER_OUT_MS) not in dead]
    last = max(live or scheduled, key=lambda m: m.store_ms)
    return KeyLookup(
        KeyState.SCHEDULED if live else KeyState.RECALLED,
        uniq_key,
        topic,
        _int(last.properties, TIMER_DELIVER_MS),
        _int(last.properties, TIMER_OUT_MS),
        None,
        _int(last.properties, REAL_QID),
        scheduled,
        tombstones,
        [],
        tuple(sorted({s for m in live if (s := _int(m.properties, TIMER_OUT_MS)) is not None})),
    )
