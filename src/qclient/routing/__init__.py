"""Route resolution: name-server client, message queues, topic publish info, route cache."""

from .nameserver import AsyncNameServerClient, NameServerClient
from .publish_info import MessageQueue, TopicPublishInfo
from .route_cache import RouteCache

__all__ = [
    "AsyncNameServerClient",
    "MessageQueue",
    "NameServerClient",
    "RouteCache",
    "TopicPublishInfo",
]
