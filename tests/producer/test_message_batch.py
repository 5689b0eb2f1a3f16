"""``MessageBatch``: the columnar batch gives the same wire messages and the same errors
as the same rows sent as ``Message`` objects; ``SendResult`` stays an immutable value."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qclient import MessageBatch, SendResult, SendStatus
from qclient._config import ProducerConfig
from qclient._validation import WireBuilder, message_to_wire
from qclient.errors import InvalidMessageError, MessageTooLargeError
from qclient.protocol.wire import FLAG_COMPRESSED

CFG = ProducerConfig.create("127.0.0.1:9876")
DAY_MS = 86_400_000


def test_fast_columns_equal_the_message_path() -> None:
    n = 500
    batch = MessageBatch(
        "orders",
        [f"body-{i}".encode() for i in range(n)],
        msg_ids=[f"job-1-{i}" for i in range(n)],
        delay_ms=[None if i % 5 == 0 else i * 1000 for i in range(n)],
        keys=[f"k{i}" if i % 2 else None for i in range(n)],
        tags=[None] * n,
    )
    wires = WireBuilder(CFG).columns(batch)
    expected = [message_to_wire(CFG, m) for m in batch]
    assert wires == expected
    assert [w.delay_ms for w in wires[:3]] == [None, 1000, 2000]


def test_per_message_topics_and_str_bodies() -> None:
    batch = MessageBatch(["a", "b", "a"], ["x", b"y", "zé"], delay_ms=[1, 2, 3])
    wires = WireBuilder(CFG).columns(batch)
    assert [w.topic for w in wires] == ["a", "b", "a"]
    assert [w.body for w in wires] == [b"x", b"y", "zé".encode()]
    assert len({w.msg_id for w in wires}) == 3  # made by the producer


def test_deliver_at_ms_kept_as_given() -> None:
    now = time.time_ns() // 1_000_000
    batch = MessageBatch("t", [b"a", b"b"], deliver_at_ms=[now + 5000, None])
    wires = WireBuilder(CFG).columns(batch)
    assert [(w.delay_ms, w.deliver_at_ms) for w in wires] == [(None, now + 5000), (None, None)]


def test_big_bodies_are_compressed_like_messages() -> None:
    big = b"abc" * 5000
    batch = MessageBatch("t", [b"small", big], msg_ids=["i1", "i2"])
    wires = WireBuilder(CFG).columns(batch)
    assert wires[1].flag == FLAG_COMPRESSED and len(wires[1].body) < len(big)
    assert wires == [message_to_wire(CFG, m) for m in batch]


def test_properties_go_row_by_row_and_match() -> None:
    batch = MessageBatch("t", [b"a", b"b"], properties=[{"p": "1"}, None], msg_ids=["a1", "a2"])
    wires = WireBuilder(CFG).columns(batch)
    assert wires[0].properties == {"p": "1"} and wires[1].properties is None


class _NumpyLikeInt:
    """An integral that is not ``int`` (numpy.int64, say): accepted via ``__index__``."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


def test_integral_non_int_delays_are_accepted() -> None:
    batch = MessageBatch("t", [b"a"], delay_ms=[_NumpyLikeInt(1500)], msg_ids=["x"])  # type: ignore[list-item]
    (wire,) = WireBuilder(CFG).columns(batch)
    assert wire.delay_ms == 1500


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"topic": "bad topic"}, InvalidMessageError, "message #0: invalid topic"),
        ({"topic": ["t", "t", "../x"]}, InvalidMessageError, "message #2: invalid topic"),
        ({"msg_ids": ["ok", "has space", "ok2"]}, InvalidMessageError, "message #1: msg_id"),
        ({"msg_ids": ["ok", "two\nlines", "ok2"]}, InvalidMessageError, "message #1: msg_id"),
        ({"msg_ids": ["ok", "", "ok2"]}, InvalidMessageError, "message #1: msg_id"),
        ({"msg_ids": ["ok", "x" * 129, "ok2"]}, InvalidMessageError, "message #1: msg_id"),
        ({"delay_ms": [0, -1, 5]}, InvalidMessageError, "message #1: delay_ms must be 0.."),
        ({"delay_ms": [0, 41 * DAY_MS, 5]}, InvalidMessageError, "message #1: delay_ms must"),
        ({"delay_ms": [0, True, 5]}, InvalidMessageError, "message #1: delay_ms must be an int"),
        ({"delay_ms": [0, 1.5, 5]}, InvalidMessageError, "message #1: delay_ms must be an int"),
        ({"deliver_at_ms": [None, -5, None]}, InvalidMessageError, "message #1: deliver_at_ms"),
        (
            {"deliver_at_ms": [None, None, 2**62]},
            InvalidMessageError,
            "message #2: deliver_at_ms",
        ),
        (
            {"delay_ms": [1, 2, 3], "deliver_at_ms": [None, 1, None]},
            InvalidMessageError,
            "message #1: give at most one",
        ),
        ({"keys": [None, "k" * 1025, None]}, InvalidMessageError, "message #1: key is longer"),
        ({"keys": [None, 5, None]}, InvalidMessageError, "message #1: key must be a str"),
        ({"tags": ["t" * 257, None, None]}, InvalidMessageError, "message #0: tags is longer"),
        ({"bodies": [b"a", None, b"c"]}, InvalidMessageError, "message #1: body must be"),
        ({"bodies": [b"a", b"b", b"x" * (5 << 20)]}, MessageTooLargeError, "message #2: body"),
        (
            {"properties": [None, {"k": 1}, None]},
            InvalidMessageError,
            "message #1: properties must be",
        ),
    ],
)
def test_bad_rows_fail_the_batch_naming_the_row(
    kwargs: dict[str, Any], error: type[Exception], needle: str
) -> None:
    args: dict[str, Any] = {"topic": "t", "bodies": [b"a", b"b", b"c"], **kwargs}
    batch = MessageBatch(args.pop("topic"), args.pop("bodies"), **args)
    with pytest.raises(error) as info:
        WireBuilder(CFG).columns(batch)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_columns_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(InvalidMessageError, match="msg_ids has 1 entries for 2 bodies"):
        MessageBatch("t", [b"a", b"b"], msg_ids=["x"])
    with pytest.raises(InvalidMessageError, match="topic has 3 entries"):
        MessageBatch(["t", "t", "t"], [b"a", b"b"])


