"""The Authorizer and its middleware on an in-process server (no cluster): the
timestamp window's edges, a full replay cache refuses instead of forgetting, scopes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx

from qclient.protocol import auth
from qclient.server._auth import Account, Authorizer, auth_middleware
from qclient.server._http import Request, Response, make_app
from qclient.server._serve import start_server

NOW_S = 1_700_000_000.0
ACCOUNT = Account("k", "SECRET-unit", ("orders", "bill_*"))


def _run(authorizer: Authorizer, body: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    async def topics(request: Request) -> Response:
        authorizer.check_topics(request, set(request.query.getall("t", [])))
        return Response(body=b'{"ok": true}', content_type="application/json")

    async def health(request: Request) -> Response:
        return Response(body=b'{"ok": true}', content_type="application/json")

    async def main() -> None:
        app = make_app(1 << 20, [auth_middleware(authorizer)])
        app.router.add_post("/v1/x", topics)
        app.router.add_get("/health", health)
        server, state = await start_server(app, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await body(client)
        finally:
            server.close()
            await state.drain()

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

    async def body(client: httpx.AsyncClient) -> None:
        for offset, status in [(-60_000, 200), (60_000, 200), (-60_001, 401), (60_001, 401)]:
            resp = await client.post(
                "/v1/x", content=b"{}", headers=_signed(now_ms=now_ms + offset)
            )
            assert resp.status_code == status, (offset, resp.text)

    _run(authorizer, body)
    assert authorizer.refused == {"expired": 2}


def test_a_full_replay_cache_refuses_rather_than_forgets() -> None:
    authorizer = Authorizer([ACCOUNT], max_nonces=2, clock=lambda: NOW_S)

    async def body(client: httpx.AsyncClient) -> None:
        first, second = _signed(), _signed()
        for headers in (first, second):
            assert (await client.post("/v1/x", content=b"{}", headers=headers)).status_code == 200
        resp = await client.post("/v1/x", content=b"{}", headers=_signed())
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "BROKER_BUSY"
        for headers in (first, second):  # still remembered
            resp = await client.post("/v1/x", content=b"{}", headers=headers)
            assert resp.status_code == 401
            assert "replayed nonce" in resp.json()["error"]["message"]

    _run(authorizer, body)
    assert authorizer.stats()["nonces"] == 2


def test_scopes_and_open_health() -> None:
    authorizer = Authorizer([ACCOUNT], clock=lambda: NOW_S)

    async def body(client: httpx.AsyncClient) -> None:
        assert (await client.get("/health")).status_code == 200
        ok = await client.post("/v1/x?t=orders&t=bill_x", content=b"{}", headers=_signed())
        assert ok.status_code == 200
        # The query string is not signed, so a scope check on it is the handler's business;
        # the signature itself still holds for a fresh nonce.
        denied = await client.post("/v1/x?t=orders&t=payroll", content=b"{}", headers=_signed())
        assert denied.status_code == 403
        err = denied.json()["error"]
        assert err["code"] == "FORBIDDEN" and "'payroll'" in err["message"]
        wrong = await client.post("/v1/x", content=b"{}", headers=_signed(secret="SECRET-other"))
        assert wrong.status_code == 401
        for resp in (ok, denied, wrong):
            assert "SECRET" not in resp.text

    _run(authorizer, body)
