"""The chaos bench's audit on RocketMQ: every stored copy, read at the storage level, and
what a fresh consumer group receives.

RocketMQ stores a re-sent id again (no deduplication by id) and qclient's RocketMQ
consumer drops an id it returned recently, so a consumer cannot count copies. The
``RawReader`` pulls every queue of the chaos topic on every routed replica of each group
(master and slave) from offset 0 with plain PULL_MESSAGE requests (no offsets committed,
nothing dropped): each (group, commit log offset) holding an id is one copy, the same
record on every replica of the group. Reading each replica's consume queue, not only the
master's, finds a record that one replica's queue skips: a master that stored messages
while stopping, its slave already down, can give their queue offsets to other messages
once restarted (apache/rocketmq#7689), so the replicas' queues differ at those offsets.
A fresh ``Consumer`` group reads the topic meanwhile, as an application would: what it
returns is checked against the deliver times (never early), and its counters say how many
copies it dropped.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks._chaos import TOPIC, Ledger
from benchmarks._chaos_member import body_for
from qclient import Consumer
from qclient.engines.rocketmq import message as rmq_msg
from qclient.engines.rocketmq.connection import RemotingError
from qclient.engines.rocketmq.local import RocketMQCluster
from qclient.engines.rocketmq.message import MessageDecodeError
from qclient.engines.rocketmq.pool import ConnectionPool
from qclient.engines.rocketmq.pull import PullStatus, deliver_at_ms, parse_pull, pull_request
from qclient.errors import QClientError

#: queues of the chaos topic on each group
QUEUES = 4
_PULL_BATCH = 32
_RAW_GROUP = "chaos-raw-audit"


@dataclass(slots=True, frozen=True)
class Copy:
    """One stored copy of a message in the chaos topic. ``born_ms`` is the producer's
    attempt (every attempt stamps its own), ``fired_ms`` when the timer put it into the
    topic (TIMER_DEQUEUE_MS)."""

    msg_id: str
    group: str
    queue: int
    offset: int
    deliver_ms: int
    fired_ms: int
    born_ms: int
    body_ok: bool
    #: the record's commit log offset: the same on every replica of the group
    phys: int = -1
    #: the replica (address) whose consume queue listed it
    replica: str = ""


@dataclass(slots=True)
class Consumed:
    """What the audit's consumer returned: id, received and deliver time (epoch ms)."""

    msg_id: str
    received_ms: int
    deliver_ms: int


@dataclass
class AuditResult:
    copies: list[Copy] = field(default_factory=list)
    consumed: list[Consumed] = field(default_factory=list)
    consumer_stats: dict[str, int] = field(default_factory=dict)
    consumer_errors: int = 0
    raw_errors: list[str] = field(default_factory=list)
    #: offsets a pull said were out of range: (group, queue, asked, moved to)
    moved: list[tuple[str, int, int, int]] = field(default_factory=list)
    #: how many rounds each queue's read took, and the read's duration
    rounds: int = 0
    audit_s: float = 0.0


