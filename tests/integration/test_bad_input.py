"""Issue 2 acceptance: bad input gets a 4xx with a one-line JSON error, never a 5xx,
never a crash, and nothing is stored."""

from __future__ import annotations

import base64
import os

import httpx
import msgspec
import pytest

from qclient import LocalCluster
from qclient.protocol import wire


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(brokers=1) as c:
        yield c


def _msg(**over):
    m = {"topic": "bad", "queue_id": 0, "msg_id": "m-1", "body": base64.b64encode(b"x").decode()}
    m.update(over)
    return m


CASES = [
    # (method, path, content-type, body, expected status)
    ("POST", "/v1/send", "application/json", b"{", 400),
    ("POST", "/v1/send", "application/json", b"", 400),
    ("POST", "/v1/send", "application/json", b"[]", 400),
    ("POST", "/v1/send", "application/json", b'{"messages": 5}', 400),
    ("POST", "/v1/send", "application/json", b'{"messages": []}', 400),
    ("POST", "/v1/send", "application/json", b'{"messages": [{"topic": 1}]}', 400),
    ("POST", "/v1/send", "application/json", b'{"messages": [], "extra": 1}', 400),
    ("POST", "/v1/send", "application/msgpack", b"\xc1\xc1", 400),
    ("POST", "/v1/send", "text/plain", b"hello", 415),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(topic="../../etc/passwd")]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(topic="a" * 128)]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(body="not base64!")]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(queue_id=-1)]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(delay_ms=-5)]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(delay_ms=10**15)]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(delay_ms=5, deliver_at_ms=5)]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(msg_id="")]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(msg_id="has space")]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(msg_id="trailing-newline\n")]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(topic="orders\n")]}),
        400,
    ),
    ("POST", "/v1/pull", "application/json", b'{"topic": "t\\n", "group": "g"}', 400),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(flag=128)]}),
        400,
    ),
    (
        "POST",
        "/v1/send",
        "application/json",
        msgspec.json.encode({"messages": [_msg(properties={"k": "v" * 5000})]}),
        400,
    ),
    (
        "POST",
        "/v1/cancel",
        "application/json",
        b'{"topic": "../x", "msg_id": "a", "deliver_at_ms": 1}',
        400,
    ),
    ("POST", "/v1/pull", "application/json", b'{"topic": "..", "group": "g"}', 400),
    ("POST", "/v1/lookup", "application/json", b'{"topic": "../x", "msg_id": "a"}', 400),
    ("POST", "/v1/lookup", "application/json", b'{"topic": "t", "msg_id": "has space"}', 400),
    ("POST", "/v1/lookup", "application/json", b'{"topic": "t"}', 400),
    ("POST", "/v1/reschedule", "application/json", b'{"topic": "t", "msg_id": "a"}', 400),
    (
        "POST",
        "/v1/reschedule",
        "application/json",
        b'{"topic": "t", "msg_id": "a", "delay_ms": 1, "deliver_at_ms": 1}',
        400,
    ),
    (
        "POST",
        "/v1/reschedule",
        "application/json",
        b'{"topic": "t", "msg_id": "a", "delay_ms": -1}',
        400,
    ),
    (
        "POST",
        "/v1/reschedule",
        "application/json",
        b'{"topic": "t", "msg_id": "a", "deliver_at_ms": 99999999999999}',
        400,
    ),
    (
        "POST",
        "/v1/cancel",
        "application/json",
        b'{"topic": "t", "msg_id": "a", "deliver_at_ms": -5}',
        400,
    ),
    # strings that are not UTF-8 (found by the fuzz test: a 500 before)
    ("POST", "/v1/pull", "application/json", b'{"topic": "\xff", "group": "g"}', 400),
    ("POST", "/v1/pull", "application/msgpack", b"\xde\x00\x01\xa1\x80\xc0", 400),
    ("POST", "/v1/send", "application/msgpack", b"\x81\xa8messages\x91\x81\xa5topic\xa1\xff", 400),
    ("POST", "/v1/pull", "application/json", b'{"topic": "bad", "group": "../g"}', 400),
    (
        "POST",
        "/v1/pull",
        "application/json",
        b'{"topic": "bad", "group": "g", "max_messages": 100000}',
        400,
    ),
    ("POST", "/v1/pull", "application/json", b'{"topic": "bad", "group": "g", "wait_ms": -1}', 400),
    ("POST", "/v1/topics", "application/json", b'{"topic": "a/b"}', 400),
    ("POST", "/v1/topics", "application/json", b'{"topic": "ok", "queues": 100000}', 400),
    ("POST", "/v1/topics", "application/json", b'{"topic": "ok", "perm": 99}', 400),
    ("GET", "/v1/nope", None, b"", 404),
    ("GET", "/../../etc/passwd", None, b"", 404),
    ("DELETE", "/v1/send", None, b"", 405),
    ("GET", "/v1/send", None, b"", 405),
]


