"""Shared bits of the access-control tests: auth files, raw signed requests, counters."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from qclient import Consumer, ReceivedMessage
from qclient.protocol import auth, wire

# Distinctive strings, so a leak is easy to find in logs, reprs and messages.
APP_KEY = "app1"
APP_SECRET = "S3CRET-app1-7f2c9d0e"
OTHER_KEY = "ops"
OTHER_SECRET = "S3CRET-ops-41b8aa53"
BROKER_KEY = "broker"
BROKER_SECRET = "S3CRET-broker-90cd12ee"
WRONG_SECRET = "S3CRET-wrong-5e5e5e5e"
SECRETS = (APP_SECRET, OTHER_SECRET, BROKER_SECRET, WRONG_SECRET)

#: app1 may use "orders" and "bill_*"; ops may use everything
ACCOUNTS: dict[str, Any] = {
    "accounts": [
        {"access_key": APP_KEY, "secret_key": APP_SECRET, "topics": ["orders", "bill_*"]},
        {"access_key": OTHER_KEY, "secret_key": OTHER_SECRET, "topics": ["*"]},
    ],
    "broker": {"access_key": BROKER_KEY, "secret_key": BROKER_SECRET},
}


def write_auth_file(directory: Path, data: dict[str, Any] | None = None) -> str:
    path = directory / "auth.json"
    path.write_text(json.dumps(ACCOUNTS if data is None else data))
    return str(path)


def url(addr: str, path: str) -> str:
    return wire.base_url(addr) + path


def signed_headers(
    method: str,
    path: str,
    body: bytes = b"",
    *,
    key: str = OTHER_KEY,
    secret: str = OTHER_SECRET,
    now_ms: int | None = None,
    content_type: str | None = wire.JSON,
) -> dict[str, str]:
    headers = auth.sign_headers(key, secret, method, path, body, now_ms=now_ms)
    if content_type:
        headers["Content-Type"] = content_type
    return headers


def broker_stats(addr: str, **tls: Any) -> dict[str, Any]:
    """``GET /v1/stats`` of a broker, signed (stats need a signature when auth is on)."""
    r = httpx.get(
        url(addr, wire.BROKER_STATS),
        headers=signed_headers("GET", wire.BROKER_STATS, content_type=None),
        timeout=5.0,
        trust_env=False,
        **tls,
    )
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def appended(addr: str) -> int:
    return int(broker_stats(addr)["store"]["appended"])


def send_body(topic: str, msg_id: str, body: bytes = b"x", **extra: Any) -> bytes:
    msg = wire.WireMessage(topic=topic, queue_id=0, msg_id=msg_id, body=body, **extra)
    return wire.encode(wire.SendRequest([msg]))


def drain_signed(
    namesrv: str,
    topic: str,
    group: str,
    want: set[str],
    timeout: float,
    *,
    access_key: str,
    secret_key: str,
    verify: bool | str = True,
) -> list[ReceivedMessage]:
    """Consume with credentials until every id of ``want`` arrived, or ``timeout``."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout
    with Consumer(
        namesrv, topic, group, access_key=access_key, secret_key=secret_key, verify=verify
    ) as consumer:
        while not want <= {m.msg_id for m in got} and time.monotonic() < deadline:
            got.extend(consumer.poll(max_messages=256, timeout=0.5))
    return got
