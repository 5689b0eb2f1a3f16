"""The one exception hierarchy of qclient. Every error a caller can see derives from
``QClientError``; messages are one line and never contain secrets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._models import MessageState, SendResult

__all__ = [
    "AuthError",
    "BatchSendError",
    "BrokerResponseError",
    "BrokerUnavailableError",
    "BufferFullError",
    "ClosedError",
    "ClusterError",
    "ConsumerClosedError",
    "InvalidMessageError",
    "MessageNotScheduledError",
    "MessageTooLargeError",
    "NameServerUnavailableError",
    "ProducerClosedError",
    "QClientError",
    "RouteNotFoundError",
    "SendTimeoutError",
    "UnsupportedByEngineError",
]


class QClientError(Exception):
    """Base class of every qclient error."""


class InvalidMessageError(QClientError, ValueError):
    """A message (topic, body, delay, key, properties) is not acceptable."""


class MessageTooLargeError(InvalidMessageError):
    """The body is larger than ``max_message_size`` (or the broker's limit)."""


class RouteNotFoundError(QClientError):
    """No name server knows a route for the topic."""

    def __init__(self, message: str, *, topic: str = "", namesrv: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.topic = topic
        self.namesrv = list(namesrv)


class NameServerUnavailableError(QClientError):
    """No name server answered and there is no last good route to fall back on."""


class BrokerUnavailableError(QClientError):
    """Every attempt failed because brokers could not be reached or refused for now."""

    def __init__(self, message: str, *, broker_name: str | None = None) -> None:
        super().__init__(message)
        self.broker_name = broker_name


class BrokerResponseError(QClientError):
    """A broker answered with an error that is not one of the specific kinds above."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        broker_name: str | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.broker_name = broker_name
        self.status_code = status_code


class SendTimeoutError(QClientError, TimeoutError):
    """The send did not complete within ``send_timeout``."""


class BufferFullError(QClientError):
    """``send_async`` could not buffer the message within ``send_timeout``."""


class AuthError(QClientError):
    """The request was refused for its credentials (missing, wrong, expired, out of scope)."""

    def __init__(self, message: str, *, code: str = "UNAUTHORIZED") -> None:
        super().__init__(message)
        self.code = code


class MessageNotScheduledError(QClientError):
    """The message cannot be moved: it fired, was cancelled, or no broker knows it.

    ``state`` is the ``MessageState`` it is in, or None when the id is unknown.
    """

    def __init__(self, message: str, *, state: MessageState | None = None) -> None:
        super().__init__(message)
        self.state = state


class ClosedError(QClientError):
    """The client (producer or consumer) is closed."""


class ProducerClosedError(ClosedError):
    """The producer is closed."""


class ConsumerClosedError(ClosedError):
    """The consumer is closed."""


class BatchSendError(QClientError):
    """Some messages of a batch were not acknowledged.

    ``results`` is in input order: a ``SendResult`` for each acknowledged message and a
    ``QClientError`` for each one that was not.
    """

    def __init__(self, message: str, results: list[SendResult | QClientError]) -> None:
        super().__init__(message)
        self.results = results

    @property
    def failed(self) -> list[tuple[int, QClientError]]:
        return [(i, r) for i, r in enumerate(self.results) if isinstance(r, QClientError)]

    @property
    def succeeded(self) -> list[tuple[int, SendResult]]:
        return [(i, r) for i, r in enumerate(self.results) if not isinstance(r, QClientError)]


class ClusterError(QClientError):
    """A local cluster process could not be started or did not become ready."""


class UnsupportedByEngineError(QClientError):
    """The engine behind the name-server address cannot do what was asked.

    ``engine`` names the engine (``"rocketmq"``), ``feature`` the capability; README's
    per-engine table lists what each engine does.
    """

    def __init__(self, engine: str, feature: str, why: str = "") -> None:
        tail = f": {why}" if why else ""
        super().__init__(f"the {engine} engine does not support {feature}{tail}")
        self.engine = engine
        self.feature = feature
