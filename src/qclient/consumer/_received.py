"""A pulled message as the application sees it (:class:`ReceivedMessage`), built cheaply:
a consumer makes one per message delivered."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable

from .._models import ReceivedMessage
from ..protocol import wire

__all__ = ["from_pulled"]

_new = object.__new__
_MISSING = dataclasses.MISSING
_COMPRESSED = wire.FLAG_COMPRESSED


def _setter(name: str) -> Callable[[ReceivedMessage, object], None]:
    return getattr(ReceivedMessage, name).__set__


#: the slot setters of the fields without a default (they come first, in order), then
#: the setter and default maker of each other field
_SET = tuple(
    _setter(f.name)
    for f in dataclasses.fields(ReceivedMessage)
    if f.default is _MISSING and f.default_factory is _MISSING
)
_DEFAULTS = tuple(
    (
        _setter(f.name),
        f.default_factory if f.default_factory is not _MISSING else lambda v=f.default: v,
    )
    for f in dataclasses.fields(ReceivedMessage)[len(_SET) :]
)


def build(*values: object) -> ReceivedMessage:
    """``ReceivedMessage(*values)`` (the fields without defaults) at about a third of the
    cost: a frozen dataclass's ``__init__`` goes through ``object.__setattr__`` for each
    field, this sets the slots directly."""
    m = _new(ReceivedMessage)
    for put, v in zip(_SET, values, strict=True):
        put(m, v)
    for put, make in _DEFAULTS:
        put(m, make())
    return m


def from_pulled(m: wire.PulledMessage, broker: str) -> ReceivedMessage:
    """The message a broker answered a pull with, body decompressed if it was sent so."""
    body = zlib.decompress(m.body) if m.flag & _COMPRESSED else m.body
    return build(
        m.msg_id,
        m.topic,
        body,
        m.key,
        m.tags,
        dict(m.properties) if m.properties else {},
        m.deliver_at_ms,
        m.fired_at_ms,
        broker,
        m.queue_id,
        m.offset,
    )
