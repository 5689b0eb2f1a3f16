"""The delay broker: HTTP API, topic table and heartbeat over the durable store."""

from .app import Broker, create_app, run
from .config import BrokerConfig

__all__ = ["Broker", "BrokerConfig", "create_app", "run"]
