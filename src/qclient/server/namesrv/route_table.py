"""RouteTable: live brokers and the topics they serve (RocketMQ's RouteInfoManager)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from ...protocol import wire

log = logging.getLogger(__name__)


@dataclass
class BrokerLive:
    registration: wire.BrokerRegistration
    last_heartbeat_ms: int


class RouteTable:
    """Brokers keyed by name; a broker that misses heartbeats for ``expire_ms`` is dropped."""

    def __init__(self, expire_ms: int) -> None:
        self.expire_ms = expire_ms
        #: until then routes are partial: a broker alive before a restart registers again
        #: within its heartbeat interval, which is shorter than the expiry
        self._partial_until = self._now() + expire_ms
        self._brokers: dict[str, BrokerLive] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _now() -> int:
        return int(time.time() * 1000)

    def register(self, reg: wire.BrokerRegistration) -> bool:
        """Add or refresh a broker; True when it is new (or came back at a new address)."""
        with self._lock:
            old = self._brokers.get(reg.broker_name)
            self._brokers[reg.broker_name] = BrokerLive(reg, self._now())
        is_new = old is None or old.registration.addr != reg.addr
        if is_new:
            log.info(
                "broker %s registered at %s (%d topics, perm %d)",
                reg.broker_name,
                reg.addr,
                len(reg.topics),
                reg.perm,
            )
        return is_new

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
        for name in gone:
            log.warning("broker %s expired: no heartbeat for %d ms", name, self.expire_ms)
        return gone

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
        """The topic's route; for an unknown topic, the auto-create route, else None."""
        with self._lock:
            lives = sorted(self._brokers.values(), key=lambda b: b.registration.broker_name)
        queue_datas: list[wire.QueueData] = []
        broker_datas: list[wire.BrokerData] = []
        for live in lives:
            reg = live.registration
            cfg = reg.topics.get(topic)
            if cfg is None:
                continue
            queue_datas.append(
                wire.QueueData(
                    reg.broker_name, cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm & reg.perm
                )
            )
            broker_datas.append(
                wire.BrokerData(reg.broker_name, {wire.MASTER_ID: reg.addr}, reg.cluster)
            )
        partial = self._now() < self._partial_until
        if queue_datas:
            return wire.TopicRoute(topic, queue_datas, broker_datas, partial=partial)
        # RocketMQ's TBW102: brokers that create topics on first send.
        for live in lives:
            reg = live.registration
            if reg.auto_create_topics and reg.perm & wire.PERM_WRITE:
                n = reg.default_queue_nums
                queue_datas.append(wire.QueueData(reg.broker_name, n, n, reg.perm))
                broker_datas.append(
                    wire.BrokerData(reg.broker_name, {wire.MASTER_ID: reg.addr}, reg.cluster)
                )
        if queue_datas:
            return wire.TopicRoute(
                topic, queue_datas, broker_datas, auto_create=True, partial=partial
            )
        return None
