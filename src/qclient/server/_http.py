"""HTTP plumbing shared by the name server and the broker: requests, responses, routes.

A small aiohttp-like surface: ``async def handler(request) -> Response``, middlewares
``async def mw(request, handler)``, routes with ``{name}`` path parameters; the server
under it is :mod:`._serve` (listening, stopping) and :mod:`._connection` (an
:class:`asyncio.Protocol` with the ``httptools`` parser).

Every error leaves as ``{"error": {"code", "message"}}`` with a 4xx/5xx status and a
one-line message; unknown paths and methods too. Bodies are negotiated between JSON and
MessagePack by ``Content-Type`` (the response mirrors the request).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote

import msgspec
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

from ..protocol import wire
from ..protocol.wire import ErrorCode

__all__ = [
    "ApiError",
    "Application",
    "DirectHandler",
    "Handler",
    "Middleware",
    "Request",
    "Response",
    "decode_body",
    "encoded_reply",
    "error_answer",
    "error_middleware",
    "error_response",
    "make_app",
    "media_type_of",
    "read_body",
    "reply",
    "response_type",
    "ssl_context",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_CONTENT_TYPE = "application/octet-stream"


class ApiError(Exception):
    """Raised by handlers; rendered as an error response."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# --- request / response ---------------------------------------------------------------


class _State(MutableMapping[str, Any]):
    """A dict of shared or per-request state on an object compared by identity (as
    aiohttp's ``request["k"]`` / ``app["k"]``)."""

    __slots__ = ()
    _state: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self._state[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._state[key] = value

    def __delitem__(self, key: str) -> None:
        del self._state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


def media_type_of(value: str | bytes | None) -> str:
    """The media type of a ``Content-Type`` value (lower case, no parameters)."""
    if not value:
        return DEFAULT_CONTENT_TYPE
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.partition(";")[0].strip().lower()


class Request(_State):
    """One parsed request; also a per-request dict (``request["k"]``) for middlewares."""

    __slots__ = (
        "_body",
        "_headers",
        "_query",
        "_raw_headers",
        "_response_type",
        "_state",
        "app",
        "content_type",
        "match_info",
        "method",
        "path",
        "query_string",
        "raw_path",
        "remote",
        "version",
    )

    def __init__(
        self,
        method: str,
        raw_path: str,
        query_string: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        app: Application,
        *,
        version: str = "1.1",
        remote: str | None = None,
        content_type: str | None = None,
    ) -> None:
        """``headers``: as received, latin-1 bytes (turned into :attr:`headers` when
        asked for); ``content_type``: the media type of its Content-Type, if the caller
        has it already."""
        self.method = method
        self.raw_path = raw_path
        self.path = unquote(raw_path) if "%" in raw_path else raw_path
        self.query_string = query_string
        self._raw_headers = headers
        self._headers: CIMultiDictProxy[str] | None = None
        #: the media type of ``Content-Type`` (lower case, no parameters)
        self.content_type = (
            content_type
            if content_type is not None
            else media_type_of(next((v for n, v in headers if n.lower() == b"content-type"), None))
        )
        self._response_type: str | None = None
        self.version = version
        self.remote = remote
        self.app = app
        self.match_info: dict[str, str] = {}
        self._body = body
        self._state: dict[str, Any] = {}
        self._query: MultiDictProxy[str] | None = None

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        if self._headers is None:
            self._headers = CIMultiDictProxy(
                CIMultiDict(
                    (n.decode("latin-1"), v.decode("latin-1")) for n, v in self._raw_headers
                )
            )
        return self._headers

    @property
    def content_length(self) -> int:
        return len(self._body)

    @property
    def query(self) -> MultiDictProxy[str]:
        if self._query is None:
            self._query = MultiDictProxy(
                MultiDict(parse_qsl(self.query_string, keep_blank_values=True))
            )
        return self._query

    async def read(self) -> bytes:
        """The whole body (already received and bounded by the app's size limit)."""
        return self._body

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.path}>"


