"""The record codec: round trip and corruption detection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qclient.server.store import record as rec

_text = st.text(max_size=40)
_i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from([rec.KIND_MESSAGE, rec.KIND_CANCEL, rec.KIND_FIRED]),
    msg_id=_text,
    topic=_text,
    body=st.binary(max_size=300),
    flag=_i32,
    queue_id=_i32,
    received=_i64,
    deliver=_i64,
    fired=_i64,
    qoff=_i64,
    ref=_i64,
    key=st.none() | _text,
    tags=st.none() | _text,
    props=st.none() | st.dictionaries(_text, _text, max_size=5),
)
def test_round_trip(
    kind, msg_id, topic, body, flag, queue_id, received, deliver, fired, qoff, ref, key, tags, props
) -> None:
    data = rec.encode(
        kind,
        msg_id,
        topic,
        body,
        flag=flag,
        queue_id=queue_id,
        received_ms=received,
        deliver_at_ms=deliver,
        fired_at_ms=fired,
        qoffset=qoff,
        ref=ref,
        key=key,
        tags=tags,
        properties=props,
    )
    r, n = rec.decode(b"junk" + data, 4)
    assert n == len(data)
    assert r == rec.Record(
        kind,
        flag,
        queue_id,
        received,
        deliver,
        fired,
        qoff,
        ref,
        msg_id,
        topic,
        key,
        tags,
        props,
        body,
    )


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64), where=st.integers(min_value=0), delta=st.integers(1, 255))
def test_any_single_byte_change_is_detected(body: bytes, where: int, delta: int) -> None:
    data = bytearray(rec.encode(rec.KIND_MESSAGE, "id", "topic", body, key="k"))
    i = where % len(data)
    data[i] = (data[i] + delta) % 256
    with pytest.raises(rec.CorruptRecord):
        rec.decode(bytes(data))


def test_truncated_record_is_detected() -> None:
    data = rec.encode(rec.KIND_MESSAGE, "id", "topic", b"body" * 10)
    for cut in (1, 5, rec.HEADER_SIZE, len(data) - 1):
        with pytest.raises(rec.CorruptRecord):
            rec.decode(data[:cut])


def test_oversized_string_is_refused() -> None:
    with pytest.raises(ValueError):
        rec.encode(rec.KIND_MESSAGE, "id", "t", b"", key="k" * 70000)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=20),
            st.sampled_from(["t", "orders", "a-b"]),
            st.binary(max_size=64),
            st.integers(0, 3),
            st.integers(0, 65535),
            st.integers(0, 2**62),
            st.integers(0, 2**40),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_encode_messages_is_byte_identical_to_encode(rows: list[tuple]) -> None:
    from qclient.server.store import NewMessage

    msgs = [
        NewMessage(topic, q, mid, body, at, flag=flag, received_ms=recv)
        for mid, topic, body, flag, q, at, recv in rows
    ]
    topics = {m.topic: m.topic.encode() for m in msgs}
    now = 1_700_000_000_000
    assert rec.encode_messages(msgs, topics, now) == [
        rec.encode(
            rec.KIND_MESSAGE,
            m.msg_id,
            m.topic,
            m.body,
            flag=m.flag,
            queue_id=m.queue_id,
            received_ms=m.received_ms or now,
            deliver_at_ms=m.deliver_at_ms,
        )
        for m in msgs
    ]
    # a message with a key is not for this fast loop
    keyed = [*msgs, NewMessage("t", 0, "k", b"", 0, key="k")]
    assert rec.encode_messages(keyed, {**topics, "t": b"t"}, now) is None


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(rec.SCHEDULING_KINDS),
    msg_id=_text,
    topic=_text,
    body=st.binary(max_size=300),
    queue_id=_i32,
    deliver=_i64,
    fired=_i64,
    qoff=_i64,
    ref=_i64,
    key=st.none() | _text,
    props=st.none() | st.dictionaries(_text, _text, max_size=3),
    flip=st.integers(min_value=0),
)
def test_the_firing_fast_paths_agree_with_encode_and_decode(
    kind, msg_id, topic, body, queue_id, deliver, fired, qoff, ref, key, props, flip
) -> None:
    """verify_route reads what decode reads; to_fired's copy is what encode makes of the
    same fields with kind FIRED; a flipped byte anywhere is refused."""
    fields = {"queue_id": queue_id, "deliver_at_ms": deliver, "key": key, "properties": props}
    data = rec.encode(kind, msg_id, topic, body, received_ms=7, **fields)
    assert rec.verify_route(data) == (kind, queue_id, deliver, topic.encode())
    copy = rec.to_fired(data, fired, qoff, ref)
    assert copy == rec.encode(
        rec.KIND_FIRED,
        msg_id,
        topic,
        body,
        received_ms=7,
        fired_at_ms=fired,
        qoffset=qoff,
        ref=ref,
        **fields,
    )
    bad = bytearray(data)
    bad[flip % len(bad)] ^= 0x01
    with pytest.raises(rec.CorruptRecord):
        rec.verify_route(bytes(bad))
