"""Every default in one place: the producers' options (``ProducerConfig``, validated) and
the servers' and CLI's ``DEFAULT_*`` values."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from .protocol.limits import MAX_DELAY_MS, MAX_MESSAGE_SIZE
from .protocol.wire import ENCODINGS, split_addrs

__all__ = [
    "DEFAULT_BATCH_MAX_BYTES",
    "DEFAULT_BATCH_MAX_MESSAGES",
    "DEFAULT_BROKER_EXPIRE",
    "DEFAULT_BROKER_PORT",
    "DEFAULT_DETECT_INTERVAL",
    "DEFAULT_DETECT_TIMEOUT",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_HOST",
    "DEFAULT_LINGER_MS",
    "DEFAULT_MAX_BUFFERED_MESSAGES",
    "DEFAULT_MAX_DELAY",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MIN_FREE_MB",
    "DEFAULT_NAMESRV_PORT",
    "DEFAULT_QUEUES",
    "DEFAULT_RETRY_TIMES",
    "DEFAULT_ROUTE_REFRESH_INTERVAL",
    "DEFAULT_SEND_LATENCY_FAULT_ENABLE",
    "DEFAULT_SEND_TIMEOUT",
    "DEFAULT_START_DETECTOR_ENABLE",
    "ProducerConfig",
    "parse_addrs",
]

_MS = timedelta(milliseconds=1)


def _fault_tables() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The latency -> isolation tables, whose home is qclient.fault (imported on first
    use, so that the servers can read the defaults here without the SDK's HTTP stack)."""
    from .fault.strategy import LATENCY_MAX_MS, NOT_AVAILABLE_MS

    return LATENCY_MAX_MS, NOT_AVAILABLE_MS


# --- the producers' options (Producer and AsyncProducer signatures use these) -------
DEFAULT_SEND_TIMEOUT = 3.0  # seconds per send, retries included
DEFAULT_RETRY_TIMES = 2
DEFAULT_SEND_LATENCY_FAULT_ENABLE = True
DEFAULT_START_DETECTOR_ENABLE = True
DEFAULT_DETECT_INTERVAL = 2.0  # seconds between probes of isolated brokers
DEFAULT_DETECT_TIMEOUT = 0.2  # seconds per probe
DEFAULT_ROUTE_REFRESH_INTERVAL = 30.0  # seconds
DEFAULT_MAX_MESSAGE_SIZE = MAX_MESSAGE_SIZE
DEFAULT_LINGER_MS = 5.0
DEFAULT_BATCH_MAX_MESSAGES = 256
DEFAULT_BATCH_MAX_BYTES = 1 << 20
DEFAULT_MAX_BUFFERED_MESSAGES = 100_000
#: the broker's default maximum delay; validated before the network with the same bound
DEFAULT_MAX_DELAY = timedelta(milliseconds=MAX_DELAY_MS)

# --- the servers (and the CLI that starts them) -------------------------------------
DEFAULT_HOST = "127.0.0.1"
DEFAULT_NAMESRV_PORT = 9876
DEFAULT_BROKER_PORT = 10911
DEFAULT_HEARTBEAT_INTERVAL = 30.0  # seconds between broker heartbeats (RocketMQ: 30 s)
DEFAULT_BROKER_EXPIRE = 120.0  # seconds without one before a broker leaves the routes
DEFAULT_QUEUES = 4  # queues of an auto-created topic
#: a broker refuses sends below this much free space (MiB) in its data directory; the
#: reserve keeps firing, dispatch and checkpoint writes going (RocketMQ refuses at 90 %)
DEFAULT_MIN_FREE_MB = 256.0


#: a consumer looks again this often (s) at a topic it reads that does not exist yet, on
#: a broker of its route or at all, and (RocketMQ) at a route that changed within
#: NEW_TOPIC_WINDOW_S: a topic is created on each broker by its first message there, and
#: a member that learned of it at its next heartbeat (seconds) or route look-up (5 s)
#: received those messages that late. One small request per broker or name server each
#: time, and only while the topic is missing or new
NEW_TOPIC_WATCH_S = 0.1
NEW_TOPIC_WINDOW_S = 10.0

