"""Hand-backs to one broker from many threads share requests (``consumer/_lane.py``):
every caller gets its own result, a lone call goes at once, errors reach everyone in
the request, and nobody is left waiting."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from qclient.consumer._lane import MAX_BATCH, Lane
from qclient.errors import BrokerUnavailableError
from qclient.protocol import wire


def _msg(i: int, size: int = 1) -> wire.WireMessage:
    return wire.WireMessage("%RETRY%g", 0, f"m{i}", b"x" * size)


class Broker:
    """Answers each request after ``delay_s`` (a request's round trip), recording it."""

    def __init__(self, delay_s: float = 0.005, fail: bool = False) -> None:
        self.delay_s = delay_s
        self.fail = fail
        self.requests: list[list[str]] = []
        self.concurrent = 0
        self.most = 0
        self._lock = threading.Lock()

    def send(self, messages: list[wire.WireMessage]) -> list[wire.MessageResult]:
        with self._lock:
            self.requests.append([m.msg_id for m in messages])
            self.concurrent += 1
            self.most = max(self.most, self.concurrent)
        time.sleep(self.delay_s)
        with self._lock:
            self.concurrent -= 1
        if self.fail:
            raise BrokerUnavailableError("down")
        return [wire.MessageResult(m.msg_id, wire.SEND_OK) for m in messages]


def test_a_lone_call_is_one_request_of_one():
    broker = Broker(delay_s=0)
    out = Lane(broker.send).call(_msg(1))
    assert out.error is None and out.result is not None and out.result.msg_id == "m1"
    assert out.batched == 1 and broker.requests == [["m1"]]


def test_concurrent_calls_share_requests_one_at_a_time_each_its_own_result():
    broker = Broker()
    lane = Lane(broker.send)
    with ThreadPoolExecutor(32) as pool:
        outs = list(pool.map(lambda i: lane.call(_msg(i)), range(400)))
    assert [o.result.msg_id for o in outs] == [f"m{i}" for i in range(400)]  # type: ignore[union-attr]
    assert sorted(m for r in broker.requests for m in r) == sorted(f"m{i}" for i in range(400))
    assert broker.most == 1  # one request out at a time
    assert len(broker.requests) < 400 / 4, f"{len(broker.requests)} requests for 400"
    assert max(len(r) for r in broker.requests) <= MAX_BATCH


def test_a_failed_request_fails_every_copy_in_it_and_the_next_ones_go_on():
    broker = Broker(fail=True)
    lane = Lane(broker.send)
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda i: lane.call(_msg(i)), range(64)))
    assert all(isinstance(o.error, BrokerUnavailableError) for o in outs)
    assert sum(len(r) for r in broker.requests) == 64
    broker.fail = False
    assert lane.call(_msg(99)).error is None  # not stuck busy


@pytest.mark.timeout(30)
def test_big_bodies_split_batches_by_bytes():
    broker = Broker()
    lane = Lane(broker.send)
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: lane.call(_msg(i, 3 << 20)), range(8)))
    assert all(o.error is None for o in outs)
    assert all(len(r) == 1 for r in broker.requests)  # 3 MiB each: one per request