def _stored(addr: str) -> int:
    stats = httpx.get(f"http://{addr}{wire.BROKER_STATS}").json()
    return int(stats["store"]["appended"])


@pytest.mark.parametrize(("method", "path", "ctype", "body", "status"), CASES)
def test_bad_request_is_refused_cleanly(cluster, method, path, ctype, body, status):
    addr = cluster.brokers[0].addr
    before = _stored(addr)
    headers = {"content-type": ctype} if ctype else {}
    resp = httpx.request(method, f"http://{addr}{path}", content=body, headers=headers)
    assert resp.status_code == status, resp.text
    err = wire.decode(
        resp.content, wire.ErrorResponse, resp.headers["content-type"].split(";")[0]
    ).error
    assert err.code and err.message
    assert "\n" not in err.message
    assert _stored(addr) == before
    assert cluster.brokers[0].running


def test_oversized_body_and_huge_batch(cluster):
    addr = cluster.brokers[0].addr
    before = _stored(addr)
    big = wire.SendRequest([wire.WireMessage("bad", 0, "big-1", os.urandom(4 * 1024 * 1024 + 1))])
    resp = httpx.post(
        f"http://{addr}/v1/send",
        content=wire.encode(big, wire.MSGPACK),
        headers={"content-type": wire.MSGPACK},
    )
    assert resp.status_code == 413
    assert wire.decode(resp.content, wire.ErrorResponse, wire.MSGPACK).error.code == (
        "MESSAGE_TOO_LARGE"
    )
    many = wire.SendRequest([wire.WireMessage("bad", 0, f"n-{i}", b"") for i in range(5000)])
    resp = httpx.post(
        f"http://{addr}/v1/send",
        content=wire.encode(many, wire.MSGPACK),
        headers={"content-type": wire.MSGPACK},
    )
    assert resp.status_code == 413
    assert wire.decode(resp.content, wire.ErrorResponse, wire.MSGPACK).error.code == (
        "BATCH_TOO_LARGE"
    )
    # one request body beyond the server's limit is cut off before it is read
    resp = httpx.post(
        f"http://{addr}/v1/send",
        content=b"0" * (65 * 1024 * 1024),
        headers={"content-type": wire.JSON},
    )
    assert resp.status_code == 413
    assert _stored(addr) == before


def test_a_batch_with_one_bad_message_stores_none(cluster):
    addr = cluster.brokers[0].addr
    before = _stored(addr)
    good = [_msg(msg_id=f"g-{i}") for i in range(5)]
    body = msgspec.json.encode({"messages": [*good, _msg(topic="no/slash")]})
    resp = httpx.post(f"http://{addr}/v1/send", content=body, headers={"content-type": wire.JSON})
    assert resp.status_code == 400
    assert "messages[5].topic" in resp.json()["error"]["message"]
    assert _stored(addr) == before


def test_name_server_refuses_bad_input(cluster):
    ns = cluster.namesrv
    assert httpx.get(f"http://{ns}/v1/routes/a%2F..%2Fb").status_code == 400
    resp = httpx.post(
        f"http://{ns}/v1/brokers/register", content=b"{}", headers={"content-type": wire.JSON}
    )
    assert resp.status_code == 400
    resp = httpx.post(
        f"http://{ns}/v1/brokers/register", content=b"nope", headers={"content-type": wire.JSON}
    )
    assert resp.status_code == 400
    assert httpx.get(f"http://{ns}/v1/routes/never-made-x").status_code in (200, 404)
    assert httpx.get(f"http://{ns}/health").status_code == 200


def test_no_topic_directory_escapes_the_data_dir(cluster):
    root = cluster.data_dir.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            assert ".." not in name and "/" not in name
            assert os.path.realpath(os.path.join(dirpath, name)).startswith(str(root))
