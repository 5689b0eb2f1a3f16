"""Latency fault tolerance (seed 004): counters, fault table, selection, detector."""

from .detector import Detector, http_probe
from .index import ContextIndex, ThreadLocalIndex
from .latency import FaultItem, FaultItemSnapshot, LatencyFaultTolerance
from .strategy import LATENCY_MAX_MS, NOT_AVAILABLE_MS, MQFaultStrategy

__all__ = [
    "LATENCY_MAX_MS",
    "NOT_AVAILABLE_MS",
    "ContextIndex",
    "Detector",
    "FaultItem",
    "FaultItemSnapshot",
    "LatencyFaultTolerance",
    "MQFaultStrategy",
    "ThreadLocalIndex",
    "http_probe",
]
