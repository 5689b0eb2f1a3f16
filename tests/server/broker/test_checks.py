"""The broker's message checks: the bulk fast path agrees with the row checker."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qclient.protocol import limits
from qclient.protocol.limits import Rule, check_row
from qclient.protocol.wire import ErrorCode, WireMessage
from qclient.server._http import ApiError
from qclient.server.broker.checks import MessageChecks

NOW = 1_700_000_000_000
MAX_DELAY = 86_400_000
MAX_SIZE = 64
CHECKS = MessageChecks(MAX_SIZE, MAX_DELAY)

# values near every limit, on both sides
_topics = st.sampled_from(["t", "orders", "a" * 127, "a" * 128, "", "a/b", "t\n", "é"])
_ids = st.one_of(
    st.sampled_from(["m", "x" * 128, "x" * 129, "", "a b", "a\nb", "ü", "\x7f"]),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1),
)
_bodies = st.sampled_from([b"", b"x", b"x" * MAX_SIZE, b"x" * (MAX_SIZE + 1)])
_queues = st.sampled_from([0, 3, 255, 256, -1])
_keys = st.sampled_from([None, "", "k", "k" * 1024, "k" * 1025])
_tags = st.sampled_from([None, "", "a||b", "t" * 256, "t" * 257])
_props = st.sampled_from([None, {}, {"a": "1"}, {"k" * 257: "v"}, {str(i): "" for i in range(65)}])
_flags = st.sampled_from([0, 1, 2, 3])
_delays = st.sampled_from([None, 0, 5, MAX_DELAY, MAX_DELAY + 1, -1])
_ats = st.sampled_from([None, 0, NOW, NOW + MAX_DELAY, NOW + MAX_DELAY + 1, -1])

_messages = st.builds(
    WireMessage,
    topic=_topics,
    queue_id=_queues,
    msg_id=_ids,
    body=_bodies,
    key=_keys,
    tags=_tags,
    properties=_props,
    delay_ms=_delays,
    deliver_at_ms=_ats,
    flag=_flags,
)


def _one_by_one(msgs: list[WireMessage]) -> list[int] | tuple[int, str, str]:
    try:
        return [CHECKS.message(i, m, NOW) for i, m in enumerate(msgs)]
    except ApiError as exc:
        return exc.status, exc.code, exc.message


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_messages, min_size=1, max_size=6))
def test_batch_fast_path_agrees_with_the_row_checker(msgs: list[WireMessage]) -> None:
    """Whatever the fast path accepts, every row passes, with the same deliver times."""
    topics = dict.fromkeys(m.topic for m in msgs)
    fast = CHECKS.batch(msgs, NOW, topics, max(m.queue_id for m in msgs))
    slow = _one_by_one(msgs)
    if fast is not None:
        assert fast == slow
    rules = [
        check_row(
            m.topic, m.msg_id, len(m.body), m.queue_id, m.key, m.tags, m.properties, m.flag,
            m.delay_ms, m.deliver_at_ms, NOW, max_delay_ms=MAX_DELAY, max_size=MAX_SIZE,
        )
        for m in msgs
    ]  # fmt: skip
    assert isinstance(slow, list) == all(r is None for r in rules)


def test_a_plain_batch_takes_the_fast_path() -> None:
    msgs = [WireMessage("t", i % 4, f"m{i}", b"x", delay_ms=i) for i in range(10)]
    assert CHECKS.batch(msgs, NOW, {"t"}, 3) == [NOW + i for i in range(10)]


@pytest.mark.parametrize(
    ("m", "status", "code", "message"),
    [
        (
            WireMessage("a/b", 0, "m", b""),
            400,
            ErrorCode.INVALID_TOPIC,
            "messages[0].topic 'a/b' must match",
        ),
        (
            WireMessage("t", 0, "a b", b""),
            400,
            ErrorCode.INVALID_MESSAGE,
            "messages[0].msg_id must be 1-128 printable",
        ),
        (
            WireMessage("t", 0, "m", b"x" * 65),
            413,
            ErrorCode.MESSAGE_TOO_LARGE,
            "messages[0].body is 65 bytes, the limit is 64",
        ),
        (
            WireMessage("t", 256, "m", b""),
            400,
            ErrorCode.INVALID_MESSAGE,
            "messages[0].queue_id out of range",
        ),
        (
            WireMessage("t", 0, "m", b"", flag=2),
            400,
            ErrorCode.INVALID_MESSAGE,
            "messages[0].flag has unknown bits",
        ),
        (
            WireMessage("t", 0, "m", b"", delay_ms=1, deliver_at_ms=1),
            400,
            ErrorCode.INVALID_DELAY,
            "messages[0]: give delay_ms or deliver_at_ms, not both",
        ),
        (
            WireMessage("t", 0, "m", b"", key="k" * 1025),
            400,
            ErrorCode.INVALID_MESSAGE,
            "messages[0].key longer than 1024 characters",
        ),
        (
            WireMessage("t", 0, "m", b"", tags="t" * 257),
            400,
            ErrorCode.INVALID_MESSAGE,
            "messages[0].tags longer than 256 characters",
        ),
        (
            WireMessage("t", 0, "m", b"", properties={str(i): "" for i in range(65)}),
            400,
            ErrorCode.INVALID_MESSAGE,
            "messages[0].properties has more than 64 entries",
        ),
        (
            WireMessage("t", 0, "m", b"", properties={"k" * 257: ""}),
            400,
            ErrorCode.INVALID_MESSAGE,
            "messages[0].properties entry too long",
        ),
        (
            WireMessage("t", 0, "m", b"", deliver_at_ms=-1),
            400,
            ErrorCode.INVALID_DELAY,
            "messages[0].deliver_at_ms is more than 86400000 ms ahead (the broker's maximum "
            "delay) or negative",
        ),
        (
            WireMessage("t", 0, "m", b"", delay_ms=-1),
            400,
            ErrorCode.INVALID_DELAY,
            "messages[0].delay_ms must be 0..86400000, got -1",
        ),
    ],
)
def test_each_rule_has_its_status_code_and_line(
    m: WireMessage, status: int, code: str, message: str
) -> None:
    with pytest.raises(ApiError) as info:
        CHECKS.message(0, m, NOW)
    assert (info.value.status, info.value.code) == (status, code)
    assert info.value.message.startswith(message)


def test_check_row_order_and_limits_are_the_table() -> None:
    assert check_row("t", "m", 0, 0, None, None, None, 0, None, None, NOW) is None
    # the first broken rule is named, in the documented order
    assert check_row("a/b", "", 10**9, -1, None, None, None, 0, None, None, NOW) == Rule.TOPIC
    long_id = "x" * (limits.MAX_MSG_ID_CHARS + 1)
    assert check_row("t", long_id, 0, 0, None, None, None, 0, None, None, NOW) == Rule.MSG_ID
    far = NOW + limits.MAX_DELAY_MS + 1
    assert check_row("t", "m", 0, 0, None, None, None, 0, None, far, NOW) == Rule.DELIVER_AT
