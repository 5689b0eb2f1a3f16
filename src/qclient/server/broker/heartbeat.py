"""Registration with every name server, repeated as the heartbeat.

Each registration is one HTTP/1.1 POST on a connection of its own (``Connection:
close``), its answer parsed by ``httptools`` (llhttp, which the servers' request parser
already loads): an HTTP client library costs a broker's start more than everything else
it imports (aiohttp's client: ~0.3 of a broker's 0.57 CPU seconds to ready), and a beat
every few seconds on loopback needs no pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import httptools

from ...protocol import wire

log = logging.getLogger(__name__)

#: a registration's bound: connect, send and answer (seconds)
POST_TIMEOUT_S = 3.0
#: the most of an answer read (a registration's answer is a few bytes; an error's text is
#: cut to 200 characters in the log)
_MAX_ANSWER = 64 * 1024


class _Answer:
    """httptools' callbacks: the status comes from the parser, the body from here."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.complete = False

    def on_body(self, data: bytes) -> None:
        if len(self.body) < _MAX_ANSWER:
            self.body += data[: _MAX_ANSWER - len(self.body)]

    def on_message_complete(self) -> None:
        self.complete = True


async def post(
    url: str, headers: Mapping[str, str], body: bytes, ssl_ctx: ssl.SSLContext | None
) -> tuple[int, bytes]:
    """POST ``body`` to ``url`` on a new connection; ``(status, body)`` of the answer.
    Raises OSError, ``httptools.HttpParserError`` or ConnectionError (closed early)."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if tls else 80)
    ctx = (ssl_ctx or ssl.create_default_context()) if tls else None
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
    try:
        head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        writer.write("\r\n".join(head).encode("latin-1") + body)
        await writer.drain()
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        while not answer.complete:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("the name server closed the connection before answering")
            parser.feed_data(data)
        return parser.get_status_code(), bytes(answer.body)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


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
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._failing: set[str] = set()  # name servers unreachable at the last try

    async def start(self) -> None:
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
        headers = {"Content-Type": wire.MSGPACK}
        if self._sign is not None:
            headers.update(self._sign("POST", path, body))
        try:
            async with asyncio.timeout(POST_TIMEOUT_S):
                status, answer = await post(wire.base_url(addr) + path, headers, body, self._ssl)
            if status != 200:
                text = answer[:200].decode(errors="replace")
                raise RuntimeError(f"HTTP {status}: {text}")
            if addr in self._failing:
                self._failing.discard(addr)
                log.info("name server %s reachable again", addr)
        except (TimeoutError, RuntimeError, OSError, httptools.HttpParserError) as exc:
            # Log once per outage, not once per heartbeat.
            if addr not in self._failing:
                reason = str(exc) or f"no answer within {POST_TIMEOUT_S:g} s"
                log.warning("cannot register with name server %s: %s", addr, reason)
            self._failing.add(addr)

    async def stop(self, unregister: wire.BrokerUnregistration | None = None) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if unregister is not None:
            body = wire.encode(unregister, wire.MSGPACK)
            await asyncio.gather(
                *(self._post(a, wire.NAMESRV_UNREGISTER, body) for a in self._namesrv)
            )
