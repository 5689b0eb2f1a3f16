"""How each attempt's outcome updates the fault table: the one place for isolation rules.

The transport classifies every attempt into an ``Outcome`` (``qclient.transport.errors``);
a :class:`FaultPolicy` turns the outcome into a fault-table update. A new fault policy is
a new subclass, given to ``MQFaultStrategy(policy=...)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..transport.errors import Outcome

if TYPE_CHECKING:
    from .strategy import MQFaultStrategy

__all__ = [
    "FaultPolicy",
    "IsolationPolicy",
    "Outcome",
]  # Outcome: how the transport classified an attempt


class FaultPolicy:
    """Maps an attempt's outcome to ``strategy.update_fault_item(...)``."""

    def apply(
        self, strategy: MQFaultStrategy, broker: str, latency_ms: float, outcome: Outcome
    ) -> None:
        raise NotImplementedError


class IsolationPolicy(FaultPolicy):
    """RocketMQ's rules: an answer records its latency (which may isolate a slow broker by
    the latency table); a transport failure isolates, and marks the broker unreachable only
    when a detector will probe it back; a retryable broker error isolates and marks it
    unreachable; a failure before the request left, a final answer or an interruption
    records the latency and keeps the broker reachable."""

    def apply(
        self, strategy: MQFaultStrategy, broker: str, latency_ms: float, outcome: Outcome
    ) -> None:
        if outcome is Outcome.TRANSPORT:
            strategy.update_fault_item(broker, latency_ms, True, not strategy.start_detector_enable)
        elif outcome is Outcome.BROKER:
            strategy.update_fault_item(broker, latency_ms, True, False)
        else:
            strategy.update_fault_item(broker, latency_ms, False, True)
