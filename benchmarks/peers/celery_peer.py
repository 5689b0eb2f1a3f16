"""Celery ``apply_async(countdown=...)`` on a Redis broker (default Redis config), one worker."""

from __future__ import annotations

import importlib.util
import logging
import sys
import uuid
from pathlib import Path
from typing import Any

from benchmarks._suite.procs import ServerProcess, env_with
from benchmarks.peers.base import Peer, PeerConsumer, PeerProducer, Sink
from benchmarks.peers.redis_peer import RedisPeer

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]


class CeleryProducer(PeerProducer):
    """``send_task(countdown=delay_s)``; the broker's reply to the push is the ack."""

    def __init__(self, app: Any, channel: str) -> None:
        self.app = app
        self.channel = channel

    def send(self, msg_id: str, delay_s: float) -> None:
        self.app.send_task("qbench.fire", args=(msg_id, self.channel), countdown=delay_s)


class CeleryConsumer(PeerConsumer):
    """BLPOP of the list the task pushes its message id onto."""

    def __init__(self, port: int, channel: str, sink: Sink) -> None:
        super().__init__(sink)
        self.port = port
        self.channel = channel
        self.r: Any = None

    def connect(self) -> None:
        import redis

        self.r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=3)

    def poll_once(self) -> None:
        got = self.r.blpop([self.channel], timeout=1)
        if got:
            self.sink(got[1].decode())

    def disconnect(self) -> None:
        if self.r is not None:
            self.r.close()


class CeleryPeer(Peer):
    """redis-server (default config) plus one ``celery worker --pool=solo``."""

    name = "celery"
    description = "apply_async(countdown) on Redis (default config), 1 worker, solo pool"
    start_timeout = 30.0

    def __init__(self) -> None:
        self.redis = RedisPeer("celery-redis", [], "celery's broker")
        self.worker: ServerProcess | None = None
        self.app: Any = None

    def missing(self) -> str | None:
        why = self.redis.missing()
        if why:
            return why
        if importlib.util.find_spec("celery") is None:
            return "python package celery not installed (bash benchmarks/setup_peers.sh)"
        return None

    def start(self, workdir: Path) -> None:
        from benchmarks.peers.celery_app import make_app

        self.redis.start(workdir / "redis")
        url = f"redis://127.0.0.1:{self.redis.port}/0"
        self.app = make_app(url)
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        sent = False

        def ready() -> bool:
            nonlocal sent
            if not sent:  # one probe task; ready once the worker ran it
                self.app.send_task("qbench.fire", args=("probe", probe))
                sent = True
            import redis

            r = redis.Redis(host="127.0.0.1", port=self.redis.port, socket_timeout=2)
            try:
                return r.lpop(probe) is not None
            finally:
                r.close()

        env = env_with(QBENCH_CELERY_BROKER=url, PYTHONPATH=str(REPO))
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "benchmarks.peers.celery_app:app",
            "worker",
            "--pool=solo",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=WARNING",
            f"--hostname=qbench{self.redis.port}@localhost",
        ]
        self.worker = ServerProcess(
            "celery-worker", argv, ready=ready, env=env, cwd=REPO, log_path=workdir / "worker.log"
        )
        self.worker.start(self.start_timeout)

    def kill9(self) -> None:
        self.redis.kill9()  # the server; the worker lives on and has to reconnect

    def restart(self) -> None:
        self.redis.restart()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.redis.stop()

    def note(self) -> str | None:
        return (
            "countdown tasks are fetched by the worker at once and held in its memory until "
            "their ETA; their unacknowledged copies live in Redis (default config: no AOF)"
        )

    def producer(self, channel: str) -> PeerProducer:
        return CeleryProducer(self.app, channel)

    def consumer(self, channel: str, sink: Sink) -> PeerConsumer:
        return CeleryConsumer(self.redis.port, channel, sink).start()
