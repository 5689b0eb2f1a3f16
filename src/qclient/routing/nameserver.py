"""Name-server client: route and broker queries with failover over a list of name servers.

The decisions (which server next, what an answer means) live in ``_NameServerCore``;
``NameServerClient`` and ``AsyncNameServerClient`` only do the I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar
from urllib.parse import quote

import httpx
import msgspec

from ..errors import InvalidMessageError, NameServerUnavailableError, RouteNotFoundError
from ..protocol.wire import (
    HEALTH,
    MSGPACK,
    NAMESRV_BROKERS,
    NAMESRV_ROUTE,
    BrokerList,
    ErrorCode,
    Health,
    TopicRoute,
    decode,
    split_addrs,
    valid_topic,
)
from ..transport.errors import parse_error_response
from ..transport.http import AsyncHttp, HttpResponse, SyncHttp

__all__ = ["AsyncNameServerClient", "NameServerClient"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class _NotFound(Exception):
    """A name server answered that it does not know the topic."""


class _NameServerCore:
    """Failover order and answer interpretation, shared by the sync and async clients."""

    def __init__(self, addrs: str | Sequence[str], timeout: float) -> None:
        self.addrs = split_addrs(addrs)
        self.timeout = timeout
        self._current = 0  # the server that answered last is asked first

    def order(self) -> list[int]:
        n = len(self.addrs)
        return [(self._current + i) % n for i in range(n)]

    def answered(self, i: int) -> None:
        if i != self._current:
            log.info("name server %s answers; using it first", self.addrs[i])
        self._current = i

    @staticmethod
    def route_path(topic: str) -> str:
        if not isinstance(topic, str) or not valid_topic(topic):
            raise InvalidMessageError(f"invalid topic {topic!r}")
        return NAMESRV_ROUTE.format(topic=quote(topic, safe=""))

    @staticmethod
    def parse(resp: HttpResponse, typ: type[T]) -> T:
        """The decoded body, ``_NotFound``, or an exception that means "ask the next one"."""
        if resp.status == 200:
            return decode(resp.content, typ, resp.media_type)
        code, message = parse_error_response(resp)
        if resp.status == 404 and code == ErrorCode.TOPIC_NOT_FOUND:
            raise _NotFound(message)
        raise RuntimeError(f"HTTP {resp.status} {code}: {message}")

    def failure(
        self, what: str, errors: list[str], not_found: bool, topic: str | None = None
    ) -> Exception:
        asked = ", ".join(self.addrs)
        if not_found and topic is not None:
            return RouteNotFoundError(
                f"no route for topic {topic!r}: unknown to the name servers asked ({asked})",
                topic=topic,
                namesrv=self.addrs,
            )
        detail = "; ".join(errors)
        return NameServerUnavailableError(f"{what}: no name server answered ({detail})")


_RETRY_NEXT = (httpx.HTTPError, msgspec.DecodeError, msgspec.ValidationError, RuntimeError)


class NameServerClient:
    """Blocking name-server client. ``NameServerClient("h:p,h2:p2", timeout=3.0)``."""

    def __init__(
        self,
        addrs: str | Sequence[str],
        *,
        timeout: float = 3.0,
        verify: bool | str = True,
        http: SyncHttp | None = None,
    ) -> None:
        self._core = _NameServerCore(addrs, timeout)
        self._own_http = http is None
        self._http = http or SyncHttp(content_type=MSGPACK, verify=verify)

    @property
    def addrs(self) -> tuple[str, ...]:
        return self._core.addrs

    def _get(self, path: str, typ: type[T], what: str, topic: str | None = None) -> T:
        errors: list[str] = []
        not_found = False
        for i in self._core.order():
            addr = self._core.addrs[i]
            try:
                resp = self._http.request("GET", addr, path, timeout=self._core.timeout)
                result = self._core.parse(resp, typ)
            except _NotFound:
                not_found = True
                continue
            except _RETRY_NEXT as exc:
                log.warning("name server %s failed %s: %s", addr, what, exc)
                errors.append(f"{addr}: {type(exc).__name__}: {exc}")
                continue
            self._core.answered(i)
            return result
        raise self._core.failure(what, errors, not_found, topic)

    def get_route(self, topic: str) -> TopicRoute:
        """The topic's route; ``RouteNotFoundError`` / ``NameServerUnavailableError``."""
        return self._get(self._core.route_path(topic), TopicRoute, f"route of {topic!r}", topic)

    def list_brokers(self) -> BrokerList:
        """Every registered broker."""
        return self._get(NAMESRV_BROKERS, BrokerList, "list brokers")

    def health(self) -> Health:
        """The health of the first name server that answers."""
        return self._get(HEALTH, Health, "health")

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> NameServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NameServerClient({list(self._core.addrs)!r})"


class AsyncNameServerClient:
    """asyncio flavour of ``NameServerClient``."""

    def __init__(
        self,
        addrs: str | Sequence[str],
        *,
        timeout: float = 3.0,
        verify: bool | str = True,
        http: AsyncHttp | None = None,
    ) -> None:
        self._core = _NameServerCore(addrs, timeout)
        self._own_http = http is None
        self._http = http or AsyncHttp(content_type=MSGPACK, verify=verify)

    @property
    def addrs(self) -> tuple[str, ...]:
        return self._core.addrs

    async def _get(self, path: str, typ: type[T], what: str, topic: str | None = None) -> T:
        errors: list[str] = []
        not_found = False
        for i in self._core.order():
            addr = self._core.addrs[i]
            try:
                resp = await self._http.request("GET", addr, path, timeout=self._core.timeout)
                result = self._core.parse(resp, typ)
            except _NotFound:
                not_found = True
                continue
            except _RETRY_NEXT as exc:
                log.warning("name server %s failed %s: %s", addr, what, exc)
                errors.append(f"{addr}: {type(exc).__name__}: {exc}")
                continue
            self._core.answered(i)
            return result
        raise self._core.failure(what, errors, not_found, topic)

    async def get_route(self, topic: str) -> TopicRoute:
        return await self._get(
            self._core.route_path(topic), TopicRoute, f"route of {topic!r}", topic
        )

    async def list_brokers(self) -> BrokerList:
        return await self._get(NAMESRV_BROKERS, BrokerList, "list brokers")

    async def health(self) -> Health:
        return await self._get(HEALTH, Health, "health")

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    close = aclose

    async def __aenter__(self) -> AsyncNameServerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncNameServerClient({list(self._core.addrs)!r})"