class Response:
    """A complete response: status, body and content type (plus optional headers)."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"",
        text: str | None = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if text is not None:
            body = text.encode()
            content_type = content_type or "text/plain; charset=utf-8"
        self.status = status
        self.body = body
        self.content_type = content_type or DEFAULT_CONTENT_TYPE
        self.headers = headers

    def __repr__(self) -> str:
        return f"<Response {self.status} {len(self.body)} bytes>"


Handler = Callable[[Request], Awaitable[Response]]
Middleware = Callable[[Request, Handler], Awaitable[Response]]
#: ``handler(body, media_type, answer)``: a request answered without a Request object, a
#: task or the middlewares (see :meth:`Application.add_direct`); returns the Response, or
#: None and calls ``answer(response)`` once later, on the loop thread (never before it
#: returns)
DirectHandler = Callable[[bytes, str, Callable[[Response], None]], Response | None]


# --- application and routing ----------------------------------------------------------


class Router:
    """Static paths by dict lookup; ``/a/{name}`` paths by segment (one segment each)."""

    def __init__(self, app: Application) -> None:
        self._app = app
        self._static: dict[str, dict[str, Handler]] = {}
        self._dynamic: list[tuple[tuple[str | None, ...], tuple[str, ...], dict[str, Handler]]] = []

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        wrapped = self._app._wrap(handler)
        if "{" not in path:
            self._static.setdefault(path, {})[method] = wrapped
            return
        parts: list[str | None] = []
        names: list[str] = []
        for seg in path.split("/"):
            if seg.startswith("{") and seg.endswith("}"):
                parts.append(None)
                names.append(seg[1:-1])
            else:
                parts.append(seg)
        key = tuple(parts)
        for p, _n, methods in self._dynamic:
            if p == key:
                methods[method] = wrapped
                return
        self._dynamic.append((key, tuple(names), {method: wrapped}))

    def add_get(self, path: str, handler: Handler) -> None:
        """GET (and HEAD: the same answer without its body)."""
        self.add_route("GET", path, handler)
        self.add_route("HEAD", path, handler)

    def add_post(self, path: str, handler: Handler) -> None:
        self.add_route("POST", path, handler)

    def resolve(self, request: Request) -> Handler:
        """The (middleware-wrapped) handler of ``request``; fills ``match_info``."""
        methods = self._static.get(request.path)
        if methods is None:
            segs = request.raw_path.split("/")
            for parts, names, candidate in self._dynamic:
                if len(parts) != len(segs):
                    continue
                values: list[str] = []
                for want, seg in zip(parts, segs, strict=True):
                    if want is None:
                        if not seg:
                            break
                        values.append(unquote(seg))
                    elif unquote(want) != unquote(seg):
                        break
                else:
                    request.match_info = dict(zip(names, values, strict=True))
                    methods = candidate
                    break
        if methods is None:
            return self._app._not_found
        handler = methods.get(request.method)
        return self._app._not_allowed if handler is None else handler


class Application(_State):
    """Routes, middlewares, shared state (``app["k"]``) and startup/cleanup hooks."""

    def __init__(
        self, *, max_request_bytes: int, middlewares: list[Middleware] | None = None
    ) -> None:
        self.max_request_bytes = max_request_bytes
        self.middlewares: tuple[Middleware, ...] = tuple(middlewares or ())
        self.router = Router(self)
        #: ``async def ctx(app)`` generators: code before ``yield`` runs at startup,
        #: after it at cleanup (in reverse order)
        self.cleanup_ctx: list[Callable[[Application], AsyncIterator[None]]] = []
        #: requests handed to a handler that has not started yet (kept by the server): a
        #: handler that sees 0 is the last one its loop iteration runs
        self.pending_handlers = 0
        #: (method, path) -> its direct handler, as bytes (see :meth:`add_direct`)
        self.direct: dict[tuple[bytes, bytes], DirectHandler] = {}
        self._state: dict[str, Any] = {}
        self._not_found = self._wrap(_not_found)
        self._not_allowed = self._wrap(_not_allowed)

    def add_direct(self, method: str, path: str, handler: DirectHandler) -> None:
        """Answer a request to exactly ``method path`` (a static route whose handler is
        added as usual too) with ``handler``, called by the server as the request is
        parsed when its connection has nothing else in flight; pipelined requests, paths
        spelled differently (percent-escapes) and every other case take the route's
        handler. The middlewares are not run: the caller answers for what they do (errors
        as :func:`error_answer` gives them, metrics)."""
        self.direct[(method.encode(), path.encode())] = handler

    def _wrap(self, handler: Handler) -> Handler:
        for mw in reversed(self.middlewares):
            handler = _bind(mw, handler)
        return handler

    def __repr__(self) -> str:
        return f"<Application {len(self.router._static)} static path(s)>"


def _bind(mw: Middleware, handler: Handler) -> Handler:
    # a plain function handing over the middleware's own awaitable: one coroutine per
    # middleware and request, not two
    def bound(request: Request) -> Awaitable[Response]:
        return mw(request, handler)

    return bound


async def _not_found(request: Request) -> Response:
    raise ApiError(404, ErrorCode.NOT_FOUND, f"no such endpoint: {request.method} {request.path}")


async def _not_allowed(request: Request) -> Response:
    raise ApiError(
        405, ErrorCode.METHOD_NOT_ALLOWED, f"method {request.method} not allowed on {request.path}"
    )


# --- errors and bodies ----------------------------------------------------------------


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_response(status: int, code: str, message: str, content_type: str = wire.JSON) -> Response:
    body = wire.ErrorResponse(wire.ErrorBody(code=code, message=_one_line(message)))
    ct = wire.media_type(content_type)
    return Response(status=status, body=wire.encode(body, ct), content_type=ct)


def response_type(request: Request) -> str:
    """The encoding of the answer: the request's own, JSON if it names none we know."""
    ct = request._response_type
    if ct is None:
        ct = request._response_type = wire.media_type(request.content_type)
    return ct


