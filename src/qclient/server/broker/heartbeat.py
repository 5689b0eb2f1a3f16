"""Registration with every name server, repeated as the heartbeat."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable

import aiohttp

from ...protocol import wire

log = logging.getLogger(__name__)


class Heartbeat:
    """Registers the broker with all name servers now, then every ``interval_ms``."""

    def __init__(
        self,
        namesrv: list[str],
        interval_ms: int,
        registration: Callable[[], wire.BrokerRegistration],
        sign: Callable[[str, str, bytes], dict[str, str]] | None = None,
        ssl_ctx: ssl.SSLContext | None = None,
    ) -> None:
        self._namesrv = namesrv
        self._ssl = ssl_ctx  # verifies https:// name servers (None: system CAs)
        self._interval = interval_ms / 1000
        self._registration = registration
        self._sign = sign
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._failing: set[str] = set()  # name servers unreachable at the last try

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=3), connector=connector
        )
        await self.register_all()
        self._task = asyncio.create_task(self._loop())

    def kick(self) -> None:
        """Register again now (a topic was created)."""
        self._kick.set()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self._interval)
            self._kick.clear()
            await self.register_all()

    async def register_all(self) -> None:
        body = wire.encode(self._registration(), wire.MSGPACK)
        await asyncio.gather(*(self._post(a, wire.NAMESRV_REGISTER, body) for a in self._namesrv))

    async def _post(self, addr: str, path: str, body: bytes) -> None:
        assert self._session is not None
        headers = {"Content-Type": wire.MSGPACK}
        if self._sign is not None:
            headers.update(self._sign("POST", path, body))
        try:
            async with self._session.post(
                wire.base_url(addr) + path, data=body, headers=headers
            ) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    raise RuntimeError(f"HTTP {resp.status}: {text}")
            if addr in self._failing:
                self._failing.discard(addr)
                log.info("name server %s reachable again", addr)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError) as exc:
            # Log once per outage, not once per heartbeat.
            if addr not in self._failing:
                log.warning("cannot register with name server %s: %s", addr, exc)
            self._failing.add(addr)

    async def stop(self, unregister: wire.BrokerUnregistration | None = None) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if unregister is not None and self._session is not None:
            body = wire.encode(unregister, wire.MSGPACK)
            await asyncio.gather(
                *(self._post(a, wire.NAMESRV_UNREGISTER, body) for a in self._namesrv)
            )
        if self._session is not None:
            await self._session.close()
