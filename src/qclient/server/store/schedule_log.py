"""Schedule log: one index file per time bucket of the deliver time.

``bucket = deliver_at_ms // bucket_ms``. Each entry is fixed-size
``(deliver_at_ms i64, position u64, size u32, kind i32)``: a message to fire
(``KIND_MESSAGE``, position/size of its message-log record) or a cancel
(``KIND_CANCEL``, position of the cancelled message). Entries are appended by the replayer
after the message log's group fsync, buffered in memory until the next checkpoint (which
writes and fsyncs them before it advances; see ``AppendFiles``); a replay resumed from an
older checkpoint may append an entry twice, which the loader dedupes by position. Not
thread-safe: the store calls it under its scheduler lock (``read`` excepted).
"""

from __future__ import annotations

import struct
from pathlib import Path

from qclient.server.store._files import SIDE_BUFFER_BYTES, AppendFiles, aligned_find

ENTRY = struct.Struct("<qQIi")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")


class ScheduleLog(AppendFiles):
    """Per-bucket schedule index files."""

    def __init__(self, directory: Path, *, fsync: bool):
        super().__init__(
            directory, ".sched", ENTRY.size, fsync=fsync, buffer_bytes=SIDE_BUFFER_BYTES
        )

    def entries(self, bucket: int, upto: int | None = None) -> list[tuple[int, int, int, int]]:
        """The bucket's entries in file order, up to ``upto`` bytes."""
        return list(ENTRY.iter_unpack(self.read(bucket, upto)))

    def find(
        self, bucket: int, *, deliver_at_ms: int | None = None, position: int | None = None
    ) -> list[tuple[int, int, int, int]]:
        """Entries with the given deliver time or position (a C-speed ``bytes.find`` scan,
        so a cancel never loops in Python over a big bucket)."""
        data = self.read(bucket)
        if deliver_at_ms is not None:
            needle, field = _I64.pack(deliver_at_ms), 0
        elif position is not None:
            needle, field = _U64.pack(position), 8
        else:
            raise ValueError("give deliver_at_ms or position")
        return [ENTRY.unpack_from(data, s) for s in aligned_find(data, needle, ENTRY.size, field)]
