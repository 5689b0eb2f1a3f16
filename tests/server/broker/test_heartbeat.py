"""Heartbeat: registers with every name server, again on a kick, unregisters on stop,
and carries on past a name server that is down (real sockets on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest
from aiohttp import web

from qclient.protocol import wire
from qclient.server.broker import heartbeat
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


def test_a_refusal_and_a_silent_name_server_are_logged_once_each(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One name server answers 403, one accepts and never answers: each beat to either is
    bounded and logged once per outage, and the answer's text is in the log."""
    monkeypatch.setattr(heartbeat, "POST_TIMEOUT_S", 0.3)
    held: list[asyncio.StreamWriter] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b"unknown access key"
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # reads nothing, answers nothing

    async def scenario() -> float:
        servers = [await asyncio.start_server(h, "127.0.0.1", 0) for h in (refuse, silent)]
        addrs = [f"127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
        try:
            hb = Heartbeat(addrs, 3_600_000, lambda: wire.BrokerRegistration("b1", "127.0.0.1:1"))
            started = time.monotonic()
            await hb.start()
            took = time.monotonic() - started
            await hb.register_all()
            await hb.stop()
            return took
        finally:
            for w in held:
                w.close()
            for s in servers:
                s.close()
                await s.wait_closed()

    with caplog.at_level(logging.WARNING, logger=heartbeat.__name__):
        took = asyncio.run(scenario())
    assert took < 5  # bounded by the timeout, not by the silent server (a bound, not a goal)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # two beats, one line per name server
    assert any("HTTP 403: unknown access key" in line for line in lines)
    assert any("no answer within 0.3 s" in line for line in lines)
