"""Engines: the clusters the SDK can talk to, chosen by the name-server address.

``host:port`` and ``qclient://host:port`` are the name server and delay broker shipped
with qclient (``engines/qclient``, HTTP); ``rocketmq://host:port`` is an Apache RocketMQ 5
cluster spoken to in its own remoting protocol (``engines/rocketmq``). The producer,
consumer, fault table and routes above this package are the same code for both; an engine
turns their decisions into requests on its wire and its answers back into outcomes
(``engines.base.Engine``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..protocol.limits import MAX_DELAY_MS

if TYPE_CHECKING:
    from .base import Engine

__all__ = [
    "DEFAULT_MAX_DELAY_MS",
    "ENGINES",
    "QCLIENT",
    "ROCKETMQ",
    "create_engine",
    "parse_namesrv",
]

QCLIENT = "qclient"
ROCKETMQ = "rocketmq"
#: every engine, by the scheme that selects it
ENGINES = (QCLIENT, ROCKETMQ)

#: the longest delay each engine's brokers accept by default (ms), checked before sending:
#: ours 40 days (``protocol.limits``); RocketMQ's ``timerMaxDelaySec`` defaults to 3 days
ROCKETMQ_TIMER_MAX_DELAY_SEC = 259_200
DEFAULT_MAX_DELAY_MS = {QCLIENT: MAX_DELAY_MS, ROCKETMQ: ROCKETMQ_TIMER_MAX_DELAY_SEC * 1000}


def parse_namesrv(namesrv: str | Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """``(engine, addresses)`` of a name-server address: ``"h:p,h2:p2"``, a sequence of
    them, each optionally prefixed with ``qclient://`` or ``rocketmq://`` (one engine for
    all). Raises ``ValueError`` for an unknown scheme, mixed engines or no address."""
    items = [namesrv] if isinstance(namesrv, str) else list(namesrv)
    engine: str | None = None
    addrs: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"name server address must be a string, got {type(item).__name__}")
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            scheme, sep, rest = part.partition("://")
            if not sep:
                this, addr = None, part
            elif scheme.lower() in ENGINES:
                this, addr = scheme.lower(), rest.strip().rstrip("/")
            elif scheme.lower() in ("http", "https"):
                this, addr = None, part  # our name server over HTTP(S), as before
            else:
                raise ValueError(
                    f"unknown engine {scheme!r} in name server address {part!r}: "
                    f"use host:port, qclient://host:port or rocketmq://host:port"
                )
            if this is not None:
                if engine is not None and engine != this:
                    raise ValueError(f"name server addresses name two engines: {engine}, {this}")
                engine = this
            if not addr:
                raise ValueError(f"empty address in name server address {part!r}")
            addrs.append(addr)
    if not addrs:
        raise ValueError("at least one name server address is required")
    return engine or QCLIENT, tuple(addrs)


def create_engine(name: str, encoding: str = "msgpack") -> Engine:
    """The engine called ``name`` (its modules load only when it is used); ``encoding``:
    the body encoding of the qclient engine's requests."""
    if name == ROCKETMQ:
        from .rocketmq.engine import RocketMQEngine

        return RocketMQEngine()
    if name == QCLIENT:
        from .qclient.engine import QClientEngine

        return QClientEngine(encoding)
    raise ValueError(f"unknown engine {name!r}: one of {', '.join(ENGINES)}")
