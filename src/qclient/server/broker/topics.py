"""The broker's topic table, persisted as JSON (written atomically)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from ...protocol import wire
from ..store._files import atomic_write

log = logging.getLogger(__name__)


class TopicRegistry:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._topics: dict[str, wire.TopicConfig] = {}
        if path.exists():
            raw = json.loads(path.read_text())
            for name, cfg in raw.items():
                if wire.valid_topic(name):
                    self._topics[name] = wire.TopicConfig(**cfg)

    def get(self, topic: str) -> wire.TopicConfig | None:
        return self._topics.get(topic)

    def all(self) -> dict[str, wire.TopicConfig]:
        return dict(self._topics)

    def put(
        self, topic: str, queues: int, perm: int, *, auto_created: bool = False
    ) -> tuple[wire.TopicConfig, bool]:
        """Create or update a topic; returns (config, changed). ``auto_created``: made by a
        first send rather than asked for (an explicit put makes an auto-created topic explicit)."""
        cfg = wire.TopicConfig(
            read_queue_nums=queues, write_queue_nums=queues, perm=perm, auto_created=auto_created
        )
        with self._lock:
            if self._topics.get(topic) == cfg:
                return cfg, False
            self._topics[topic] = cfg
            self._save()
        log.info("topic %s: %d queues, perm %d", topic, queues, perm)
        return cfg, True

    def _save(self) -> None:
        data = {
            n: {
                "read_queue_nums": c.read_queue_nums,
                "write_queue_nums": c.write_queue_nums,
                "perm": c.perm,
                **({"auto_created": True} if c.auto_created else {}),
            }
            for n, c in self._topics.items()
        }
        atomic_write(self._path, json.dumps(data, sort_keys=True).encode())
