"""Pull consumers with RocketMQ-style consumer groups (clustering mode)."""

from ._allocate import allocate_averagely
from ._async import AsyncConsumer
from ._consumer import Consumer

__all__ = ["AsyncConsumer", "Consumer", "allocate_averagely"]
