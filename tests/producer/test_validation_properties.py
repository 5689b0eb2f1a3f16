"""The SDK's validation fast paths agree with the general path built on the protocol's
row checker: the same wire message, or the same error (type and line)."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qclient._config import ProducerConfig
from qclient._models import Message, MessageBatch
from qclient._validation import WireBuilder, message_to_wire
from qclient.errors import InvalidMessageError

MAX_SIZE = 64
CFG = ProducerConfig.create(
    "127.0.0.1:1", max_delay=timedelta(days=1), max_message_size=MAX_SIZE, compress_threshold=0
)
DAY_S = 86_400
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# values near every limit, on both sides (deliver times far from the clock's edge)
_topics = st.sampled_from(["t", "a" * 127, "a" * 128, "", "a/b", "t\n"])
_ids = st.sampled_from(["m1", "x" * 128, "x" * 129, "", "a b", "ü"])
_bodies = st.sampled_from([b"", b"x", "text", b"x" * MAX_SIZE, b"x" * (MAX_SIZE + 1), 5])
_keys = st.sampled_from([None, "", "k", "k" * 1024, "k" * 1025, 3])
_tags = st.sampled_from([None, "a||b", "t" * 256, "t" * 257])
_props = st.sampled_from([None, {}, {"a": "1"}, {"k" * 257: "v"}])
_delays = st.sampled_from([None, 0, 1.5, 60, 2 * DAY_S, -1, float("nan"), timedelta(hours=1)])
_ats = st.sampled_from([None, 0, 3 * DAY_S * 1000, "soon", "far", -5])


#: the clock both paths read while compared: each reads it at its own instant, and an error
#: names the seconds ahead ("deliver_at is 172800s ahead"), which a stall can move by one
_NOW_NS = time.time_ns()
_frozen_clock = mock.patch("qclient._validation.time", SimpleNamespace(time_ns=lambda: _NOW_NS))


def _at(v: Any) -> Any:
    now = _NOW_NS / 1e9
    return {"soon": now + 3600, "far": now + 2 * DAY_S}.get(v, v) if isinstance(v, str) else v


def _outcome(build: Any) -> Any:
    try:
        w = build()
    except InvalidMessageError as exc:  # MessageTooLargeError included
        return type(exc), str(exc)
    return (w.topic, w.msg_id, w.body, w.key, w.tags, w.properties, w.delay_ms, w.flag)


@SETTINGS
@given(_topics, _bodies, _keys, _tags, _props, _delays, _ats, _ids)
def test_wire_builder_message_agrees_with_the_checked_path(
    topic: str, body: Any, key: Any, tags: Any, props: Any, delay: Any, at: Any, mid: str
) -> None:
    m = Message(topic, body, key=key, tags=tags, properties=props, msg_id=mid)
    m.delay, m.deliver_at = delay, _at(at)  # (around the constructor's own checks)
    with _frozen_clock:
        assert _outcome(lambda: WireBuilder(CFG).message(m)) == _outcome(
            lambda: message_to_wire(CFG, m)
        )


_col_delays = st.sampled_from([None, [0, 5], [None, 5], [-1, 0], [0, 2 * DAY_S * 1000]])
_col_bodies = st.sampled_from([[b"a", b"b"], ["a", b"b"], [b"a", b"x" * (MAX_SIZE + 1)]])
_col_ids = st.sampled_from([["a", "b"], ["a", "a b"], ["x" * 129, "b"], ["a", ""]])
_col_keys = st.sampled_from([None, ["k", None], ["k" * 1025, None]])


@SETTINGS
@given(_topics, _col_bodies, _col_ids, _col_delays, _col_keys)
def test_batch_columns_fast_path_agrees_with_row_by_row(
    topic: str, bodies: list[Any], ids: list[str], delays: Any, keys: Any
) -> None:
    batch = MessageBatch(topic, bodies, msg_ids=ids, delay_ms=delays, keys=keys)
    builder = WireBuilder(CFG)
    now_ms = time.time_ns() // 1_000_000
    fast = builder._fast_columns(batch, len(batch), now_ms)
    rows: Any
    try:
        rows = [builder._row(batch, i, now_ms) for i in range(len(batch))]
    except InvalidMessageError:
        rows = None
    if fast is not None:  # whatever the fast path builds, every row passes alike
        assert rows == fast
