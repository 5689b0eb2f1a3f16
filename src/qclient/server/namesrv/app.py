"""The name server's HTTP API (see docs/PROTOCOL.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ...protocol import wire
from ...protocol.wire import ErrorCode
from .._http import ApiError, make_app, read_body, reply, serve, ssl_context
from .route_table import RouteTable

log = logging.getLogger(__name__)


@dataclass
class NameServerConfig:
    host: str = "127.0.0.1"
    port: int = 9876
    #: what brokers are told to use (RocketMQ: 30 s)
    heartbeat_interval_ms: int = 30_000
    #: a broker without a heartbeat for this long leaves every route (RocketMQ: 120 s)
    broker_expire_ms: int = 120_000
    max_request_bytes: int = 8 << 20
    tls_cert: str | None = None
    tls_key: str | None = None
    #: issue 6: when set, register/unregister need a broker signature (see server/_auth.py)
    auth_file: str | None = None
    ready_file: str | None = None
    exit_with_parent: int | None = None


def create_app(config: NameServerConfig) -> web.Application:
    table = RouteTable(config.broker_expire_ms)
    middlewares: list[Any] = []
    if config.auth_file:  # issue 6: only the write endpoints; routes stay open to readers
        from .._auth import Authorizer, auth_middleware

        authorizer = Authorizer.from_file(config.auth_file)
        middlewares.append(auth_middleware(
            authorizer, paths={wire.NAMESRV_REGISTER, wire.NAMESRV_UNREGISTER},
            accounts=authorizer.signers()))
    app = make_app(config.max_request_bytes, middlewares)
    app["table"] = table
    routes = web.RouteTableDef()

    @routes.post(wire.NAMESRV_REGISTER)
    async def register(request: web.Request) -> web.Response:
        reg = await read_body(request, wire.BrokerRegistration)
        if not reg.broker_name or not reg.addr:
            raise ApiError(400, ErrorCode.INVALID_REQUEST, "broker_name and addr are required")
        for topic in reg.topics:
            if not wire.valid_topic(topic):
                raise ApiError(400, ErrorCode.INVALID_TOPIC, f"invalid topic name {topic!r}")
        table.register(reg)
        return reply(request, wire.RegisterResult(config.heartbeat_interval_ms,
                                                   config.broker_expire_ms))

    @routes.post(wire.NAMESRV_UNREGISTER)
    async def unregister(request: web.Request) -> web.Response:
        body = await read_body(request, wire.BrokerUnregistration)
        table.unregister(body.broker_name, body.addr)
        return reply(request, {"ok": True})

    @routes.get(wire.NAMESRV_BROKERS)
    async def brokers(request: web.Request) -> web.Response:
        return reply(request, table.brokers())

    @routes.get("/v1/routes/{topic}")
    async def route(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        if not wire.valid_topic(topic):
            raise ApiError(400, ErrorCode.INVALID_TOPIC,
                           f"invalid topic name {topic!r}: must match {wire.TOPIC_RE.pattern}")
        found = table.route(topic)
        if found is None:
            raise ApiError(404, ErrorCode.TOPIC_NOT_FOUND,
                           f"no route for topic {topic!r}: no broker has it or creates it")
        return reply(request, found)

    @routes.get(wire.HEALTH)
    async def health(request: web.Request) -> web.Response:
        return reply(request, wire.Health(status="ok", name="namesrv", role="namesrv"))

    app.add_routes(routes)

    async def expiry_loop(app: web.Application) -> None:
        interval = max(0.05, min(config.broker_expire_ms / 4000, 10.0))
        while True:
            await asyncio.sleep(interval)
            table.expire()

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        task = asyncio.create_task(expiry_loop(app))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(lifecycle)
    return app


async def run(config: NameServerConfig) -> None:
    app = create_app(config)
    await serve(app, config.host, config.port,
                ssl_ctx=ssl_context(config.tls_cert, config.tls_key),
                ready_file=config.ready_file, exit_with_parent=config.exit_with_parent)
