"""Id affinity: a message id always goes to the same broker while that broker is healthy.

A broker deduplicates ids it has stored itself; it cannot know what another broker
stored. Round-robin queue selection would send the replay of a message to the other
broker half of the time and deliver it twice, so the sink picks each message's broker by
rendezvous hashing of its id over the topic's writable brokers (a broker leaving moves
only its own ids), and its queue by the id too. A broker the producer's latency fault
tolerance holds unavailable is skipped: the producer selects as usual, and its retries
fail over to another broker (there a re-send after a failure is at-least-once).

``Producer.send_batch`` has no way to pin queues, so this drives the producer's send
plan directly; with a producer lacking those internals it falls back to ``send_batch``.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from typing import Any

from qclient._models import Message, SendResult

__all__ = ["pick_queue", "send_batch_pinned"]

log = logging.getLogger(__name__)

_warned = False


def _internals() -> tuple[Any, Any, Any] | None:
    try:
        from qclient.producer._base import batch_outcome
        from qclient.producer._core import Item
        from qclient.producer._drivers import run_sync
    except ImportError:
        return None
    return Item, run_sync, batch_outcome


def _mix(x: int) -> int:
    """MurmurHash3's 32-bit finalizer: spreads a (crc) value over all 32 bits."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


_salts: dict[str, int] = {}


def pick_queue(info: Any, msg_id: str, unavailable: frozenset[str] | set[str]) -> Any:
    """The id's queue: its highest-scoring healthy broker, then a queue of it by the id."""
    h = zlib.crc32(msg_id.encode())
    best = None
    best_score = -1
    for broker in info.by_broker:
        if broker in unavailable:
            continue
        salt = _salts.get(broker)
        if salt is None:
            salt = _salts[broker] = zlib.crc32(broker.encode())
        # crc32 is linear, so a per-broker crc of the id would rank brokers alike for
        # many ids; mixing id-hash ^ broker-salt gives independent scores.
        score = _mix(h ^ salt)
        if score > best_score:
            best, best_score = broker, score
    if best is None:
        return None  # every broker unhealthy: let the producer's selection decide
    queues = info.by_broker[best]
    return queues[h % len(queues)]


def send_batch_pinned(producer: Any, messages: Sequence[Message]) -> list[SendResult]:
    """``producer.send_batch(messages)``, each id pinned to its broker (see module doc)."""
    global _warned
    parts = _internals()
    needed = ("_core", "_info", "_http", "_executor", "_check_open")
    if parts is None or not all(hasattr(producer, a) for a in needed):
        if not _warned:
            _warned = True
            log.warning(
                "producer %s cannot pin ids to brokers: a replayed row may be "
                "stored on two brokers and delivered twice",
                type(producer).__name__,
            )
        return producer.send_batch(messages)
    item_cls, run_sync, batch_outcome = parts
    producer._check_open()
    if not messages:
        return []
    core = producer._core
    wires = core.wires(list(messages))
    infos: dict[str, Any] = {}
    for w in wires:
        if w.topic not in infos:
            infos[w.topic] = producer._info(w.topic)
    unavailable: set[str] = set()
    strategy = core.strategy
    if strategy.send_latency_fault_enable:
        unavailable = set(strategy.latency_fault_tolerance.unhealthy()[0])
    items = []
    for i, w in enumerate(wires):
        info = infos[w.topic]
        items.append(item_cls(i, w, info, pick_queue(info, w.msg_id, unavailable)))
    results = run_sync(core.plan_send(items), producer._http, producer._executor)
    return batch_outcome(results)
