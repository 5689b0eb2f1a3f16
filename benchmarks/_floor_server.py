"""The floor of a durable one-message request: the least a server can do per ``POST``.

A uvloop ``asyncio.Protocol`` with the ``httptools`` parser (the broker's own stack) that
appends each request body to one file, ``fdatasync``s it (unless ``--no-sync``) and answers
``200``. No routing, no checks, no store: what a request costs on this machine before any
broker logic, measured by the same client as the broker in the same benchmark run.

    python -m benchmarks._floor_server --dir DIR [--no-sync | --prealloc]   # prints its port
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import httptools
import uvloop

_PREALLOC_BYTES = 64 << 20
_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\nContent-Length: 1\r\n\r\n\x80"


class _Floor(asyncio.Protocol):
    def __init__(self, fd: int, sync: bool, prealloc: bool) -> None:
        self._fd = fd
        self._sync = sync
        self._offset: int | None = 0 if prealloc else None
        self._body: list[bytes] = []
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

    def on_body(self, chunk: bytes) -> None:
        self._body.append(chunk)

    def on_message_complete(self) -> None:
        data = b"".join(self._body)
        if self._offset is None:
            os.write(self._fd, data)
        else:
            os.pwrite(self._fd, data, self._offset)
            self._offset = (self._offset + len(data)) % (_PREALLOC_BYTES - (1 << 16))
        self._body.clear()
        if self._sync:
            os.fdatasync(self._fd)
        assert self._transport is not None
        self._transport.write(_ANSWER)


async def _serve(directory: str, sync: bool, prealloc: bool) -> None:
    path = os.path.join(directory, f"floor-{os.getpid()}.log")
    if prealloc:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        zeros = bytes(1 << 20)
        for _ in range(_PREALLOC_BYTES >> 20):
            os.write(fd, zeros)
        os.fsync(fd)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Floor(fd, sync, prealloc), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    try:
        await asyncio.Event().wait()  # until killed: the benchmark owns this process
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="where the appended file lives")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-sync", action="store_true", help="skip the fdatasync")
    mode.add_argument("--prealloc", action="store_true", help="overwrite a zero-filled file")
    args = ap.parse_args()
    try:
        uvloop.run(_serve(args.dir, not args.no_sync, args.prealloc))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
