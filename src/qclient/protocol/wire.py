"""Request and response bodies on the wire, shared by the SDK and the servers.

Every body is a ``msgspec.Struct`` so that decoding *is* schema validation: a wrong
type, a missing field or (where ``forbid_unknown_fields``) an unknown one fails to
decode with a one-line message. Bodies travel as JSON (``application/json``, ``bytes``
as base64) or MessagePack (``application/msgpack``, ``bytes`` raw). See
``docs/PROTOCOL.md``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from . import limits as _limits

# --- constants -------------------------------------------------------------------

# the message limits' home is limits.py; wire keeps the names its readers use
FLAG_COMPRESSED = _limits.FLAG_COMPRESSED
MAX_KEY_CHARS = _limits.MAX_KEY_CHARS
MAX_PROPERTIES = _limits.MAX_PROPERTIES
MAX_PROPERTY_KEY_CHARS = _limits.MAX_PROPERTY_KEY_CHARS
MAX_PROPERTY_VALUE_CHARS = _limits.MAX_PROPERTY_VALUE_CHARS
MAX_QUEUES = _limits.MAX_QUEUES
MAX_TAGS_CHARS = _limits.MAX_TAGS_CHARS
MSG_ID_RE = _limits.MSG_ID_RE
TOPIC_PATTERN = _limits.TOPIC_PATTERN
TOPIC_RE = _limits.TOPIC_RE

GROUP_RE = TOPIC_RE
#: a consumer group's retry and dead-letter topics are these plus the group's name
#: (RocketMQ's); brokers create them on first send even without topic auto-creation
RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX = "%RETRY%", "%DLQ%"
#: 1-128 printable ASCII characters, no space: access keys and broker/cluster names
PRINTABLE_128_RE = re.compile(r"^[\x21-\x7e]{1,128}\Z")

#: consumer-group members: ownership lease bounds (ms) and members per (group, topic)
MIN_GROUP_LEASE_MS = 300
MAX_GROUP_LEASE_MS = 120_000
MAX_GROUP_MEMBERS = 1024
#: a broker fires messages into its consume logs this long before their deliver time and
#: hands them early only to pulls that hold each one until its time (``PullRequest.hold``),
#: answering such a pull once something is due within :func:`hold_answer_ms` of it: a
#: broker or consumer stalled for less than that (a preempted vCPU, a slow fsync round)
#: delays nothing. A cancel or a move has to reach the broker this long before the
#: deliver time. A pull without ``hold`` gets a message only once it is due (and a
#: queue's messages wait behind its first one not due yet: a short delay sent after a
#: longer one can be up to this late for such readers).
DEFAULT_FIRE_AHEAD_MS = 40
MAX_FIRE_AHEAD_MS = 1000


def firing_time_ms(deliver_at_ms: int, fire_ahead_ms: int = DEFAULT_FIRE_AHEAD_MS) -> int:
    """When a broker fires a message due at ``deliver_at_ms``: never before this, and its
    firing lateness counts from it."""
    return deliver_at_ms - fire_ahead_ms


def hold_answer_ms(fire_ahead_ms: int) -> int:
    """A holding pull is answered once a message for it is due within this many ms: at a
    steady rate every ``fire_ahead_ms`` minus this (10 ms of messages by default), each
    message this long (30 ms) before its time -- the stall it survives."""
    return fire_ahead_ms * 3 // 4


PERM_READ = 4
PERM_WRITE = 2
PERM_READ_WRITE = PERM_READ | PERM_WRITE

MASTER_ID = 0

JSON = "application/json"
MSGPACK = "application/msgpack"

# paths
NAMESRV_REGISTER = "/v1/brokers/register"
NAMESRV_UNREGISTER = "/v1/brokers/unregister"
NAMESRV_BROKERS = "/v1/brokers"
NAMESRV_ROUTE = "/v1/routes/{topic}"
BROKER_SEND = "/v1/send"
BROKER_CANCEL = "/v1/cancel"
BROKER_LOOKUP = "/v1/lookup"
BROKER_RESCHEDULE = "/v1/reschedule"
BROKER_PULL = "/v1/pull"
BROKER_GROUP_HEARTBEAT = "/v1/groups/heartbeat"
BROKER_TOPICS = "/v1/topics"
BROKER_STATS = "/v1/stats"
HEALTH = "/health"
#: Prometheus text format; open like /health (no message content, no credentials)
METRICS = "/metrics"


class ErrorCode:
    """Error codes carried in ``ErrorResponse.error.code`` and per-message results."""

    INVALID_REQUEST = "INVALID_REQUEST"  # body does not decode / fails the schema
    INVALID_TOPIC = "INVALID_TOPIC"
    INVALID_MESSAGE = "INVALID_MESSAGE"
    INVALID_DELAY = "INVALID_DELAY"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    BATCH_TOO_LARGE = "BATCH_TOO_LARGE"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    NOT_FOUND = "NOT_FOUND"  # unknown path
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
    NOT_WRITABLE = "NOT_WRITABLE"  # read-only broker, or topic without the write perm
    BROKER_BUSY = "BROKER_BUSY"  # back-pressure: too much pending
    STORE_ERROR = "STORE_ERROR"  # the store could not make the message durable
    DISK_FULL = "DISK_FULL"  # the broker's data directory is (nearly) out of space
    SHUTTING_DOWN = "SHUTTING_DOWN"
    #: the request's ``deadline_ms`` passed before it was stored: its sender no longer
    #: waits for it; a definite answer, nothing of the request was stored
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNAUTHORIZED = "UNAUTHORIZED"  # missing / wrong / expired / replayed signature
    FORBIDDEN = "FORBIDDEN"  # signed, but the account may not use the topic
    INTERNAL = "INTERNAL"


#: Broker error codes after which a producer may safely retry on another broker.
#: Everything else (bad input, auth) is final: retrying cannot change the answer.
RETRYABLE_CODES = frozenset(
    {
        ErrorCode.BROKER_BUSY,
        ErrorCode.NOT_WRITABLE,
        ErrorCode.STORE_ERROR,
        ErrorCode.DISK_FULL,  # other brokers have space; this one again once it is freed
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.TOPIC_NOT_FOUND,  # stale route: the topic lives on other brokers
        ErrorCode.INTERNAL,
        ErrorCode.DEADLINE_EXCEEDED,  # this attempt came too late here; nothing stored
    }
)

SEND_OK = "SEND_OK"


class _Base(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


# --- errors ----------------------------------------------------------------------


class ErrorBody(_Base):
    code: str
    message: str


class ErrorResponse(_Base):
    error: ErrorBody


# --- name server -----------------------------------------------------------------


class TopicConfig(_Base):
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ_WRITE
    #: True when the broker created the topic on a first send, False when it was asked to
    #: (``POST /v1/topics``): only a young auto-created topic's route lists the auto-create
    #: brokers that have not registered it yet
    auto_created: bool = False


class BrokerRegistration(_Base):
    """Sent by a broker at start and then as its heartbeat (RocketMQ's registerBrokerAll)."""

    broker_name: str
    addr: str
    cluster: str = "DefaultCluster"
    perm: int = PERM_READ_WRITE  # broker-wide; a read-only broker drops PERM_WRITE
    auto_create_topics: bool = True
    default_queue_nums: int = 4
    topics: dict[str, TopicConfig] = {}


class BrokerUnregistration(_Base):
    broker_name: str
    addr: str


class RegisterResult(_Base):
    heartbeat_interval_ms: int
    expire_ms: int


class QueueData(_Base):
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


class BrokerData(_Base):
    broker_name: str
    addrs: dict[int, str]  # broker id -> address; 0 is the master
    cluster: str = "DefaultCluster"


class TopicRoute(_Base):
    topic: str
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    #: True when the topic does not exist yet and the route lists the brokers that
    #: will create it on first send (RocketMQ's TBW102 default route).
    auto_create: bool = False
    #: True when a broker missing here may still serve the topic soon, so clients keep the
    #: brokers of their last route meanwhile and ask again soon: while the name server is
    #: younger than its broker expiry (brokers registered before it started may not have
    #: registered again yet), and while the topic is young (the route then also lists the
    #: auto-create brokers that have not registered it yet)
    partial: bool = False


class BrokerInfo(_Base):
    broker_name: str
    addr: str
    cluster: str
    perm: int
    last_heartbeat_ms: int
    topics: list[str] = []


class BrokerList(_Base):
    brokers: list[BrokerInfo]


# --- broker: send / cancel -------------------------------------------------------


class WireMessage(_Base):
    topic: str
    queue_id: int
    msg_id: str
    body: bytes
    key: str | None = None
    tags: str | None = None
    properties: dict[str, str] | None = None
    #: relative delay, turned into a deliver time by the *broker's* clock
    delay_ms: int | None = None
    #: absolute deliver time (epoch ms), kept as given; neither field = now
    deliver_at_ms: int | None = None
    flag: int = 0


class SendRequest(_Base):
    messages: list[WireMessage]
    #: wall-clock Unix ms after which the sender no longer waits for this attempt's answer;
    #: the broker then stores nothing of it (``protocol.deadline``). None: no deadline
    deadline_ms: int | None = None


class MessageResult(_Base):
    msg_id: str
    status: str  # SEND_OK or an ErrorCode
    queue_id: int = 0
    deliver_at_ms: int = 0
    error: str | None = None  # one-line reason when status != SEND_OK


class SendResponse(_Base):
    broker_name: str
    results: list[MessageResult]


class CancelRequest(_Base):
    topic: str
    msg_id: str
    #: the deliver time from the SendResult, if known (a hint: brokers find ids by index)
    deliver_at_ms: int | None = None


class CancelResponse(_Base):
    cancelled: bool
    reason: str | None = None  # "not_found", "already_fired", ...


# --- broker: message lifecycle ---------------------------------------------------

#: states of a stored message (``LookupResponse.state``, ``RescheduleResponse.state``)
STATE_SCHEDULED = "scheduled"
STATE_FIRED = "fired"
STATE_CANCELLED = "cancelled"


class LookupRequest(_Base):
    topic: str
    msg_id: str


class LookupResponse(_Base):
    broker_name: str
    found: bool
    state: str | None = None  # one of the STATE_* when found
    queue_id: int = 0
    deliver_at_ms: int = 0
    fired_at_ms: int | None = None


class RescheduleRequest(_Base):
    topic: str
    msg_id: str
    #: exactly one of them: relative to the broker's clock, or absolute (epoch ms)
    delay_ms: int | None = None
    deliver_at_ms: int | None = None


class RescheduleResponse(_Base):
    broker_name: str
    rescheduled: bool
    #: when not rescheduled: the message's state, None if this broker does not know it
    state: str | None = None
    queue_id: int = 0
    deliver_at_ms: int = 0


# --- broker: consume -------------------------------------------------------------


class PullRequest(_Base):
    topic: str
    group: str
    max_messages: int = 32
    #: long poll: wait up to this long for a message when none is ready
    wait_ms: int = 0
    #: offsets to commit first: queue id -> next offset to read
    commits: dict[int, int] = {}
    #: group member pulling (see GroupHeartbeat); with it the broker commits and serves
    #: only the queues this member holds, and renews its leases
    client_id: str | None = None
    #: with ``client_id``: the queues to read, queue id -> offset to read from (-1: the
    #: group's committed offset)
    queues: dict[int, int] = {}
    #: the reader keeps each message until its ``deliver_at_ms`` (by the broker's clock,
    #: see ``PullResponse.clock_ns``): the broker also serves messages fired ahead of
    #: their time (DEFAULT_FIRE_AHEAD_MS); without it, only due ones
    hold: bool = False
    #: the group's tag filter: only messages whose ``tags`` is one of these are served, the
    #: others skipped (``PullResponse.next_offsets`` moves past them). None: every message
    tags: list[str] | None = None


class PulledMessage(_Base):
    msg_id: str
    topic: str
    body: bytes
    queue_id: int
    offset: int
    deliver_at_ms: int
    fired_at_ms: int
    key: str | None = None
    tags: str | None = None
    properties: dict[str, str] | None = None
    flag: int = 0


class PullResponse(_Base):
    broker_name: str
    messages: list[PulledMessage]
    #: queue id -> next offset after the returned (and skipped) messages: commit these
    next_offsets: dict[int, int] = {}
    #: group pulls: requested queues this member does not hold (not served, commits for
    #: them ignored); the member stops reading them until it holds them again
    lost: list[int] = []
    #: the broker's wall clock (ns since the epoch) when it answered: a holding reader
    #: releases a message once this clock, as it estimates it, reaches its deliver time
    clock_ns: int = 0
    #: how long before their deliver time this broker fires messages (served early only
    #: to ``hold`` pulls, each answered once something is due within hold_answer_ms)
    fire_ahead_ms: int = 0


class GroupHeartbeat(_Base):
    """A consumer-group member's lease renewal and queue claim on one broker."""

    topic: str
    group: str
    client_id: str
    #: membership and queue leases last this long without a heartbeat or pull
    lease_ms: int = 6_000
    #: every queue of this broker the member wants to hold; held queues not listed are
    #: released (after ``commits`` are applied)
    want: list[int] = []
    #: offsets to commit first (queues this member holds): queue id -> next offset
    commits: dict[int, int] = {}
    #: leave the group now (close): releases every queue and the membership
    leave: bool = False


class GroupState(_Base):
    broker_name: str
    #: live members of the group on this broker, sorted
    members: list[str]
    #: the topic's read queues on this broker
    queues: int
    #: queues the member holds after this heartbeat, sorted
    owned: list[int] = []
    #: the broker's wall clock (ns) when it answered, as in PullResponse: a small answer
    #: is the holding reader's best sample of the broker's clock
    clock_ns: int = 0


# --- broker: admin ---------------------------------------------------------------


class CreateTopicRequest(_Base):
    topic: str
    queues: int = 4
    perm: int = PERM_READ_WRITE


class TopicList(_Base):
    topics: dict[str, TopicConfig]


class Health(_Base):
    status: str  # "ok"
    name: str
    role: str  # "namesrv" | "broker"
    perm: int = PERM_READ_WRITE


# --- codecs ----------------------------------------------------------------------

T = TypeVar("T")

#: every wire encoding: media type -> (encoder, decoder class). JSON is the default for
#: a body whose Content-Type names no known encoding. A new encoding is one entry here
#: plus its name in ENCODINGS.
_CODECS: dict[str, tuple[Any, Any]] = {
    JSON: (msgspec.json.Encoder(), msgspec.json.Decoder),
    MSGPACK: (msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder),
}
#: the media types a server accepts
MEDIA_TYPES = tuple(_CODECS)
#: the encodings by the name a producer's ``encoding`` option uses
ENCODINGS: dict[str, str] = {"msgpack": MSGPACK, "json": JSON}


def media_type(content_type: str | None) -> str:
    """The encoding a Content-Type (parameters allowed) names; JSON if none is known."""
    if content_type:
        for mt in _CODECS:
            if content_type.startswith(mt):
                return mt
    return JSON


def encode(obj: Any, content_type: str = JSON) -> bytes:
    """Encode a wire struct in the encoding ``content_type`` names."""
    codec = _CODECS.get(content_type) or _CODECS[media_type(content_type)]
    result: bytes = codec[0].encode(obj)
    return result


_decoders: dict[tuple[type, str], Any] = {}


def decode(data: bytes, typ: type[T], content_type: str = JSON) -> T:
    """Decode and validate; raises ``msgspec.ValidationError`` / ``DecodeError``."""
    key = (typ, media_type(content_type))
    dec = _decoders.get(key)
    if dec is None:
        dec = _decoders[key] = _CODECS[key[1]][1](typ)
    try:
        result: T = dec.decode(data)
    except UnicodeDecodeError as exc:
        # msgspec lets a string that is not UTF-8 through as this, not as a DecodeError:
        # callers catch DecodeError for every malformed body (else the servers answer 500)
        raise msgspec.DecodeError(f"a string is not valid UTF-8: {exc.reason}") from None
    return result


def valid_topic(topic: str) -> bool:
    return bool(TOPIC_RE.match(topic))


def base_url(addr: str) -> str:
    """``host:port`` → ``http://host:port``; an address with a scheme is kept."""
    addr = addr.strip().rstrip("/")
    return addr if "://" in addr else f"http://{addr}"


def split_addrs(addrs: str | Sequence[str]) -> tuple[str, ...]:
    """``"h:p"``, ``"h:p,h2:p2"`` or a sequence of them -> a tuple of addresses."""
    parts: list[str] = []
    for item in [addrs] if isinstance(addrs, str) else list(addrs):
        if not isinstance(item, str):
            raise ValueError(f"name server address must be a string, got {type(item).__name__}")
        parts.extend(p.strip() for p in item.split(",") if p.strip())
    if not parts:
        raise ValueError("at least one name server address is required")
    return tuple(parts)
