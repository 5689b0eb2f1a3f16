"""``MQFaultStrategy``: queue selection in three tiers and the fault-table updates."""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Iterable, Sequence

import xxhash

from ..routing.publish_info import MessageQueue, TopicPublishInfo
from .index import POSITIVE_MASK
from .latency import LatencyFaultTolerance
from .policy import FaultPolicy, IsolationPolicy, Outcome

__all__ = ["LATENCY_MAX_MS", "NOT_AVAILABLE_MS", "MQFaultStrategy", "id_order", "id_owner"]

log = logging.getLogger(__name__)

#: a send that took at least LATENCY_MAX_MS[i] isolates its broker for NOT_AVAILABLE_MS[i]
#: (RocketMQ's MQFaultStrategy tables; the one home of these defaults)
LATENCY_MAX_MS = (50, 100, 550, 1800, 3000, 5000, 15000)
NOT_AVAILABLE_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)


class MQFaultStrategy:
    """Selects a queue for each attempt and records each attempt's outcome.

    Both flags can be flipped at runtime (apache/rocketmq#7813): selection reads them on
    every call and the detector thread checks ``start_detector_enable`` every round.
    """

    def __init__(
        self,
        *,
        send_latency_fault_enable: bool = True,
        start_detector_enable: bool = True,
        latency_max_ms: Sequence[int] = LATENCY_MAX_MS,
        not_available_ms: Sequence[int] = NOT_AVAILABLE_MS,
        isolation_latency_ms: int = 10000,
        fault_tolerance: LatencyFaultTolerance | None = None,
        policy: FaultPolicy | None = None,
    ) -> None:
        self.send_latency_fault_enable = send_latency_fault_enable
        self.start_detector_enable = start_detector_enable
        self.latency_max = tuple(latency_max_ms)
        #: below the table's smallest latency nothing is isolated (the common answer)
        self._min_latency_max = min(self.latency_max, default=0)
        self.not_available_duration = tuple(not_available_ms)
        self.isolation_latency_ms = isolation_latency_ms
        self.latency_fault_tolerance = fault_tolerance or LatencyFaultTolerance()
        self.policy = policy or IsolationPolicy()

    # --- the table ---------------------------------------------------------------------

    def compute_not_available_duration(self, current_latency: float) -> int:
        """The isolation (ms) that ``current_latency`` (ms) earns by the seed's table."""
        if current_latency < self._min_latency_max:
            return 0
        for i in range(len(self.latency_max) - 1, -1, -1):
            if current_latency >= self.latency_max[i]:
                return self.not_available_duration[i]
        return 0

    def update_fault_item(
        self, broker_name: str, current_latency: float, isolation: bool, reachable: bool
    ) -> None:
        """Record one attempt; a no-op while fault tolerance is off (as in RocketMQ)."""
        if not self.send_latency_fault_enable:
            return
        duration = self.compute_not_available_duration(
            self.isolation_latency_ms if isolation else current_latency
        )
        self.latency_fault_tolerance.update_fault_item(
            broker_name, current_latency, duration, reachable
        )

    def record(self, broker_name: str, latency_ms: float, outcome: Outcome) -> None:
        """Record one attempt's outcome by the fault policy."""
        self.policy.apply(self, broker_name, latency_ms, outcome)

    # --- selection ---------------------------------------------------------------------

    def select_many(self, info: TopicPublishInfo, n: int) -> list[MessageQueue]:
        """``n`` first-attempt selections (``select_one_message_queue(info)`` n times): the
        brokers' health read once, one advance of the index, then round robin over the
        queues that passed the filter."""
        if n < 1:
            return []
        queues = info.queues
        if not queues:
            raise ValueError(f"topic {info.topic} has no writable queue")
        first = info.index.advance(n)
        pool: Sequence[MessageQueue] = queues
        if self.send_latency_fault_enable:
            lft = self.latency_fault_tolerance
            if not lft.all_healthy():
                unavailable, unreachable = lft.unhealthy()
                if unavailable:  # the tiers of select_one_message_queue, no last broker
                    pool = (
                        [q for q in queues if q.broker_name not in unavailable]
                        or [q for q in queues if q.broker_name not in unreachable]
                        or queues
                    )
        size = len(pool)
        if first + n - 1 <= POSITIVE_MASK:  # no wrap of the counter inside the run
            start = first % size
            rotated = [*pool[start:], *pool[:start]]
            return (rotated * -(-n // size))[:n]
        return [pool[((first + i) & POSITIVE_MASK) % size] for i in range(n)]

    def select_one_message_queue(
        self,
        info: TopicPublishInfo,
        last_broker: str | None = None,
        reset_index: bool = False,
        failed: Collection[str] = (),
    ) -> MessageQueue:
        """Pick the queue of the next attempt.

        ``failed`` names the brokers whose attempt failed earlier in this send, and
        ``last_broker`` the one that just failed; together they are the send's own news.
        Fault tolerance on: (1) a queue of an available broker the send has not failed on;
        (2) of a reachable one; (3) of any broker it has not failed on; (4) when it has
        failed on every broker, the best by the table (available, then reachable), the
        last one only if it ranks above the rest; (5) any queue. Off: (3), else any
        broker but the last. RocketMQ's third tier is any queue, so when every other
        broker is flagged a retry may go back to a broker that failed this very send; a
        flag is older news than that failure, and a retry on a hung broker costs another
        whole attempt share (decision 0034). The round-robin index runs over the queues
        that passed the filter, not over all of them, so a filtered-out broker's share is
        spread evenly instead of landing on the queue after it (apache/rocketmq#5672).
        """
        queues = info.queues
        if not queues:
            raise ValueError(f"topic {info.topic} has no writable queue")
        index = info.index
        if reset_index:
            index.reset()
        idx = index.increment_and_get()
        avoid: Collection[str] = failed
        if last_broker is not None and last_broker not in failed:
            avoid = {*failed, last_broker}
        if self.send_latency_fault_enable:
            lft = self.latency_fault_tolerance
            if not avoid and lft.all_healthy():
                return queues[idx % len(queues)]  # the hot path: everything healthy
            unavailable, unreachable = lft.unhealthy()
            if not avoid and not unavailable:
                return queues[idx % len(queues)]
            tier = [
                q for q in queues if q.broker_name not in avoid and q.broker_name not in unavailable
            ]
            if tier:
                return tier[idx % len(tier)]
            tier = [
                q for q in queues if q.broker_name not in avoid and q.broker_name not in unreachable
            ]
            if tier:
                return tier[idx % len(tier)]
            if avoid:
                tier = [q for q in queues if q.broker_name not in avoid]
                if tier:
                    return tier[idx % len(tier)]
                tier = _best_ranked(queues, unavailable, unreachable, last_broker)
                return tier[idx % len(tier)]
        if avoid:
            tier = [q for q in queues if q.broker_name not in avoid] or [
                q for q in queues if q.broker_name != last_broker
            ]
            if tier:
                return tier[idx % len(tier)]
        return queues[idx % len(queues)]

    def select_for_id(
        self, info: TopicPublishInfo, msg_id: str, last_broker: str | None = None
    ) -> MessageQueue:
        """The queue for a message whose id the caller chose: the same broker every time.

        A broker deduplicates only the ids it stored itself, so a re-sent id (a retried
        Spark task, an application replay) must land on the broker that has it. The
        broker is picked by rendezvous hashing of the id over the brokers other than
        ``last_broker`` that are reachable (a broker leaving moves only its own ids; a
        retry after ``last_broker`` failed goes to the id's next broker), the queue by the
        id too. Unlike round robin, a broker isolated only for its latency keeps
        its ids: idempotence matters more here than a faster broker.
        """
        order, by_broker = self._id_brokers(info, last_broker)
        return _pick_for_id(msg_id, order, by_broker)

    def select_for_ids(self, info: TopicPublishInfo, msg_ids: Sequence[str]) -> list[MessageQueue]:
        """``select_for_id(info, id)`` for each id (first attempts), the brokers' health
        read once for all of them."""
        order, by_broker = self._id_brokers(info, None)
        if len(order) != 2:
            return [_pick_for_id(i, order, by_broker) for i in msg_ids]
        # The common two-broker case inlined (a Spark sink's 50k ids/s spend most of their
        # routing time in this loop).
        (a, seed_a), (b, seed_b) = order
        qa, qb = by_broker[a], by_broker[b]
        na, nb = len(qa), len(qb)
        out: list[MessageQueue] = []
        append = out.append
        for i in msg_ids:
            key = i.encode()
            pick = _hash(key)
            if _hash(key, seed_b) > _hash(key, seed_a):
                append(qb[pick % nb])
            else:
                append(qa[pick % na])
        return out

    def _id_brokers(
        self, info: TopicPublishInfo, last_broker: str | None
    ) -> tuple[list[tuple[str, int]], dict[str, tuple[MessageQueue, ...]]]:
        """The candidate brokers of ``select_for_id`` (sorted, with their hash seeds)
        and the queues of each broker in route order."""
        if not info.queues:
            raise ValueError(f"topic {info.topic} has no writable queue")
        by_broker = info.by_broker
        brokers = {b for b, mine in by_broker.items() if mine}
        candidates = brokers - {last_broker} if last_broker in brokers else brokers
        lft = self.latency_fault_tolerance
        if self.send_latency_fault_enable and not lft.all_healthy():
            # Only a broker that failed (unreachable) loses its ids; one that is merely
            # slow (isolated for its latency) keeps them: moving ids on a latency blip
            # would store a later re-send on another broker, which cannot dedupe it.
            _unavailable, unreachable = lft.unhealthy()
            candidates = (candidates - unreachable) or candidates
        if not candidates:
            candidates = brokers
        return [(b, _broker_seed(b)) for b in sorted(candidates)], by_broker


#: xxHash3 (64-bit): a well-mixed hash ~7x cheaper than blake2b from Python; ids are not
#: secrets, so no keyed hash is needed
_hash = xxhash.xxh3_64_intdigest


def _best_ranked(
    queues: Sequence[MessageQueue],
    unavailable: Collection[str],
    unreachable: Collection[str],
    last_broker: str | None,
) -> list[MessageQueue]:
    """The queues of the best-ranked brokers by the fault table (available, then
    reachable), the broker that just failed only when no other ranks as well: when a
    send has failed on every broker, the table may hold news newer than its own failures
    (another call's answer), and ranks equal, the freshest failure is the worst news."""

    def rank(name: str) -> tuple[bool, bool, bool]:
        return name in unavailable, name in unreachable, name == last_broker

    best = min(rank(q.broker_name) for q in queues)
    return [q for q in queues if rank(q.broker_name) == best]


@functools.cache
def _broker_seed(name: str) -> int:
    """The seed that makes a broker's rendezvous score of an id its own."""
    return _hash(name.encode())


def id_owner(msg_id: str, brokers: Iterable[str]) -> str:
    """The broker a caller-chosen id belongs to among ``brokers`` (all of them up): the
    one ``select_for_id`` picks when none is excluded."""
    return id_order(msg_id, brokers)[0]


def id_order(msg_id: str, brokers: Iterable[str]) -> list[str]:
    """``brokers`` in the order ``select_for_id`` tries them for a caller-chosen id: its
    own broker first, then the one that stands in while that one is excluded, ..."""
    key = msg_id.encode()
    return sorted(sorted(brokers), key=lambda b: _hash(key, _broker_seed(b)), reverse=True)


def _pick_for_id(
    msg_id: str,
    order: list[tuple[str, int]],
    by_broker: dict[str, tuple[MessageQueue, ...]],
) -> MessageQueue:
    """Rendezvous hashing: the candidate (in ``order``) with the highest hash of the id
    seeded with its name (the first of equals), then the id's own hash picks the queue."""
    key = msg_id.encode()
    if len(order) == 1:
        broker = order[0][0]
    else:
        broker, best = "", -1
        for name, seed in order:
            score = _hash(key, seed)
            if score > best:
                broker, best = name, score
    mine = by_broker[broker]
    return mine[_hash(key) % len(mine)]
