"""The floor of received lateness for a pull design: fire on a timer, answer a long poll.

A uvloop ``asyncio.Protocol`` with the ``httptools`` parser (the broker's own stack) holds
``rate x seconds`` messages due evenly from ``--start-ms`` (wall clock) on. A timer on the
event loop fires each due millisecond: its messages join a ready list and a parked pull is
answered at once. ``GET /pull`` answers whatever is ready (8-byte ``deliver_at`` ms + a
100-byte body per message) or parks until something is. No store, no checks, no threads:
what "fired, then received by a consumer over HTTP" costs on this machine before any broker
logic, measured in the same benchmark run as the broker.

    python -m benchmarks._floor_pull --rate N --seconds S --start-ms T   # prints its port
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time

import httptools
import uvloop

_BODY = b"x" * 100
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"


class _Pulls:
    """The messages, the ready list and the parked pull (one consumer connection)."""

    def __init__(self, due_ms: list[int]) -> None:
        self.due_ms = due_ms
        self.next = 0  # first message not fired yet
        self.ready: list[bytes] = []
        self.parked: _Conn | None = None
        self.loop = asyncio.get_running_loop()

    def arm(self) -> None:
        if self.next < len(self.due_ms):
            wait_s = (self.due_ms[self.next] - time.time() * 1000) / 1000
            self.loop.call_at(self.loop.time() + max(0.0, wait_s), self.fire)

    def fire(self) -> None:
        now_ms = time.time() * 1000
        i = self.next
        while i < len(self.due_ms) and self.due_ms[i] <= now_ms:
            self.ready.append(struct.pack("<q", self.due_ms[i]) + _BODY)
            i += 1
        self.next = i
        if self.ready and self.parked is not None:
            conn, self.parked = self.parked, None
            conn.answer()
        self.arm()


class _Conn(asyncio.Protocol):
    def __init__(self, pulls: _Pulls) -> None:
        self._pulls = pulls
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def on_message_complete(self) -> None:
        if self._pulls.ready:
            self.answer()
        else:
            self._pulls.parked = self

    def answer(self) -> None:
        body = b"".join(self._pulls.ready)
        self._pulls.ready.clear()
        assert self._transport is not None
        self._transport.write(_HEAD % len(body) + body)


async def _serve(rate: int, seconds: float, start_ms: int) -> None:
    total = int(rate * seconds)
    step = seconds * 1000 / total
    pulls = _Pulls([start_ms + int(i * step) for i in range(total)])
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(pulls), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    pulls.arm()
    await asyncio.Event().wait()  # until killed: the benchmark owns this process


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, required=True, help="due messages per second")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--start-ms", type=int, required=True, help="first due time, epoch ms")
    args = ap.parse_args()
    uvloop.run(_serve(args.rate, args.seconds, args.start_ms))


if __name__ == "__main__":
    main()
