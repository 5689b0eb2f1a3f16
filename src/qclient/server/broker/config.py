"""Broker configuration (the `qclient broker` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..._config import (
    DEFAULT_BROKER_PORT,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HOST,
    DEFAULT_MIN_FREE_MB,
    DEFAULT_QUEUES,
)
from ...protocol.limits import MAX_DELAY_MS, MAX_MESSAGE_SIZE


@dataclass
class BrokerConfig:
    name: str
    data_dir: str
    namesrv: list[str]
    host: str = DEFAULT_HOST
    port: int = DEFAULT_BROKER_PORT
    advertise_addr: str | None = None
    read_only: bool = False
    auth_file: str | None = None
    auto_create_topics: bool = True
    default_queue_nums: int = DEFAULT_QUEUES
    heartbeat_interval_ms: int = int(DEFAULT_HEARTBEAT_INTERVAL * 1000)
    # limits on input (every one returns a 4xx with a one-line reason)
    max_message_size: int = MAX_MESSAGE_SIZE
    max_batch_messages: int = 4096
    max_request_bytes: int = 64 * 1024 * 1024
    max_delay_ms: int = MAX_DELAY_MS
    max_pull_messages: int = 1024
    max_pull_wait_ms: int = 30_000
    #: one pull answer stops growing past this many body bytes (at least 1 message)
    max_pull_bytes: int = 16 * 1024 * 1024
    #: sends are refused (507 DISK_FULL, retryable) below this much free space in the data
    #: directory (0: no check)
    min_free_bytes: int = int(DEFAULT_MIN_FREE_MB * 2**20)
    # store tunables (see qclient.server.store.StoreConfig)
    store: dict[str, int | bool] = field(default_factory=dict)
    tls_cert: str | None = None
    tls_key: str | None = None
    #: CA bundle that verifies https:// name servers (default: the system's)
    tls_ca: str | None = None
    ready_file: str | None = None
    exit_with_parent: int | None = None

    @property
    def addr(self) -> str:
        return self.advertise_addr or f"{self.host}:{self.port}"
