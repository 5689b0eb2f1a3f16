"""Consumer-group offsets, kept in memory and persisted atomically (periodically + on close)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from qclient.server.store._files import atomic_write, check_name, check_queue_id

log = logging.getLogger(__name__)


class OffsetStore:
    """``(group, topic, queue_id) -> next offset to consume``; thread-safe."""

    def __init__(self, path: Path, *, fsync: bool):
        self.path = path
        self.fsync = fsync
        self._lock = threading.Lock()
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._dirty = False
        self._unsynced = False  # written without fsync since the last durable flush

    def load(self) -> None:
        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return
        except ValueError:
            log.error("unreadable %s; consumer offsets start from 0", self.path)
            return
        for group, topics in doc.get("offsets", {}).items():
            for topic, queues in topics.items():
                for qid, off in queues.items():
                    self._offsets[(group, topic, int(qid))] = int(off)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        check_name(group, "group")
        check_name(topic)
        check_queue_id(queue_id)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError("offset must be a non-negative int")
        with self._lock:
            key = (group, topic, queue_id)
            if self._offsets.get(key) != offset:
                self._offsets[key] = offset
                self._dirty = True

    def clamp(self, end: Callable[[str, int], int]) -> int:
        """Lower every committed offset past its queue's ``end(topic, queue_id)`` to it;
        returns how many. After a crash that took back a consume log's unsynced tail (it
        may have been pulled and committed already), the re-fired copies land at offsets
        from the durable end on, and the group must read them there."""
        n = 0
        with self._lock:
            for key, off in self._offsets.items():
                top = end(key[1], key[2])
                if off > top:
                    self._offsets[key] = top
                    self._dirty = True
                    n += 1
        return n

    def get(self, group: str, topic: str, queue_id: int) -> int:
        return self._offsets.get((group, topic, queue_id), 0)

    def snapshot(self) -> dict[tuple[str, str, int], int]:
        """Every committed offset: ``(group, topic, queue_id) -> offset``."""
        with self._lock:
            return dict(self._offsets)

    def flush(self, *, durable: bool = True) -> None:
        """Persist if anything changed since the last flush. ``durable=False`` skips the
        fsyncs: the file then survives a killed process (the page cache keeps it) but not
        an OS crash, until the next durable flush."""
        with self._lock:
            if not self._dirty and not (durable and self._unsynced):
                return
            doc: dict[str, dict[str, dict[str, int]]] = {}
            for (g, t, q), off in self._offsets.items():
                doc.setdefault(g, {}).setdefault(t, {})[str(q)] = off
            self._dirty = False
            data = json.dumps({"version": 1, "offsets": doc}, sort_keys=True).encode()
        fsync = self.fsync and durable
        try:
            atomic_write(self.path, data, fsync=fsync)
        except OSError:
            with self._lock:
                self._dirty = True
            raise
        self._unsynced = self.fsync and not durable
