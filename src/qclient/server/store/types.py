"""Public value types of the delay store: configuration, inputs, results, errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from qclient.protocol.limits import MAX_DELAY_MS
from qclient.protocol.wire import MAX_FIRE_AHEAD_MS


@dataclass
class StoreConfig:
    """Tunables of one :class:`~qclient.server.store.DelayStore` (one data directory)."""

    data_dir: Path
    segment_bytes: int = 256 << 20  # message-log segment size
    bucket_ms: int = 3_600_000  # schedule-log time bucket (fixed at creation, see meta.json)
    load_ahead_ms: int = 1_800_000  # load a bucket into the wheel this long before it starts
    max_delay_ms: int = MAX_DELAY_MS
    dedupe_window_ms: int = 3_600_000  # msg ids remembered this long ...
    dedupe_max_ids: int = 500_000  # ... and at most this many (oldest evicted)
    fsync: bool = True  # False only for tests/benchmarks that say so
    max_pending_messages: int = 50_000  # submit() raises StoreBusyError beyond it
    max_pending_bytes: int = 256 << 20  # ... or beyond this many encoded bytes pending
    sync_interval_ms: int = 10  # min gap between group fsyncs of the consume logs
    #: fired messages are pullable as soon as they are in the consume log, before its
    #: fsync (a crash re-fires what was not synced: redelivered, never lost); False:
    #: only after the fsync, a group fsync later
    visible_before_sync: bool = True
    checkpoint_interval_ms: int = 1_000  # replay checkpoint + consumer offsets flush period
    #: committed consumer offsets are also written (without fsync) this often, so a
    #: killed broker process re-delivers at most this much of what consumers committed
    offsets_write_ms: int = 20
    retain_fired_ms: int = 600_000  # keep a fully fired bucket's files this long after its end
    max_record_bytes: int = (16 << 20) - 1  # hard cap of one encoded record (wheel packing)
    id_index: bool = True  # keep the on-disk id index (lookup / cancel / reschedule by id)
    #: fire on the store's own thread; False: the owner drives firing by calling
    #: ``DelayStore.fire_due()`` when ``set_fire_wake``'s callback runs and at the times
    #: it returns (the broker does, on its event loop)
    firing_thread: bool = True
    #: fire (append to the consume log) this long before ``deliver_at_ms``: readers must
    #: then hold each message until its time (the broker's pulls do, see
    #: ``server/broker/app.py``); 0: never in a consume log before its time
    fire_ahead_ms: int = 0

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.bucket_ms <= 0 or self.segment_bytes <= 0 or self.load_ahead_ms < 0:
            raise ValueError("bucket_ms and segment_bytes must be > 0, load_ahead_ms >= 0")
        if not 0 <= self.fire_ahead_ms <= MAX_FIRE_AHEAD_MS:
            raise ValueError(f"fire_ahead_ms must be 0..{MAX_FIRE_AHEAD_MS}")


class NewMessage(msgspec.Struct):
    """One message to store, already validated by the app."""

    topic: str
    queue_id: int
    msg_id: str
    body: bytes
    deliver_at_ms: int
    key: str | None = None
    tags: str | None = None
    properties: dict[str, str] | None = None
    flag: int = 0
    received_ms: int = 0  # 0: the store's clock at submit()


class StoreResult(msgspec.Struct):
    """Outcome of one submitted message (``duplicate``: the original result, nothing stored)."""

    msg_id: str
    queue_id: int
    deliver_at_ms: int
    duplicate: bool = False


class FiredMessage(msgspec.Struct):
    """A message that fired, as read back from its topic queue's consume log."""

    msg_id: str
    topic: str
    queue_id: int
    offset: int
    body: bytes
    key: str | None
    tags: str | None
    properties: dict[str, str] | None
    deliver_at_ms: int
    fired_at_ms: int
    flag: int = 0


class CancelOutcome(msgspec.Struct):
    """Outcome of a cancel: ``reason`` is None when cancelled."""

    cancelled: bool
    reason: str | None = None  # None | "not_found" | "already_fired" | "already_cancelled"


class MessageStatus(msgspec.Struct):
    """What the store knows of a message id: ``state`` is "scheduled", "fired" or
    "cancelled"; ``fired_at_ms`` is None unless fired (or when its time was lost)."""

    state: str
    queue_id: int
    deliver_at_ms: int
    fired_at_ms: int | None = None


class RescheduleOutcome(msgspec.Struct):
    """Outcome of a reschedule: when not rescheduled, ``state`` is the message's state, or
    None when the id is unknown here."""

    rescheduled: bool
    state: str | None = None
    queue_id: int = 0
    deliver_at_ms: int = 0


class StoreError(Exception):
    """The store cannot do what was asked (closed, I/O failure, corrupt state)."""


class DiskFullError(StoreError):
    """The message log could not be written for lack of space (ENOSPC, EDQUOT, EFBIG);
    nothing of the failed group is kept. Retry later or elsewhere."""


class DeadlineExceededError(StoreError):
    """A submit's ``refuse_after_ms`` passed before its records were written (it was
    queued behind a stall); nothing of it is stored."""


class StoreBusyError(StoreError):
    """Too many messages pending the group commit; retry later (back-pressure)."""


class InvalidRecordError(StoreError, ValueError):
    """A message the store refuses (bad topic/queue, too large, delay out of range)."""
