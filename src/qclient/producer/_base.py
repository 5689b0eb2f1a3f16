"""What ``Producer`` and ``AsyncProducer`` share besides the core: options, flags, stats."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .._config import ProducerConfig
from .._models import SendResult
from ..errors import BatchSendError, ProducerClosedError, QClientError
from ..fault.latency import FaultItemSnapshot
from ..transport.http import Credentials
from ._core import ProducerCore

__all__ = ["ProducerBase", "batch_outcome"]


def batch_outcome(results: list[SendResult | QClientError]) -> list[SendResult]:
    """The results of ``send_batch``, or ``BatchSendError`` if any message failed."""
    failed = [r for r in results if isinstance(r, QClientError)]
    if failed:
        raise BatchSendError(
            f"{len(failed)} of {len(results)} message(s) not acknowledged; first: {failed[0]}",
            results,
        )
    return results  # type: ignore[return-value]


class ProducerBase:
    """Configuration, the shared core, and the read-only views of a producer."""

    def __init__(
        self,
        namesrv: str | Sequence[str],
        index_factory: Callable[[], Any],
        options: dict[str, Any],
    ) -> None:
        self._cfg = ProducerConfig.create(namesrv, **options)
        self._core = ProducerCore(self._cfg, index_factory)
        cfg = self._cfg
        self._credentials = (
            Credentials(cfg.access_key, cfg.secret_key)
            if cfg.access_key is not None and cfg.secret_key is not None
            else None
        )
        self._closed = False
        self._pid = os.getpid()
        #: set in a forked child by the at-fork hook, so a send checks a flag, not getpid()
        self._in_child = False
        _LIVE.add(self)

    @property
    def config(self) -> ProducerConfig:
        return self._cfg

    # runtime toggles (apache/rocketmq#7813): selection and the detector read them live
    @property
    def send_latency_fault_enable(self) -> bool:
        return self._core.strategy.send_latency_fault_enable

    @send_latency_fault_enable.setter
    def send_latency_fault_enable(self, value: bool) -> None:
        self._core.strategy.send_latency_fault_enable = bool(value)

    @property
    def start_detector_enable(self) -> bool:
        return self._core.strategy.start_detector_enable

    @start_detector_enable.setter
    def start_detector_enable(self, value: bool) -> None:
        self._core.strategy.start_detector_enable = bool(value)

    def fault_items(self) -> list[FaultItemSnapshot]:
        """Snapshots of the fault table: ``.name, .current_latency_ms, .available,
        .reachable, .isolated_until`` (epoch seconds, or None when not isolated)."""
        return self._core.fault_items()

    def stats(self) -> dict[str, Any]:
        """Counters: ``sent``, ``failed``, ``retried``, ``requests`` and per-broker
        ``brokers[name] = {requests, errors, avg_ms, p50_ms, p99_ms, max_ms}``."""
        return self._core.stats.snapshot()

    def _lifecycle(self, feature: str) -> None:
        """Raise ``UnsupportedByEngineError`` unless the engine can ``feature`` by id."""
        self._check_open()
        engine = self._core.engine
        if not engine.lifecycle:
            raise engine.unsupported(feature, "see README's per-engine table")

    def _check_open(self) -> None:
        if self._closed:
            raise ProducerClosedError("producer is closed")
        if self._in_child:
            self._forked()

    def _forked(self) -> None:
        """First use in a child process (``os.fork()`` after the producer was made): the
        parent's threads did not come along. Subclasses restart what they need."""
        self._pid = os.getpid()
        self._in_child = False

    def _after_fork_in_child(self) -> None:
        """Right after ``os.fork()``, in the child: fresh locks for the shared state (a
        lock the parent's other threads held at the fork would never be released here)."""
        self._in_child = True
        self._core.after_fork_in_child()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"{type(self).__name__}(namesrv={','.join(self._cfg.namesrv)!r}, {state})"


_LIVE: weakref.WeakSet[ProducerBase] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for producer in list(_LIVE):
        producer._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
