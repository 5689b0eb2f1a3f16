"""A group member in a process of its own, for the consumer tests:
``python -m tests.engines.rocketmq._consumer_member NAMESRV TOPIC GROUP [RETRY_S]``.

Polls until a ``close`` line (or EOF) on stdin, then closes the consumer. Prints JSON
lines: ``{"assignment": [[broker, queue], ...], "t": epoch s}`` whenever the queues it
reads change, ``{"got": [[msg_id, broker, queue, offset], ...], "t": ...}`` for each
poll that returned messages, and ``{"closed": true, "stats": {...}}`` at the end.

With ``RETRY_S`` it hands every message back (``retry_later(m, delay=RETRY_S)``) and
prints ``{"retried": [msg_id, attempt], "t": ...}`` as soon as each call returned.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from qclient.engines.rocketmq.consumer import RocketMQConsumer


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(namesrv: str, topic: str, group: str, retry_s: str | None = None) -> None:
    stop = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                break
        stop.set()  # "close", or EOF: the test is gone

    threading.Thread(target=read_stdin, daemon=True).start()
    consumer = RocketMQConsumer((namesrv,), topic, group)
    _emit({"started": consumer.client_id})
    last: list[tuple[str, int]] | None = None
    while not stop.is_set():
        batch = consumer.poll(64, timeout=0.05)
        now = time.time()
        held = consumer.assignment()
        if held != last:
            _emit({"assignment": held, "t": now})
            last = held
        if batch:
            _emit(
                {"got": [[m.msg_id, m.broker_name, m.queue_id, m.offset] for m in batch], "t": now}
            )
        if retry_s is not None:
            for m in batch:
                consumer.retry_later(m, delay=float(retry_s))
                _emit({"retried": [m.msg_id, m.attempt], "t": time.time()})
    consumer.close()
    _emit({"closed": True, "stats": consumer.stats(), "t": time.time()})


if __name__ == "__main__":
    main(*sys.argv[1:5])