#: ``"h:p,h2:p2"`` or a sequence -> a tuple of addresses (shared with the servers' CLI)
parse_addrs = split_addrs


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Options of a producer. The contract's options first, then the SDK's own."""

    namesrv: tuple[str, ...]
    #: the engine the name-server address names (``qclient.engines.parse_namesrv``)
    engine: str = "qclient"
    send_timeout: float = DEFAULT_SEND_TIMEOUT
    retry_times: int = DEFAULT_RETRY_TIMES
    send_latency_fault_enable: bool = DEFAULT_SEND_LATENCY_FAULT_ENABLE
    start_detector_enable: bool = DEFAULT_START_DETECTOR_ENABLE
    detect_interval: float = DEFAULT_DETECT_INTERVAL
    detect_timeout: float = DEFAULT_DETECT_TIMEOUT
    route_refresh_interval: float = DEFAULT_ROUTE_REFRESH_INTERVAL
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    linger_ms: float = DEFAULT_LINGER_MS
    batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES
    batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES
    max_buffered_messages: int = DEFAULT_MAX_BUFFERED_MESSAGES
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    # --- beyond the contract ---
    #: largest delay / furthest deliver time accepted (the broker's default bound)
    max_delay: timedelta = DEFAULT_MAX_DELAY
    #: bodies larger than this are zlib-compressed and flagged (RocketMQ: 4 KiB)
    compress_threshold: int = 4096
    compress_level: int = 5
    #: TLS verification for https:// addresses: True, False or a CA bundle path
    verify: bool | str = True
    #: timeout of one name-server request
    namesrv_timeout: float = 3.0
    #: wire encoding of request bodies: "msgpack" (default, measured faster) or "json"
    encoding: str = "msgpack"
    #: the synchronous HTTP transport: "lean" (qclient.transport.lean, the fast path) or
    #: "httpx" (httpx's own transport: proxies and every httpx feature; what respx mocks)
    http_transport: str = "lean"
    #: concurrent requests one send_batch round may issue (one per broker chunk)
    max_concurrency: int = 8
    #: batches of send_async in flight per broker at once
    max_in_flight_per_broker: int = 4
    #: latency -> isolation tables (a send that took latency_max_ms[i] isolates its
    #: broker for not_available_ms[i]; see qclient.fault.strategy)
    latency_max_ms: tuple[int, ...] = field(default_factory=lambda: _fault_tables()[0])
    not_available_ms: tuple[int, ...] = field(default_factory=lambda: _fault_tables()[1])
    #: an isolating failure is looked up in the table as this much latency
    isolation_latency_ms: int = 10000
    #: how each attempt's outcome updates the fault table (a ``qclient.fault.FaultPolicy``;
    #: None: ``IsolationPolicy``, RocketMQ's rules)
    fault_policy: Any = None

    def __post_init__(self) -> None:
        def positive(name: str, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
                raise ValueError(f"{name} must be a number, got {v!r}")
            if v < 0 or (v == 0 and not allow_zero):
                raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {v!r}")

        for name in (
            "send_timeout",
            "detect_interval",
            "detect_timeout",
            "route_refresh_interval",
            "max_message_size",
            "batch_max_messages",
            "batch_max_bytes",
            "max_buffered_messages",
            "namesrv_timeout",
            "max_concurrency",
            "max_in_flight_per_broker",
        ):
            positive(name)
        for name in ("retry_times", "linger_ms", "compress_threshold"):
            positive(name, allow_zero=True)
        if not isinstance(self.retry_times, int):
            raise ValueError(f"retry_times must be an int, got {self.retry_times!r}")
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("access_key and secret_key must be given together")
        if self.encoding not in ENCODINGS:
            names = " or ".join(repr(e) for e in ENCODINGS)
            raise ValueError(f"encoding must be {names}, got {self.encoding!r}")
        if self.http_transport not in ("lean", "httpx"):
            raise ValueError(
                f"http_transport must be 'lean' or 'httpx', got {self.http_transport!r}"
            )
        if len(self.latency_max_ms) != len(self.not_available_ms):
            raise ValueError("latency_max_ms and not_available_ms must have the same length")
        if not isinstance(self.max_delay, timedelta) or self.max_delay <= timedelta(0):
            raise ValueError(f"max_delay must be a positive timedelta, got {self.max_delay!r}")

    @classmethod
    def create(cls, namesrv: str | Sequence[str], **options: Any) -> ProducerConfig:
        """Build from the constructor arguments of ``Producer``; unknown options fail."""
        known = {f.name for f in fields(cls) if f.init} - {"namesrv", "engine"}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown producer option(s): {', '.join(sorted(unknown))}")
        from .engines import DEFAULT_MAX_DELAY_MS, parse_namesrv

        engine, addrs = parse_namesrv(namesrv)
        md = options.get("max_delay")
        if isinstance(md, int | float) and not isinstance(md, bool):
            options["max_delay"] = timedelta(seconds=md)
        elif md is None:
            options["max_delay"] = timedelta(milliseconds=DEFAULT_MAX_DELAY_MS[engine])
        return cls(namesrv=addrs, engine=engine, **options)

    @property
    def times_total(self) -> int:
        return 1 + self.retry_times

    @property
    def max_delay_ms(self) -> int:
        return self.max_delay // _MS
