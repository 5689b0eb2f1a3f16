"""Real Apache RocketMQ 5 processes (NameServer, brokers) as local JVMs, for tests and
benchmarks: ``RocketMQCluster`` (what ``LocalCluster(engine="rocketmq")`` runs)."""

from .cluster import DEFAULT_TOPIC, RocketMQCluster
from .node import JvmNode
from .runtime import SETUP_HINT, TIMER_MAX_DELAY_SEC, TIMER_PRECISION_MS

__all__ = [
    "DEFAULT_TOPIC",
    "SETUP_HINT",
    "TIMER_MAX_DELAY_SEC",
    "TIMER_PRECISION_MS",
    "JvmNode",
    "RocketMQCluster",
]
