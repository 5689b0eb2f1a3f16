"""The producer SDK: ``Producer`` (blocking + ``send_async``) and ``AsyncProducer``."""

from .async_producer import AsyncProducer
from .producer import Producer

__all__ = ["AsyncProducer", "Producer"]
