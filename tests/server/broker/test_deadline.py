"""The send deadline: a broker stores nothing of a request whose sender gave up on it,
whether the request arrives late (it sat in the socket buffer of a paused broker) or
waits for its group commit behind a stall; a live request, within the clock-skew
allowance, is stored as before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from tests.integration.helpers import wait_until

from qclient import LocalCluster, Producer
from qclient.protocol import wire
from qclient.protocol.deadline import (
    DEADLINE_SKEW_MS,
    attempt_deadline_ms,
    expired,
    refuse_after_ms,
)
from qclient.server.broker.commit import LoopCommitter
from qclient.server.store import (
    DeadlineExceededError,
    DelayStore,
    NewMessage,
    StoreConfig,
)

TOPIC = "deadline"


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- the rule and the wire ---------------------------------------------------------


@pytest.mark.parametrize("content_type", [wire.JSON, wire.MSGPACK])
def test_send_request_round_trip_with_and_without_a_deadline(content_type: str) -> None:
    m = wire.WireMessage(TOPIC, 1, "id-1", b"body", delay_ms=5)
    old = wire.encode(wire.SendRequest([m]), content_type)
    assert b"deadline_ms" not in old  # omitted when unset: the body of a client without it
    assert wire.decode(old, wire.SendRequest, content_type).deadline_ms is None
    new = wire.SendRequest([m], deadline_ms=1_700_000_000_123)
    back = wire.decode(wire.encode(new, content_type), wire.SendRequest, content_type)
    assert back == new and back.deadline_ms == 1_700_000_000_123
    with pytest.raises(msgspec.ValidationError):
        wire.decode(
            wire.encode({"messages": [m], "deadline_ms": "soon"}, content_type),
            wire.SendRequest,
            content_type,
        )


def test_the_rule_allows_the_clock_skew_margin() -> None:
    assert attempt_deadline_ms(1.0, now_s=1000.0) == 1_001_001  # rounded up, never early
    assert refuse_after_ms(5_000) == 5_000 + DEADLINE_SKEW_MS
    assert not expired(None, 10**15)
    assert not expired(5_000, 5_000 + DEADLINE_SKEW_MS)  # a broker ahead by the margin
    assert expired(5_000, 5_000 + DEADLINE_SKEW_MS + 1)
    assert wire.ErrorCode.DEADLINE_EXCEEDED in wire.RETRYABLE_CODES


# --- the store: checked again right before the write -------------------------------


class _Clock:
    def __init__(self) -> None:
        self.ms = _now_ms()

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clocked_store(tmp_path: Path) -> Iterator[tuple[DelayStore, _Clock]]:
    clock = _Clock()
    s = DelayStore(StoreConfig(data_dir=tmp_path / "store", bucket_ms=60_000), clock_ms=clock)
    s.open()
    try:
        yield s, clock
    finally:
        s.close()


def _msgs(clock: _Clock, tag: str, n: int = 1) -> list[NewMessage]:
    return [NewMessage(TOPIC, 0, f"{tag}-{i}", b"x" * 50, clock.ms + 600_000) for i in range(n)]


def test_a_submit_queued_past_its_deadline_is_not_written(
    clocked_store: tuple[DelayStore, _Clock],
) -> None:
    store, clock = clocked_store
    appended = store.stats()["appended"]
    # two requests queue for one group; the group commit starts after the first one's
    # deadline (it waited behind a stall): only the live one is written
    stale = store.submit(_msgs(clock, "stale", 3), defer=True, refuse_after_ms=clock.ms + 100)
    live = store.submit(_msgs(clock, "live", 2), defer=True, refuse_after_ms=clock.ms + 10_000)
    plain = store.submit(_msgs(clock, "plain"), defer=True)
    clock.ms += 101
    store.commit_pending()
    with pytest.raises(DeadlineExceededError, match="deadline had passed 1 ms ago"):
        stale.result(timeout=5)
    assert [r.msg_id for r in live.result(timeout=5)] == ["live-0", "live-1"]
    assert plain.result(timeout=5)[0].msg_id == "plain-0"
    stats = store.stats()
    assert stats["appended"] - appended == 3 and stats["deadline_refusals"] == 1
    assert stats["pending"] == 0 and stats["pending_bytes"] == 0
    assert store.lookup(TOPIC, "stale-0") is None and store.lookup(TOPIC, "live-0") is not None
    # nothing of it is remembered: the same ids sent again are stored, not duplicates
    again = store.store_now(_msgs(clock, "stale", 3))
    assert [r.duplicate for r in again] == [False, False, False]
    assert store.lookup(TOPIC, "stale-2") is not None


def test_the_loop_committer_refuses_at_once_and_in_a_group(
    clocked_store: tuple[DelayStore, _Clock],
) -> None:
    store, clock = clocked_store

    async def main() -> None:
        committer = LoopCommitter(store, asyncio.get_running_loop())
        with pytest.raises(DeadlineExceededError):
            committer.store_now(_msgs(clock, "now"), refuse_after_ms=clock.ms - 1)
        first = committer.submit(_msgs(clock, "g1"), refuse_after_ms=clock.ms - 1)
        second = committer.submit(_msgs(clock, "g2"), refuse_after_ms=clock.ms + 1000)
        done = await asyncio.gather(first, second, return_exceptions=True)
        assert isinstance(done[0], DeadlineExceededError)
        assert [r.msg_id for r in done[1]] == ["g2-0"]  # type: ignore[union-attr]

    asyncio.run(main())
    assert store.lookup(TOPIC, "now-0") is None and store.lookup(TOPIC, "g1-0") is None
    assert store.lookup(TOPIC, "g2-0") is not None


# --- a real broker -----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=2, data_dir=str(tmp_path_factory.mktemp("deadline"))) as c:
        yield c


def _post(addr: str, path: str, body: object) -> httpx.Response:
    return httpx.post(
        f"http://{addr}{path}",
        content=wire.encode(body),
        headers={"content-type": wire.JSON},
        timeout=10,
    )


def _send(addr: str, msg_id: str, deadline_ms: int | None) -> httpx.Response:
    m = wire.WireMessage(TOPIC, 0, msg_id, b"direct", delay_ms=60_000)
    return _post(addr, wire.BROKER_SEND, wire.SendRequest([m], deadline_ms=deadline_ms))


def _found(addr: str, msg_id: str) -> bool:
    resp = _post(addr, wire.BROKER_LOOKUP, wire.LookupRequest(TOPIC, msg_id))
    assert resp.status_code == 200, resp.text
    return msgspec.json.decode(resp.content, type=wire.LookupResponse).found


def _refusals(addr: str) -> int:
    stats = httpx.get(f"http://{addr}{wire.BROKER_STATS}", timeout=10).json()
    return int(stats.get("deadline_refusals", 0))


def test_a_request_past_its_deadline_is_refused_and_nothing_stored(
    cluster: LocalCluster,
) -> None:
    addr = cluster.brokers[0].addr
    refused = _send(addr, "late-1", _now_ms() - DEADLINE_SKEW_MS - 2_000)
    assert refused.status_code == 504, refused.text
    err = msgspec.json.decode(refused.content, type=wire.ErrorResponse).error
    assert err.code == wire.ErrorCode.DEADLINE_EXCEEDED
    assert "nothing stored" in err.message and "\n" not in err.message
    assert not _found(addr, "late-1")
    assert _send(addr, "live-1", _now_ms() + 30_000).status_code == 200
    assert _found(addr, "live-1")
    # no deadline (an older client), and the refused id again: stored, not a duplicate
    assert _send(addr, "late-1", None).status_code == 200
    assert _found(addr, "late-1")


def test_a_request_queued_behind_a_paused_broker_is_not_stored(cluster: LocalCluster) -> None:
    """The broker is SIGSTOPped while the producer's attempt waits in its socket buffer;
    the attempt times out, the retry is acknowledged by the other broker, and once the
    paused one resumes (after the deadline and its skew margin) it refuses the stale
    request: a single copy, no cancel needed."""
    a, b = cluster.brokers
    for x in (a, b):  # the topic on both, so the route offers the retry another broker
        assert _post(x.addr, wire.BROKER_TOPICS, wire.CreateTopicRequest(TOPIC)).status_code == 200

    def routed() -> set[str]:
        resp = httpx.get(f"http://{cluster.namesrv}{wire.NAMESRV_ROUTE.format(topic=TOPIC)}")
        route = wire.decode(resp.content, wire.TopicRoute, resp.headers["content-type"])
        return {q.broker_name for q in route.queue_datas}

    wait_until(lambda: routed() == {a.name, b.name}, 15, "both brokers in the route")
    before = _refusals(a.addr)
    # 2 attempts of 1 s each: the first one's deadline is about 1 s after it starts
    with Producer(
        cluster.namesrv, send_timeout=2.0, retry_times=1, start_detector_enable=False
    ) as p:
        info = p._info(TOPIC)
        mid = next(
            f"stale-{i}"
            for i in range(1000)
            if p._core.select(info, msg_id=f"stale-{i}").broker_name == a.name
        )
        a.pause()
        try:
            sent_at = _now_ms()
            r = p.send_delayed(TOPIC, b"once", delay=30.0, msg_id=mid)
            assert r.broker_name == b.name
            # resume only once the first attempt's deadline (<= sent_at + 2 s: its timeout
            # is at most the whole budget) and the skew margin have passed on a's clock
            wait_until(
                lambda: _now_ms() > sent_at + 2_000 + DEADLINE_SKEW_MS + 50, 10, "the deadline"
            )
        finally:
            a.resume()
        wait_until(lambda: _refusals(a.addr) > before, 15, "a to refuse the stale request")
        assert not _found(a.addr, mid)
        assert _found(b.addr, mid)
        assert p.lookup(TOPIC, mid).copies == 1  # type: ignore[union-attr]
