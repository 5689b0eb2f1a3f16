"""The Authorizer and its middleware on an in-process aiohttp server (no cluster): the
timestamp window's edges, a full replay cache refuses instead of forgetting, scopes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from qclient.protocol import auth
from qclient.server._auth import Account, Authorizer, auth_middleware
from qclient.server._http import make_app

NOW_S = 1_700_000_000.0
ACCOUNT = Account("k", "SECRET-unit", ("orders", "bill_*"))


def _run(authorizer: Authorizer, body: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def topics(request: web.Request) -> web.Response:
        authorizer.check_topics(request, set(request.query.getall("t", [])))
        return web.json_response({"ok": True})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def main() -> None:
        app = make_app(1 << 20, [auth_middleware(authorizer)])
        app.router.add_post("/v1/x", topics)
        app.router.add_get("/health", health)
        async with TestClient(TestServer(app)) as client:
            await body(client)

    asyncio.run(main())


def _signed(
    body: bytes = b"{}", *, now_ms: int | None = None, secret: str = "SECRET-unit"
) -> dict[str, str]:
    ms = int(NOW_S * 1000) if now_ms is None else now_ms
    return {
        **auth.sign_headers("k", secret, "POST", "/v1/x", body, now_ms=ms),
        "Content-Type": "application/json",
    }


def test_timestamp_window_edges() -> None:
    authorizer = Authorizer([ACCOUNT], max_skew_ms=60_000, clock=lambda: NOW_S)
    now_ms = int(NOW_S * 1000)

    async def body(client: TestClient[Any, Any]) -> None:
        for offset, status in [(-60_000, 200), (60_000, 200), (-60_001, 401), (60_001, 401)]:
            resp = await client.post("/v1/x", data=b"{}", headers=_signed(now_ms=now_ms + offset))
            assert resp.status == status, (offset, await resp.text())

    _run(authorizer, body)
    assert authorizer.refused == {"expired": 2}


def test_a_full_replay_cache_refuses_rather_than_forgets() -> None:
    authorizer = Authorizer([ACCOUNT], max_nonces=2, clock=lambda: NOW_S)

    async def body(client: TestClient[Any, Any]) -> None:
        first, second = _signed(), _signed()
        for headers in (first, second):
            assert (await client.post("/v1/x", data=b"{}", headers=headers)).status == 200
        resp = await client.post("/v1/x", data=b"{}", headers=_signed())
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "BROKER_BUSY"
        for headers in (first, second):  # still remembered
            resp = await client.post("/v1/x", data=b"{}", headers=headers)
            assert resp.status == 401
            assert "replayed nonce" in (await resp.json())["error"]["message"]

    _run(authorizer, body)
    assert authorizer.stats()["nonces"] == 2


def test_scopes_and_open_health() -> None:
    authorizer = Authorizer([ACCOUNT], clock=lambda: NOW_S)

    async def body(client: TestClient[Any, Any]) -> None:
        assert (await client.get("/health")).status == 200
        ok = await client.post("/v1/x?t=orders&t=bill_x", data=b"{}", headers=_signed())
        assert ok.status == 200
        # The query string is not signed, so a scope check on it is the handler's business;
        # the signature itself still holds for a fresh nonce.
        denied = await client.post("/v1/x?t=orders&t=payroll", data=b"{}", headers=_signed())
        assert denied.status == 403
        err = (await denied.json())["error"]
        assert err["code"] == "FORBIDDEN" and "'payroll'" in err["message"]
        wrong = await client.post("/v1/x", data=b"{}", headers=_signed(secret="SECRET-other"))
        assert wrong.status == 401
        for resp in (ok, denied, wrong):
            assert "SECRET" not in await resp.text()

    _run(authorizer, body)
