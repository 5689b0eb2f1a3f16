"""A store's data directory: one store at a time (an flock), and ``meta.json``.

``meta.json`` fixes ``bucket_ms`` when the directory is created: the schedule files are
cut into buckets of that width, so a store reopened with another width keeps the stored
one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

from qclient.server.store._files import atomic_write
from qclient.server.store.types import StoreConfig, StoreError

log = logging.getLogger(__name__)

__all__ = ["lock_data_dir", "read_bucket_ms"]


def lock_data_dir(d: Path) -> int:
    """Create ``d`` if needed and lock it for this process; returns the lock's file
    descriptor (closing it releases the lock). StoreError if another store holds it."""
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(f"data directory {d} is in use by another store") from None
    return fd


def read_bucket_ms(config: StoreConfig) -> int:
    """The directory's ``bucket_ms``: the stored one, else ``config.bucket_ms``, written to
    a new ``meta.json``. ValueError if the file is not a store meta file."""
    path = config.data_dir / "meta.json"
    try:
        meta = json.loads(path.read_bytes())
    except FileNotFoundError:
        data = json.dumps({"version": 1, "bucket_ms": config.bucket_ms}).encode()
        atomic_write(path, data, fsync=config.fsync)
        return config.bucket_ms
    if not isinstance(meta, dict) or not isinstance(meta.get("bucket_ms"), int):
        raise ValueError(f"{path} is not a store meta file")
    stored: int = meta["bucket_ms"]
    if stored <= 0:
        raise ValueError(f"{path}: bad bucket_ms")
    if stored != config.bucket_ms:
        log.warning("data dir was created with bucket_ms=%d; keeping it", stored)
    return stored
