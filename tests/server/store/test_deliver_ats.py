"""Messages given with their deliver times (``submit(..., deliver_ats=...)``: the broker's
wire messages, no store message object each) are stored exactly as the NewMessages
with those deliver times, received at the store's clock: the same results, duplicates
and message-log bytes, also when one needs the full checks (key, tags, properties)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.server.store.conftest import FakeClock

from qclient.protocol.wire import WireMessage
from qclient.server.store import DelayStore, InvalidRecordError, NewMessage, StoreConfig
from qclient.server.store import record as rec

NOW = 1_700_000_000_000

_ROWS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),  # msg_id: repeats are duplicates
        st.sampled_from(["t", "u"]),
        st.binary(max_size=40),
        st.integers(0, 3),  # queue id
        st.integers(0, 86_400_000),  # delay
        st.sampled_from([None, "k"]),
        st.sampled_from([None, "x,y"]),
        st.sampled_from([None, {}, {"p": "v"}]),
    ),
    min_size=1,
    max_size=8,
)


def _raw(store: DelayStore) -> bytes:
    """The message log's bytes."""
    mlog = store._files.mlog
    return b"".join(mlog.segment_path(b).read_bytes() for b in mlog._bases)


def _run(rows: list[tuple], wire: bool) -> tuple[list[object], bytes]:
    with tempfile.TemporaryDirectory() as d:
        clock = FakeClock(NOW)
        store = DelayStore(
            StoreConfig(data_dir=Path(d), bucket_ms=60_000, fsync=False), clock_ms=clock
        )
        store.open()
        try:
            outcomes: list[object] = []
            for half in (rows[: len(rows) // 2], rows[len(rows) // 2 :]):
                if not half:
                    continue
                ats = [NOW + delay for _, _, _, _, delay, _, _, _ in half]
                if wire:
                    msgs: list = [
                        WireMessage(t, q, mid, body, key, tags, props)
                        for mid, t, body, q, _, key, tags, props in half
                    ]
                else:
                    msgs = [
                        NewMessage(t, q, mid, body, at, key, tags, props, 0, clock.now)
                        for (mid, t, body, q, _, key, tags, props), at in zip(
                            half, ats, strict=True
                        )
                    ]
                try:
                    fut = store.submit(
                        msgs, validated=True, deliver_ats=ats if wire else None, defer=True
                    )
                    store.commit_pending()
                    outcomes.append(fut.result(10))
                except InvalidRecordError as exc:
                    outcomes.append(str(exc))
                clock.advance(1)
            return outcomes, _raw(store)
        finally:
            store.close()


@settings(max_examples=40, deadline=None)
@given(rows=_ROWS)
def test_wire_messages_with_deliver_times_are_stored_as_new_messages(rows: list[tuple]) -> None:
    assert _run(rows, wire=True) == _run(rows, wire=False)


def test_deliver_times_are_for_validated_messages(make_store) -> None:
    store = make_store()
    with pytest.raises(ValueError, match="validated"):
        store.submit([WireMessage("t", 0, "m", b"x")], deliver_ats=[NOW])


def test_encode_messages_takes_deliver_times_beside_the_messages() -> None:
    wires = [WireMessage("t", 1, "m1", b"x", flag=1), WireMessage("t", 2, "m2", b"")]
    news = [NewMessage("t", 1, "m1", b"x", 5, flag=1), NewMessage("t", 2, "m2", b"", 6)]
    topics = {"t": b"t"}
    assert rec.encode_messages(wires, topics, NOW, [5, 6]) == rec.encode_messages(news, topics, NOW)
