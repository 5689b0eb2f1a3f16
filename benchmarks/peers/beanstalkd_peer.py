"""beanstalkd's delayed put (greenstalk): a job is ready after a whole number of seconds."""

from __future__ import annotations

import importlib.util
import logging
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._suite.procs import ServerProcess, free_port, port_open
from benchmarks.peers.base import Peer, PeerConsumer, PeerProducer, ServerPeer, Sink

log = logging.getLogger(__name__)


def _tube(channel: str) -> str:
    # tube names: letters, digits and - + / ; . $ _ ( ), at most 200 bytes
    return channel[:200]


class BeanstalkProducer(PeerProducer):
    """``put(delay=ceil(delay_s))``; the INSERTED reply is the acknowledgement."""

    def __init__(self, port: int, channel: str) -> None:
        import greenstalk

        self.c = greenstalk.Client(("127.0.0.1", port), use=_tube(channel))

    def send(self, msg_id: str, delay_s: float) -> None:
        # Whole seconds only; rounding up so a job is never ready before its time.
        self.c.put(msg_id, delay=math.ceil(delay_s))

    def close(self) -> None:
        self.c.close()


class BeanstalkConsumer(PeerConsumer):
    """``reserve`` with a 1 s timeout, then ``delete``."""

    def __init__(self, port: int, channel: str, sink: Sink) -> None:
        super().__init__(sink)
        self.port = port
        self.channel = channel
        self.c: Any = None

    def connect(self) -> None:
        import greenstalk

        self.c = greenstalk.Client(("127.0.0.1", self.port), watch=_tube(self.channel))

    def poll_once(self) -> None:
        import greenstalk

        try:
            job = self.c.reserve(timeout=1)
        except greenstalk.TimedOutError:
            return
        self.sink(job.body)
        self.c.delete(job)

    def disconnect(self) -> None:
        if self.c is not None:
            self.c.close()


class BeanstalkPeer(ServerPeer):
    """beanstalkd, in memory or with a write-ahead binlog."""

    start_timeout = 10.0

    def __init__(self, name: str, binlog_args: Sequence[str] | None, description: str) -> None:
        super().__init__()
        self.name = name
        self.binlog_args = list(binlog_args) if binlog_args is not None else None
        self.description = description

    def missing(self) -> str | None:
        if shutil.which("beanstalkd") is None:
            return "beanstalkd not installed (bash benchmarks/setup_peers.sh)"
        if importlib.util.find_spec("greenstalk") is None:
            return "python package greenstalk not installed"
        return None

    def start(self, workdir: Path) -> None:
        self.port = free_port()
        argv = ["beanstalkd", "-l", "127.0.0.1", "-p", str(self.port)]
        if self.binlog_args is not None:
            binlog = workdir / "binlog"
            binlog.mkdir(parents=True, exist_ok=True)
            argv += ["-b", str(binlog), *self.binlog_args]
        self.server = ServerProcess(
            self.name, argv, ready=lambda: port_open(self.port), log_path=workdir / "server.log"
        )
        self.server.start(self.start_timeout)

    def producer(self, channel: str) -> PeerProducer:
        return BeanstalkProducer(self.port, channel)

    def consumer(self, channel: str, sink: Sink) -> PeerConsumer:
        return BeanstalkConsumer(self.port, channel, sink).start()

    def note(self) -> str | None:
        return "delays are whole seconds: each is rounded up, so lateness includes up to 1 s"


def beanstalk_peers() -> list[Peer]:
    """beanstalkd without persistence (its default) and with a binlog fsynced on every write."""
    return [
        BeanstalkPeer("beanstalkd", None, "delayed put; default (in memory, no binlog)"),
        BeanstalkPeer("beanstalkd-binlog", ["-f", "0"], "delayed put; binlog, fsync every write"),
    ]