class RawReader:
    """Each queue of ``topic`` on each routed replica of each group, read from offset 0
    with plain pulls."""

    def __init__(self, cluster: RocketMQCluster, result: AuditResult) -> None:
        self.cluster = cluster
        self.result = result
        self.pool = ConnectionPool()
        #: (group, replica address, queue) -> next offset to read
        self.pos: dict[tuple[str, str, int], int] = {}
        self.ids: set[str] = set()

    def close(self) -> None:
        self.pool.close()

    def read_round(self) -> int:
        """Pull every queue up to its end once; returns the copies found."""
        route = self.cluster.route(TOPIC, timeout=2.0)
        found = 0
        for group in self.cluster.replicas:
            for addr in route.get(group, {}).values():  # a replica not routed now: later
                for queue in range(QUEUES):
                    offset = self.pos.get((group, addr, queue), 0)
                    found += self._read_queue(group, queue, offset, addr)
        self.result.rounds += 1
        return found

    def _read_queue(self, group: str, queue: int, offset: int, addr: str) -> int:
        found = 0
        res = self.result
        for _ in range(100_000 // _PULL_BATCH):  # bounded: a round reads at most this much
            req = pull_request(
                group=_RAW_GROUP,
                topic=TOPIC,
                queue_id=queue,
                offset=offset,
                max_messages=_PULL_BATCH,
                suspend_ms=0,
                sub_version=0,
                broker_name=group,
            )
            try:
                answer = self.pool.get(addr).call(req, 5.0)
                result = parse_pull(answer, queue, offset)
            except (RemotingError, MessageDecodeError) as exc:
                res.raw_errors.append(f"{group}/{queue}@{offset} {addr}: {exc}"[:200])
                break
            if result.status is PullStatus.MOVED:
                res.moved.append((group, queue, offset, result.next_offset))
                if result.next_offset < 0 or result.next_offset == offset:
                    break
                offset = result.next_offset
                continue
            if result.status is not PullStatus.FOUND:
                if result.status is PullStatus.ERROR:
                    res.raw_errors.append(
                        f"{group}/{queue}@{offset} {addr}: code {result.code} {result.remark}"[:200]
                    )
                break
            for m in result.messages:
                props = m.properties
                mid = props.get(rmq_msg.UNIQ_KEY) or m.msg_id
                deliver = deliver_at_ms(m) or m.store_ms
                fired = int(props.get(rmq_msg.TIMER_DEQUEUE_MS) or m.store_ms)
                res.copies.append(
                    Copy(
                        mid,
                        group,
                        queue,
                        m.queue_offset,
                        deliver,
                        fired,
                        m.born_ms,
                        m.body == body_for(mid),
                        m.commit_log_offset,
                        addr,
                    )
                )
                self.ids.add(mid)
                found += 1
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        self.pos[(group, addr, queue)] = offset
        return found


def _consume(
    cluster: RocketMQCluster, res: AuditResult, want: set[str], stop: threading.Event
) -> None:
    """A fresh group reads the topic until ``stop``; what it returned goes to ``res``."""
    seen: set[str] = set()
    with Consumer(cluster.namesrv, TOPIC, f"audit-{int(time.time())}") as c:
        while not stop.is_set():
            try:
                batch = c.poll(1024, timeout=0.5)
            except QClientError:
                res.consumer_errors += 1
                stop.wait(0.2)
                continue
            now = time.time_ns() // 1_000_000
            res.consumed.extend(Consumed(m.msg_id, now, m.deliver_at_ms) for m in batch)
            seen.update(m.msg_id for m in batch)
        stats = getattr(c, "stats", None)
        if callable(stats):
            res.consumer_stats = dict(stats())


def audit(cluster: RocketMQCluster, ledger: Ledger, deadline: float) -> AuditResult:
    """Read every copy (``RawReader``) and consume with a fresh group until each
    acknowledged id was read and received, the last is due, and two rounds found nothing
    new -- or ``deadline`` (time.monotonic)."""
    with ledger.lock:  # a send_async callback may still be adding its last ones
        want = set(ledger.acked)
        last_due = max((d for d, _, _ in ledger.acked.values()), default=0)
    res = AuditResult()
    t0 = time.monotonic()
    reader = RawReader(cluster, res)
    stop = threading.Event()
    consumer = threading.Thread(
        target=_consume, args=(cluster, res, want, stop), name="audit-consumer", daemon=True
    )
    consumer.start()
    quiet = 0
    try:
        while time.monotonic() < deadline:
            found = reader.read_round()
            received = {c.msg_id for c in res.consumed}
            due = time.time() * 1000 > last_due + 2000
            quiet = quiet + 1 if (found == 0 and due) else 0
            if want <= reader.ids and want <= received and quiet >= 2:
                break
            time.sleep(0.5)  # the pace of rounds; each ends on its own condition above
    finally:
        stop.set()
        consumer.join(30)
        reader.read_round()  # what fired while the consumer closed
        reader.close()
    res.audit_s = round(time.monotonic() - t0, 1)
    return res


def describe_consumer(res: AuditResult) -> dict[str, Any]:
    """The audit consumer's figures: returned, received early, its duplicate drops, and
    whether returned + dropped matches the copies the raw read found."""
    stats = res.consumer_stats
    returned = len(res.consumed)
    dropped = stats.get("duplicates_dropped", 0)
    return {
        "returned": returned,
        "distinct": len({c.msg_id for c in res.consumed}),
        "duplicates_dropped": dropped,
        "returned_plus_dropped": returned + dropped,
        "raw_copies": len({(c.group, c.phys) for c in res.copies}),
        "fetched_early_held": stats.get("early", 0),
        "max_early_ms": stats.get("max_early_ms", 0),
        "errors": res.consumer_errors,
    }
