"""``POST /v1/send`` answered by the broker's direct handler (no Request, task or
middleware) gives exactly the answers, counters and request metrics of the routed
handler, for good requests and for every kind of refusal."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from tests.server.test_http import Served, _read_response, _request

from qclient.protocol import wire
from qclient.server.broker.app import Broker, create_app
from qclient.server.broker.config import BrokerConfig

AT = int(time.time() * 1000) + 3_600_000  # a fixed deliver time: answers repeat exactly


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Broker]]:
    app, broker = create_app(
        BrokerConfig(name="b", data_dir=str(tmp_path), namesrv=[], min_free_bytes=0)
    )
    s = Served(app)
    asyncio.run_coroutine_threadsafe(broker.start(), s.loop).result(30)
    try:
        yield s, broker
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), s.loop).result(30)
        s.stop()


def _msg(msg_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "topic": "t",
        "queue_id": 0,
        "msg_id": msg_id,
        "body": b"x",
        "deliver_at_ms": AT,
    } | fields


def _requests(tag: str) -> list[tuple[str, bytes]]:
    """(content type, body) of good and refused sends; ``tag`` makes the ids new."""
    mp = msgspec.msgpack.encode
    one = mp({"messages": [_msg(f"{tag}-a")]})
    return [
        (wire.MSGPACK, one),
        (wire.MSGPACK, one),  # a duplicate: the original's answer
        (wire.JSON, json.dumps({"messages": [_msg(f"{tag}-j", body="eA==")]}).encode()),
        (wire.MSGPACK, mp({"messages": [_msg(f"{tag}-{i}", queue_id=i * 3) for i in range(3)]})),
        (wire.MSGPACK, mp({"messages": [_msg(f"{tag}-q", queue_id=99)]})),  # not writable
        (wire.MSGPACK, mp({"messages": [_msg(f"{tag}-u", topic="other")]})),  # auto-created
        ("text/plain", one),  # 415
        (wire.MSGPACK, b""),  # 400 empty
        (wire.MSGPACK, b"\xc1garbage"),  # 400 malformed
        (wire.MSGPACK, mp({"messages": []})),  # 400 empty list
        (wire.MSGPACK, mp({"messages": [_msg(f"{tag} b")]})),  # 400 bad id
        (wire.MSGPACK, mp({"messages": [_msg(f"{tag}-t", topic="a/b")]})),  # 400 bad topic
        (wire.MSGPACK, mp({"messages": [_msg(f"{tag}-d", delay_ms=5)]})),  # both delays
        (wire.MSGPACK, mp({"messages": [_msg(f"{tag}-x")], "deadline_ms": 1})),  # 504
    ]


def _round(served: Served, broker: Broker, tag: str) -> tuple[list[Any], dict[Any, int], Any]:
    series = broker.request_metrics._durations._series  # type: ignore[union-attr]
    before = {k: h.snapshot()[0][-1] for k, h in series.items()}
    counters = dict(broker.counters)
    answers = []
    with served.connect() as sock, sock.makefile("rb") as f:
        for ct, body in _requests(tag):
            sock.sendall(_request("POST", wire.BROKER_SEND, body, f"Content-Type: {ct}\r\n"))
            status, headers, data = _read_response(f)
            data = re.sub(rb"passed \d+ ms", b"passed N ms", data.replace(tag.encode(), b"#"))
            answers.append((status, headers["content-type"], data))
    counted = {k: h.snapshot()[0][-1] - before.get(k, 0) for k, h in series.items()}
    moved = {k: v - counters.get(k, 0) for k, v in broker.counters.items()}
    return answers, {k: v for k, v in counted.items() if v}, moved


def test_direct_and_routed_sends_answer_alike(served: tuple[Served, Broker]) -> None:
    s, broker = served
    assert (b"POST", wire.BROKER_SEND.encode()) in s.app.direct
    direct = _round(s, broker, "r1")
    routes = dict(s.app.direct)
    s.app.direct.clear()  # every request takes the routed handler and its middlewares
    try:
        routed = _round(s, broker, "r2")
    finally:
        s.app.direct.update(routes)
    assert direct == routed
    statuses = [a[0] for a in direct[0]]
    assert statuses == [200] * 6 + [415, 400, 400, 400, 400, 400, 400, 504]
    assert direct[1][(wire.BROKER_SEND, "POST", 200)] == 6
    assert direct[2]["stored"] == 5 and direct[2]["duplicates"] == 1
