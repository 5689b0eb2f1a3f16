"""The one small interface every delay-queue system implements, qclient included."""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks._suite.procs import ServerProcess

log = logging.getLogger(__name__)

__all__ = ["Peer", "PeerConsumer", "PeerProducer", "ServerPeer", "Sink"]

#: Called by a consumer with the id of each message that arrives.
Sink = Callable[[str], None]


class PeerProducer(abc.ABC):
    """Sends delayed messages; a send returns once the system acknowledged it."""

    @abc.abstractmethod
    def send(self, msg_id: str, delay_s: float) -> None:
        """Schedule one message carrying ``msg_id`` to fire after ``delay_s`` seconds."""

    def send_many(self, items: Sequence[tuple[str, float]]) -> None:
        """Schedule several messages; peers with a batch path override this."""
        for msg_id, delay_s in items:
            self.send(msg_id, delay_s)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class PeerConsumer(abc.ABC):
    """A background thread that receives fired messages and hands their ids to a sink.

    Errors (e.g. the server was killed) are logged and retried after a short pause until
    ``close()``; ``connect()`` is called again after every error.
    """

    #: how long ``close()`` waits for the thread
    close_timeout = 5.0

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def start(self) -> PeerConsumer:
        """Start the receiving thread."""
        self._thread.start()
        return self

    @property
    def stopping(self) -> bool:
        """True once ``close()`` was called."""
        return self._stop.is_set()

    @abc.abstractmethod
    def connect(self) -> None:
        """(Re)open the connection; called on start and after every error."""

    @abc.abstractmethod
    def poll_once(self) -> None:
        """Wait a short, bounded time (≤ 1 s) for messages and pass their ids to the sink."""

    def disconnect(self) -> None:  # noqa: B027 - optional hook
        """Close the connection, ignoring errors."""

    def breakdown(self) -> dict[str, Any] | None:
        """Optional extra figures the system itself reports (e.g. server-side lateness)."""
        return None

    def _run(self) -> None:
        connected = False
        while not self._stop.is_set():
            try:
                if not connected:
                    self.connect()
                    connected = True
                self.poll_once()
            except Exception as exc:
                log.debug("%s: %s: %s", type(self).__name__, type(exc).__name__, exc)
                connected = False
                with contextlib.suppress(Exception):
                    self.disconnect()
                self._stop.wait(0.1)
        with contextlib.suppress(Exception):
            self.disconnect()

    def close(self) -> None:
        """Stop the thread (bounded wait) and close the connection."""
        self._stop.set()
        self._thread.join(self.close_timeout)
        if self._thread.is_alive():
            log.warning(
                "%s: consumer thread did not stop in %.0f s",
                type(self).__name__,
                self.close_timeout,
            )


class Peer(abc.ABC):
    """A delay-queue system under test: its server's life cycle, a producer and a consumer.

    ``channel`` names a queue / tube / key / topic; each workload phase uses a fresh one.
    """

    #: row label in the report
    name: str = "peer"
    #: one line: how the delay is made and how durable the ack is
    description: str = ""
    #: seconds the start-up may take before the peer is skipped
    start_timeout: float = 20.0

    @abc.abstractmethod
    def missing(self) -> str | None:
        """Why this peer cannot run here (not installed), or None."""

    @abc.abstractmethod
    def start(self, workdir: Path) -> None:
        """Start the server on loopback on a free port with its data in ``workdir``."""

    @abc.abstractmethod
    def kill9(self) -> None:
        """SIGKILL the server (and its helpers); returns when they are gone."""

    @abc.abstractmethod
    def restart(self) -> None:
        """Start the server again on the same port and data, after ``kill9``."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop everything ``start`` started; safe to call twice or after a failed start."""

    @abc.abstractmethod
    def producer(self, channel: str) -> PeerProducer:
        """A connected producer for ``channel``."""

    @abc.abstractmethod
    def consumer(self, channel: str, sink: Sink) -> PeerConsumer:
        """A started consumer for ``channel``."""

    def note(self) -> str | None:
        """A caveat to print under the table (how the delay is represented, what limits it)."""
        return None


class ServerPeer(Peer):
    """A peer whose server is one ``ServerProcess`` on a loopback ``port``.

    ``start`` picks the port and sets ``server``; kill -9, restart and stop act on it.
    """

    def __init__(self) -> None:
        self.server: ServerProcess | None = None
        self.port = 0

    def kill9(self) -> None:
        if self.server is not None:
            self.server.kill9()

    def restart(self) -> None:
        assert self.server is not None
        self.server.start(self.start_timeout)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
