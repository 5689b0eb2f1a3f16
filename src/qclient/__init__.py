"""qclient: send delayed (scheduled) messages to a broker cluster, fault-tolerantly."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from ._models import (
    DELAY_LEVELS,
    Message,
    MessageBatch,
    MessageInfo,
    MessageState,
    ReceivedMessage,
    SendResult,
    SendStatus,
    delay_level,
)
from .errors import (
    AuthError,
    BatchSendError,
    BrokerResponseError,
    BrokerUnavailableError,
    BufferFullError,
    ClosedError,
    ClusterError,
    ConsumerClosedError,
    InvalidMessageError,
    MessageNotScheduledError,
    MessageTooLargeError,
    NameServerUnavailableError,
    ProducerClosedError,
    QClientError,
    RouteNotFoundError,
    SendTimeoutError,
    UnsupportedByEngineError,
)

if TYPE_CHECKING:
    from .cluster import LocalCluster
    from .consumer import AsyncConsumer, Consumer
    from .producer import AsyncProducer, Producer

    __version__: str


# A library's logging: records go to the application's handlers; without any, nothing is
# printed (no "no handlers" warning) and the root logger is never configured here.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "DELAY_LEVELS",
    "AsyncConsumer",
    "AsyncProducer",
    "AuthError",
    "BatchSendError",
    "BrokerResponseError",
    "BrokerUnavailableError",
    "BufferFullError",
    "ClosedError",
    "ClusterError",
    "Consumer",
    "ConsumerClosedError",
    "InvalidMessageError",
    "LocalCluster",
    "Message",
    "MessageBatch",
    "MessageInfo",
    "MessageNotScheduledError",
    "MessageState",
    "MessageTooLargeError",
    "NameServerUnavailableError",
    "Producer",
    "ProducerClosedError",
    "QClientError",
    "ReceivedMessage",
    "RouteNotFoundError",
    "SendResult",
    "SendStatus",
    "SendTimeoutError",
    "UnsupportedByEngineError",
    "__version__",
    "delay_level",
]

# Heavier parts load on first use, so `import qclient` (and the CLI) start fast.
_LAZY = {
    "Producer": ".producer",
    "AsyncProducer": ".producer",
    "Consumer": ".consumer",
    "AsyncConsumer": ".consumer",
    "LocalCluster": ".cluster",
}


def _version() -> str:
    """The installed distribution's version: pyproject.toml is its one home."""
    from importlib import metadata

    try:
        return metadata.version("qclient")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = version = _version()
        return version
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qclient' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
