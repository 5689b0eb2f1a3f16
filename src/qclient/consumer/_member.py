"""What every group consumer shares, whatever its engine: the checks of a member's
arguments and the ``messages()`` iterator over ``poll()``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from .._models import ReceivedMessage
from ..errors import ConsumerClosedError, InvalidMessageError
from ..protocol import wire

__all__ = ["MAX_SESSION_S", "MIN_SESSION_S", "check_member", "iter_messages"]

MIN_SESSION_S = wire.MIN_GROUP_LEASE_MS / 1000
MAX_SESSION_S = wire.MAX_GROUP_LEASE_MS / 1000


def check_member(topic: str, group: str, session_timeout: float, client_id: str) -> None:
    """Raise ``InvalidMessageError`` / ``ValueError`` for a bad topic, group, session timeout
    or member id, before anything is started."""
    if not wire.valid_topic(topic):
        raise InvalidMessageError(f"invalid topic name {topic!r}")
    if not wire.GROUP_RE.match(group):
        raise InvalidMessageError(f"invalid group name {group!r}")
    if not MIN_SESSION_S <= session_timeout <= MAX_SESSION_S:
        raise ValueError(f"session_timeout must be {MIN_SESSION_S}..{MAX_SESSION_S} s")
    if not wire.PRINTABLE_128_RE.match(client_id):
        raise ValueError("client_id must be 1-128 printable ASCII characters")


def iter_messages(
    poll: Callable[..., list[ReceivedMessage]],
    closed: Callable[[], bool],
    timeout: float | None,
    max_messages: int,
) -> Iterator[ReceivedMessage]:
    """Yield what ``poll`` returns as it arrives; stop after ``timeout`` seconds without a
    message (``None``: never) or once the consumer is closed."""
    idle_since = time.monotonic()
    while not closed():
        wait_s = 1.0
        if timeout is not None:
            wait_s = min(wait_s, timeout - (time.monotonic() - idle_since))
            if wait_s <= 0:
                return
        try:
            batch = poll(max_messages, timeout=wait_s)
        except ConsumerClosedError:
            return
        if batch:
            yield from batch
            idle_since = time.monotonic()