def test_slicing_take_iteration_repr() -> None:
    batch = MessageBatch(
        ["a", "b", "c", "d"], [b"0", b"1", b"2", b"3"], msg_ids=["i0", "i1", "i2", "i3"]
    )
    assert len(batch) == 4 and len(batch[1:3]) == 2
    assert batch[1:3].bodies == [b"1", b"2"] and batch[1:3].topic == ["b", "c"]
    taken = batch.take([3, 0])
    assert taken.msg_ids == ["i3", "i0"] and taken.topic == ["d", "a"]
    assert [m.msg_id for m in batch] == ["i0", "i1", "i2", "i3"]
    assert batch.msg_id(2) == "i2" and MessageBatch("t", [b"x"]).msg_id(0) is None
    assert repr(batch) == "MessageBatch(topic='<per message>', 4 messages)"
    with pytest.raises(TypeError):
        batch[0]  # type: ignore[index]
    assert WireBuilder(CFG).columns(MessageBatch("t", [])) == []


# Any batch: the columns path and the Message path agree (same wire messages, or the
# same error for the same row).
def _mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` 19 times in 20: most batches are valid, some have one bad row."""
    return st.integers(0, 19).flatmap(lambda k: bad if k == 0 else good)


_printable = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
_ids = _mostly(
    st.one_of(st.none(), st.text(alphabet=_printable, min_size=1, max_size=6)),
    st.sampled_from(["", "a b", "x\ny", "z" * 129]),
)
_delay = _mostly(
    st.one_of(st.none(), st.integers(0, 40 * DAY_MS)),
    st.sampled_from([-1, 40 * DAY_MS + 1, True, 1.5]),
)
_key = _mostly(st.one_of(st.none(), st.text(max_size=3)), st.just("k" * 1025))
_topic = _mostly(st.sampled_from(["t", "u"]), st.just("b d"))


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.binary(max_size=8), _ids, _delay, _key, _topic),
        min_size=1,
        max_size=8,
    ),
    one_topic=st.booleans(),
)
def test_columns_agree_with_messages(rows: list[tuple[Any, ...]], one_topic: bool) -> None:
    bodies, ids, delays, keys, topics = (list(c) for c in zip(*rows, strict=True))
    batch = MessageBatch(
        "t" if one_topic else topics, bodies, msg_ids=ids, delay_ms=delays, keys=keys
    )
    builder = WireBuilder(CFG)
    try:
        got: Any = builder.columns(batch)
    except InvalidMessageError as exc:
        got = ("error", str(exc).split(":")[0])  # "message #i"
    expected: Any = []
    for i, m in enumerate(batch):
        d = delays[i]
        if d is not None and (type(d) is not int or not 0 <= d <= CFG.max_delay_ms):
            expected = ("error", f"message #{i}")  # the ms column's own check comes first
            break
        try:
            w = message_to_wire(CFG, m)
        except InvalidMessageError:
            expected = ("error", f"message #{i}")
            break
        if m.msg_id is None:
            w.msg_id = "*"
        expected.append(w)
    if isinstance(got, list):
        for w, i in zip(got, ids, strict=True):
            if i is None:
                w.msg_id = "*"  # made by the producer: unique, not comparable
    assert got == expected


def test_send_result_is_an_immutable_value() -> None:
    r = SendResult("id", SendStatus.SEND_OK, "broker-a", 3, 1_700_000_000_123, "t")
    assert r == SendResult("id", SendStatus.SEND_OK, "broker-a", 3, 1_700_000_000_123, "t")
    assert hash(r) == hash(
        SendResult("id", SendStatus.SEND_OK, "broker-a", 3, 1_700_000_000_123, "t")
    )
    assert r.deliver_at.timestamp() == pytest.approx(1_700_000_000.123)
    assert SendResult("id", SendStatus.SEND_OK, "b", 0, 0).topic == ""
    with pytest.raises(AttributeError):
        r.queue_id = 4  # type: ignore[misc]
    assert "broker-a" in repr(r) and r.status == "SEND_OK"
    import pickle

    assert pickle.loads(pickle.dumps(r)) == r  # e.g. across a process pool
