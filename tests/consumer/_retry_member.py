"""A group member in its own process that hands the first message it gets back with
``retry_later(m, delay=1)`` and then stops (no poll, so nothing is committed) until the
test kills it: ``python -m tests.consumer._retry_member NAMESRV TOPIC GROUP``.

Prints JSON lines: ``{"ready": client_id}`` once it holds queues of the topic, then
``{"retried": msg_id, "attempt": n}`` as soon as the ``retry_later`` call returned.
Public API only, so it runs on either engine."""

from __future__ import annotations

import json
import sys
import time

from qclient import Consumer

SESSION_S = 2.0  # short leases: the test's member takes the queues over soon


def _emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(namesrv: str, topic: str, group: str) -> None:
    consumer = Consumer(namesrv, topic, group, session_timeout=SESSION_S)
    deadline = time.monotonic() + 30
    batch = []
    while not consumer.assignment() and time.monotonic() < deadline:
        batch += consumer.poll(32, timeout=0.2)
    _emit({"ready": consumer.client_id})
    while not batch:
        batch = consumer.poll(32, timeout=0.5)
    m = batch[0]
    consumer.retry_later(m, delay=1)
    _emit({"retried": m.msg_id, "attempt": m.attempt})
    time.sleep(600)  # killed here: the original stays uncommitted


if __name__ == "__main__":
    main(*sys.argv[1:4])
