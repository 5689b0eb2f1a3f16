"""Latency fault tolerance: the fault table, the isolation policy, queue selection and the
reachability detector (RocketMQ's MQFaultStrategy)."""

from .detector import Detector, http_probe
from .index import ContextIndex, ThreadLocalIndex
from .latency import FaultItem, FaultItemSnapshot, LatencyFaultTolerance
from .policy import FaultPolicy, IsolationPolicy, Outcome
from .strategy import LATENCY_MAX_MS, NOT_AVAILABLE_MS, MQFaultStrategy

__all__ = [
    "LATENCY_MAX_MS",
    "NOT_AVAILABLE_MS",
    "ContextIndex",
    "Detector",
    "FaultItem",
    "FaultItemSnapshot",
    "FaultPolicy",
    "IsolationPolicy",
    "LatencyFaultTolerance",
    "MQFaultStrategy",
    "Outcome",
    "ThreadLocalIndex",
    "http_probe",
]
