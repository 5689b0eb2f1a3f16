"""The seam between the engine-neutral producer and one engine.

The producer's plan (``producer/_core.py``) decides which messages go to which broker
queue, with which per-attempt timeout, and what each outcome means for the fault table
and the retries. An ``Engine`` turns a chunk of messages for one broker into a call on its
wire (``send_call``), reads the answer back as a ``SendVerdict`` (``read_send``), and makes
the I/O objects the drivers use: transports (``perform(call)``), name-server clients
(``get_route(topic)``) and the detector's reachability probe.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..errors import UnsupportedByEngineError

if TYPE_CHECKING:
    from .._config import ProducerConfig
    from .._models import SendResult
    from ..errors import QClientError
    from ..producer._core import ProducerCore
    from ..producer._plan import CallResult, Item, Plan
    from ..protocol.wire import RescheduleRequest, TopicRoute
    from ..transport.errors import Outcome
    from ..transport.http import Credentials

__all__ = [
    "AsyncNameServer",
    "AsyncTransport",
    "Call",
    "Engine",
    "NameServer",
    "SendVerdict",
    "SyncTransport",
]


class Call(Protocol):
    """One request of a plan's round to one broker (``HttpCall``, ``RemotingCall``)."""

    broker: str
    addr: str
    timeout: float
    items: list[Item]


class SyncTransport(Protocol):
    """Performs calls, blocking; thread-safe."""

    def perform(self, call: Any, on_write: Callable[[], None] | None = None) -> Any: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """Performs calls on one running event loop."""

    async def perform(self, call: Any) -> Any: ...

    async def aclose(self) -> None: ...


class NameServer(Protocol):
    """Routes from a list of name servers, with failover (blocking)."""

    def get_route(self, topic: str) -> TopicRoute: ...

    def close(self) -> None: ...


class AsyncNameServer(Protocol):
    async def get_route(self, topic: str) -> TopicRoute: ...

    async def aclose(self) -> None: ...


class SendVerdict(NamedTuple):
    """What one send call came to.

    ``answers``: per item of the call, in order, its ``SendResult`` or error; None when the
    call failed as a whole with ``error`` (retried elsewhere unless ``outcome`` is FINAL).
    ``retry``: the items whose error is retried on another broker (indexes into answers).
    ``ambiguous``: whether the broker may have stored the call's messages anyway (a bool
    for the whole call, or the indexes of such items).
    ``latency_ms``: the latency the fault table records for the broker when the call's
    whole time would misjudge it (None: the call's).
    """

    outcome: Outcome
    answers: Sequence[SendResult | QClientError] | None = None
    error: QClientError | None = None
    retry: frozenset[int] = frozenset()
    ambiguous: bool | frozenset[int] = False
    latency_ms: float | None = None


class Engine(ABC):
    """One kind of cluster; stateless apart from its name (one instance per producer)."""

    #: the scheme of its name-server addresses, and the name in errors
    name: str = ""
    #: cancel, lookup and reschedule by id (and so the clean-up of ambiguous copies)
    lifecycle: bool = True
    #: the most messages one call carries (``batch_max_messages`` may ask for fewer)
    max_call_messages: int = 1 << 30

    # --- messages ------------------------------------------------------------------

    @abstractmethod
    def send_call(self, broker: str, addr: str, items: list[Item], timeout: float) -> Call:
        """The call that sends ``items`` (one broker's chunk, queues assigned)."""

    @abstractmethod
    def read_send(self, call: Any, res: CallResult) -> SendVerdict:
        """How the send ``call`` ended, from the driver's ``res``."""

    def unsupported(self, feature: str, why: str = "") -> UnsupportedByEngineError:
        return UnsupportedByEngineError(self.name, feature, why)

    # --- lifecycle by id (plans the producers' drivers run; ``lifecycle`` says whether
    # the engine has them; the rules they share are in ``producer/lifecycle.py``) ----------

    def plan_lookup(
        self, core: ProducerCore, addrs: dict[str, str], topic: str, msg_id: str
    ) -> Plan:
        """Returns the merged ``MessageInfo`` of every master's copy, or None."""
        raise self.unsupported("lookup", "see README's per-engine table")

    def plan_lookup_on(
        self, core: ProducerCore, topic: str, msg_id: str, broker: str, addr: str
    ) -> Plan:
        """Returns the state (``wire.STATE_*``) of ``broker``'s copy, or None."""
        raise self.unsupported("lookup", "see README's per-engine table")

    def plan_cancel_id(
        self,
        core: ProducerCore,
        addrs: dict[str, str],
        topic: str,
        msg_id: str,
        deliver_at_ms: int | None = None,
    ) -> Plan:
        """Returns True if this call cancelled a copy on any master (``deliver_at_ms``: the
        time the id was sent for, when known)."""
        raise self.unsupported("cancel", "see README's per-engine table")

    def plan_cancel(self, core: ProducerCore, result: SendResult, addr: str) -> Plan:
        """Returns True if this call cancelled ``result``'s copy on its broker (``addr``)."""
        raise self.unsupported("cancel", "see README's per-engine table")

    def plan_reschedule(
        self, core: ProducerCore, addrs: dict[str, str], request: RescheduleRequest
    ) -> Plan:
        """Returns the ``SendResult`` of the moved message (``MessageNotScheduledError``
        when no copy is scheduled)."""
        raise self.unsupported("reschedule", "see README's per-engine table")

    # --- I/O objects ------------------------------------------------------------------

    @abstractmethod
    def sync_transport(
        self, cfg: ProducerConfig, credentials: Credentials | None, *, lean: bool | None = None
    ) -> SyncTransport: ...

    @abstractmethod
    def async_transport(
        self, cfg: ProducerConfig, credentials: Credentials | None, *, lean: bool | None = None
    ) -> AsyncTransport: ...

    @abstractmethod
    def name_server(
        self, cfg: ProducerConfig, transport: SyncTransport | None = None
    ) -> NameServer:
        """A blocking name-server client (on ``transport`` when given, else its own)."""

    @abstractmethod
    def async_name_server(self, cfg: ProducerConfig) -> AsyncNameServer: ...

    @abstractmethod
    def probe(self, transport: SyncTransport) -> Callable[[str, float], bool]:
        """The detector's probe: does the broker at ``addr`` answer within ``timeout``?"""
