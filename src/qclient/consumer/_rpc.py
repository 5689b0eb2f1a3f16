"""One request of a consumer to a broker, with the SDK's error mapping."""

from __future__ import annotations

from typing import TypeVar

import httpx
import msgspec

from ..errors import QClientError
from ..protocol import wire
from ..transport.errors import classify_exception, error_for_code, parse_error_response
from ..transport.http import SyncHttp

__all__ = ["call"]

T = TypeVar("T")


def call(
    http: SyncHttp,
    broker: str,
    addr: str,
    path: str,
    req: object,
    typ: type[T],
    *,
    topic: str,
    timeout: float,
) -> T | None:
    """POST ``req`` and decode a ``typ``; ``None`` when the topic does not exist on that
    broker (yet). Transport failures and error answers raise ``QClientError``s."""
    body = wire.encode(req, wire.MSGPACK)
    try:
        resp = http.request("POST", addr, path, body, timeout=timeout)
    except httpx.HTTPError as exc:
        raise classify_exception(exc, broker=broker, timeout=timeout)[1] from None
    if resp.status == 404:
        return None
    if resp.status != 200:
        code, message = parse_error_response(resp)
        raise error_for_code(code, message, broker=broker, topic=topic, status=resp.status)
    try:
        return wire.decode(resp.content, typ, resp.media_type)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise QClientError(f"broker {broker}: malformed response: {exc}") from None
