"""Validation before the network, message ids, config."""

from __future__ import annotations

import os
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qclient._config import ProducerConfig
from qclient._ids import new_msg_id
from qclient._validation import seconds_to_ms, to_wire
from qclient.errors import InvalidMessageError, MessageTooLargeError
from qclient.protocol.wire import FLAG_COMPRESSED
from qclient.transport import Credentials

CFG = ProducerConfig.create("127.0.0.1:1", max_message_size=1000, compress_threshold=100)


@settings(max_examples=500)
@given(st.integers(0, 40 * 86_400_000), st.integers(2, 999))
def test_seconds_to_ms_rounds_up_and_keeps_whole_ms(ms: int, micros: int) -> None:
    """Whole ms written as seconds stay those ms; over a µs more is a ms more."""
    assert seconds_to_ms(ms / 1000) == ms
    assert seconds_to_ms((ms * 1000 + micros) / 1e6) == ms + 1


@pytest.mark.parametrize("topic", ["", "a b", "a/b", "x" * 128, "é", None, "orders\n"])
def test_bad_topics(topic: object) -> None:
    with pytest.raises(InvalidMessageError):
        to_wire(CFG, topic, b"x")  # type: ignore[arg-type]


@pytest.mark.parametrize("topic", ["a", "A-b_c%d|e", "x" * 127])
def test_good_topics(topic: str) -> None:
    assert to_wire(CFG, topic, b"x").topic == topic


def test_body_too_large_and_str_body() -> None:
    with pytest.raises(MessageTooLargeError):
        to_wire(CFG, "t", b"x" * 1001)
    assert to_wire(CFG, "t", "héllo").body == "héllo".encode()
    with pytest.raises(InvalidMessageError):
        to_wire(CFG, "t", 12)  # type: ignore[arg-type]


def test_delays() -> None:
    assert to_wire(CFG, "t", b"", delay=1.5).delay_ms == 1500
    # rounded up to whole ms (never due early), but not a float's own error: 1.1 s is 1100
    assert to_wire(CFG, "t", b"", delay=0.0011).delay_ms == 2
    assert to_wire(CFG, "t", b"", delay=1.1).delay_ms == 1100
    assert to_wire(CFG, "t", b"", delay=timedelta(microseconds=1)).delay_ms == 1
    assert to_wire(CFG, "t", b"", delay=timedelta(minutes=1)).delay_ms == 60000
    w = to_wire(CFG, "t", b"")
    assert w.delay_ms is None and w.deliver_at_ms is None
    for bad in (-1, -0.001, timedelta(seconds=-1), float("nan"), True, "5s"):
        with pytest.raises(InvalidMessageError):
            to_wire(CFG, "t", b"", delay=bad)
    with pytest.raises(InvalidMessageError, match="maximum delay"):
        to_wire(CFG, "t", b"", delay=timedelta(days=40, seconds=1))
    assert to_wire(CFG, "t", b"", delay=timedelta(days=40)).delay_ms == 40 * 86400 * 1000


def test_deliver_at() -> None:
    at = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=123_400)
    at_ms = int(at.timestamp()) * 1000 + 124  # rounded up: never due before the time asked
    assert to_wire(CFG, "t", b"", deliver_at=at).deliver_at_ms == at_ms
    assert to_wire(CFG, "t", b"", deliver_at=at.timestamp()).deliver_at_ms == at_ms
    assert to_wire(CFG, "t", b"", deliver_at=at.replace(microsecond=0)).deliver_at_ms == (
        at_ms - 124
    )
    just_after = at.replace(microsecond=1)  # a datetime's whole µs round up exactly
    assert to_wire(CFG, "t", b"", deliver_at=just_after).deliver_at_ms == at_ms - 123
    with pytest.raises(InvalidMessageError, match="aware"):
        to_wire(CFG, "t", b"", deliver_at=datetime.now())
    with pytest.raises(InvalidMessageError, match="maximum delay"):
        to_wire(CFG, "t", b"", deliver_at=at + timedelta(days=40))
    with pytest.raises(InvalidMessageError, match="at most one"):
        to_wire(CFG, "t", b"", delay=1, deliver_at=at)
    small = ProducerConfig.create("h:1", max_delay=60)
    with pytest.raises(InvalidMessageError):
        to_wire(small, "t", b"", delay=61)


