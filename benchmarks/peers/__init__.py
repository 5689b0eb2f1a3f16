"""Peer comparison: qclient and the delay queues users would pick instead, same workload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.peers.base import Peer

__all__ = ["PEERS", "PeerSpec", "peer_specs"]


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """A row of the comparison: which peer, and whether it sends in batches."""

    label: str
    make: Callable[[], Peer]
    batch: bool = False
    #: part of the smoke test in `make test` (fast to start)
    in_smoke: bool = True


def _qclient() -> Peer:
    from benchmarks.peers.qclient_peer import QClientPeer

    return QClientPeer()


def _redis(i: int) -> Callable[[], Peer]:
    def make() -> Peer:
        from benchmarks.peers.redis_peer import redis_peers

        return redis_peers()[i]

    return make


def _beanstalk(i: int) -> Callable[[], Peer]:
    def make() -> Peer:
        from benchmarks.peers.beanstalkd_peer import beanstalk_peers

        return beanstalk_peers()[i]

    return make


def _rabbit() -> Peer:
    from benchmarks.peers.rabbitmq_peer import RabbitPeer

    return RabbitPeer()


def _celery() -> Peer:
    from benchmarks.peers.celery_peer import CeleryPeer

    return CeleryPeer()


PEERS: list[PeerSpec] = [
    PeerSpec("qclient", _qclient),
    PeerSpec("qclient-batch", _qclient, batch=True),
    PeerSpec("redis", _redis(0)),
    PeerSpec("redis-batch", _redis(0), batch=True),
    PeerSpec("redis-aof-everysec", _redis(1)),
    PeerSpec("redis-aof-always", _redis(2)),
    PeerSpec("beanstalkd", _beanstalk(0)),
    PeerSpec("beanstalkd-binlog", _beanstalk(1)),
    PeerSpec("rabbitmq", _rabbit, in_smoke=False),
    PeerSpec("celery", _celery, in_smoke=False),
]


def peer_specs(only: list[str] | None = None) -> list[PeerSpec]:
    """The registered peers, or those named in ``only`` (unknown names raise ValueError)."""
    if not only:
        return list(PEERS)
    known = {s.label: s for s in PEERS}
    unknown = [n for n in only if n not in known]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in only]
