"""qclient as just another peer: LocalCluster, Producer.send_delayed / send_batch, Consumer."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers.base import Peer, PeerConsumer, PeerProducer, Sink
from benchmarks.peers.workload import percentile
from qclient.protocol.wire import firing_time_ms

log = logging.getLogger(__name__)


class QClientProducer(PeerProducer):
    """``send_delayed`` per message, ``send_batch`` for a batch; SEND_OK is the (durable) ack."""

    def __init__(self, namesrv: str, topic: str) -> None:
        from qclient import Producer

        self.topic = topic
        self.p = Producer(namesrv)

    def send(self, msg_id: str, delay_s: float) -> None:
        from qclient import SendStatus

        r = self.p.send_delayed(self.topic, msg_id, delay=delay_s, key=msg_id)
        if r.status != SendStatus.SEND_OK:
            raise RuntimeError(f"send_delayed: {r.status}")

    def send_many(self, items: Sequence[tuple[str, float]]) -> None:
        from qclient import Message, SendStatus

        results = self.p.send_batch([Message(self.topic, m, key=m, delay=d) for m, d in items])
        bad = [r for r in results if r.status != SendStatus.SEND_OK]
        if bad or len(results) != len(items):
            raise RuntimeError(f"send_batch: {len(bad)} not SEND_OK of {len(results)}")

    def close(self) -> None:
        self.p.close()


class QClientConsumer(PeerConsumer):
    """``Consumer.poll`` in a loop; the message body is the id."""

    def __init__(self, namesrv: str, topic: str, sink: Sink) -> None:
        super().__init__(sink)
        self.namesrv = namesrv
        self.topic = topic
        self.c: Any = None
        self.fired_late_ms: list[float] = []
        self.to_consumer_ms: list[float] = []

    def connect(self) -> None:
        from qclient import Consumer

        self.c = Consumer(self.namesrv, self.topic, "bench")

    def poll_once(self) -> None:
        for m in self.c.poll(max_messages=256, timeout=0.5):
            now_ms = time.time() * 1000
            self.sink(bytes(m.body).decode())
            # where the lateness goes: the broker firing late (against its firing time,
            # fire_ahead_ms before deliver_at), or the way to the consumer and its hold
            fired_late = m.fired_at_ms - firing_time_ms(m.deliver_at_ms)
            self.fired_late_ms.append(fired_late)
            self.to_consumer_ms.append(now_ms - m.deliver_at_ms - fired_late)

    def breakdown(self) -> dict[str, Any] | None:
        def stats(xs: list[float]) -> dict[str, float]:
            s = sorted(xs)
            return {
                "p50": round(percentile(s, 50), 2),
                "p99": round(percentile(s, 99), 2),
                "max": round(s[-1], 2),
            }

        if not self.fired_late_ms:
            return None
        return {
            "broker_fired_late_ms": stats(self.fired_late_ms),
            "fired_to_consumer_ms": stats(self.to_consumer_ms),
        }

    def disconnect(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None


class QClientPeer(Peer):
    """A ``LocalCluster`` with one broker (the peers are single servers too)."""

    name = "qclient"
    description = "LocalCluster, 1 broker; send_delayed (batch row: send_batch); fsync before ack"
    start_timeout = 30.0

    def __init__(self, brokers: int = 1) -> None:
        self.brokers = brokers
        self.cluster: Any = None
        self._entered = False

    def missing(self) -> str | None:
        try:
            from qclient import Consumer, LocalCluster, Producer  # noqa: F401
        except Exception as exc:
            return f"qclient Producer/Consumer/LocalCluster not importable yet: {exc}"
        return None

    def start(self, workdir: Path) -> None:
        from qclient import LocalCluster

        self.cluster = LocalCluster(brokers=self.brokers, data_dir=str(workdir / "cluster"))
        self.cluster.__enter__()
        self._entered = True

    def kill9(self) -> None:
        for b in self.cluster.brokers:
            b.kill()

    def restart(self) -> None:
        for b in self.cluster.brokers:
            b.start()

    def stop(self) -> None:
        if self._entered:
            self._entered = False
            self.cluster.__exit__(None, None, None)

    def producer(self, channel: str) -> PeerProducer:
        return QClientProducer(self.cluster.namesrv, channel)

    def consumer(self, channel: str, sink: Sink) -> PeerConsumer:
        return QClientConsumer(self.cluster.namesrv, channel, sink).start()
