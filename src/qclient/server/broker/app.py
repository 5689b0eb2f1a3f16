"""The delay broker's HTTP API (see docs/PROTOCOL.md) over a :class:`DelayStore`."""

from __future__ import annotations

import asyncio
import gc
import ssl
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

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
from ..metrics import BrokerCollector, RequestMetrics, metrics_handler
from ..store import DelayStore, StoreConfig
from . import lifecycle
from .checks import MessageChecks
from .commit import LoopCommitter
from .config import BrokerConfig
from .disk import DiskGuard
from .firing import LoopFiring
from .groups import GroupTable, group_heartbeat
from .heartbeat import Heartbeat
from .pull import PullHandlers
from .send import SendHandlers
from .topics import TopicRegistry
from .waiters import FireWaiters


class Broker(SendHandlers, PullHandlers):
    """State of one broker process: topics, store, heartbeat, waiting consumers."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        data_dir = Path(config.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.topics = TopicRegistry(data_dir / "topics.json")
        # Minute buckets loaded 30 s ahead: the wheel then holds ~90 s of due messages
        # (QMQ's hour buckets would hold up to 90 min: hundreds of MB at 5k msgs/s).
        # Fired on the event loop (firing.py says why)
        tunables: dict[str, Any] = {
            "bucket_ms": 60_000,
            "load_ahead_ms": 30_000,
            "firing_thread": False,
            **config.store,
        }
        if tunables.get("visible_before_sync", True):
            # consumers see fired messages before the consume logs' group fsync, and a
            # killed process re-fires nothing (recovery reconciles from the logs), so
            # its period bounds only what a power loss re-fires: fewer, larger fsyncs
            # (each round is several blocking syscalls on the syncer thread)
            tunables.setdefault("sync_interval_ms", 50)
        if not tunables["firing_thread"]:
            # fired a little early, held by the pulls: see wire.DEFAULT_FIRE_AHEAD_MS
            tunables.setdefault("fire_ahead_ms", wire.DEFAULT_FIRE_AHEAD_MS)
        store_cfg = StoreConfig(
            data_dir=data_dir / "store", max_delay_ms=config.max_delay_ms, **tunables
        )
        self.store = DelayStore(store_cfg)
        self.disk = DiskGuard(str(data_dir), config.min_free_bytes, config.name)
        self.checks = MessageChecks(config.max_message_size, config.max_delay_ms)
        self.perm = wire.PERM_READ if config.read_only else wire.PERM_READ_WRITE
        self.heartbeat: Heartbeat | None = None
        self.authorizer: Any = None  # set when --auth-file is given
        self.fired = FireWaiters()
        self.firing: LoopFiring | None = None  # set by start() unless the store fires itself
        self.groups = GroupTable()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.committer: LoopCommitter  # set by start()
        self.request_metrics: RequestMetrics | None = None  # set by create_app
        self.counters: dict[str, int] = defaultdict(int)
        self.retries: Counter[str] = Counter()
        self.dead_lettered: Counter[str] = Counter()

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if not self.store.config.firing_thread:
            self.firing = LoopFiring(self.store, self._loop)
            self.store.set_fire_wake(self.firing.wake)
        await asyncio.to_thread(self.store.open)
        self.committer = LoopCommitter(self.store, self._loop)
        self.fired.bind(self._loop)
        self.store.add_fire_listener(self.fired.fired)
        if self.firing is not None:
            self.firing.start()

    async def register(self, addr: str) -> None:
        if self.config.advertise_addr is None:
            scheme = "https://" if self.config.tls_cert else ""
            self.config.advertise_addr = scheme + addr
        sign = None
        if self.authorizer is not None:  # name servers with --auth-file want it signed
            from .._auth import heartbeat_signer

            account = self.authorizer.signing_account()
            sign = heartbeat_signer(account.access_key, account.secret_key)
        ca = (
            ssl.create_default_context(cafile=self.config.tls_ca) if self.config.tls_ca else None
        )  # verifies https:// name servers (None: the system's CAs)
        self.heartbeat = Heartbeat(
            self.config.namesrv, self.config.heartbeat_interval_ms, self.registration, sign, ca
        )
        await self.heartbeat.start()

    async def stop(self) -> None:
        if self.heartbeat is not None:
            await self.heartbeat.stop(wire.BrokerUnregistration(self.config.name, self.config.addr))
        if self.firing is not None:
            self.firing.stop()
        await asyncio.to_thread(self.store.close)

    def registration(self) -> wire.BrokerRegistration:
        return wire.BrokerRegistration(
            broker_name=self.config.name,
            addr=self.config.addr,
            perm=self.perm,
            auto_create_topics=self.config.auto_create_topics,
            default_queue_nums=self.config.default_queue_nums,
            topics=self.topics.all(),
        )

    # --- topics ---------------------------------------------------------------------

    def authorize(self, request: Request, topics: set[str]) -> None:
        if self.authorizer is not None:
            self.authorizer.check_topics(request, topics)

    def existing_topic(self, request: Request, topic: str) -> wire.TopicConfig:
        """An existing topic the request may read; else the request's 403 or 404."""
        self.authorize(request, {topic})
        cfg = self.topics.get(topic)
        if cfg is None:
            raise ApiError(
                404,
                ErrorCode.TOPIC_NOT_FOUND,
                f"topic {topic!r} does not exist on broker {self.config.name}",
            )
        return cfg

    # --- handlers -------------------------------------------------------------------

    async def create_topic(self, request: Request) -> Response:
        body = await read_body(request, wire.CreateTopicRequest)
        if not wire.valid_topic(body.topic):
            raise ApiError(
                400,
                ErrorCode.INVALID_TOPIC,
                f"invalid topic name {body.topic!r}: must match {wire.TOPIC_PATTERN}",
            )
        if not 1 <= body.queues <= wire.MAX_QUEUES:
            raise ApiError(400, ErrorCode.INVALID_REQUEST, f"queues must be 1..{wire.MAX_QUEUES}")
        if body.perm & ~wire.PERM_READ_WRITE or not body.perm:
            raise ApiError(400, ErrorCode.INVALID_REQUEST, "perm must be 2, 4 or 6")
        self.authorize(request, {body.topic})
        cfg, changed = self.topics.put(body.topic, body.queues, body.perm)
        if changed and self.heartbeat is not None:
            await self.heartbeat.register_all()
        return reply(request, wire.TopicList({body.topic: cfg}))

    async def list_topics(self, request: Request) -> Response:
        return reply(request, wire.TopicList(self.topics.all()))

    async def health(self, request: Request) -> Response:
        return reply(
            request, wire.Health(status="ok", name=self.config.name, role="broker", perm=self.perm)
        )

    async def stats(self, request: Request) -> Response:
        data: dict[str, Any] = {"broker_name": self.config.name, **self.counters}
        data["store"] = self.store.stats()
        data["disk"] = {"free_bytes": self.disk.free_bytes(), "refusals": self.disk.refusals}
        if self.authorizer is not None:  # refusals by reason (no secrets)
            data["auth"] = self.authorizer.stats()
        return reply(request, data)


