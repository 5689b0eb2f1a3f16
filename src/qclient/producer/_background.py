"""A producer's background thread: the detector's probes and the route refreshes."""

from __future__ import annotations

import logging
import threading
import time

from .._config import ProducerConfig
from ..errors import QClientError
from ..fault.detector import Detector
from ._core import ProducerCore

__all__ = ["Background"]

log = logging.getLogger(__name__)

#: after a failed refresh of a topic, wait this long before asking the name servers again
_REFRESH_BACKOFF = 2.0
#: a stale route wakes the thread at most this often
_WAKE_EVERY = 0.5


class Background:
    """Owns the detector thread, its transport (the engine's) and the name-server client it
    refreshes routes with; shared as-is by ``Producer`` and ``AsyncProducer``."""

    def __init__(self, core: ProducerCore, cfg: ProducerConfig) -> None:
        self.core = core
        engine = core.engine
        self._http = engine.sync_transport(cfg, None)
        #: the name-server client; ``Producer`` fetches first routes with it too
        self.ns = engine.name_server(cfg, self._http)
        self._retry_after: dict[str, float] = {}
        self._last_wake = 0.0
        self._lock = threading.Lock()
        self.detector = Detector(
            core.strategy,
            core.routes.resolve,
            engine.probe(self._http),
            interval=cfg.detect_interval,
            timeout=cfg.detect_timeout,
            housekeeping=self.refresh_routes,
        )
        core.routes.set_on_stale(self._stale)
        core.on_route_failure = self.route_failed
        self.detector.start()

    def _stale(self, topic: str) -> None:
        now = time.monotonic()
        if now - self._last_wake >= _WAKE_EVERY:
            self._last_wake = now
            self.detector.wake()

    def route_failed(self, topic: str) -> None:
        """A send to ``topic`` failed: refresh its route now (in the background)."""
        self.core.routes.mark_stale(topic)
        self._stale(topic)

    def refresh_routes(self) -> None:
        """Fetch every stale route; on failure the last good one stays in use."""
        now = time.monotonic()
        for topic in self.core.routes.stale_topics():
            if self._retry_after.get(topic, 0.0) > now:
                continue
            try:
                route = self.ns.get_route(topic)
            except QClientError as exc:
                self._retry_after[topic] = now + _REFRESH_BACKOFF
                log.warning(
                    "route refresh of %s failed, keeping the last good route: %s", topic, exc
                )
                continue
            self._retry_after.pop(topic, None)
            self.core.store_route(topic, route)

    def close(self) -> None:
        self.detector.stop()
        self.ns.close()
        self._http.close()
