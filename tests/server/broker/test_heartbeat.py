"""Heartbeat: registers with every name server, again on a kick, unregisters on stop,
and carries on past a name server that is down (real sockets on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from qclient.protocol import wire
from qclient.server.broker.heartbeat import Heartbeat


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _scenario() -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []  # (path, broker name)

    async def register(request: web.Request) -> web.Response:
        seen.append((request.path, wire.decode(await request.read(), wire.BrokerRegistration,
                                               request.content_type).broker_name))  # fmt: skip
        return web.Response(body=b"{}", content_type="application/json")

    async def unregister(request: web.Request) -> web.Response:
        body = wire.decode(await request.read(), wire.BrokerUnregistration, request.content_type)
        seen.append((request.path, body.broker_name))
        return web.Response(body=b"{}", content_type="application/json")

    app = web.Application()
    app.router.add_post(wire.NAMESRV_REGISTER, register)
    app.router.add_post(wire.NAMESRV_UNREGISTER, unregister)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        hb = Heartbeat(
            [f"127.0.0.1:{port}", f"127.0.0.1:{_closed_port()}"],  # the second one is down
            3_600_000,  # no timed beat during the test: only start and the kick
            lambda: wire.BrokerRegistration("b1", "127.0.0.1:1"),
        )
        await hb.start()
        assert seen == [(wire.NAMESRV_REGISTER, "b1")]
        hb.kick()
        for _ in range(200):  # bounded: 2 s at most
            if len(seen) == 2:
                break
            await asyncio.sleep(0.01)
        await hb.stop(wire.BrokerUnregistration("b1", "127.0.0.1:1"))
    finally:
        await runner.cleanup()
    return seen


def test_register_kick_and_unregister_with_one_name_server_down() -> None:
    assert asyncio.run(_scenario()) == [
        (wire.NAMESRV_REGISTER, "b1"),
        (wire.NAMESRV_REGISTER, "b1"),
        (wire.NAMESRV_UNREGISTER, "b1"),
    ]
