"""The chaos bench's producers: one thread per kind (sync threads, ``send_async``,
``AsyncProducer``, ``send_batch``), each paced to its rate, writing what callers saw into
the ``Ledger``; now and then a caller re-sends an acknowledged id, same deliver time."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypedDict

from benchmarks._chaos import TOPIC, Ledger
from benchmarks._chaos_member import body_for
from qclient import AsyncProducer, Message, Producer

SEND_TIMEOUT = 3.0
PRODUCER_KINDS = ("sync", "send_async", "async_producer", "batch")
#: the share of sends that re-send an acknowledged id (``--resend-fraction``'s default)
RESEND_FRACTION = 0.03


class When(TypedDict, total=False):
    """A send's time: ``delay`` (s) or ``deliver_at`` (epoch s), one of them."""

    delay: float
    deliver_at: float


class Traffic:
    """The producers: one thread per kind, each paced to its rate, until ``stop``."""

    def __init__(self, namesrv: str, ledger: Ledger, args: argparse.Namespace) -> None:
        self.namesrv = namesrv
        self.ledger = ledger
        self.args = args
        self.stop = threading.Event()
        #: producers stay open until then: they cancel copies on brokers that come back
        self.release = threading.Event()
        self.ambiguous: Counter[str] = Counter()
        self._ids = itertools.count()
        self._threads: list[threading.Thread] = []
        self._sent = 0  # threads done sending (their last send answered)
        self._sent_cv = threading.Condition()

    def _next(self, rng: random.Random, kind: str) -> tuple[str, When]:
        """A new id and delay, or (now and then) an acknowledged id again, same time."""
        if rng.random() < self.args.resend_fraction:
            got = self.ledger.pick_resend(rng, int(time.time() * 1000) + 1500)
            if got is not None:
                return got[0], {"deliver_at": got[1] / 1000}
        a = self.args
        hi = a.long_max if rng.random() < a.long_fraction else a.short_max
        return f"{kind}-{next(self._ids)}", {"delay": round(rng.uniform(0.5, hi), 3)}

    def start(self) -> None:
        a = self.args
        specs: list[tuple[str, Callable[[random.Random], None]]] = [
            *[(f"sync{i}", self._sync) for i in range(2)],
            ("send_async", self._send_async),
            ("async_producer", self._async_producer),
            ("batch", self._batch),
        ]
        for i, (name, fn) in enumerate(specs):
            rng = random.Random(a.seed * 1000 + i)
            t = threading.Thread(target=fn, args=(rng,), name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def wait_sent(self, timeout: float) -> None:
        """After ``stop``: until every thread's last send is answered."""
        with self._sent_cv:
            self._sent_cv.wait_for(lambda: self._sent >= len(self._threads), timeout)

    def join(self) -> None:
        self.stop.set()
        self.release.set()
        for t in self._threads:
            t.join(60)

    def _linger(self, p: Producer | AsyncProducer) -> None:
        """Before closing: wait for ``release``, then for pending copies to settle."""
        with self._sent_cv:
            self._sent += 1
            self._sent_cv.notify_all()
        self.release.wait()
        deadline = time.monotonic() + 15
        copies = p._ambiguous
        while time.monotonic() < deadline and (
            copies.pending() or copies.late_asks_within(deadline - time.monotonic())
        ):
            time.sleep(0.2)
        self.ambiguous.update(p._ambiguous.counts)

    def _paced(self, rate: float) -> Any:
        """Yields until ``stop``, ``rate`` times a second (catching up at most 1 s)."""
        interval = 1 / rate
        nxt = time.monotonic()
        while not self.stop.is_set():
            yield
            nxt = max(nxt + interval, time.monotonic() - 1)
            self.stop.wait(max(0.0, nxt - time.monotonic()))

    def _producer(self) -> Producer:
        return Producer(self.namesrv, send_timeout=SEND_TIMEOUT)

    def _sync(self, rng: random.Random) -> None:
        ledger, clock = self.ledger, self.ledger.clock
        with self._producer() as p:
            for _ in self._paced(self.args.rate):
                mid, when = self._next(rng, "sync")
                start = clock()
                try:
                    r = p.send_delayed(TOPIC, body_for(mid), msg_id=mid, **when)
                except Exception as exc:
                    ledger.fail("sync", start, exc)
                else:
                    ledger.ok("sync", start, [r])
            self._linger(p)

    def _send_async(self, rng: random.Random) -> None:
        ledger, clock = self.ledger, self.ledger.clock
        with self._producer() as p:
            for _ in self._paced(self.args.rate * 2):
                mid, when = self._next(rng, "send_async")
                start = clock()

                def done(fut: Any, start: float = start) -> None:
                    exc = fut.exception()
                    if exc is not None:
                        ledger.fail("send_async", start, exc)
                    else:
                        ledger.ok("send_async", start, [fut.result()])

                try:
                    fut = p.send_async(Message(TOPIC, body_for(mid), msg_id=mid, **when))
                except Exception as exc:
                    ledger.fail("send_async", start, exc)
                else:
                    fut.add_done_callback(done)
            try:
                p.flush(timeout=SEND_TIMEOUT * 4)
            except Exception as exc:
                ledger.fail("send_async", clock(), exc)
            self._linger(p)

    def _async_producer(self, rng: random.Random) -> None:
        ledger, clock = self.ledger, self.ledger.clock

        async def one(ap: AsyncProducer, mid: str, when: When) -> None:
            start = clock()
            try:
                r = await ap.send_delayed(TOPIC, body_for(mid), msg_id=mid, **when)
            except Exception as exc:
                ledger.fail("async_producer", start, exc)
            else:
                ledger.ok("async_producer", start, [r])

        async def run() -> None:
            tasks: set[asyncio.Task[None]] = set()
            interval = 1 / self.args.rate
            async with AsyncProducer(self.namesrv, send_timeout=SEND_TIMEOUT) as ap:
                while not self.stop.is_set():
                    if len(tasks) < 64:
                        t = asyncio.create_task(one(ap, *self._next(rng, "async_producer")))
                        tasks.add(t)
                        t.add_done_callback(tasks.discard)
                    await asyncio.sleep(interval)
                if tasks:
                    await asyncio.wait(tasks, timeout=SEND_TIMEOUT * 4)
                await asyncio.to_thread(self._linger, ap)

        asyncio.run(run())

    def _batch(self, rng: random.Random) -> None:
        ledger, clock = self.ledger, self.ledger.clock
        with self._producer() as p:
            for _ in self._paced(self.args.rate / 8):
                msgs = []
                for _i in range(16):
                    mid, when = self._next(rng, "batch")
                    msgs.append(Message(TOPIC, body_for(mid), msg_id=mid, **when))
                start = clock()
                try:
                    results = p.send_batch(msgs)
                except Exception as exc:
                    ledger.fail("batch", start, exc, len(msgs))
                else:
                    ledger.ok("batch", start, results)
            self._linger(p)
