"""The send templates (``sending.single_request``) against the exact path
(``sending.single_request_exact``: ``send_header`` + ``encode_properties`` + ``encode``):
the same frame, byte for byte, for any message, and the same command once decoded."""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st

from qclient.engines.rocketmq import sending
from qclient.engines.rocketmq.remoting import (
    FrameDecoder,
    RemotingCommand,
    SplicedCommand,
    encode,
)
from qclient.protocol.wire import FLAG_COMPRESSED, WireMessage

_SENTINELS = [str(n) for n in range(1987654321, 1987654326)]
_text = st.text(max_size=12) | st.sampled_from(["one-call", "%RETRY%g", "\x00P\x00", *_SENTINELS])
_ids = (
    st.text(alphabet="0123456789abcdefABCDEF", min_size=1, max_size=40)
    | st.text(max_size=20)
    | st.text(alphabet="abc", min_size=129, max_size=140)
    | st.sampled_from(["", "a\x01b", 'q"\\', "é", "\x00U\x00"])
)
_props = st.none() | st.dictionaries(
    st.text(min_size=1, max_size=6), st.text(max_size=6), max_size=3
)


@st.composite
def _wires(draw: st.DrawFn) -> WireMessage:
    """Half of them plain (no key, tags or properties): what the spliced properties take."""
    plain = draw(st.booleans())
    return WireMessage(
        topic=draw(_text),
        queue_id=draw(st.integers(-5, 2**31 - 1)),
        msg_id=draw(_ids),
        body=draw(st.binary(max_size=40)),
        key=None if plain else draw(st.none() | st.text(max_size=6)),
        tags=None if plain else draw(st.none() | st.text(max_size=6)),
        properties=None if plain else draw(_props),
        flag=draw(st.sampled_from([0, FLAG_COMPRESSED])),
    )


def _both(
    w: WireMessage, broker: str, deliver: int | None, now: int
) -> tuple[RemotingCommand | ValueError, RemotingCommand | ValueError]:
    out: list[RemotingCommand | ValueError] = []
    for build in (sending.single_request, sending.single_request_exact):
        try:
            out.append(build(w, broker, deliver, now))
        except ValueError as exc:
            out.append(exc)
    return out[0], out[1]


@settings(max_examples=400, deadline=None)
@given(
    w=_wires(),
    broker=_text,
    deliver=st.none() | st.integers(0, 2**62),
    now=st.integers(0, 2**62),
    opaque=st.integers(0, 2**31 - 1),
    flag=st.integers(0, 3),
)
def test_template_frames_are_the_exact_frames(
    w: WireMessage, broker: str, deliver: int | None, now: int, opaque: int, flag: int
) -> None:
    fast, exact = _both(w, broker, deliver, now)
    if isinstance(exact, ValueError):  # an id or property the format refuses
        assert isinstance(fast, ValueError)
        return
    assert isinstance(fast, RemotingCommand)
    fast.opaque = exact.opaque = opaque
    fast.flag = exact.flag = flag
    frame = encode(exact)
    assert encode(fast) == frame
    (decoded,) = FrameDecoder().feed(encode(fast))
    assert decoded == FrameDecoder().feed(frame)[0]
    if isinstance(fast, SplicedCommand):
        assert fast.fields() == exact.ext_fields


def test_our_ids_take_the_template_and_splice_their_properties() -> None:
    w = WireMessage("orders", 3, "0123456789abcdef0123456789abcdef0000", b"x", delay_ms=5000)
    cmd = sending.single_request(w, "broker-a", 1_700_000_005_000, 1_700_000_000_000)
    assert isinstance(cmd, SplicedCommand)
    assert cmd.fields()["i"] == (
        "UNIQ_KEY\x010123456789abcdef0123456789abcdef0000\x02WAIT\x01true\x02"
        "TIMER_DELIVER_MS\x011700000005000\x02"
    )
    assert cmd.fields()["e"] == "3" and cmd.fields()["g"] == "1700000000000"


def test_a_name_holding_a_sentinel_gets_no_template() -> None:
    assert sending.send_template("t1987654323", "broker-a", 0) is None
    assert sending.send_template("t", "broker-a", 0) is not None
    w = WireMessage("t1987654323", 1, "abc", b"x")
    cmd = sending.single_request(w, "broker-a", None, 5)
    assert type(cmd) is RemotingCommand  # the exact path


def test_spliced_commands_compare_by_their_bytes() -> None:
    w = WireMessage("t", 1, "abc", b"x")
    a = sending.single_request(w, "b", None, 5)
    b = sending.single_request(w, "b", None, 5)
    c = sending.single_request(w, "b", None, 6)
    assert a == b and a != c
    assert "abc" in repr(a)


def test_commands_are_not_tracked_by_the_collector() -> None:
    """Requests and answers hold only numbers, strings, bytes and a dict of strings: never
    part of a cycle, so the hundreds a pipelined connection keeps in flight cost no
    collections."""
    w = WireMessage("t", 1, "abc", b"x")
    spliced = sending.single_request(w, "b", 9_000, 5)
    exact = sending.single_request_exact(w, "b", 9_000, 5)
    answer = FrameDecoder().feed(encode(RemotingCommand(0, 7, 1, None, {"msgId": "m"})))[0]
    assert type(spliced) is SplicedCommand and type(exact) is RemotingCommand
    assert not any(gc.is_tracked(c) for c in (spliced, exact, answer))
