"""Responses and transport failures -> typed ``qclient.errors`` and a fault outcome."""

from __future__ import annotations

import enum

import httpx
import msgspec

from ..errors import (
    AuthError,
    BrokerResponseError,
    BrokerUnavailableError,
    InvalidMessageError,
    MessageTooLargeError,
    QClientError,
    RouteNotFoundError,
    SendTimeoutError,
)
from ..protocol.wire import RETRYABLE_CODES, ErrorCode, ErrorResponse, decode
from .http import HttpResponse

__all__ = [
    "Outcome",
    "classify_exception",
    "error_for_code",
    "parse_error_response",
    "response_outcome",
]


class Outcome(enum.Enum):
    """How an attempt ended, for the retry decision and the fault policy
    (``qclient.fault.policy``, which alone decides what isolates a broker)."""

    OK = "ok"  # answered: latency only, reachable
    CLIENT = "client"  # failed before the request left: reachable, retry
    TRANSPORT = "transport"  # connect/read failure or timeout: isolate, retry
    BROKER = "broker"  # retryable broker error: isolate, unreachable, retry
    FINAL = "final"  # the answer will not change (bad input, auth): no isolation, no retry


_INVALID = {
    ErrorCode.INVALID_REQUEST,
    ErrorCode.INVALID_TOPIC,
    ErrorCode.INVALID_MESSAGE,
    ErrorCode.INVALID_DELAY,
}
_TOO_LARGE = {ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.BATCH_TOO_LARGE, ErrorCode.PAYLOAD_TOO_LARGE}
_AUTH = {ErrorCode.UNAUTHORIZED, ErrorCode.FORBIDDEN}


def error_for_code(
    code: str, message: str, *, broker: str | None, topic: str = "", status: int | None = None
) -> QClientError:
    """The typed error for a broker error code."""
    text = f"broker {broker}: {code}: {message}" if broker else f"{code}: {message}"
    if code in _AUTH:
        return AuthError(text, code=code)
    if code in _TOO_LARGE:
        return MessageTooLargeError(text)
    if code in _INVALID:
        return InvalidMessageError(text)
    if code == ErrorCode.TOPIC_NOT_FOUND:
        return RouteNotFoundError(text, topic=topic)
    if code in RETRYABLE_CODES:
        return BrokerUnavailableError(text, broker_name=broker)
    return BrokerResponseError(text, code=code, broker_name=broker, status_code=status)


def parse_error_response(resp: HttpResponse) -> tuple[str, str]:
    """``(code, message)`` of a non-2xx response, tolerating a body that is not ours."""
    try:
        err = decode(resp.content, ErrorResponse, resp.media_type).error
        return err.code, err.message
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = resp.content[:200].decode("utf-8", "replace").strip().replace("\n", " ")
        if resp.status in (401,):
            return ErrorCode.UNAUTHORIZED, text or "unauthorized"
        if resp.status == 403:
            return ErrorCode.FORBIDDEN, text or "forbidden"
        if resp.status == 413:
            return ErrorCode.PAYLOAD_TOO_LARGE, text or "payload too large"
        if resp.status == 503:
            return ErrorCode.BROKER_BUSY, text or "service unavailable"
        if resp.status >= 500:
            return ErrorCode.INTERNAL, f"HTTP {resp.status} {text}".strip()
        return ErrorCode.INVALID_REQUEST, f"HTTP {resp.status} {text}".strip()


def response_outcome(code: str, status: int) -> Outcome:
    """Outcome of an error response with ``code``."""
    if code in _AUTH or status in (401, 403):
        return Outcome.FINAL  # never retried, never isolates the broker
    if code in RETRYABLE_CODES:
        return Outcome.BROKER
    return Outcome.FINAL


def classify_exception(
    exc: BaseException, *, broker: str | None, timeout: float
) -> tuple[Outcome, QClientError]:
    """Outcome and typed error of an exception raised by an HTTP call."""
    where = f"broker {broker}" if broker else "server"
    if isinstance(exc, httpx.PoolTimeout):
        # our own connection pool was exhausted: says nothing about the broker
        return Outcome.CLIENT, SendTimeoutError(
            f"no free connection to {where} within {timeout:.3f}s (client pool exhausted)"
        )
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return Outcome.TRANSPORT, SendTimeoutError(
            f"{where} did not answer within {timeout:.3f}s ({type(exc).__name__})"
        )
    if isinstance(exc, httpx.LocalProtocolError | httpx.UnsupportedProtocol):
        return Outcome.CLIENT, BrokerUnavailableError(
            f"request to {where} could not be made: {exc}", broker_name=broker
        )
    if isinstance(exc, httpx.TransportError):
        return Outcome.TRANSPORT, BrokerUnavailableError(
            f"{where} unreachable: {type(exc).__name__}: {exc}", broker_name=broker
        )
    if isinstance(exc, QClientError):
        return Outcome.FINAL, exc
    return Outcome.CLIENT, BrokerUnavailableError(
        f"request to {where} failed: {type(exc).__name__}: {exc}", broker_name=broker
    )
