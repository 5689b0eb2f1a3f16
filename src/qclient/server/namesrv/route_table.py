"""RouteTable: live brokers and the topics they serve (RocketMQ's RouteInfoManager)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...protocol import wire

log = logging.getLogger(__name__)


def _wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class BrokerLive:
    registration: wire.BrokerRegistration
    last_heartbeat_ms: int


class RouteTable:
    """Brokers keyed by name; a broker that misses heartbeats for ``expire_ms`` is dropped.

    A topic is *young* for ``expire_ms`` after a broker this table already knew first
    registered it while no other broker had it. Brokers register a topic at their first
    heartbeat after its first message, not all at once; the heartbeat interval is shorter
    than the expiry, so by the end of it every broker that stored a message has registered
    it. Meanwhile an auto-created topic's route also lists the auto-create brokers that
    have not registered it yet (see ``route``).
    """

    def __init__(self, expire_ms: int, *, clock: Callable[[], int] | None = None) -> None:
        self.expire_ms = expire_ms
        #: wall-clock ms (brokers' heartbeat times are shown to users)
        self._now = clock or _wall_ms
        #: until then routes are partial: a broker alive before a restart registers again
        #: within its heartbeat interval, which is shorter than the expiry
        self._partial_until = self._now() + expire_ms
        self._brokers: dict[str, BrokerLive] = {}
        #: young topics -> when first registered (ms); ``expire`` forgets a topic once it is
        #: old or no broker registers it any more, so this holds only recent topics
        self._first_seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def register(self, reg: wire.BrokerRegistration) -> bool:
        """Add or refresh a broker; True when it is new (or came back at a new address)."""
        now = self._now()
        with self._lock:
            old = self._brokers.get(reg.broker_name)
            self._brokers[reg.broker_name] = BrokerLive(reg, now)
            is_new = old is None or old.registration.addr != reg.addr
            if old is not None and not is_new:
                self._note_new_topics(reg, old.registration, now)
        if is_new:
            log.info(
                "broker %s registered at %s (%d topics, perm %d)",
                reg.broker_name,
                reg.addr,
                len(reg.topics),
                reg.perm,
            )
        return is_new

    def _note_new_topics(
        self, reg: wire.BrokerRegistration, before: wire.BrokerRegistration, now: int
    ) -> None:
        """Mark young the topics ``reg`` adds that no other broker has (lock held).

        Only a known broker's heartbeat shows a topic being born: the topics of a broker's
        first registration here (after it or this name server started) may be of any age,
        and widening an old topic would spread it to brokers it was never meant to reach.
        """
        for topic in reg.topics.keys() - before.topics.keys():
            if not any(
                topic in b.registration.topics
                for name, b in self._brokers.items()
                if name != reg.broker_name
            ):
                self._first_seen[topic] = now

    def unregister(self, broker_name: str, addr: str) -> bool:
        with self._lock:
            live = self._brokers.get(broker_name)
            if live is None or live.registration.addr != addr:
                return False
            del self._brokers[broker_name]
        log.info("broker %s at %s unregistered", broker_name, addr)
        return True

    def expire(self) -> list[str]:
        """Drop brokers whose last heartbeat is older than ``expire_ms``."""
        cutoff = self._now() - self.expire_ms
        with self._lock:
            gone = [n for n, b in self._brokers.items() if b.last_heartbeat_ms < cutoff]
            for name in gone:
                del self._brokers[name]
            self._forget_topics(cutoff)
        for name in gone:
            log.warning("broker %s expired: no heartbeat for %d ms", name, self.expire_ms)
        return gone

    def _forget_topics(self, cutoff: int) -> None:
        """Drop young-topic entries older than ``cutoff`` or that no broker has (lock held)."""
        lives = self._brokers.values()
        forget = [
            topic
            for topic, seen in self._first_seen.items()
            if seen < cutoff or not any(topic in b.registration.topics for b in lives)
        ]
        for topic in forget:
            del self._first_seen[topic]

    def brokers(self) -> wire.BrokerList:
        with self._lock:
            items = sorted(self._brokers.values(), key=lambda b: b.registration.broker_name)
        return wire.BrokerList(
            brokers=[
                wire.BrokerInfo(
                    broker_name=b.registration.broker_name,
                    addr=b.registration.addr,
                    cluster=b.registration.cluster,
                    perm=b.registration.perm,
                    last_heartbeat_ms=b.last_heartbeat_ms,
                    topics=sorted(b.registration.topics),
                )
                for b in items
            ]
        )

    def route(self, topic: str) -> wire.TopicRoute | None:
        """The topic's route; for an unknown topic, the auto-create route, else None.

        A young topic that every broker holding it auto-created also lists the live
        writable auto-create brokers that have not registered it yet, with their default
        queue numbers, and is then partial: a producer whose first lookup comes after one
        broker registered it would otherwise send to, and retry on, that broker alone. A
        topic created on purpose stays on the brokers that were asked to hold it.
        """
        now = self._now()
        with self._lock:
            lives = sorted(self._brokers.values(), key=lambda b: b.registration.broker_name)
            seen = self._first_seen.get(topic)
        configs = [live.registration.topics.get(topic) for live in lives]
        held = [cfg for cfg in configs if cfg is not None]
        partial = now < self._partial_until
        if held:
            young = seen is not None and now - seen < self.expire_ms
            widen = young and all(cfg.auto_created for cfg in held)
            queue_datas, broker_datas = _route_datas(lives, configs, widen=widen)
            widened = len(queue_datas) > len(held)
            return wire.TopicRoute(topic, queue_datas, broker_datas, partial=partial or widened)
        # RocketMQ's TBW102: brokers that create topics on first send.
        queue_datas, broker_datas = _route_datas(lives, configs, widen=True)
        if not queue_datas:
            return None
        return wire.TopicRoute(topic, queue_datas, broker_datas, auto_create=True, partial=partial)


def _route_datas(
    lives: list[BrokerLive], configs: list[wire.TopicConfig | None], *, widen: bool
) -> tuple[list[wire.QueueData], list[wire.BrokerData]]:
    """The brokers holding a topic (``configs``: its config on each of ``lives``) and, with
    ``widen``, the writable auto-create brokers that do not, in the order of ``lives``."""
    queue_datas: list[wire.QueueData] = []
    broker_datas: list[wire.BrokerData] = []
    for live, cfg in zip(lives, configs, strict=True):
        reg = live.registration
        if cfg is not None:
            data = wire.QueueData(
                reg.broker_name, cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm & reg.perm
            )
        elif widen and reg.auto_create_topics and reg.perm & wire.PERM_WRITE:
            n = reg.default_queue_nums
            data = wire.QueueData(reg.broker_name, n, n, reg.perm)
        else:
            continue
        queue_datas.append(data)
        broker_datas.append(
            wire.BrokerData(reg.broker_name, {wire.MASTER_ID: reg.addr}, reg.cluster)
        )
    return queue_datas, broker_datas
