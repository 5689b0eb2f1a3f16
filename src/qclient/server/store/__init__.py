"""The delay broker's durable storage engine (docs/STORAGE.md is the map)."""

from qclient.server.store.store import DelayStore, accept_clock_ms, wall_clock_ms
from qclient.server.store.types import (
    CancelOutcome,
    DeadlineExceededError,
    DiskFullError,
    FiredMessage,
    InvalidRecordError,
    MessageStatus,
    NewMessage,
    RescheduleOutcome,
    StoreBusyError,
    StoreConfig,
    StoreError,
    StoreResult,
)

__all__ = [
    "CancelOutcome",
    "DeadlineExceededError",
    "DelayStore",
    "DiskFullError",
    "FiredMessage",
    "InvalidRecordError",
    "MessageStatus",
    "NewMessage",
    "RescheduleOutcome",
    "StoreBusyError",
    "StoreConfig",
    "StoreError",
    "StoreResult",
    "accept_clock_ms",
    "wall_clock_ms",
]