def test_compression_flag_and_roundtrip() -> None:
    body = b"abc" * 200
    w = to_wire(CFG, "t", body)
    assert w.flag & FLAG_COMPRESSED and zlib.decompress(w.body) == body
    random_body = os.urandom(500)  # incompressible: sent as is
    w = to_wire(CFG, "t", random_body)
    assert w.flag == 0 and w.body == random_body
    assert to_wire(CFG, "t", b"a" * 100).flag == 0  # at the threshold: not compressed


def test_properties_key_tags_msg_id() -> None:
    w = to_wire(CFG, "t", b"", key="k", tags="a||b", properties={"x": "1"}, msg_id="id-1")
    assert (w.key, w.tags, w.properties, w.msg_id) == ("k", "a||b", {"x": "1"}, "id-1")
    for kw in ({"properties": {"x": 1}}, {"key": 3}, {"tags": 1}, {"msg_id": ""}):
        with pytest.raises(InvalidMessageError):
            to_wire(CFG, "t", b"", **kw)  # type: ignore[arg-type]


def test_ids_unique_in_process_and_across_fork() -> None:
    ids = {new_msg_id() for _ in range(100_000)}
    assert len(ids) == 100_000
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report a few ids and leave without running pytest's teardown
        os.write(w, ",".join(new_msg_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(w)
    child = set(os.read(r, 1 << 16).decode().split(","))
    os.close(r)
    os.waitpid(pid, 0)
    mine = {new_msg_id() for _ in range(100)}
    assert len(child) == 100 and not child & mine
    assert {i[:16] for i in child} != {i[:16] for i in mine}


def test_secrets_never_in_reprs() -> None:
    cfg = ProducerConfig.create("h:1", access_key="app1", secret_key="s3cr3t-value")
    assert "s3cr3t" not in repr(cfg)
    assert "s3cr3t" not in repr(Credentials("app1", "s3cr3t-value"))
    with pytest.raises(ValueError):
        ProducerConfig.create("h:1", access_key="app1")
    with pytest.raises(TypeError):
        ProducerConfig.create("h:1", no_such_option=1)
    assert ProducerConfig.create(["a:1", "b:2,c:3"]).namesrv == ("a:1", "b:2", "c:3")


@pytest.mark.parametrize(
    "fields",
    [
        {"msg_id": "has space"},
        {"msg_id": "x" * 129},
        {"msg_id": "é"},
        {"msg_id": "id\n"},  # "$" would let a trailing newline through
        {"key": "k" * 1025},
        {"tags": "t" * 257},
        {"properties": {f"p{i}": "v" for i in range(65)}},
        {"properties": {"k" * 257: "v"}},
        {"properties": {"k": "v" * 4097}},
    ],
)
def test_the_brokers_limits_are_checked_before_the_network(fields: dict[str, Any]) -> None:
    """The broker refuses these with a 400; the SDK refuses them first (same limits)."""
    from qclient import Message
    from qclient._validation import WireBuilder

    with pytest.raises(InvalidMessageError):
        to_wire(CFG, "t", b"x", **fields)
    with pytest.raises(InvalidMessageError):  # the fast path falls through to the same checks
        WireBuilder(CFG).message(Message("t", b"x", **fields))


def test_limits_at_the_edge_pass() -> None:
    w = to_wire(CFG, "t", b"x", key="k" * 1024, tags="t" * 256, msg_id="~" * 128)
    assert (len(w.key or ""), len(w.tags or ""), len(w.msg_id)) == (1024, 256, 128)
