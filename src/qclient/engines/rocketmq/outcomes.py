"""What a failed remoting request means for the producer: whether it may have reached
the broker (and been stored), and the typed error a caller sees."""

from __future__ import annotations

from ...errors import BrokerUnavailableError, QClientError, SendTimeoutError
from .connection import RemotingConnectionError, RemotingError, RemotingTimeoutError

__all__ = ["NotSentError", "maybe_sent", "transport_error"]


class NotSentError(RemotingConnectionError):
    """No connection to the broker could be opened: nothing of the call was sent."""


def maybe_sent(exc: BaseException) -> bool:
    """Whether a failed request may have reached the broker (and been stored)."""
    return isinstance(exc, RemotingError | TimeoutError) and not isinstance(exc, NotSentError)


def transport_error(exc: BaseException, broker: str, timeout: float) -> QClientError:
    if isinstance(exc, QClientError):
        return exc
    if isinstance(exc, RemotingTimeoutError | TimeoutError):
        return SendTimeoutError(f"broker {broker} did not answer within {timeout:.3f}s")
    return BrokerUnavailableError(
        f"broker {broker} unreachable: {type(exc).__name__}: {exc}", broker_name=broker
    )
