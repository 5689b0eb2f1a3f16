"""The consumer's cheap ReceivedMessage construction gives what the constructor gives."""

from __future__ import annotations

import dataclasses
import zlib

import pytest

from qclient import ReceivedMessage
from qclient.consumer._received import build, from_pulled
from qclient.protocol import wire


def test_build_equals_the_constructor_and_stays_frozen() -> None:
    values = ("id-1", "t", b"body", "k", "tag", {"a": "b"}, 10, 12, "broker-a", 3, 42)
    fast, slow = build(*values), ReceivedMessage(*values)
    assert fast == slow
    assert repr(fast) == repr(slow)
    assert fast.extra == {} and fast.extra is not build(*values).extra
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.msg_id = "x"  # type: ignore[misc]
    with pytest.raises(ValueError):
        build(*values[:-1])  # every field without a default is required


def test_from_pulled_decompresses_and_copies_properties() -> None:
    props = {"traceparent": "00-abc"}
    m = wire.PulledMessage(
        msg_id="m",
        topic="t",
        body=zlib.compress(b"x" * 1000),
        queue_id=2,
        offset=7,
        deliver_at_ms=5,
        fired_at_ms=6,
        properties=props,
        flag=wire.FLAG_COMPRESSED,
    )
    r = from_pulled(m, "broker-b")
    assert r == ReceivedMessage("m", "t", b"x" * 1000, None, None, props, 5, 6, "broker-b", 2, 7)
    assert r.properties is not props
