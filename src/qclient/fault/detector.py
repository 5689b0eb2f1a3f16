"""The detector: a daemon thread that probes isolated brokers and refreshes routes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import httpx

from ..protocol.wire import HEALTH
from ..transport.http import SyncHttp
from .strategy import MQFaultStrategy

__all__ = ["Detector", "http_probe"]

log = logging.getLogger(__name__)


def http_probe(http: SyncHttp) -> Callable[[str, float], bool]:
    """A probe: ``GET /health`` answers 200 within the timeout."""

    def probe(addr: str, timeout: float) -> bool:
        try:
            return http.request("GET", addr, HEALTH, timeout=timeout).status == 200
        except httpx.HTTPError:
            return False

    return probe


class Detector:
    """Background thread of a producer.

    Every ``interval`` it probes isolated/unreachable brokers (when
    ``strategy.start_detector_enable``, read each round so runtime toggles work), and it
    runs the periodic ``housekeeping`` callback (route refresh). ``wake()`` makes it run at
    once, e.g. after a send failure made a route stale.
    """

    def __init__(
        self,
        strategy: MQFaultStrategy,
        resolve: Callable[[str], str | None],
        probe: Callable[[str, float], bool],
        *,
        interval: float,
        timeout: float,
        housekeeping: Callable[[], None] | None = None,
        name: str = "qclient-detector",
    ) -> None:
        self.strategy = strategy
        self.resolve = resolve
        self.probe = probe
        self.interval = interval
        self.timeout = timeout
        self.housekeeping = housekeeping
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def run_once(self) -> int:
        """One round; returns the number of probes made."""
        probes = 0
        if self.strategy.start_detector_enable:
            probes = self.strategy.latency_fault_tolerance.detect_round(
                self.resolve, self.probe, interval=self.interval, timeout=self.timeout
            )
        if self.housekeeping is not None:
            self.housekeeping()
        return probes

    def _run(self) -> None:
        # Probe more often than ``interval`` so a due item waits at most a fraction of it;
        # each item's own check_stamp keeps its probes ``interval`` apart.
        tick = min(self.interval, 0.5)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:  # the thread must survive anything a round does
                log.exception("detector round failed")
            self._wake.wait(max(0.0, tick - (time.monotonic() - started)))
            self._wake.clear()