def reply(request: Request, obj: Any, status: int = 200) -> Response:
    return encoded_reply(response_type(request), obj, status)


def encoded_reply(answer_type: str, obj: Any, status: int = 200) -> Response:
    """``obj`` encoded as ``answer_type`` (a media type of ``wire.MEDIA_TYPES``)."""
    return Response(status=status, body=wire.encode(obj, answer_type), content_type=answer_type)


def text_reply(request: Request, body: bytes, content_type: str) -> Response:
    """A 200 with a body that is not a protocol message (``/metrics``' text format)."""
    return Response(body=body, content_type=content_type)


def decode_body(data: bytes, content_type: str, typ: type[T]) -> T:
    """Schema-check a JSON or MessagePack body of media type ``content_type``."""
    if content_type not in wire.MEDIA_TYPES:
        raise ApiError(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type must be {' or '.join(wire.MEDIA_TYPES)}, got {content_type!r}",
        )
    if not data:
        raise ApiError(400, ErrorCode.INVALID_REQUEST, "empty request body")
    try:
        return wire.decode(data, typ, content_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ApiError(400, ErrorCode.INVALID_REQUEST, f"malformed request body: {exc}") from None


async def read_body(request: Request, typ: type[T]) -> T:
    """Read and schema-check a JSON or MessagePack body."""
    return decode_body(await request.read(), request.content_type, typ)


def error_answer(exc: Exception, method: str, path: str, answer_type: str) -> Response:
    """The one-line error response of a handler's exception (``answer_type``: the
    encoding of the answer); one that is not an ApiError is a bug: logged, 500."""
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.code, exc.message, answer_type)
    log.error("internal error on %s %s", method, path, exc_info=exc)
    return error_response(
        500, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}", answer_type
    )


async def error_middleware(request: Request, handler: Handler) -> Response:
    """Every exception of a handler becomes a one-line error response (a bug: 500)."""
    try:
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # an ApiError, or a bug: say so in one line, keep serving
        return error_answer(exc, request.method, request.path, response_type(request))


def make_app(max_request_bytes: int, middlewares: list[Any] | None = None) -> Application:
    app = Application(
        max_request_bytes=max_request_bytes, middlewares=[error_middleware, *(middlewares or [])]
    )
    app["max_request_bytes"] = max_request_bytes
    return app


def ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx
