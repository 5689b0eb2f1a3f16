"""``Replayer.replay_new`` (new messages as columns) leaves exactly what ``replay`` of
the same items leaves: schedule entries, wheel heap and buckets, lowest positions, the
replay offset and the loader wake-ups."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.server.store.test_stages import NOW, Stages

from qclient.server.store import record as rec

# the load horizon (NOW + _AHEAD) falls inside a bucket, between two of the offsets
_AHEAD = 1_800_500
# deliver times relative to NOW by bucket: the loaded one, the next, the one holding the
# horizon (on either side of it), one far ahead
_BUCKETS = [[0, 1, 7, 100, 999], [1_000, 1_500], [1_800_100, 1_800_900], [86_400_000, 86_400_999]]
_ONE_BUCKET = st.sampled_from(_BUCKETS).flatmap(
    lambda offsets: st.lists(st.sampled_from(offsets), min_size=1, max_size=40)
)
_ANY = st.lists(st.sampled_from([o for b in _BUCKETS for o in b]), min_size=1, max_size=6)
_GROUPS = st.lists(st.one_of(_ONE_BUCKET, _ANY), min_size=1, max_size=5)


def _state(stages: Stages) -> tuple[Any, ...]:
    w, slog = stages.sh.wheel, stages.files.slog
    buckets = sorted(set(w.unloaded) | set(stages.replayer._bucket_first))
    return (
        {b: slog.entries(b) for b in buckets},
        sorted(w.heap),
        sorted(w.unloaded),
        dict(stages.replayer._bucket_first),
        stages.replayer.replayed,
        stages.woken,
    )


@settings(max_examples=40, deadline=None)
@given(groups=_GROUPS, loaded=st.booleans())
def test_replay_new_leaves_what_replay_leaves(groups: list[list[int]], loaded: bool) -> None:
    states = []
    for columns in (False, True):
        with tempfile.TemporaryDirectory() as d:
            stages = Stages(Path(d), load_ahead_ms=_AHEAD)
            try:
                if loaded:  # the first bucket loaded: its messages go into the wheel
                    first = stages.append(("warm", NOW))
                    stages.replayer.replay(first, stages.files.mlog.end)
                    stages.loader.step()
                n = 0
                for offsets in groups:
                    msgs = [(f"m{n + i}", NOW + off) for i, off in enumerate(offsets)]
                    n += len(offsets)
                    items = stages.append(*msgs)
                    end = stages.files.mlog.end
                    if columns:
                        positions, sizes, kinds, ats, refs = map(list, zip(*items, strict=True))
                        assert set(kinds) == {rec.KIND_MESSAGE} and set(refs) == {0}
                        stages.replayer.replay_new(positions, sizes, ats, end)
                    else:
                        stages.replayer.replay(items, end)
                states.append(_state(stages))
            finally:
                stages.files.close()
    assert states[0] == states[1]
