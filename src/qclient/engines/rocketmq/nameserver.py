"""Routes from RocketMQ NameServers (``GET_ROUTEINFO_BY_TOPIC``), with failover.

A topic no NameServer knows yet is routed like RocketMQ's producer does: through the
default topic ``TBW102``, whose brokers create the topic on its first send
(``autoCreateTopicEnable``); such a route is marked ``auto_create`` and kept young, so the
real route replaces it as soon as the brokers register the new topic.

A NameServer keeps its routes in memory only, and brokers register with it every
``registerNameServerPeriod`` (30 s by default). One reached again on a new connection may
have restarted: until that period has passed, its routes may lack a live broker group, or
list a group's slave before its master. Its routes are marked ``partial`` meanwhile, so the
producer keeps the groups and masters of its last route and asks again soon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import msgspec

from ...errors import InvalidMessageError, NameServerUnavailableError, RouteNotFoundError
from ...protocol.wire import QueueData, TopicRoute, valid_topic
from .aio import AsyncConnectionPool
from .codes import RequestCode, ResponseCode, code_name
from .connection import RemotingError
from .pool import ConnectionPool
from .remoting import RemotingCommand, RemotingProtocolError, request
from .route import parse_route

__all__ = [
    "AUTO_CREATE_TOPIC",
    "DEFAULT_TOPIC_QUEUES",
    "AsyncRocketMQNameServer",
    "RocketMQNameServer",
]

log = logging.getLogger(__name__)

#: the topic whose route names the brokers that create unknown topics on first send
AUTO_CREATE_TOPIC = "TBW102"
#: queues of a topic created on first send (the Java producer's defaultTopicQueueNums)
DEFAULT_TOPIC_QUEUES = 4


#: how long the routes of a NameServer reached again on a new connection are ``partial``:
#: brokers' default registration period (30 s), and a margin for one that was late
REREGISTER_S = 35.0


class _NotFound(Exception):
    pass


class _Failover:
    """Which NameServer to ask next, and what an answer means (no I/O)."""

    def __init__(
        self,
        addrs: str | Sequence[str],
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.addrs = (addrs,) if isinstance(addrs, str) else tuple(addrs)
        self.timeout = timeout
        self.current = 0
        self._clock = clock
        self._conns: dict[str, object] = {}  # addr -> the connection last asked
        self._young_until: dict[str, float] = {}  # addr -> ``clock()`` end of ``partial``

    def order(self) -> list[str]:
        n = len(self.addrs)
        return [self.addrs[(self.current + i) % n] for i in range(n)]

    def answered(self, addr: str) -> None:
        self.current = self.addrs.index(addr)

    def asking(self, addr: str, conn: object) -> None:
        """A request to ``addr`` goes out on ``conn``: a connection other than the last
        one asked there (the first one excepted) may reach a NameServer that restarted."""
        last = self._conns.get(addr)
        if last is not conn:
            if last is not None:
                self._young_until[addr] = self._clock() + REREGISTER_S
            self._conns[addr] = conn

    def young(self, addr: str, route: TopicRoute) -> TopicRoute:
        """``route`` as ``addr`` gave it, ``partial`` while that NameServer may not have
        heard from every broker since it was reached again."""
        until = self._young_until.get(addr)
        if until is None or route.partial:
            return route
        if self._clock() >= until:
            del self._young_until[addr]
            return route
        return msgspec.structs.replace(route, partial=True)

    @staticmethod
    def route_request(topic: str) -> RemotingCommand:
        if not isinstance(topic, str) or not valid_topic(topic):
            raise InvalidMessageError(f"invalid topic {topic!r}")
        return request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})

    @staticmethod
    def read(topic: str, answer: RemotingCommand) -> TopicRoute:
        if answer.code == ResponseCode.TOPIC_NOT_EXIST:
            raise _NotFound(answer.remark or "")
        if answer.code != ResponseCode.SUCCESS:
            raise RemotingProtocolError(f"{code_name(answer.code)}: {answer.remark}")
        return parse_route(topic, answer.body)

    def failure(
        self, topic: str, errors: list[str], not_found: bool, auto_create: bool = False
    ) -> Exception:
        asked = ", ".join(self.addrs)
        if not_found and not errors:
            tail = (
                f", and no broker creates topics ({AUTO_CREATE_TOPIC} has no route)"
                if auto_create
                else ""
            )
            return RouteNotFoundError(
                f"no route for topic {topic!r}: unknown to the NameServers asked ({asked}){tail}",
                topic=topic,
                namesrv=self.addrs,
            )
        return NameServerUnavailableError(
            f"route of {topic!r}: no NameServer answered ({'; '.join(errors)})"
        )


def auto_create_route(topic: str, default: TopicRoute) -> TopicRoute:
    """The route of a topic that the default topic's brokers create on first send (the Java
    producer's ``topicRouteData2TopicPublishInfo`` of ``TBW102``, queues capped)."""
    queues = [
        QueueData(
            q.broker_name,
            min(q.read_queue_nums, DEFAULT_TOPIC_QUEUES),
            min(q.write_queue_nums, DEFAULT_TOPIC_QUEUES),
            q.perm,
        )
        for q in default.queue_datas
    ]
    return TopicRoute(topic, queues, list(default.broker_datas), auto_create=True, partial=True)


