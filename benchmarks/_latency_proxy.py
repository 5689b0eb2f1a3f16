"""A latency-injecting TCP proxy for the failover bench's "slow broker" case.

Listens on 127.0.0.1 (a free port), forwards every connection to one upstream, and holds
each chunk from client to server for ``delay_s`` (0 = pass through) before writing it on.
Chunks are stamped on arrival and released at arrival + delay, in order, so a request
split into several writes is delayed once, not once per write. Server-to-client bytes
pass at once. The proxy runs an asyncio loop in a daemon thread of the calling process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

__all__ = ["LatencyProxy"]

log = logging.getLogger(__name__)

_CHUNK = 65536


class LatencyProxy:
    """``start()``, ``port``, ``set_upstream()``, ``set_delay()``, ``stop()``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.delay_s = 0.0  # read by the loop thread on each chunk; a float swap is atomic
        self.upstream: tuple[str, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return (
            f"<LatencyProxy {self.host}:{self.port} -> {self.upstream} "
            f"delay={self.delay_s * 1000:.0f} ms>"
        )

    # --- control (any thread) -------------------------------------------------------

    def set_upstream(self, host: str, port: int) -> None:
        """Where new connections go (a connection before this is closed at once)."""
        self.upstream = (host, port)

    def set_delay(self, seconds: float) -> None:
        """The client-to-server delay applied to chunks arriving from now on."""
        self.delay_s = max(0.0, seconds)

    def start(self, timeout: float = 10.0) -> LatencyProxy:
        """Start the loop thread and listen; returns once ``port`` is known."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._handle, self.host, 0)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # handed to start()'s caller
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="latency-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("latency proxy did not start")
        if failure:
            raise failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every connection; end the loop thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout)
        except Exception:  # stopping anyway
            log.warning("latency proxy: shutdown did not finish cleanly", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the loop thread ------------------------------------------------------------

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        s_writer: asyncio.StreamWriter | None = None
        try:
            if self.upstream is None:
                return
            try:
                s_reader, s_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return  # upstream down: the client sees the connection close
            up = asyncio.ensure_future(self._delayed_pump(c_reader, s_writer))
            down = asyncio.ensure_future(self._pump(s_reader, c_writer))
            try:
                # either side closing ends the pair
                await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                up.cancel()
                down.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        finally:
            for w in (c_writer, s_writer):
                if w is not None:
                    w.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass

    async def _delayed_pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Each chunk leaves at its arrival time + the delay then in force, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(release())
        try:
            while True:
                data = await reader.read(_CHUNK)
                queue.put_nowait((time.monotonic() + self.delay_s, data))
                if not data:
                    break
            await sender  # flush what is held before closing
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
