"""The vocabulary of a send plan: the messages in flight, the calls a plan asks its driver
to make (an engine's ``Call``: ``HttpCall`` here for the qclient engine), what came of
them, and the plan type itself (see ``_core.py``)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import msgspec

from ..protocol.deadline import attempt_deadline_ms
from ..protocol.wire import WireMessage
from ..routing.publish_info import MessageQueue, TopicPublishInfo

__all__ = [
    "MIN_ATTEMPT",
    "CallResult",
    "HttpCall",
    "Item",
    "Plan",
    "Sleep",
    "Step",
    "queued_seconds",
]

#: framing allowance per message when sizing a chunk against batch_max_bytes
PER_MESSAGE_OVERHEAD = 96

#: the shortest per-attempt timeout worth trying; below it the send has timed out
MIN_ATTEMPT = 0.02


class Item(msgspec.Struct, gc=False, eq=False):
    """One message in flight: its wire form, route, and where it went last.

    Not tracked by the cyclic collector (``gc=False``): ``send_async`` keeps one per
    buffered message, and tracked ones would each make the collector's full passes
    longer and more frequent. That is safe while no field can lead back to an ``Item``:
    a send's errors stay in the plan's results, never here (an exception's traceback
    holds the frames that hold the items).
    """

    index: int  # position in the caller's input
    wire: WireMessage
    info: TopicPublishInfo
    queue: MessageQueue | None = None  # pre-assigned by the accumulator for round 1
    #: the caller chose the id: send it to the broker that owns the id (see select_for_id)
    pinned: bool = False
    last_broker: str | None = None
    #: brokers whose attempt failed earlier in this send: a retry avoids them all
    failed: tuple[str, ...] = ()
    #: the message's send span (``_tracing.defer_send``), ended with its result
    trace: Any = None
    #: the delay of the first attempt (ms), once a retry has shortened ``wire.delay_ms``
    first_delay_ms: int | None = None
    #: brokers whose attempt may have stored it anyway (see _ambiguous)
    ambiguous: tuple[str, ...] = ()
    #: the last attempt failed after its request may have been stored (a timeout, a
    #: dropped connection): a caller-chosen id is retried on that broker and queue, where
    #: the copy it may hold makes the retry one copy (qclient deduplicates the id there;
    #: RocketMQ's consumer drops a key it returned from that queue)
    stay: bool = False

    def failed_on(self, broker: str) -> None:
        """This send's attempt on ``broker`` failed: its retry avoids it."""
        self.last_broker = broker
        if broker not in self.failed:
            self.failed += (broker,)

    @property
    def size(self) -> int:
        return len(self.wire.body) + len(self.wire.topic) + PER_MESSAGE_OVERHEAD


@dataclass(slots=True, eq=False)
class HttpCall:
    """A POST the driver must make (the qclient engine's ``Call``)."""

    broker: str
    addr: str
    path: str
    body: bytes
    timeout: float
    items: list[Item]
    #: a send's body, made when the attempt starts (after any wait for a client-side
    #: slot): it carries the attempt's deadline, ``build(deadline_ms)``; None: ``body``
    build: Callable[[int], bytes] | None = None

    def payload(self) -> bytes:
        """The body to send now (see ``build``)."""
        build = self.build
        return self.body if build is None else build(attempt_deadline_ms(self.timeout))


@dataclass(slots=True)
class CallResult:
    """What came of a call: the engine transport's answer or an exception, and how long
    it took."""

    response: Any = None
    exc: BaseException | None = None
    latency_ms: float = 0.0
    queued_s: float = 0.0  # waited for a client-side slot before the attempt started


class Sleep(float):
    """A pause the driver must take between rounds (seconds)."""


Step = list[Any] | Sleep  # a round's calls (each an engine's ``Call``), or a pause
Plan = Generator[Step, Any, Any]


def queued_seconds(outcomes: list[CallResult]) -> float:
    """Seconds a round waited for client-side slots: client queueing is not the brokers'
    time, so the send's deadline moves by it."""
    return max((o.queued_s for o in outcomes), default=0.0)