def create_app(config: BrokerConfig) -> tuple[Application, Broker]:
    broker = Broker(config)
    registry = CollectorRegistry()
    registry.register(BrokerCollector(broker))
    # outside the auth check: refused requests are counted too
    broker.request_metrics = request_metrics = RequestMetrics(registry)
    middlewares: list[Any] = [request_metrics.middleware]
    if config.auth_file:
        from .._auth import Authorizer, auth_middleware

        broker.authorizer = Authorizer.from_file(config.auth_file)
        middlewares.append(auth_middleware(broker.authorizer))
    app = make_app(config.max_request_bytes, middlewares)
    app["broker"] = broker
    app.router.add_post(wire.BROKER_SEND, broker.send)
    if broker.authorizer is None:  # (the authorizer's check needs the Request)
        app.add_direct("POST", wire.BROKER_SEND, broker.send_direct)
    app.router.add_post(wire.BROKER_CANCEL, lifecycle.cancel)
    app.router.add_post(wire.BROKER_LOOKUP, lifecycle.lookup)
    app.router.add_post(wire.BROKER_RESCHEDULE, lifecycle.reschedule)
    app.router.add_post(wire.BROKER_PULL, broker.pull)
    app.router.add_post(wire.BROKER_GROUP_HEARTBEAT, group_heartbeat)
    app.router.add_post(wire.BROKER_TOPICS, broker.create_topic)
    app.router.add_get(wire.BROKER_TOPICS, broker.list_topics)
    app.router.add_get(wire.BROKER_STATS, broker.stats)
    app.router.add_get(wire.HEALTH, broker.health)
    app.router.add_get(wire.METRICS, metrics_handler(registry))
    return app, broker


#: the send path allocates a few short-lived container objects per message, so
#: with CPython's default gen-0 threshold (700) one 2000-message request ran ~20 young
#: collections and, every few requests, a full one over every module-level object. Young
#: collections every 10k allocations (~1 ms each, far below the firing lateness budget)
#: and a frozen startup heap: broker CPU per message of large msgpack batches -20 %.
GC_THRESHOLDS = (10_000, 10, 10)


def _tune_gc() -> None:
    """Broker processes only (``run``): nothing else shares the interpreter."""
    gc.collect()
    gc.freeze()  # modules, classes, config: never garbage, never scanned again
    gc.set_threshold(*GC_THRESHOLDS)


async def run(config: BrokerConfig) -> None:
    # Short GIL slices: the event loop fires and answers pulls, and each of its syscalls
    # lets the store's threads (syncer, loader, committer) take the GIL; it waits up to
    # one interval to get it back (measured: docs/decisions/0016-firing-on-the-event-loop.md).
    sys.setswitchinterval(0.0002)
    app, broker = create_app(config)
    await broker.start()
    _tune_gc()
    try:
        await serve(
            app,
            config.host,
            config.port,
            ssl_ctx=ssl_context(config.tls_cert, config.tls_key),
            ready_file=config.ready_file,
            on_ready=broker.register,
            exit_with_parent=config.exit_with_parent,
        )
    finally:
        await broker.stop()
