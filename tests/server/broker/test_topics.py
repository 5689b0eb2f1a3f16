"""TopicRegistry: create/update, persistence across a restart, bad files."""

from __future__ import annotations

import json
from pathlib import Path

from qclient.protocol import wire
from qclient.server.broker.topics import TopicRegistry


def test_put_reports_changes_and_persists(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    r = TopicRegistry(path)
    cfg, changed = r.put("t", 4, wire.PERM_READ_WRITE)
    assert changed and cfg == wire.TopicConfig(4, 4, wire.PERM_READ_WRITE)
    assert r.put("t", 4, wire.PERM_READ_WRITE) == (cfg, False)  # no change: no write
    _, changed = r.put("t", 8, wire.PERM_READ)
    assert changed
    again = TopicRegistry(path)  # a restart reads it back
    assert again.all() == {"t": wire.TopicConfig(8, 8, wire.PERM_READ)}
    assert again.get("missing") is None


def test_invalid_names_in_the_file_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    one = {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}
    path.write_text(json.dumps({"ok": one, "../x": one}))
    assert list(TopicRegistry(path).all()) == ["ok"]


def test_auto_created_is_persisted_and_an_explicit_put_clears_it(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    r = TopicRegistry(path)
    cfg, _ = r.put("t", 4, wire.PERM_READ_WRITE, auto_created=True)
    assert cfg.auto_created
    assert TopicRegistry(path).all() == {"t": cfg}
    _, changed = r.put("t", 4, wire.PERM_READ_WRITE)  # asked for: held on purpose from now
    assert changed and not TopicRegistry(path).all()["t"].auto_created
