"""The Celery app the celery peer's worker runs: one task that reports its own arrival."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

#: set by the bench for the worker it starts
BROKER_URL = os.environ.get("QBENCH_CELERY_BROKER", "redis://127.0.0.1:6379/0")


def make_app(broker_url: str) -> Celery:
    """A Celery app on ``broker_url`` (Redis), results ignored, JSON only."""
    app = Celery("qbench", broker=broker_url)
    app.conf.update(
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        # a countdown task is held by the worker until its ETA; do not let Redis hand it
        # to another worker meanwhile (default is 1 h; our delays are seconds)
        broker_transport_options={"visibility_timeout": 3600},
    )
    return app


app = make_app(BROKER_URL)
_redis: Any = None


@app.task(name="qbench.fire")
def fire(msg_id: str, key: str) -> None:
    """Push ``msg_id`` onto the Redis list ``key`` the bench's consumer pops."""
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(BROKER_URL)
    _redis.rpush(key, msg_id)
