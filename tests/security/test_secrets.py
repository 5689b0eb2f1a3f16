"""Issue 6: secret keys never show in logs, reprs, exception messages or stats; the auth
file is checked strictly and its errors do not quote it."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from qclient import AsyncProducer, Consumer, LocalCluster, Message, Producer
from qclient._config import ProducerConfig
from qclient.errors import AuthError, BatchSendError, QClientError
from qclient.protocol import wire
from qclient.server._auth import Account, AuthFile, AuthFileError, Authorizer
from qclient.transport.http import Credentials

from ._support import (
    ACCOUNTS,
    APP_KEY,
    APP_SECRET,
    SECRETS,
    WRONG_SECRET,
    broker_stats,
    drain_signed,
    write_auth_file,
)

pytestmark = pytest.mark.timeout(120)


def _assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a secret key leaked into {where}"


def test_secrets_stay_out_of_logs_reprs_errors_and_stats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    caplog.set_level(logging.DEBUG)  # everything, httpx/httpcore included
    monkeypatch.setenv("QCLIENT_LOG_FORMAT", "json")  # the servers' JSON lines, extras too
    auth_file = write_auth_file(tmp_path)
    texts: list[tuple[str, str]] = []
    with LocalCluster(brokers=1, data_dir=str(tmp_path / "c"), auth_file=auth_file) as c:
        good = Producer(
            c.namesrv, access_key=APP_KEY, secret_key=APP_SECRET, start_detector_enable=False
        )
        bad = Producer(
            c.namesrv,
            access_key=APP_KEY,
            secret_key=WRONG_SECRET,
            start_detector_enable=False,
            retry_times=0,
        )
        with good, bad:
            r = good.send_delayed("orders", b"hello", delay=0.1, msg_id="leak-1")
            good.send_async(Message("orders", b"hi", msg_id="leak-2")).result(10)
            errors: list[BaseException] = []
            for call in (
                lambda: bad.send("orders", b"x"),
                lambda: bad.send_batch([Message("orders", b"x")]),
                lambda: bad.cancel(r),
                lambda: good.send("forbidden_topic", b"x"),
                lambda: bad.send_async(Message("orders", b"x")).result(10),
            ):
                with pytest.raises(QClientError) as info:
                    call()
                errors.append(info.value)
                if isinstance(info.value, BatchSendError):
                    errors.extend(e for _, e in info.value.failed)
            assert any(isinstance(e, AuthError) for e in errors)
            texts += [
                ("producer repr", repr(good)),
                ("producer stats", repr(good.stats())),
                ("bad producer stats", repr(bad.stats())),
                ("fault items", repr(good.fault_items())),
            ]
            texts += [(f"error {type(e).__name__}", f"{e} {e!r} {e.args!r}") for e in errors]
        got = drain_signed(
            c.namesrv,
            "orders",
            "g",
            {"leak-1", "leak-2"},
            10.0,
            access_key=APP_KEY,
            secret_key=APP_SECRET,
        )
        assert {"leak-1", "leak-2"} <= {m.msg_id for m in got}
        with Consumer(
            c.namesrv, "orders", "g2", access_key=APP_KEY, secret_key=WRONG_SECRET
        ) as consumer:
            texts.append(("consumer repr", repr(consumer)))
            with pytest.raises(AuthError) as info:
                consumer.poll(1, timeout=1.0)
            texts.append(("consumer error", f"{info.value} {info.value!r}"))

        async def async_side() -> None:
            async with AsyncProducer(
                c.namesrv, access_key=APP_KEY, secret_key=WRONG_SECRET, start_detector_enable=False
            ) as p:
                texts.append(("async producer repr", repr(p)))
                with pytest.raises(AuthError) as info:
                    await p.send("orders", b"x")
                texts.append(("async error", f"{info.value} {info.value!r}"))

        asyncio.run(async_side())
        stats = broker_stats(c.brokers[0].addr)
        assert stats["auth"]["refused"]["bad_signature"] >= 1
        texts.append(("broker stats", json.dumps(stats)))
        for node in (c.brokers[0], c.namesrv_node):
            r = httpx.get(f"http://{node.addr}{wire.METRICS}", timeout=5.0, trust_env=False)
            assert r.status_code == 200  # open like /health, with --auth-file too
            texts.append((f"{node.name} metrics", r.text))
        assert 'status="401"' in texts[-2][1]  # refused requests are counted
        broker_log = c.data_dir / f"{c.brokers[0].name}.log"
        namesrv_log = c.data_dir / f"{c.namesrv_node.name}.log"
        texts += [
            ("broker log", broker_log.read_text()),
            ("name server log", namesrv_log.read_text()),
        ]
        assert "bad signature" in texts[-2][1]  # the refusals are logged, without secrets
        records = [json.loads(ln) for ln in texts[-2][1].splitlines() if ln.startswith("{")]
        assert any("bad signature" in r["message"] for r in records)
    cfg = ProducerConfig.create("127.0.0.1:1", access_key=APP_KEY, secret_key=APP_SECRET)
    authorizer = Authorizer.from_file(auth_file)
    texts += [
        ("config repr", repr(cfg)),
        ("credentials", repr(Credentials(APP_KEY, APP_SECRET))),
        ("account", repr(Account(APP_KEY, APP_SECRET, ("*",)))),
        ("authorizer", repr(authorizer)),
        ("authorizer stats", repr(authorizer.stats())),
        ("auth file", repr(AuthFile.load(auth_file))),
        ("captured logs", caplog.text),
    ]
    assert "UNAUTHORIZED" in caplog.text  # the SDK logged the refusals: capture works
    for where, text in texts:
        _assert_no_secret(text, where)


# --- the auth file -------------------------------------------------------------------


def _acct(**over: Any) -> dict[str, Any]:
    return {"access_key": "k", "secret_key": "SECRET-in-file", "topics": ["*"], **over}


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "JSON object"),
        ({"accounts": []}, "non-empty list"),
        ({"accounts": [_acct(topics="orders")]}, "list of topic names"),
        ({"accounts": [_acct(topics=["../etc"])]}, "not a topic name or pattern"),
        ({"accounts": [_acct(secret_key="")]}, "secret_key must be a non-empty string"),
        ({"accounts": [_acct(access_key=5)]}, "access_key must be a non-empty string"),
        ({"accounts": [_acct(access_key="has space")]}, "printable ASCII"),
        ({"accounts": [_acct(), _acct()]}, "more than once"),
        ({"accounts": [_acct(scopes=["x"])]}, "unknown field"),
        ({"accounts": [_acct()], "extra": 1}, "unknown top-level"),
        (
            {"accounts": [_acct()], "broker": {"access_key": "k", "secret_key": "s"}},
            "more than once",
        ),
    ],
)
def test_auth_file_shape_is_checked(data, message):
    with pytest.raises(AuthFileError, match=message) as info:
        AuthFile.parse(data)
    assert "SECRET-in-file" not in str(info.value)


def test_a_broken_auth_file_stops_the_broker_with_one_line(tmp_path: Path):
    path = tmp_path / "auth.json"
    path.write_text('{"accounts": [{"access_key": "k", "secret_key": "SECRET-in-file",')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "qclient",
            "broker",
            "--name",
            "b",
            "--data-dir",
            str(tmp_path / "d"),
            "--namesrv",
            "127.0.0.1:1",
            "--port",
            "0",
            "--auth-file",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        f"qclient: error: auth file {path} is not valid JSON (line 1)"
    ]


def test_topic_patterns():
    account = AuthFile.parse(ACCOUNTS).accounts[0]  # orders, bill_*
    allowed = ["orders", "bill_", "bill_march", "bill_a_b"]
    denied = ["order", "orders2", "xorders", "bill", "abill_x", "BILL_x"]
    assert [account.allows(t) for t in allowed] == [True] * len(allowed)
    assert [account.allows(t) for t in denied] == [False] * len(denied)
    assert Account("k", "s", ("a*b*c",)).allows("a1b2c")
    assert not Account("k", "s", ("a*b*c",)).allows("a1b2cd")
    assert Account("k", "s", ("*",)).allows("anything")
    assert not Account("k", "s", ()).allows("anything")
    # "|" and "%" are topic characters, not regex syntax
    assert Account("k", "s", ("a|b",)).allows("a|b")
    assert not Account("k", "s", ("a|b",)).allows("a")
