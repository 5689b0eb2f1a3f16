"""Broker configuration (the `qclient broker` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BrokerConfig:
    name: str
    data_dir: str
    namesrv: list[str]
    host: str = "127.0.0.1"
    port: int = 10911
    advertise_addr: str | None = None
    read_only: bool = False
    auth_file: str | None = None
    auto_create_topics: bool = True
    default_queue_nums: int = 4
    heartbeat_interval_ms: int = 30_000
    # limits on input (every one returns a 4xx with a one-line reason)
    max_message_size: int = 4 * 1024 * 1024
    max_batch_messages: int = 4096
    max_request_bytes: int = 64 * 1024 * 1024
    max_delay_ms: int = 40 * 86_400_000
    max_pull_messages: int = 1024
    max_pull_wait_ms: int = 30_000
    #: issue 6: one pull answer stops growing past this many body bytes (at least 1 message)
    max_pull_bytes: int = 16 * 1024 * 1024
    # store tunables (see qclient.server.store.StoreConfig)
    store: dict[str, int | bool] = field(default_factory=dict)
    tls_cert: str | None = None
    tls_key: str | None = None
    #: issue 6: CA bundle that verifies https:// name servers (default: the system's)
    tls_ca: str | None = None
    ready_file: str | None = None
    exit_with_parent: int | None = None

    @property
    def addr(self) -> str:
        return self.advertise_addr or f"{self.host}:{self.port}"
