"""RabbitMQ's usual delay recipe: per-message TTL on a wait queue that dead-letters to a ready
queue (pika). Persistent messages on durable queues, publisher confirms."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from benchmarks._suite.procs import ServerProcess, env_with, free_port, port_open
from benchmarks.peers.base import PeerConsumer, PeerProducer, ServerPeer, Sink

log = logging.getLogger(__name__)

RABBIT_BIN = "/usr/lib/rabbitmq/bin/rabbitmq-server"
EPMD_BIN = "epmd"


def _params(port: int) -> Any:
    import pika

    return pika.ConnectionParameters(
        host="127.0.0.1",
        port=port,
        heartbeat=0,
        blocked_connection_timeout=10,
        socket_timeout=5,
        connection_attempts=1,
    )


def _declare(ch: Any, channel: str) -> tuple[str, str]:
    wait, ready = f"{channel}.wait", f"{channel}.ready"
    ch.queue_declare(queue=ready, durable=True)
    ch.queue_declare(
        queue=wait,
        durable=True,
        arguments={
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": ready,
        },
    )
    return wait, ready


class RabbitProducer(PeerProducer):
    """``basic_publish`` to the wait queue with ``expiration``; returns on the broker's confirm."""

    def __init__(self, port: int, channel: str) -> None:
        import pika

        self.conn = pika.BlockingConnection(_params(port))
        self.ch = self.conn.channel()
        self.wait, _ = _declare(self.ch, channel)
        self.ch.confirm_delivery()
        self._props = pika.BasicProperties

    def send(self, msg_id: str, delay_s: float) -> None:
        props = self._props(delivery_mode=2, expiration=str(max(0, round(delay_s * 1000))))
        # With confirms on, this blocks until the broker confirms (persisted) or raises.
        self.ch.basic_publish(
            exchange="", routing_key=self.wait, body=msg_id.encode(), properties=props
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class RabbitConsumer(PeerConsumer):
    """``basic_consume`` on the ready queue with manual acks."""

    def __init__(self, port: int, channel: str, sink: Sink) -> None:
        super().__init__(sink)
        self.port = port
        self.channel = channel
        self.conn: Any = None
        self.ch: Any = None
        self.ready = ""

    def connect(self) -> None:
        import pika

        self.conn = pika.BlockingConnection(_params(self.port))
        self.ch = self.conn.channel()
        _, self.ready = _declare(self.ch, self.channel)
        self.ch.basic_qos(prefetch_count=256)

    def poll_once(self) -> None:
        for method, _props, body in self.ch.consume(self.ready, inactivity_timeout=0.2):
            if method is None:
                return
            self.sink(body.decode())
            self.ch.basic_ack(method.delivery_tag)
            if self.stopping:
                return

    def disconnect(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


class RabbitPeer(ServerPeer):
    """rabbitmq-server on its own epmd port, node name, and data dir."""

    name = "rabbitmq"
    description = "per-message TTL + dead-letter exchange; persistent, publisher confirms"
    start_timeout = 60.0

    def __init__(self) -> None:
        super().__init__()
        self.epmd: ServerProcess | None = None

    def missing(self) -> str | None:
        if not os.path.exists(RABBIT_BIN):
            return "rabbitmq-server not installed (bash benchmarks/setup_peers.sh)"
        if importlib.util.find_spec("pika") is None:
            return "python package pika not installed"
        return None

    def start(self, workdir: Path) -> None:
        self.port = free_port()
        epmd_port, dist_port = free_port(), free_port()
        home = workdir / "home"
        for d in (home, workdir / "mnesia", workdir / "log"):
            d.mkdir(parents=True, exist_ok=True)
        (workdir / "enabled_plugins").write_text("[].\n")
        (workdir / "rabbitmq.conf").write_text(
            f"loopback_users = none\nlisteners.tcp.default = 127.0.0.1:{self.port}\n"
        )
        # Our own epmd on a private port, so nothing outlives the run.
        self.epmd = ServerProcess(
            "epmd",
            [EPMD_BIN, "-port", str(epmd_port)],
            ready=lambda: port_open(epmd_port),
            log_path=workdir / "epmd.log",
        )
        self.epmd.start(10)
        env = env_with(
            HOME=str(home),
            ERL_EPMD_PORT=str(epmd_port),
            RABBITMQ_NODENAME=f"qbench{self.port}@localhost",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_MNESIA_BASE=str(workdir / "mnesia"),
            RABBITMQ_LOG_BASE=str(workdir / "log"),
            RABBITMQ_CONFIG_FILE=str(workdir / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(workdir / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(workdir / "rabbit.pid"),
            RABBITMQ_CONF_ENV_FILE=str(workdir / "rabbitmq-env.conf"),
        )
        (workdir / "rabbitmq-env.conf").write_text("")

        def ready() -> bool:
            if not port_open(self.port):
                return False
            import pika

            pika.BlockingConnection(_params(self.port)).close()
            return True

        self.server = ServerProcess(
            self.name,
            [RABBIT_BIN],
            ready=ready,
            env=env,
            log_path=workdir / "server.log",
            cwd=workdir,
        )
        self.server.start(self.start_timeout)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(timeout=20)
        if self.epmd is not None:
            self.epmd.stop()

    def note(self) -> str | None:
        return (
            "a message's TTL is only checked at the head of the wait queue, so a long delay "
            "holds up shorter ones queued behind it (the known limit of this recipe)"
        )

    def producer(self, channel: str) -> PeerProducer:
        return RabbitProducer(self.port, channel)

    def consumer(self, channel: str, sink: Sink) -> PeerConsumer:
        return RabbitConsumer(self.port, channel, sink).start()
