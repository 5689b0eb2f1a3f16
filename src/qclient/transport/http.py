"""httpx calls to brokers and name servers, sync and asyncio, with request signing."""

from __future__ import annotations

import functools
import logging
import os
import ssl
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from ..protocol import auth
from ..protocol.wire import MEDIA_TYPES, MSGPACK, base_url, media_type
from .lean import LeanTransport
from .lean_async import LeanAsyncTransport

__all__ = ["AsyncHttp", "AsyncLeanHttp", "Credentials", "HttpResponse", "SyncHttp", "base_url"]

log = logging.getLogger(__name__)

try:  # httpcore imports sniffio on every asyncio request; when it is not installed each
    import sniffio  # noqa: F401  failed import re-scans sys.path (measured: ~1 ms a request)
except ImportError:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]  # fail fast instead


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key pair; the secret never shows in reprs."""

    access_key: str
    secret_key: str

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key!r}, secret_key=***)"

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        return auth.sign_headers(self.access_key, self.secret_key, method, path, body)


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """What the SDK needs of an HTTP response."""

    status: int
    content_type: str
    content: bytes

    @property
    def media_type(self) -> str:
        return media_type(self.content_type)


def _timeout(seconds: float) -> httpx.Timeout:
    # One budget for each phase: a hung peer costs at most this much per phase.
    return httpx.Timeout(seconds)


def tls_verify(verify: bool | str | ssl.SSLContext) -> bool | ssl.SSLContext:
    """httpx's ``verify`` from a bool, a CA bundle file / directory path, or a context.

    (httpx 0.28 deprecates ``verify=<path>``, so the context is built here.)
    ``True`` gives one process-wide context on certifi's CA bundle: what httpx would build
    for each client (35-50 ms each), built once.
    """
    if verify is True:
        return _default_context()
    if isinstance(verify, str):
        if os.path.isdir(verify):
            return ssl.create_default_context(capath=verify)
        return ssl.create_default_context(cafile=verify)
    return verify


@functools.cache
def _default_context() -> ssl.SSLContext:
    # httpx's verify=True context with trust_env=False: certifi's bundle, not the system store
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


#: connections per client; AsyncHttp admits this many requests at once (``slots``)
MAX_CONNECTIONS = 64


def _limits() -> httpx.Limits:
    return httpx.Limits(
        max_connections=MAX_CONNECTIONS, max_keepalive_connections=32, keepalive_expiry=30
    )


class _Base:
    def __init__(
        self,
        *,
        content_type: str = MSGPACK,
        credentials: Credentials | None = None,
        verify: bool | str = True,
    ) -> None:
        self.content_type = content_type
        self.credentials = credentials
        self.verify = verify
        # every encoding the SDK decodes, its own first (a new codec in wire adds itself)
        accept = ", ".join([content_type, *(t for t in MEDIA_TYPES if t != content_type)])
        self._req_headers = {"Content-Type": content_type, "Accept": accept}
        self._items = tuple(self._req_headers.items())

    def _headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        if self.credentials is None:
            return self._req_headers
        return {**self._req_headers, **self.credentials.headers(method, path, body)}

    def _header_items(self, method: str, path: str, body: bytes) -> Iterable[tuple[str, str]]:
        """The headers as the lean transports take them (unsigned: built once)."""
        if self.credentials is None:
            return self._items
        return self._headers(method, path, body).items()

    def __repr__(self) -> str:
        signed = "signed" if self.credentials else "unsigned"
        return f"{type(self).__name__}({self.content_type}, {signed})"


class SyncHttp(_Base):
    """Blocking calls, thread-safe. ``lean`` (the default): on a :class:`LeanTransport`, the
    SDK's fast path; otherwise on one pooled ``httpx.Client`` (every httpx feature, and what
    ``respx`` intercepts). Both raise httpx's exceptions."""

    def __init__(
        self,
        *,
        content_type: str = MSGPACK,
        credentials: Credentials | None = None,
        verify: bool | str = True,
        client: httpx.Client | None = None,
        lean: bool = True,
    ) -> None:
        super().__init__(content_type=content_type, credentials=credentials, verify=verify)
        self._lean: LeanTransport | None = None
        self._client: httpx.Client | None = client
        if lean and client is None:
            self._lean = LeanTransport(ssl_context=functools.partial(_lean_ssl, verify))
        elif client is None:
            # trust_env=False: loopback and cluster traffic must not go through an env proxy
            self._client = httpx.Client(
                limits=_limits(), verify=tls_verify(verify), trust_env=False
            )

    def request(
        self,
        method: str,
        addr: str,
        path: str,
        body: bytes = b"",
        *,
        timeout: float,
        on_write: Callable[[], None] | None = None,
    ) -> HttpResponse:
        """One request; raises ``httpx.HTTPError`` subclasses on transport failure.
        ``on_write`` is called once the request is written (or before it may wait)."""
        lean = self._lean
        if lean is not None:
            headers = self._header_items(method, path, body)
            r = lean.request(method, addr, path, body, headers, timeout=timeout, on_write=on_write)
            return HttpResponse(r.status, r.headers.get("content-type", ""), r.content)
        assert self._client is not None  # not lean: a client was given or built
        if on_write is not None:
            on_write()  # httpx gives no hook after the write
        resp = self._client.request(
            method,
            base_url(addr) + path,
            content=body or None,
            headers=self._headers(method, path, body),
            timeout=_timeout(timeout),
        )
        return HttpResponse(resp.status_code, resp.headers.get("content-type", ""), resp.content)

    def perform(self, call: Any, on_write: Callable[[], None] | None = None) -> HttpResponse:
        """A plan's call (``producer._plan.HttpCall``): POST its payload to its broker."""
        return self.request(
            "POST", call.addr, call.path, call.payload(), timeout=call.timeout, on_write=on_write
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._lean is not None:
            self._lean.close()


def _lean_ssl(verify: bool | str | ssl.SSLContext) -> ssl.SSLContext:
    """The TLS context of a lean transport for httpx's ``verify`` values."""
    v = tls_verify(verify)
    if v is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return v if isinstance(v, ssl.SSLContext) else _default_context()


class AsyncHttp(_Base):
    """asyncio calls on one pooled ``httpx.AsyncClient``."""

    def __init__(
        self,
        *,
        content_type: str = MSGPACK,
        credentials: Credentials | None = None,
        verify: bool | str = True,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(content_type=content_type, credentials=credentials, verify=verify)
        self._client = client or httpx.AsyncClient(
            limits=_limits(), verify=tls_verify(verify), trust_env=False
        )

    async def request(
        self, method: str, addr: str, path: str, body: bytes = b"", *, timeout: float
    ) -> HttpResponse:
        r = await self._client.request(
            method,
            base_url(addr) + path,
            content=body or None,
            headers=self._headers(method, path, body),
            timeout=_timeout(timeout),
        )
        return HttpResponse(r.status_code, r.headers.get("content-type", ""), r.content)

    async def perform(self, call: Any) -> HttpResponse:
        """A plan's call (``producer._plan.HttpCall``): POST its payload to its broker."""
        return await self.request(
            "POST", call.addr, call.path, call.payload(), timeout=call.timeout
        )

    async def aclose(self) -> None:
        await self._client.aclose()


class AsyncLeanHttp(_Base):
    """asyncio calls on a :class:`LeanAsyncTransport`: the same interface and errors as
    ``AsyncHttp`` at a fraction of httpx's per-request CPU, for ``AsyncProducer``'s and the
    ``send_async`` sender's sends. Create and use it on one running event loop."""

    def __init__(
        self,
        *,
        content_type: str = MSGPACK,
        credentials: Credentials | None = None,
        verify: bool | str = True,
    ) -> None:
        super().__init__(content_type=content_type, credentials=credentials, verify=verify)
        self._lean = LeanAsyncTransport(ssl_context=functools.partial(_lean_ssl, verify))

    async def request(
        self, method: str, addr: str, path: str, body: bytes = b"", *, timeout: float
    ) -> HttpResponse:
        """One request; raises ``httpx.HTTPError`` subclasses on transport failure."""
        headers = self._header_items(method, path, body)
        r = await self._lean.request(method, addr, path, body, headers, timeout=timeout)
        return HttpResponse(r.status, r.headers.get("content-type", ""), r.content)

    async def perform(self, call: Any) -> HttpResponse:
        """A plan's call (``producer._plan.HttpCall``): POST its payload to its broker."""
        return await self.request(
            "POST", call.addr, call.path, call.payload(), timeout=call.timeout
        )

    async def aclose(self) -> None:
        await self._lean.aclose()
