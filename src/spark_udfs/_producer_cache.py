"""One producer per Python worker process, keyed by its configuration, closed at exit.

Spark re-creates the data source writer every micro-batch and reuses Python worker
processes across tasks, so the producer (connections, routes, fault items) lives here,
not on the writer.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ._options import SinkOptions

__all__ = ["close_all", "get_producer", "resolve_factory"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_producers: dict[str, Any] = {}
_pid = os.getpid()
_atexit_registered = False


def resolve_factory(spec: str | None) -> Callable[..., Any]:
    """``None`` → ``qclient.Producer``; else ``"package.module:callable"``."""
    if spec is None:
        from qclient import Producer

        return Producer
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"producer_factory must look like 'module:callable', got {spec!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"producer_factory {spec!r} is not callable")
    return obj


def get_producer(options: SinkOptions) -> Any:
    """The cached producer of this process for ``options``' configuration (made on first use)."""
    global _pid, _atexit_registered
    key = options.cache_key()
    with _lock:
        if os.getpid() != _pid:
            # Forked: the parent's producers (threads, sockets) are not ours to use.
            _producers.clear()
            _pid = os.getpid()
        producer = _producers.get(key)
        if producer is None:
            kwargs = dict(options.producer_kwargs)
            namesrv = kwargs.pop("namesrv")
            producer = resolve_factory(options.producer_factory)(namesrv, **kwargs)
            _producers[key] = producer
            if not _atexit_registered:
                atexit.register(close_all)
                _atexit_registered = True
            log.debug("created a producer for namesrv %s in pid %d", namesrv, _pid)
        return producer


def close_all(timeout: float | None = 5.0) -> None:
    """Close every cached producer of this process (also runs at interpreter exit)."""
    with _lock:
        producers = list(_producers.values())
        _producers.clear()
    for producer in producers:
        try:
            producer.close(timeout=timeout)
        except Exception as exc:  # closing is best effort at exit
            log.warning("closing a producer failed: %s", type(exc).__name__)
