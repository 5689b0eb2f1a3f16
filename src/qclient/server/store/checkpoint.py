"""The replay checkpoint (``checkpoint.json``): how far the message log is reflected in
the schedule files on disk, so that an open replays only the log past it.

The schedule, dispatch and id-index files are written (their buffered appends) and
fsync'd before the checkpoint advances (tmp + fsync +
rename); a store that has failed keeps its last good checkpoint.
"""

from __future__ import annotations

import json
import logging

from qclient.server.store._files import atomic_write, sync_fds
from qclient.server.store._shared import Shared
from qclient.server.store.replay import Replayer

log = logging.getLogger(__name__)

_FILE = "checkpoint.json"


class Checkpoint:
    """Reads and advances the replay checkpoint."""

    def __init__(self, sh: Shared, replayer: Replayer):
        self._sh = sh
        self._replayer = replayer
        self._path = sh.config.data_dir / _FILE
        self.written = -1  # the replay offset last written (nothing before it is replayed)

    def read(self) -> int:
        """The checkpointed replay offset (0 if none or unreadable)."""
        try:
            return int(json.loads(self._path.read_bytes())["replay_offset"])
        except FileNotFoundError:
            return 0
        except (ValueError, KeyError, TypeError):
            log.error("unreadable %s: replaying the whole message log", _FILE)
            return 0

    def write(self) -> None:
        """fsync schedule/dispatch files, then advance the replay checkpoint."""
        sh = self._sh
        if sh.broken is not None:
            return  # keep the last good checkpoint: a restart replays from it
        with sh.sched:
            replayed = self._replayer.replayed
            fds = sh.files.take_dirty()
        # the group commit indexes a group before replaying it: every entry of a
        # position before ``replayed`` is in the index (or its buffer) by now
        fds += sh.files.take_dirty_index()
        sync_fds(fds)
        if replayed != self.written:
            data = json.dumps({"version": 1, "replay_offset": replayed}).encode()
            atomic_write(self._path, data, fsync=sh.config.fsync)
            self.written = replayed
