"""The name server: broker registry with heartbeat expiry, and topic routes."""

from .app import NameServerConfig, create_app, run
from .route_table import RouteTable

__all__ = ["NameServerConfig", "RouteTable", "create_app", "run"]
