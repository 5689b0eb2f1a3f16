"""ProducerConfig: every option of ``Producer`` / ``AsyncProducer`` in one validated place."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from .protocol.wire import split_addrs

__all__ = ["DEFAULT_MAX_DELAY", "ProducerConfig", "parse_addrs"]

#: the broker's default maximum delay; validated before the network with the same bound
DEFAULT_MAX_DELAY = timedelta(days=40)
_MS = timedelta(milliseconds=1)


#: ``"h:p,h2:p2"`` or a sequence -> a tuple of addresses (shared with the servers' CLI)
parse_addrs = split_addrs


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Options of a producer. The contract's options first, then the SDK's own."""

    namesrv: tuple[str, ...]
    send_timeout: float = 3.0
    retry_times: int = 2
    send_latency_fault_enable: bool = True
    start_detector_enable: bool = True
    detect_interval: float = 2.0
    detect_timeout: float = 0.2
    route_refresh_interval: float = 30.0
    max_message_size: int = 4 * 1024 * 1024
    linger_ms: float = 5.0
    batch_max_messages: int = 256
    batch_max_bytes: int = 1 << 20
    max_buffered_messages: int = 100_000
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
    #: concurrent requests one send_batch round may issue (one per broker chunk)
    max_concurrency: int = 8
    #: batches of send_async in flight per broker at once
    max_in_flight_per_broker: int = 4
    #: latency -> isolation tables (seed 004)
    latency_max_ms: tuple[int, ...] = (50, 100, 550, 1800, 3000, 5000, 15000)
    not_available_ms: tuple[int, ...] = (0, 0, 2000, 5000, 6000, 10000, 30000)
    #: an isolating failure is looked up in the table as this much latency
    isolation_latency_ms: int = 10000

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
        if self.encoding not in ("msgpack", "json"):
            raise ValueError(f"encoding must be 'msgpack' or 'json', got {self.encoding!r}")
        if len(self.latency_max_ms) != len(self.not_available_ms):
            raise ValueError("latency_max_ms and not_available_ms must have the same length")
        if not isinstance(self.max_delay, timedelta) or self.max_delay <= timedelta(0):
            raise ValueError(f"max_delay must be a positive timedelta, got {self.max_delay!r}")

    @classmethod
    def create(cls, namesrv: str | Sequence[str], **options: Any) -> ProducerConfig:
        """Build from the constructor arguments of ``Producer``; unknown options fail."""
        known = {f.name for f in fields(cls) if f.init} - {"namesrv"}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown producer option(s): {', '.join(sorted(unknown))}")
        md = options.get("max_delay")
        if isinstance(md, int | float) and not isinstance(md, bool):
            options["max_delay"] = timedelta(seconds=md)
        return cls(namesrv=parse_addrs(namesrv), **options)

    @property
    def times_total(self) -> int:
        return 1 + self.retry_times

    @property
    def max_delay_ms(self) -> int:
        return self.max_delay // _MS
