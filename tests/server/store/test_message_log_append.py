"""``MessageLog.append`` of a group in one write (when no record of it would roll the
segment) leaves what appending its records one at a time leaves: the same positions,
segments and bytes."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qclient.server.store.message_log import MessageLog

_SEGMENT = 256
_GROUPS = st.lists(st.lists(st.integers(1, 300), min_size=0, max_size=12), min_size=1, max_size=8)


def _run(groups: list[list[int]], one_by_one: bool) -> tuple[list[int], list[int], list[bytes]]:
    with tempfile.TemporaryDirectory() as d:
        log = MessageLog(Path(d), _SEGMENT, fsync=False)
        log.open()
        try:
            positions: list[int] = []
            n = 0
            for sizes in groups:
                records = [bytes([(n + i) % 251]) * size for i, size in enumerate(sizes)]
                n += len(sizes)
                if one_by_one:
                    for r in records:
                        positions += log.append([r])
                else:
                    positions += log.append(records)
            bases = list(log._bases)
            return positions, bases, [log.segment_path(b).read_bytes() for b in bases]
        finally:
            log.close()


@settings(max_examples=40, deadline=None)
@given(groups=_GROUPS)
def test_a_group_append_equals_appending_one_by_one(groups: list[list[int]]) -> None:
    assert _run(groups, one_by_one=False) == _run(groups, one_by_one=True)
