"""Copies left by ambiguous attempts are cancelled on their broker before they fire."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest
from tests.integration.helpers import drain, wait_until

from qclient import LocalCluster, Producer, SendResult, SendStatus
from qclient.fault.strategy import _broker_seed, _hash
from qclient.producer._ambiguous import AmbiguousCopies, is_ambiguous


def _ids_of(broker: str, other: str, n: int) -> list[str]:
    """Ids that rendezvous hashing sends to ``broker`` first (of the two)."""
    out = []
    for k in range(1000):
        key = f"amb-{k}".encode()
        if _hash(key, _broker_seed(broker)) > _hash(key, _broker_seed(other)):
            out.append(f"amb-{k}")
    return out[:n]


@pytest.mark.parametrize(
    ("exc", "ambiguous"),
    [
        (httpx.ReadTimeout("t"), True),
        (httpx.TimeoutException("t"), True),
        (httpx.RemoteProtocolError("gone"), True),
        (httpx.ReadError("reset"), True),
        (httpx.ConnectError("refused"), False),
        (httpx.ConnectTimeout("t"), False),
        (httpx.PoolTimeout("t"), False),
        (None, False),
    ],
)
def test_which_failures_are_ambiguous(exc: BaseException | None, ambiguous: bool) -> None:
    assert is_ambiguous(exc) is ambiguous


def _result(broker: str, deliver_at_ms: float) -> SendResult:
    return SendResult("m1", SendStatus.SEND_OK, broker, 0, int(deliver_at_ms), "t")


def test_copy_is_cancelled_once_its_broker_answers() -> None:
    calls: list[tuple[str, str, str]] = []
    answers = iter([ConnectionError("down"), ConnectionError("down"), True])
    done = threading.Event()

    def cancel(r: SendResult) -> bool:
        calls.append((r.topic, r.msg_id, r.broker_name))
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        done.set()
        return a

    copies = AmbiguousCopies(cancel)
    try:
        # acknowledged by b after ambiguous attempts on a (twice) and on b itself
        copies.note(_result("b", time.time() * 1000 + 60_000), ("a", "a", "b"))
        assert done.wait(5)
        wait_until(lambda: copies.pending() == 0, 5, "the copy to be settled")
        assert calls == [("t", "m1", "a")] * 3  # never b: it deduplicated the retry
        assert copies.counts["cancelled"] == 1
    finally:
        copies.close()


def test_not_found_is_asked_again_and_late_copies_are_dropped() -> None:
    asked: list[str] = []
    copies = AmbiguousCopies(lambda r: asked.append(r.broker_name) is not None)  # False
    try:
        copies.note(_result("b", time.time() * 1000 + 60_000), ("a",))
        copies.note(
            SendResult("m2", SendStatus.SEND_OK, "b", 0, int(time.time() * 1000) - 1, "t"), ("c",)
        )
        wait_until(lambda: copies.pending() == 0, 10, "both copies to be settled")
        assert asked == ["a"] * 4  # the broker may not have stored the late request yet
        assert copies.counts["not_found"] == 1 and copies.counts["too_late"] == 1
    finally:
        copies.close()


def test_hung_broker_copy_never_fires_twice() -> None:
    """broker-a hangs with a send in its socket: the attempt times out and broker-b
    acknowledges the retry; when broker-a resumes it stores the late request, and the
    producer cancels that copy before it fires."""
    with LocalCluster(brokers=2) as cluster:
        a = cluster.broker("broker-a")
        ids = _ids_of("broker-a", "broker-b", 30)
        with Producer(cluster.namesrv) as p:
            p.send_delayed("amb", "warm-up", delay=0.1)  # routes known before the hang
            a.pause()
            try:
                # the first times out on a (ambiguous), then a is isolated: b directly
                results = [p.send_delayed("amb", i, delay=6.0, msg_id=i) for i in ids[:3]]
            finally:
                a.resume()
            results += [p.send_delayed("amb", i, delay=6.0, msg_id=i) for i in ids[3:]]
            noted = p._ambiguous.counts["noted"]
            assert noted >= 1, p._ambiguous.counts
            assert {r.broker_name for r in results[:3]} == {"broker-b"}
            wait_until(
                lambda: (
                    p._ambiguous.counts["cancelled"] + p._ambiguous.counts["not_found"] >= noted
                ),
                10,
                "the ambiguous copies to be settled",
            )
            # a copy was there, and is gone
            assert p._ambiguous.counts["cancelled"] >= 1, p._ambiguous.counts
        got = drain(cluster.namesrv, "amb", "g", expected=len(ids) + 1, timeout=20, settle=0.5)
        counts = Counter(m.msg_id for m in got)
        assert all(counts[i] == 1 for i in ids), {i: n for i, n in counts.items() if n != 1}
