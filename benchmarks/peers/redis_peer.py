"""Redis as a delay queue: a sorted set scored by due time, due members popped by a Lua script."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._suite.procs import ServerProcess, free_port
from benchmarks.peers.base import Peer, PeerConsumer, PeerProducer, ServerPeer, Sink

log = logging.getLogger(__name__)

# Atomically take up to ARGV[2] members due by ARGV[1] (epoch seconds): the usual
# ZRANGEBYSCORE + ZREM pattern, in one step so two consumers never take the same member.
POP_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
"""

#: longest the consumer sleeps before looking again (new, earlier messages may arrive)
MAX_IDLE_SLEEP = 0.05


def _client(port: int) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)


class RedisProducer(PeerProducer):
    """ZADD with the due time as score; the reply is the acknowledgement."""

    def __init__(self, port: int, key: str) -> None:
        self.r = _client(port)
        self.key = key

    def send(self, msg_id: str, delay_s: float) -> None:
        self.r.zadd(self.key, {msg_id: time.time() + delay_s})

    def send_many(self, items: Sequence[tuple[str, float]]) -> None:
        now = time.time()
        self.r.zadd(self.key, {m: now + d for m, d in items})

    def close(self) -> None:
        self.r.close()


class RedisConsumer(PeerConsumer):
    """Pops due members; when none is due, sleeps until the earliest (at most 50 ms)."""

    def __init__(self, port: int, key: str, sink: Sink) -> None:
        super().__init__(sink)
        self.port = port
        self.key = key
        self.r: Any = None
        self.pop: Any = None

    def connect(self) -> None:
        self.r = _client(self.port)
        self.pop = self.r.register_script(POP_DUE)

    def poll_once(self) -> None:
        due = self.pop(keys=[self.key], args=[time.time(), 256])
        if due:
            for m in due:
                self.sink(m.decode())
            return
        head = self.r.zrange(self.key, 0, 0, withscores=True)
        wait = MAX_IDLE_SLEEP if not head else min(MAX_IDLE_SLEEP, head[0][1] - time.time())
        if wait > 0:
            time.sleep(wait)

    def disconnect(self) -> None:
        if self.r is not None:
            self.r.close()


class RedisPeer(ServerPeer):
    """redis-server with a given persistence configuration."""

    start_timeout = 10.0

    def __init__(self, name: str, extra_args: Sequence[str], description: str) -> None:
        super().__init__()
        self.name = name
        self.extra_args = list(extra_args)
        self.description = description

    def missing(self) -> str | None:
        if shutil.which("redis-server") is None:
            return "redis-server not installed (bash benchmarks/setup_peers.sh)"
        if importlib.util.find_spec("redis") is None:
            return "python package redis not installed"
        return None

    def start(self, workdir: Path) -> None:
        self.port = free_port()
        data = workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(data),
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra_args,
        ]

        def ready() -> bool:
            r = _client(self.port)
            try:
                return bool(r.ping())
            finally:
                r.close()

        self.server = ServerProcess(self.name, argv, ready=ready, log_path=workdir / "server.log")
        self.server.start(self.start_timeout)

    def producer(self, channel: str) -> PeerProducer:
        return RedisProducer(self.port, channel)

    def consumer(self, channel: str, sink: Sink) -> PeerConsumer:
        return RedisConsumer(self.port, channel, sink).start()


def redis_peers() -> list[Peer]:
    """The Redis variants: default persistence, AOF fsync every second, AOF fsync always."""
    return [
        RedisPeer("redis", [], "sorted set + Lua pop; default config (RDB snapshots, no AOF)"),
        RedisPeer(
            "redis-aof-everysec",
            ["--appendonly", "yes", "--appendfsync", "everysec"],
            "sorted set + Lua pop; AOF, fsync every second",
        ),
        RedisPeer(
            "redis-aof-always",
            ["--appendonly", "yes", "--appendfsync", "always"],
            "sorted set + Lua pop; AOF, fsync before every reply",
        ),
    ]
