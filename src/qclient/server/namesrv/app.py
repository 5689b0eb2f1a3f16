"""The name server's HTTP API (see docs/PROTOCOL.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from ..._config import (
    DEFAULT_BROKER_EXPIRE,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HOST,
    DEFAULT_NAMESRV_PORT,
)
from ...protocol import wire
from ...protocol.wire import ErrorCode
from .._http import (
    ApiError,
    Application,
    Request,
    Response,
    make_app,
    read_body,
    reply,
    ssl_context,
)
from .._serve import serve
from ..metrics import NameServerMetrics, metrics_handler, request_metrics_middleware
from .route_table import RouteTable

log = logging.getLogger(__name__)

# what a registration may carry: readers of the routes trust these fields
_ADDR_RE = re.compile(r"^[\x21-\x7e]{1,255}\Z")
MAX_TOPICS_PER_BROKER = 100_000


def _check_registration(reg: wire.BrokerRegistration) -> None:
    """Raise a 400 unless every field of a registration is in range."""

    def bad(message: str) -> ApiError:
        return ApiError(400, ErrorCode.INVALID_REQUEST, message)

    name_ok = wire.PRINTABLE_128_RE.match
    if not name_ok(reg.broker_name) or not name_ok(reg.cluster):
        raise bad("broker_name and cluster must be 1-128 printable ASCII characters")
    if not _ADDR_RE.match(reg.addr):
        raise bad("addr must be 1-255 printable ASCII characters (HOST:PORT or a URL)")
    if reg.perm & ~wire.PERM_READ_WRITE:
        raise bad("perm must be 0, 2, 4 or 6")
    if not 1 <= reg.default_queue_nums <= wire.MAX_QUEUES:
        raise bad(f"default_queue_nums must be 1..{wire.MAX_QUEUES}")
    if len(reg.topics) > MAX_TOPICS_PER_BROKER:
        raise bad(f"more than {MAX_TOPICS_PER_BROKER} topics in one registration")
    for topic, cfg in reg.topics.items():
        if not wire.valid_topic(topic):
            raise ApiError(400, ErrorCode.INVALID_TOPIC, f"invalid topic name {topic[:140]!r}")
        if (
            not 0 <= cfg.read_queue_nums <= wire.MAX_QUEUES
            or not 0 <= cfg.write_queue_nums <= wire.MAX_QUEUES
            or cfg.perm & ~wire.PERM_READ_WRITE
        ):
            raise bad(
                f"topic {topic!r}: queue numbers must be 0..{wire.MAX_QUEUES}, perm 0, 2, 4 or 6"
            )


@dataclass
class NameServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_NAMESRV_PORT
    #: what brokers are told to use
    heartbeat_interval_ms: int = int(DEFAULT_HEARTBEAT_INTERVAL * 1000)
    #: a broker without a heartbeat for this long leaves every route
    broker_expire_ms: int = int(DEFAULT_BROKER_EXPIRE * 1000)
    max_request_bytes: int = 8 << 20
    tls_cert: str | None = None
    tls_key: str | None = None
    #: when set, register/unregister need a broker signature (see server/_auth.py)
    auth_file: str | None = None
    ready_file: str | None = None
    exit_with_parent: int | None = None


def create_app(config: NameServerConfig) -> Application:
    table = RouteTable(config.broker_expire_ms)
    registry = CollectorRegistry()
    metrics = NameServerMetrics(registry, table)
    middlewares: list[Any] = [request_metrics_middleware(registry)]
    if config.auth_file:  # only the write endpoints; routes stay open to readers
        from .._auth import Authorizer, auth_middleware

        authorizer = Authorizer.from_file(config.auth_file)
        middlewares.append(
            auth_middleware(
                authorizer,
                paths={wire.NAMESRV_REGISTER, wire.NAMESRV_UNREGISTER},
                accounts=authorizer.signers(),
            )
        )
    app = make_app(config.max_request_bytes, middlewares)
    app["table"] = table

    async def register(request: Request) -> Response:
        reg = await read_body(request, wire.BrokerRegistration)
        if not reg.broker_name or not reg.addr:
            raise ApiError(400, ErrorCode.INVALID_REQUEST, "broker_name and addr are required")
        _check_registration(reg)
        table.register(reg)
        return reply(
            request, wire.RegisterResult(config.heartbeat_interval_ms, config.broker_expire_ms)
        )

    async def unregister(request: Request) -> Response:
        body = await read_body(request, wire.BrokerUnregistration)
        table.unregister(body.broker_name, body.addr)
        return reply(request, {"ok": True})

    async def brokers(request: Request) -> Response:
        return reply(request, table.brokers())

    async def route(request: Request) -> Response:
        topic = request.match_info["topic"]
        if not wire.valid_topic(topic):
            raise ApiError(
                400,
                ErrorCode.INVALID_TOPIC,
                f"invalid topic name {topic!r}: must match {wire.TOPIC_PATTERN}",
            )
        found = table.route(topic)
        metrics.route_lookup(found is not None)
        if found is None:
            raise ApiError(
                404,
                ErrorCode.TOPIC_NOT_FOUND,
                f"no route for topic {topic!r}: no broker has it or creates it",
            )
        return reply(request, found)

    async def health(request: Request) -> Response:
        return reply(request, wire.Health(status="ok", name="namesrv", role="namesrv"))

    app.router.add_post(wire.NAMESRV_REGISTER, register)
    app.router.add_post(wire.NAMESRV_UNREGISTER, unregister)
    app.router.add_get(wire.NAMESRV_BROKERS, brokers)
    app.router.add_get("/v1/routes/{topic}", route)
    app.router.add_get(wire.HEALTH, health)
    app.router.add_get(wire.METRICS, metrics_handler(registry))

    async def expiry_loop(app: Application) -> None:
        interval = max(0.05, min(config.broker_expire_ms / 4000, 10.0))
        while True:
            await asyncio.sleep(interval)
            table.expire()

    async def lifecycle(app: Application) -> AsyncIterator[None]:
        task = asyncio.create_task(expiry_loop(app))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(lifecycle)
    return app


async def run(config: NameServerConfig) -> None:
    app = create_app(config)

    async def ready(addr: str) -> None:
        log.info("name server serving on %s", addr)

    await serve(
        app,
        config.host,
        config.port,
        ssl_ctx=ssl_context(config.tls_cert, config.tls_key),
        on_ready=ready,
        ready_file=config.ready_file,
        exit_with_parent=config.exit_with_parent,
    )
