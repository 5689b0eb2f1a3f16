"""Issue 6 acceptance: signed requests against a real cluster started with an auth file.

Refused requests (no credentials, wrong secret, unknown key, expired timestamp, replay,
tampered body, out-of-scope topic) get 401/403 with a one-line reason, store nothing, and
surface as ``AuthError`` in the SDK without retries or isolation; the right credentials
work for send, send_delayed, send_batch, cancel and consume.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from qclient import AsyncProducer, Consumer, LocalCluster, Message, Producer
from qclient.errors import AuthError, BatchSendError
from qclient.protocol import wire

from ._support import (
    APP_KEY,
    APP_SECRET,
    BROKER_KEY,
    BROKER_SECRET,
    OTHER_KEY,
    OTHER_SECRET,
    WRONG_SECRET,
    appended,
    drain_signed,
    send_body,
    signed_headers,
    url,
    write_auth_file,
)

pytestmark = pytest.mark.timeout(120)

APP = {"access_key": APP_KEY, "secret_key": APP_SECRET}
OPS = {"access_key": OTHER_KEY, "secret_key": OTHER_SECRET}
#: a producer that gives up fast, so a wrongly retried refusal would show in the counters
#: a long budget: a refusal must come at once, far inside it, even on a loaded host
FAST = {"start_detector_enable": False, "send_timeout": 30.0, "retry_times": 2}


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_auth_file(tmp_path_factory.mktemp("auth"))


@pytest.fixture(scope="module")
def cluster(auth_file: str, tmp_path_factory: pytest.TempPathFactory):
    with LocalCluster(
        brokers=1, data_dir=str(tmp_path_factory.mktemp("cluster")), auth_file=auth_file
    ) as c:
        # Routes exist only for topics a broker has: create them with the ops account.
        with Producer(c.namesrv, **OPS, start_detector_enable=False) as p:
            for topic in ("orders", "bill_march", "secret_topic"):
                p.send(topic, b"warm-up")
        yield c


@pytest.fixture()
def broker_addr(cluster: LocalCluster) -> str:
    return cluster.brokers[0].addr


def _post(addr: str, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url(addr, path), content=body, headers=headers, timeout=5.0, trust_env=False)


def _error(resp: httpx.Response) -> tuple[str, str]:
    err = resp.json()["error"]
    assert "\n" not in err["message"]
    return err["code"], err["message"]


# --- refused -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "creds, reason",
    [
        ({}, "missing signature"),
        ({"access_key": APP_KEY, "secret_key": WRONG_SECRET}, "bad signature"),
        ({"access_key": "nobody", "secret_key": APP_SECRET}, "unknown access key"),
    ],
)
def test_producer_without_valid_credentials_is_refused(cluster, broker_addr, creds, reason):
    before = appended(broker_addr)
    with Producer(cluster.namesrv, **creds, **FAST) as p:
        started = time.monotonic()
        with pytest.raises(AuthError, match=reason) as info:
            p.send_delayed("orders", b"nope", delay=1.0)
        elapsed = time.monotonic() - started
        assert info.value.code == wire.ErrorCode.UNAUTHORIZED
        stats = p.stats()
        items = {f.name: f for f in p.fault_items()}
    # Not retried, and the broker is not isolated for it.
    assert stats["retried"] == 0, stats
    assert elapsed < 0.5 * FAST["send_timeout"]  # refused at once, not after the timeout
    assert items["broker-a"].available and items["broker-a"].isolated_until is None
    assert appended(broker_addr) == before


def test_out_of_scope_topic_is_forbidden(cluster, broker_addr):
    before = appended(broker_addr)
    with Producer(cluster.namesrv, **APP, **FAST) as p:
        with pytest.raises(AuthError, match=r"topic not allowed.*'secret_topic'") as info:
            p.send("secret_topic", b"nope")
        assert info.value.code == wire.ErrorCode.FORBIDDEN
        # One forbidden topic in a request refuses the whole request.
        with pytest.raises(BatchSendError) as batch:
            p.send_batch([Message("orders", b"ok"), Message("secret_topic", b"nope")])
        assert batch.value.failed and all(isinstance(e, AuthError) for _, e in batch.value.failed)
        assert p.stats()["retried"] == 0
    assert appended(broker_addr) == before


def test_expired_and_future_timestamps_are_refused(broker_addr):
    before = appended(broker_addr)
    for offset_ms in (-10 * 60_000, +10 * 60_000):
        body = send_body("orders", f"old-{offset_ms}")
        headers = signed_headers(
            "POST", wire.BROKER_SEND, body, now_ms=int(time.time() * 1000) + offset_ms
        )
        resp = _post(broker_addr, wire.BROKER_SEND, body, headers)
        assert resp.status_code == 401
        code, message = _error(resp)
        assert code == "UNAUTHORIZED" and message.startswith("expired timestamp"), message
    assert appended(broker_addr) == before


def test_replayed_request_is_refused(broker_addr):
    body = send_body("orders", "replay-1")
    headers = signed_headers("POST", wire.BROKER_SEND, body)
    before = appended(broker_addr)
    first = _post(broker_addr, wire.BROKER_SEND, body, headers)
    assert first.status_code == 200, first.text
    again = _post(broker_addr, wire.BROKER_SEND, body, headers)
    assert again.status_code == 401
    assert _error(again) == (
        "UNAUTHORIZED",
        "replayed nonce: this signed request was already received",
    )
    assert appended(broker_addr) == before + 1


@pytest.mark.parametrize("tamper", ["body", "path", "method", "timestamp"])
def test_tampered_request_is_refused(broker_addr, tamper):
    body = send_body("orders", f"tamper-{tamper}")
    headers = signed_headers("POST", wire.BROKER_SEND, body)
    path = wire.BROKER_SEND
    if tamper == "body":
        body = send_body("bill_march", f"tamper-{tamper}")  # same length, other topic
    elif tamper == "path":
        headers = signed_headers("POST", wire.BROKER_CANCEL, body)
    elif tamper == "method":
        headers = signed_headers("PUT", wire.BROKER_SEND, body)
    else:
        headers["X-QC-Timestamp"] = str(int(headers["X-QC-Timestamp"]) + 1)
    before = appended(broker_addr)
    resp = _post(broker_addr, path, body, headers)
    assert resp.status_code == 401
    code, message = _error(resp)
    assert code == "UNAUTHORIZED" and message.startswith("bad signature"), message
    assert appended(broker_addr) == before


@pytest.mark.parametrize(
    "headers, reason",
    [
        ({"X-QC-Access-Key": OTHER_KEY}, "missing signature"),
        (
            {
                "X-QC-Access-Key": OTHER_KEY,
                "X-QC-Timestamp": "yesterday",
                "X-QC-Nonce": "n" * 16,
                "X-QC-Signature": "00",
            },
            "malformed timestamp",
        ),
        (
            {
                "X-QC-Access-Key": OTHER_KEY,
                "X-QC-Timestamp": "1",
                "X-QC-Nonce": "short",
                "X-QC-Signature": "00",
            },
            "expired timestamp",
        ),
        (
            {
                "X-QC-Access-Key": OTHER_SECRET,
                "X-QC-Timestamp": "1",
                "X-QC-Nonce": "n" * 16,
                "X-QC-Signature": "00",
            },
            "unknown access key '(not shown)'",
        ),
    ],
)
def test_malformed_signature_headers(broker_addr, headers, reason):
    body = send_body("orders", "malformed")
    resp = _post(broker_addr, wire.BROKER_SEND, body, {"Content-Type": wire.JSON, **headers})
    assert resp.status_code == 401
    assert reason in _error(resp)[1]


def test_reads_need_a_signature_but_health_is_open(broker_addr):
    for path in (wire.BROKER_TOPICS, wire.BROKER_STATS):
        assert httpx.get(url(broker_addr, path), trust_env=False).status_code == 401
        signed = signed_headers("GET", path, key=APP_KEY, secret=APP_SECRET, content_type=None)
        assert httpx.get(url(broker_addr, path), headers=signed, trust_env=False).status_code == 200
    assert httpx.get(url(broker_addr, wire.HEALTH), trust_env=False).status_code == 200


def test_topic_create_and_pull_are_scoped(broker_addr):
    for path, body in [
        (wire.BROKER_TOPICS, wire.encode(wire.CreateTopicRequest("secret_new"))),
        (wire.BROKER_PULL, wire.encode(wire.PullRequest("secret_topic", "g"))),
        (wire.BROKER_CANCEL, wire.encode(wire.CancelRequest("secret_topic", "m", 1))),
    ]:
        headers = signed_headers("POST", path, body, key=APP_KEY, secret=APP_SECRET)
        resp = _post(broker_addr, path, body, headers)
        assert resp.status_code == 403, (path, resp.text)
        assert _error(resp)[0] == "FORBIDDEN"
    body = wire.encode(wire.CreateTopicRequest("bill_april"))
    resp = _post(
        broker_addr,
        wire.BROKER_TOPICS,
        body,
        signed_headers("POST", wire.BROKER_TOPICS, body, key=APP_KEY, secret=APP_SECRET),
    )
    assert resp.status_code == 200, resp.text


def test_consumer_with_bad_credentials_raises_auth_error(cluster):
    for creds, code in [
        ({"access_key": APP_KEY, "secret_key": WRONG_SECRET}, "UNAUTHORIZED"),
        ({}, "UNAUTHORIZED"),
        (APP, "FORBIDDEN"),
    ]:
        topic = "secret_topic" if code == "FORBIDDEN" else "orders"
        with Consumer(cluster.namesrv, topic, "g-bad", **creds) as consumer:
            started = time.monotonic()
            with pytest.raises(AuthError) as info:
                consumer.poll(10, timeout=30.0)
            assert info.value.code == code
            assert time.monotonic() - started < 10.0  # refused at once, not after the timeout


# --- accepted ------------------------------------------------------------------------


def test_right_credentials_send_delay_batch_cancel_consume(cluster, broker_addr):
    before = appended(broker_addr)
    with Producer(cluster.namesrv, **APP, start_detector_enable=False) as p:
        now = p.send("orders", b"now", msg_id="ok-now")
        later = p.send_delayed("orders", b"later", delay=0.3, msg_id="ok-later")
        batch = p.send_batch(
            [
                Message("orders", b"b1", msg_id="ok-b1"),
                Message("bill_march", b"b2", msg_id="ok-b2", delay=0.2),
            ]
        )
        doomed = p.send_delayed("orders", b"cancel me", delay=60, msg_id="ok-cancel")
        assert p.cancel(doomed) is True
        queued = p.send_async(Message("orders", b"async", msg_id="ok-async")).result(10)
        assert p.stats()["failed"] == 0
    assert {r.status.value for r in [now, later, *batch, doomed, queued]} == {"SEND_OK"}
    assert appended(broker_addr) - before >= 6  # (the store may log the cancel too)
    want = {"ok-now", "ok-later", "ok-b1", "ok-async"}
    got = drain_signed(cluster.namesrv, "orders", "g-ok", want, 10.0, **APP)
    assert want <= {m.msg_id for m in got}
    assert "ok-cancel" not in {m.msg_id for m in got}
    got = drain_signed(cluster.namesrv, "bill_march", "g-ok", {"ok-b2"}, 10.0, **APP)
    assert "ok-b2" in {m.msg_id for m in got}


def test_async_producer_signs_too(cluster):
    async def main() -> None:
        async with AsyncProducer(cluster.namesrv, **APP, start_detector_enable=False) as p:
            r = await p.send_delayed("bill_march", b"a", delay=0.1)
            assert await p.cancel(r) in (True, False)  # may have fired already
            with pytest.raises(AuthError, match="topic not allowed"):
                await p.send("secret_topic", b"nope")
        async with AsyncProducer(
            cluster.namesrv, access_key=APP_KEY, secret_key=WRONG_SECRET, **FAST
        ) as p:
            with pytest.raises(AuthError, match="bad signature"):
                await p.send("orders", b"nope")

    asyncio.run(main())


# --- CLI ----------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qclient", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_cli_signs_with_flags_or_environment(cluster):
    ns = cluster.namesrv
    env = {"QCLIENT_ACCESS_KEY": APP_KEY, "QCLIENT_SECRET_KEY": APP_SECRET}
    out = _cli("send", "--namesrv", ns, "--topic", "orders", "--msg-id", "cli-1", "hello", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "SEND_OK"
    out = _cli(
        "topic",
        "create",
        "--namesrv",
        ns,
        "--access-key",
        APP_KEY,
        "--secret-key",
        APP_SECRET,
        "bill_cli",
    )
    assert out.returncode == 0, out.stderr
    out = _cli(
        "consume",
        "--namesrv",
        ns,
        "--topic",
        "orders",
        "--group",
        "g-cli",
        "--max",
        "1",
        "--timeout",
        "5s",
        env=env,
    )
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
    refused = _cli(
        "send",
        "--namesrv",
        ns,
        "--topic",
        "orders",
        "--access-key",
        APP_KEY,
        "--secret-key",
        WRONG_SECRET,
        "hello",
    )
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad signature" in lines[0], refused.stderr
    assert WRONG_SECRET not in refused.stderr
    refused = _cli("topic", "create", "--namesrv", ns, "secret_cli")
    assert refused.returncode != 0 and "missing signature" in refused.stderr


# --- name server ---------------------------------------------------------------------


def test_name_server_needs_the_brokers_signature_to_register(cluster):
    ns = cluster.namesrv_node.addr
    reg = wire.encode(wire.BrokerRegistration(broker_name="rogue", addr="127.0.0.1:1"))
    path = wire.NAMESRV_REGISTER
    cases = [
        ({"Content-Type": wire.JSON}, "missing signature"),
        # an application account is not the broker entry
        (
            signed_headers("POST", path, reg, key=OTHER_KEY, secret=OTHER_SECRET),
            "unknown access key",
        ),
        (signed_headers("POST", path, reg, key=BROKER_KEY, secret=WRONG_SECRET), "bad signature"),
    ]
    for headers, reason in cases:
        resp = _post(ns, path, reg, headers)
        assert resp.status_code == 401 and reason in _error(resp)[1], resp.text
    unreg = wire.encode(wire.BrokerUnregistration("broker-a", cluster.brokers[0].addr))
    resp = _post(ns, wire.NAMESRV_UNREGISTER, unreg, {"Content-Type": wire.JSON})
    assert resp.status_code == 401
    assert cluster.registered() == {"broker-a"}  # the signed heartbeat got through
    ok = _post(
        ns, path, reg, signed_headers("POST", path, reg, key=BROKER_KEY, secret=BROKER_SECRET)
    )
    assert ok.status_code == 200, ok.text
    unreg = wire.encode(wire.BrokerUnregistration("rogue", "127.0.0.1:1"))
    ok = _post(
        ns,
        wire.NAMESRV_UNREGISTER,
        unreg,
        signed_headers(
            "POST", wire.NAMESRV_UNREGISTER, unreg, key=BROKER_KEY, secret=BROKER_SECRET
        ),
    )
    assert ok.status_code == 200 and cluster.registered() == {"broker-a"}
    # Reads stay open: producers look routes up without credentials.
    assert httpx.get(url(ns, "/v1/routes/orders"), trust_env=False).status_code == 200


def test_lookup_cancel_reschedule_are_scoped(cluster):
    with Producer(cluster.namesrv, **OPS, **FAST) as ops:
        r = ops.send_delayed("secret_topic", b"kept", delay=3600)
        with Producer(cluster.namesrv, **APP, **FAST) as app:
            for call in (
                lambda: app.lookup("secret_topic", r.msg_id),
                lambda: app.cancel(topic="secret_topic", msg_id=r.msg_id),
                lambda: app.reschedule("secret_topic", r.msg_id, delay=1),
            ):
                with pytest.raises(AuthError) as info:
                    call()
                assert info.value.code == wire.ErrorCode.FORBIDDEN
            assert app.lookup("orders", r.msg_id) is None  # its own topic: allowed, unknown
        info = ops.lookup("secret_topic", r.msg_id)
        assert info is not None and info.state == "scheduled"
        assert info.deliver_at_ms == r.deliver_at_ms