class RocketMQNameServer:
    """Blocking client of a list of NameServers."""

    def __init__(
        self,
        addrs: str | Sequence[str],
        *,
        timeout: float = 3.0,
        pool: ConnectionPool | None = None,
    ) -> None:
        self._f = _Failover(addrs, timeout)
        self._own_pool = pool is None
        self._pool = pool or ConnectionPool(connect_timeout=timeout)

    @property
    def addrs(self) -> tuple[str, ...]:
        return self._f.addrs

    def _route(self, topic: str) -> TopicRoute:
        cmd = self._f.route_request(topic)
        errors: list[str] = []
        not_found = False
        for addr in self._f.order():
            try:
                conn = self._pool.get(addr)
                self._f.asking(addr, conn)
                answer = conn.call(cmd, self._f.timeout)
                route = self._f.young(addr, self._f.read(topic, answer))
            except _NotFound:
                not_found = True
                continue
            except (RemotingError, RemotingProtocolError, OSError, ValueError) as exc:
                self._pool.discard(addr)
                log.warning("NameServer %s failed the route of %s: %s", addr, topic, exc)
                errors.append(f"{addr}: {type(exc).__name__}: {exc}")
                continue
            finally:
                cmd = self._f.route_request(topic)  # a fresh opaque per attempt
            self._f.answered(addr)
            return route
        raise self._f.failure(topic, errors, not_found)

    def route(self, topic: str) -> TopicRoute:
        """The topic's route as the NameServers have it; ``RouteNotFoundError`` if none."""
        return self._route(topic)

    def get_route(self, topic: str) -> TopicRoute:
        """The topic's route; an unknown topic gets the auto-create route of ``TBW102``."""
        try:
            return self._route(topic)
        except RouteNotFoundError:
            try:
                default = self._route(AUTO_CREATE_TOPIC)
            except RouteNotFoundError:
                raise self._f.failure(topic, [], True, auto_create=True) from None
            return auto_create_route(topic, default)

    def close(self) -> None:
        if self._own_pool:
            self._pool.close()

    def __enter__(self) -> RocketMQNameServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRocketMQNameServer:
    """asyncio client of a list of NameServers."""

    def __init__(self, addrs: str | Sequence[str], *, timeout: float = 3.0) -> None:
        self._f = _Failover(addrs, timeout)
        self._pool = AsyncConnectionPool(connect_timeout=timeout)

    async def _route(self, topic: str) -> TopicRoute:
        errors: list[str] = []
        not_found = False
        for addr in self._f.order():
            try:
                conn = await self._pool.get(addr)
                self._f.asking(addr, conn)
                answer = await conn.call(self._f.route_request(topic), self._f.timeout)
                route = self._f.young(addr, self._f.read(topic, answer))
            except _NotFound:
                not_found = True
                continue
            except (RemotingError, RemotingProtocolError, OSError, ValueError) as exc:
                await self._pool.discard(addr)
                log.warning("NameServer %s failed the route of %s: %s", addr, topic, exc)
                errors.append(f"{addr}: {type(exc).__name__}: {exc}")
                continue
            self._f.answered(addr)
            return route
        raise self._f.failure(topic, errors, not_found)

    async def get_route(self, topic: str) -> TopicRoute:
        try:
            return await self._route(topic)
        except RouteNotFoundError:
            try:
                default = await self._route(AUTO_CREATE_TOPIC)
            except RouteNotFoundError:
                raise self._f.failure(topic, [], True, auto_create=True) from None
            return auto_create_route(topic, default)

    async def aclose(self) -> None:
        await self._pool.close()
