"""The firing thread reads due records with one pread per run of adjacent records."""

from __future__ import annotations

from qclient.server.store.firing import _read_all

LOG = bytes(range(256)) * 4


class Log:
    """A message log of ``LOG`` whose segments end at ``segment_end``."""

    def __init__(self, segment_end: int = len(LOG)) -> None:
        self.segment_end = segment_end
        self.reads: list[tuple[int, int]] = []

    def read(self, pos: int, size: int) -> bytes:
        self.reads.append((pos, size))
        base = 0 if pos < self.segment_end else self.segment_end
        end = self.segment_end if pos < self.segment_end else len(LOG)
        return LOG[pos : min(pos + size, end)] if base <= pos else b""


def test_adjacent_records_are_read_at_once_and_gaps_split_the_runs() -> None:
    log = Log()
    due = [(5, 10, 20), (5, 0, 10), (6, 30, 5), (7, 100, 8), (8, 35, 1)]
    got = _read_all(log.read, due)
    assert got == {pos: LOG[pos : pos + size] for _, pos, size in due}
    assert log.reads == [(0, 36), (100, 8)]


def test_a_run_across_a_segment_end_is_read_entry_by_entry() -> None:
    log = Log(segment_end=30)
    due = [(1, 0, 10), (1, 10, 20), (1, 30, 10)]
    got = _read_all(log.read, due)
    assert got == {0: LOG[0:10], 10: LOG[10:30], 30: LOG[30:40]}
    assert log.reads == [(0, 40), (0, 10), (10, 20), (30, 10)]
