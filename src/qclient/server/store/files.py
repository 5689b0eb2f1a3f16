"""The store's files on disk, constructed, made durable and closed in one place.

A new kind of storage file is registered here: built in :meth:`StoreFiles.__init__`, listed
in ``parts`` (closed on :meth:`StoreFiles.close`, also after a failed open), and, if the
checkpoint must fsync it, listed in :meth:`StoreFiles.take_dirty`.
"""

from __future__ import annotations

import logging
from typing import Protocol

from qclient.server.store.consume_log import ConsumeLogs
from qclient.server.store.dispatch_log import DispatchLog
from qclient.server.store.id_index import IdIndex
from qclient.server.store.message_log import MessageLog
from qclient.server.store.offsets import OffsetStore
from qclient.server.store.schedule_log import ScheduleLog
from qclient.server.store.types import StoreConfig

log = logging.getLogger(__name__)


class StorageFile(Protocol):
    """What the store asks of every file kind it keeps."""

    def close(self) -> None: ...


class StoreFiles:
    """Every file of one data directory (the directory itself is locked by the store)."""

    def __init__(self, config: StoreConfig):
        d, fsync = config.data_dir, config.fsync
        self.mlog = MessageLog(d / "commitlog", config.segment_bytes, fsync=fsync)
        self.slog = ScheduleLog(d / "schedule", fsync=fsync)
        self.dlog = DispatchLog(d / "dispatch", fsync=fsync)
        self.consume = ConsumeLogs(d / "consume", fsync=fsync)
        self.offsets = OffsetStore(d / "offsets.json", fsync=fsync)
        self.ids = IdIndex(d / "ids", fsync=fsync) if config.id_index else None
        parts: list[StorageFile] = [self.mlog, self.slog, self.dlog, self.consume]
        if self.ids is not None:
            parts.append(self.ids)
        self.parts: tuple[StorageFile, ...] = tuple(parts)

    def open(self) -> None:
        """Open the files whose state needs no replay (the rest is read by recovery)."""
        self.mlog.open()
        self.offsets.load()

    def take_dirty(self) -> list[int]:
        """fds of the schedule and dispatch files the checkpoint must fsync before it
        advances, their buffered appends written (call with the scheduler lock held:
        schedule files are appended under it)."""
        return self.slog.take_dirty() + self.dlog.take_dirty()

    def take_dirty_index(self) -> list[int]:
        """The same for the id index (its own lock: call it after :meth:`take_dirty`,
        without the scheduler lock; it covers every entry added before it)."""
        return self.ids.take_dirty() if self.ids is not None else []

    def flush(self) -> None:
        """Persist state kept in memory between checkpoints (consumer offsets)."""
        self.offsets.flush()

    def close(self) -> None:
        """Close every part, also after a failed open (errors past the first are logged)."""
        first: BaseException | None = None
        for part in self.parts:
            try:
                part.close()
            except Exception as exc:
                log.debug("closing %s failed", type(part).__name__, exc_info=True)
                first = first or exc
        if first is not None:
            raise first
