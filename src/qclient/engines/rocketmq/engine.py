"""``RocketMQEngine``: the producer's plan on Apache RocketMQ 5, in its remoting protocol.

Each message of a chunk is one ``SEND_MESSAGE_V2`` request, and a chunk's requests are
pipelined on the broker's one connection (``Connection.call_many``): RocketMQ's batch path
does not run the timer hook (``HookUtils.handleScheduleMessage`` sees only single
messages), so a delayed message in a ``SEND_BATCH_MESSAGE`` would be delivered at once.
Immediate messages of a chunk ride one batch request. A delay becomes the absolute
``TIMER_DELIVER_MS`` when the attempt starts (a retry carries the remaining delay), and
the message id is RocketMQ's ``UNIQ_KEY``, so ids mean the same on both engines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._models import SendResult, SendStatus
from ...errors import BrokerUnavailableError, QClientError
from ...producer._plan import CallResult, Item
from ...protocol.wire import FLAG_COMPRESSED
from ...transport.errors import Outcome
from ..base import Engine, SendVerdict
from .aio import AsyncConnectionPool
from .codes import RequestCode, ResponseCode, error_for, is_ambiguous_code, send_outcome
from .connection import RemotingConnectionError, RemotingError
from .lifecycle import RocketMQLifecycle
from .nameserver import AsyncRocketMQNameServer, RocketMQNameServer
from .outcomes import NotSentError, maybe_sent, transport_error
from .pool import ConnectionPool
from .remoting import RemotingCommand, request
from .sending import PRODUCER_GROUP, batch_request, single_request

if TYPE_CHECKING:
    from ..._config import ProducerConfig
    from ...transport.http import Credentials

__all__ = ["PRODUCER_GROUP", "RemotingCall", "RocketMQEngine"]

log = logging.getLogger(__name__)

#: how much an answer says about the broker's health: a call's outcome in the fault table
#: is its requests' worst (a final refusal of one message says nothing about the broker)
_RANK = {
    Outcome.OK: 0,
    Outcome.FINAL: 0,
    Outcome.CLIENT: 1,
    Outcome.BROKER: 2,
    Outcome.TRANSPORT: 3,
}


@dataclass(slots=True, eq=False)
class RemotingCall:
    """One broker's chunk as remoting requests; ``payload()`` builds them when the attempt
    starts (fresh deliver times from the remaining delays)."""

    broker: str
    addr: str
    timeout: float
    items: list[Item]
    #: the deliver time each item was sent with, set by ``payload()`` (epoch ms)
    deliver_ms: list[int]
    #: the item indexes of each request (one for a single send, several for a batch); a
    #: range, not a list: one object fewer per message for the cyclic collector
    groups: list[range | list[int]]
    #: ms from the write to the first answer, set by the transports: one request's
    #: latency, what the fault table judges the broker by when a call pipelines several
    first_answer_ms: float | None = None

    def payload(self) -> list[RemotingCommand]:
        now = time.time_ns() // 1_000_000
        cmds: list[RemotingCommand] = []
        groups: list[range | list[int]] = []
        immediate: list[int] = []
        deliver = self.deliver_ms
        for i, it in enumerate(self.items):
            w = it.wire
            at = w.deliver_at_ms if w.deliver_at_ms is not None else now + (w.delay_ms or 0)
            deliver[i] = at
            if at > now:
                cmds.append(single_request(w, self.broker, at, now))
                groups.append(range(i, i + 1))
            else:
                immediate.append(i)
        # a batch request is one queue of one topic, and all compressed or none (its
        # header's sysFlag): the items keep the queues the plan chose for them
        batches: dict[tuple[str, int, int], list[int]] = {}
        for i in immediate:
            w = self.items[i].wire
            batches.setdefault((w.topic, w.queue_id, w.flag & FLAG_COMPRESSED), []).append(i)
        for group in batches.values():
            wires = [self.items[i].wire for i in group]
            if len(wires) == 1:
                cmds.append(single_request(wires[0], self.broker, None, now))
            else:
                cmds.append(batch_request(wires, self.broker, now))
            groups.append(group)
        self.groups = groups
        return cmds


class RocketMQEngine(RocketMQLifecycle, Engine):
    """Apache RocketMQ 5 brokers and NameServers, over remoting TCP; lookup, cancel and
    reschedule by id are index queries and recalls (``RocketMQLifecycle``)."""

    name = "rocketmq"
    #: a call's messages are as many requests (a delayed one each), answered one by one by
    #: the broker, and the attempt's timeout covers them all: 1,000 delayed rows of a Spark
    #: chunk in one call took over the 1 s attempt on a busy host and were retried (stored
    #: twice); more calls of 64 wait for a client-side slot instead, which is not charged
    max_call_messages = 64

    def send_call(self, broker: str, addr: str, items: list[Item], timeout: float) -> RemotingCall:
        return RemotingCall(broker, addr, timeout, items, [0] * len(items), [])

    def read_send(self, call: Any, res: CallResult) -> SendVerdict:
        items: list[Item] = call.items
        broker = call.broker
        if res.exc is not None or res.response is None:
            exc = res.exc or RemotingConnectionError("no response")
            err = transport_error(exc, broker, call.timeout)
            log.warning(
                "send of %d message(s) to %s failed after %.0f ms: %s",
                len(items),
                broker,
                res.latency_ms,
                err,
            )
            # a connection never opened stored nothing; anything else may have
            return SendVerdict(Outcome.TRANSPORT, None, err, ambiguous=maybe_sent(exc))
        answers: list[SendResult | QClientError | None] = [None] * len(items)
        retry: set[int] = set()
        ambiguous: set[int] = set()
        worst = Outcome.OK
        ok = SendStatus.SEND_OK
        for group, answer in zip(call.groups, res.response, strict=True):
            if isinstance(answer, RemotingCommand):
                code = answer.code
                if code == ResponseCode.SUCCESS:
                    for i in group:
                        it = items[i]
                        w = it.wire
                        deliver = call.deliver_ms[i]
                        answers[i] = SendResult(w.msg_id, ok, broker, w.queue_id, deliver, w.topic)
                    continue
                outcome, again = send_outcome(code, answer.remark)
                topic = items[group[0]].wire.topic
                err = error_for(code, answer.remark, broker=broker, topic=topic)
                if is_ambiguous_code(code):
                    ambiguous.update(group)
                log.warning("broker %s refused a send: %s", broker, err)
            else:
                outcome, again = Outcome.TRANSPORT, True
                err = transport_error(answer, broker, call.timeout)
                if maybe_sent(answer):
                    ambiguous.update(group)
            if _RANK[outcome] > _RANK[worst]:
                worst = outcome
            for i in group:
                answers[i] = err
                if again:
                    retry.add(i)
        done: list[SendResult | QClientError] = [a for a in answers if a is not None]
        if len(done) != len(items):
            err = BrokerUnavailableError(
                f"broker {broker} left messages unanswered", broker_name=broker
            )
            return SendVerdict(Outcome.BROKER, None, err)
        # many pipelined requests: the broker's health is one request's latency, not the
        # whole call's (64 answered one by one by a busy broker took over the 550 ms that
        # isolates a broker for 2 s, and the brokers took turns being isolated)
        one = call.first_answer_ms if len(call.groups) > 1 else None
        return SendVerdict(
            worst, done, retry=frozenset(retry), ambiguous=frozenset(ambiguous), latency_ms=one
        )

    # --- I/O objects ------------------------------------------------------------------

    def _no_credentials(self, credentials: Credentials | None) -> None:
        if credentials is not None:
            raise self.unsupported(
                "access control (access_key / secret_key)",
                "use RocketMQ's own ACL on the cluster and leave the keys unset",
            )

    def sync_transport(
        self, cfg: ProducerConfig, credentials: Credentials | None, *, lean: bool | None = None
    ) -> SyncRemoting:
        self._no_credentials(credentials)
        # callers read their own answers: a lone send costs no thread switch (connection.py)
        pool = ConnectionPool(connect_timeout=cfg.namesrv_timeout, read_by_callers=True)
        return SyncRemoting(pool)

    def async_transport(
        self, cfg: ProducerConfig, credentials: Credentials | None, *, lean: bool | None = None
    ) -> AsyncRemoting:
        self._no_credentials(credentials)
        return AsyncRemoting(AsyncConnectionPool(connect_timeout=cfg.namesrv_timeout))

    def name_server(self, cfg: ProducerConfig, transport: Any = None) -> RocketMQNameServer:
        pool = transport.pool if isinstance(transport, SyncRemoting) else None
        return RocketMQNameServer(cfg.namesrv, timeout=cfg.namesrv_timeout, pool=pool)

    def async_name_server(self, cfg: ProducerConfig) -> AsyncRocketMQNameServer:
        return AsyncRocketMQNameServer(cfg.namesrv, timeout=cfg.namesrv_timeout)

    def probe(self, transport: Any) -> Callable[[str, float], bool]:
        pool: ConnectionPool = transport.pool

        def probe(addr: str, timeout: float) -> bool:
            # any answer (even "not supported") says the broker is serving
            try:
                answer = pool.get(addr).call(request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout)
            except (RemotingError, OSError):
                pool.discard(addr)
                return False
            return answer.code != ResponseCode.SYSTEM_BUSY

        return probe


class SyncRemoting:
    """The blocking transport: a send call's requests, pipelined on the broker's one
    connection; answers (or errors) in request order."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    def perform(
        self, call: RemotingCall, on_write: Callable[[], None] | None = None
    ) -> list[RemotingCommand | RemotingError]:
        try:
            conn = self.pool.get(call.addr)
        except RemotingError as exc:
            raise NotSentError(str(exc)) from exc
        cmds = call.payload()
        if on_write is not None:
            on_write()
        first: list[float] = []
        start = time.monotonic()
        answers = conn.call_many(cmds, call.timeout, first)
        if first:
            call.first_answer_ms = (first[0] - start) * 1000
        if any(isinstance(a, RemotingConnectionError) for a in answers):
            self.pool.discard(call.addr)
        return answers

    def close(self) -> None:
        self.pool.close()


class AsyncRemoting:
    """The asyncio transport (``SyncRemoting`` on one event loop)."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def perform(self, call: RemotingCall) -> list[RemotingCommand | RemotingError]:
        try:
            conn = await self.pool.get(call.addr)
        except RemotingError as exc:
            raise NotSentError(str(exc)) from exc
        first: list[float] = []
        start = time.monotonic()
        answers = await conn.call_many(call.payload(), call.timeout, first)
        if first:
            call.first_answer_ms = (first[0] - start) * 1000
        if any(isinstance(a, RemotingConnectionError) for a in answers):
            await self.pool.discard(call.addr)
        return answers

    async def aclose(self) -> None:
        await self.pool.close()
