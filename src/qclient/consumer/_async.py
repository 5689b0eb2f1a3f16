"""``AsyncConsumer``: the group consumer for asyncio code."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import TracebackType
from typing import Any

from .._models import ReceivedMessage
from ._consumer import Consumer

__all__ = ["AsyncConsumer"]


class AsyncConsumer:
    """``Consumer``'s API with ``async`` methods; same arguments and semantics.

    The blocking consumer runs on one private thread, so a long poll never blocks the
    event loop and calls keep their order.
    """

    def __init__(self, namesrv: str | Sequence[str], topic: str, group: str, **kwargs: Any):
        self._consumer = Consumer(namesrv, topic, group, **kwargs)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="qclient-async-consumer")
        self.topic = topic
        self.group = group
        self.client_id = self._consumer.client_id

    def __repr__(self) -> str:
        return f"Async{self._consumer!r}"

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, lambda: fn(*args, **kwargs))

    async def poll(self, max_messages: int = 32, timeout: float = 1.0) -> list[ReceivedMessage]:
        """Up to ``max_messages`` delivered messages, waiting up to ``timeout`` seconds."""
        result: list[ReceivedMessage] = await self._run(self._consumer.poll, max_messages, timeout)
        return result

    async def messages(
        self, timeout: float | None = None, *, max_messages: int = 32
    ) -> AsyncIterator[ReceivedMessage]:
        """Yield messages as they arrive; stop after ``timeout`` seconds without one
        (``None``: never) or when the consumer is closed."""
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        while not self._consumer.closed:
            wait_s = 1.0
            if timeout is not None:
                wait_s = min(wait_s, timeout - (loop.time() - idle_since))
                if wait_s <= 0:
                    return
            batch = await self.poll(max_messages, wait_s)
            if batch:
                for m in batch:
                    yield m
                idle_since = loop.time()

    def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        return self.messages()

    async def retry_later(
        self, message: ReceivedMessage, delay: float | timedelta | None = None
    ) -> None:
        """``Consumer.retry_later``: hand ``message`` back to the group, delivered again
        after ``delay`` (or the group's backoff); returns once the copy is durable."""
        # on a thread of its own: a poll in progress on the consumer's thread may wait
        await asyncio.to_thread(self._consumer.retry_later, message, delay)

    async def dead_letter(self, message: ReceivedMessage, reason: str) -> None:
        """``Consumer.dead_letter``: put ``message`` into the group's dead-letter topic."""
        await asyncio.to_thread(self._consumer.dead_letter, message, reason)

    async def commit(self) -> None:
        """Commit now everything ``poll()`` returned so far."""
        await self._run(self._consumer.commit)

    def assignment(self) -> list[tuple[str, int]]:
        return self._consumer.assignment()

    def committed(self) -> dict[tuple[str, int], int]:
        return self._consumer.committed()

    async def close(self) -> None:
        """Commit what was returned and leave the group. Idempotent."""
        if self._consumer.closed:
            return
        try:
            await self._run(self._consumer.close)
        finally:
            self._thread.shutdown(wait=False)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
