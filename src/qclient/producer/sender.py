"""The sender thread of ``send_async``: an asyncio loop that sends ready batches
concurrently (several per broker), retries through the shared plan, and hands the
results to a completion thread so that user callbacks never run on the sender."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import _tracing
from .._config import ProducerConfig
from .._models import SendResult
from ..errors import ProducerClosedError
from ..transport.http import Credentials
from ._core import ProducerCore
from ._drivers import AsyncSlots, run_async
from ._future import settle_many
from .message_accumulator import MessageAccumulator, ProducerBatch

__all__ = ["Sender"]

log = logging.getLogger(__name__)


class Sender:
    """Owns the sender thread, its event loop and its ``httpx.AsyncClient``."""

    def __init__(
        self, core: ProducerCore, cfg: ProducerConfig, credentials: Credentials | None
    ) -> None:
        self.core = core
        self.cfg = cfg
        self._credentials = credentials
        self.accumulator = MessageAccumulator(cfg, self.wakeup)
        #: shared by every SendFuture of this producer (see _future.py)
        self.condition = threading.Condition()
        self._completions = ThreadPoolExecutor(1, thread_name_prefix="qclient-callback")
        self._in_flight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._wake_pending = False
        self._ready = threading.Event()
        self._stopping = False
        self._abort = False
        self._thread = threading.Thread(target=self._run, name="qclient-sender", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)

    # --- called from producer threads ----------------------------------------------

    def wakeup(self) -> None:
        loop, event = self._loop, self._event
        if loop is None or event is None or self._wake_pending:
            return
        self._wake_pending = True
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            loop.call_soon_threadsafe(event.set)

    def stop(self, timeout: float | None) -> None:
        """Send what is buffered (within ``timeout``), then fail whatever is left."""
        self.accumulator.close()
        self._stopping = True
        self.wakeup()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abort = True
            self._wake_pending = False
            self.wakeup()
            self._thread.join(self.cfg.send_timeout + 5.0)
        for batch in self.accumulator.take_all():  # only if the loop could not
            self._finish(
                batch, [ProducerClosedError("producer closed before sending")] * len(batch.items)
            )
        self._completions.shutdown(wait=True)

    # --- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("sender thread failed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        # the engine's fastest asyncio transport, whatever ``http_transport`` says
        http = self.core.engine.async_transport(self.cfg, self._credentials, lean=True)
        self._http = http
        self._slots = AsyncSlots(self.cfg.max_in_flight_per_broker)
        self._ready.set()
        acc = self.accumulator
        try:
            while not self._abort:
                self._wake_pending = False
                self._event.clear()
                now = time.monotonic()
                batches, next_due = acc.drain(
                    now, self._in_flight, self.cfg.max_in_flight_per_broker
                )
                for b in batches:
                    task = asyncio.create_task(self._send(b))
                    self._tasks.add(task)
                    task.add_done_callback(self._task_done)
                if self._stopping and not self._tasks and not acc.has_pending():
                    break
                wait = None if next_due is None else max(0.0, next_due - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), wait)
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            for batch in acc.take_all():
                self._finish(
                    batch,
                    [ProducerClosedError("producer closed before sending")] * len(batch.items),
                )
            await http.aclose()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._event is not None:
            self._event.set()  # the loop re-checks: more room in flight, or time to stop

    async def _send(self, batch: ProducerBatch) -> None:
        results: list[Any]
        try:
            if _tracing.AVAILABLE:
                _tracing.start_many(batch.items, self.core.routes.resolve)
            results = await run_async(
                self.core.plan_send(batch.items, one_chunk=True), self._http, self._slots
            )
        except asyncio.CancelledError:
            results = [ProducerClosedError("producer closed while sending")] * len(batch.items)
        except Exception as exc:  # a bug must still settle the futures
            log.exception("sending a batch to %s failed", batch.broker)
            results = [exc] * len(batch.items)
        finally:
            self._in_flight[batch.broker] -= 1
        self._finish(batch, list(results))

    def _finish(self, batch: ProducerBatch, results: list[SendResult | BaseException]) -> None:
        if _tracing.AVAILABLE:
            ops = [it.trace for it in batch.items]
            _tracing.end_many(ops, results, self.core.routes.resolve)

        def done() -> None:
            try:
                settle_many(self.condition, batch.futures, results)
            finally:
                self.accumulator.complete(batch)

        try:
            self._completions.submit(done)
        except RuntimeError:  # executor already shut down: settle here
            done()
