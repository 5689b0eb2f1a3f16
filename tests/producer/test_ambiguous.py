"""Extra copies on other brokers -- left by ambiguous attempts, or by a caller-chosen id
re-sent while its own broker was down -- are cancelled before they fire: of two copies,
the one on the broker ranked lower in the id's rendezvous order goes, so that every
clean-up keeps the same one and the message fires once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from tests.integration.helpers import StoredThenHung, drain, wait_until

from qclient import AsyncProducer, LocalCluster, Producer, QClientError, SendResult, SendStatus
from qclient.fault.strategy import _broker_seed, _hash, id_order, id_owner
from qclient.producer import _ambiguous
from qclient.producer._ambiguous import AmbiguousCopies, Unsettled, is_ambiguous
from qclient.protocol import wire
from qclient.routing.nameserver import NameServerClient


def _ids_of(broker: str, other: str, n: int) -> list[str]:
    """Ids that rendezvous hashing sends to ``broker`` first (of the two)."""
    out = []
    for k in range(1000):
        key = f"amb-{k}".encode()
        if _hash(key, _broker_seed(broker)) > _hash(key, _broker_seed(other)):
            out.append(f"amb-{k}")
    return out[:n]


#: how a noted copy ends (``AmbiguousCopies.counts``): each one in exactly one of these
_ENDS = ("cancelled", "not_found", "too_late", "gone", "kept", "dropped")
#: a copy that is (or was) the message: ``lookup``'s states of a copy not cancelled
_LIVE = (wire.STATE_SCHEDULED, wire.STATE_FIRED)


def _all_settled(copies: AmbiguousCopies) -> bool:
    """Every copy noted so far has ended: none is asked about or waits for its late ask."""
    counts = dict(copies.counts)  # one snapshot: the counters move on other threads
    return sum(counts[k] for k in _ENDS) == counts["noted"] + counts["noted_away"]


def _settled(copies: AmbiguousCopies, key: tuple[str, str, str]) -> bool:
    """The copy ``(topic, msg_id, broker)`` is neither asked about nor waiting for its
    late ask (read under the copies' lock: a late ask moves it from one to the other)."""
    with copies._lock:
        return key not in copies._pending and key not in copies._deferred


class _HeldLookups:
    """A producer's transport, but once ``broker`` answered a lookup of one of ``ids``
    with "not found", later lookups of that id there are refused (``httpx.ConnectError``,
    as if the broker were down) until ``release`` is set: the id's late ask cannot come
    before the test has re-sent it there."""

    def __init__(self, inner: Any, broker: str, ids: list[str], content_type: str) -> None:
        self._inner = inner
        self._broker = broker
        self._ids = set(ids)
        self._content_type = content_type
        self.not_found: set[str] = set()  # the ids the broker answered "not found" for
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def perform(self, call: Any, on_write: Any = None) -> Any:
        if call.broker != self._broker or call.path != wire.BROKER_LOOKUP:
            return self._inner.perform(call, on_write)
        msg_id = wire.decode(call.body, wire.LookupRequest, self._content_type).msg_id
        if msg_id in self.not_found and not self.release.is_set():
            raise httpx.ConnectError(f"lookup of {msg_id} held until its re-send (test)")
        answer = self._inner.perform(call, on_write)
        if (
            msg_id in self._ids
            and answer.status == 200
            and not wire.decode(answer.content, wire.LookupResponse, answer.media_type).found
        ):
            self.not_found.add(msg_id)
        return answer


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


#: an id whose rendezvous order is c, b, a: the copy on the acknowledging broker (b, or c)
#: ranks first, so the clean-up cancels the other one (a, or b)
MID = "m2"


def _result(broker: str, deliver_at_ms: float) -> SendResult:
    return SendResult(MID, SendStatus.SEND_OK, broker, 0, int(deliver_at_ms), "t")


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
        assert calls == [("t", MID, "a")] * 3  # never b: it deduplicated the retry
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
    acknowledges the retry. When broker-a resumes, it stores the late request if it is
    still within its deadline's allowance (decision 0014); past it, broker-a refuses the
    request. Which of the two happens depends on how soon the resumed broker reads its
    socket (a loaded host decides). Either way the producer settles broker-a's copy: found,
    the copy ranked lower in the id's order (broker-b's) is cancelled; not found, broker-b's
    stays. One copy is left, and every id is received once."""
    with LocalCluster(brokers=2) as cluster:
        a = cluster.broker("broker-a")
        ids = _ids_of("broker-a", "broker-b", 30)
        hung = ids[0]
        # one retry: the retry of a timed-out caller id is the send's last attempt, which
        # goes to the id's next broker (earlier retries stay where the copy may be); 4 s
        # attempts, and lookups and cancels, which a loaded host does not run out of
        with Producer(cluster.namesrv, retry_times=1, send_timeout=8.0) as p:
            p.send_delayed("amb", "warm-up", delay=0.1)  # routes known before the hang
            a.pause()
            try:
                # the first times out on a (ambiguous), then a is isolated: b directly
                results = [p.send_delayed("amb", i, delay=12.0, msg_id=i) for i in ids[:3]]
            finally:
                a.resume()
            results += [p.send_delayed("amb", i, delay=12.0, msg_id=i) for i in ids[3:]]
            # the first send went to a, its own broker, and was acknowledged by b: noted
            assert p._ambiguous.counts["noted"] >= 1, p._ambiguous.counts
            assert {r.broker_name for r in results[:3]} == {"broker-b"}
            # asked about at once and again while "not found", then from shortly before it
            # is due (its late ask): one never stored ends when it is due, as too late
            wait_until(
                lambda: _settled(p._ambiguous, ("amb", hung, "broker-a")),
                30,
                "broker-a's copy of the hung send to be settled",
            )
            on_a, on_b = (p._lookup_copy("amb", hung, b) for b in ("broker-a", "broker-b"))
            print(f"\nthe hung send's copies: a {on_a}, b {on_b}; {p._ambiguous.counts}")
            if on_a is None:  # broker-a refused the late request: broker-b's copy stays
                assert on_b in _LIVE, on_b
            else:  # broker-a stored it: broker-b's, ranked below it, was cancelled
                assert on_a in _LIVE and on_b == wire.STATE_CANCELLED, (on_a, on_b)
        got = drain(cluster.namesrv, "amb", "g", expected=len(ids) + 1, timeout=30, settle=0.5)
        counts = Counter(m.msg_id for m in got)
        assert all(counts[i] == 1 for i in ids), {i: n for i, n in counts.items() if n != 1}


def test_unsettled_merges_brokers_and_forgets_once_taken_or_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ambiguous, "_UNSETTLED_SLACK_S", 0.0)
    u = Unsettled()
    assert not u
    u.remember("t", "a", ("b1",), 5.0)
    u.remember("t", "a", ("b2", "b1"), 5.0)  # a second failed send of the same id
    assert u and u.take("t", "other") == ()
    assert u.take("t", "a") == ("b1", "b2") and not u
    u.remember("t", "c", ("b1",), 0.05)
    wait_until(lambda: u.take("t", "c") == (), 5, "the id to be forgotten once due")
    assert not u


def test_resend_after_a_failed_send_cancels_the_failed_attempts_copy() -> None:
    """A send with no retries fails on broker-a, the id's own broker, after broker-a stored
    it: broker-a hangs before its answer gets out (the test pauses it then) and the
    attempt times out. The caller sends the id again and broker-b acknowledges it; once
    broker-a resumes, the producer finds both copies and cancels the one ranked lower in
    the id's order, broker-b's: the re-send inherits the failed send's ambiguous attempt,
    asked about as if it had been its own. The id is received once, from broker-a."""
    with LocalCluster(brokers=2) as cluster:
        a = cluster.broker("broker-a")
        mid = _ids_of("broker-a", "broker-b", 1)[0]
        # a budget a loaded host does not run out of: no attempt here fails by its timeout
        with Producer(cluster.namesrv, retry_times=0, send_timeout=10.0) as p:
            p.send_delayed("amb-resend", "warm-up", delay=0.1)
            hang = p._http = StoredThenHung(p._http, "broker-a", mid, a)
            try:
                with pytest.raises(QClientError):
                    p.send_delayed("amb-resend", mid, delay=10.0, msg_id=mid)
                assert hang.stored, "broker-a did not store the first send"
                assert p._core.unsettled, "the failed send's attempt was not remembered"
                again = p.send_delayed("amb-resend", mid, delay=10.0, msg_id=mid)
            finally:
                a.resume()
            assert again.broker_name == "broker-b"
            counts = p._ambiguous.counts
            assert counts["noted"] == 1 and not p._core.unsettled, counts
            wait_until(lambda: _all_settled(p._ambiguous), 30, "the copy to be settled")
            assert counts["cancelled"] == 1, counts
            on_a, on_b = (p._lookup_copy("amb-resend", mid, b) for b in ("broker-a", "broker-b"))
            assert on_a in _LIVE and on_b == wire.STATE_CANCELLED, (on_a, on_b)
        got = drain(cluster.namesrv, "amb-resend", "g", expected=2, timeout=30, settle=0.5)
        assert [m.broker_name for m in got if m.msg_id == mid] == ["broker-a"], got


def test_close_cancels_the_copies_first() -> None:
    """A producer closed right after a send whose first attempt broker-a stored before it
    hung (the test pauses it as its answer comes back: the attempt times out, broker-b
    acknowledges the retry) still settles that copy once broker-a resumes: its close waits
    up to send_timeout for the copies, and cancels broker-b's, ranked below broker-a's in
    the id's order. Each id is received once."""
    with LocalCluster(brokers=2) as cluster:
        a = cluster.broker("broker-a")
        ids = _ids_of("broker-a", "broker-b", 2)
        # the retry goes to broker-b; close waits up to send_timeout (20 s) for the copies
        with Producer(cluster.namesrv, retry_times=1, send_timeout=20.0) as p:
            p.send_delayed("amb-close", "warm-up", delay=0.1)
            hang = p._http = StoredThenHung(p._http, "broker-a", ids[0], a)
            try:
                # the second goes to b directly: a is isolated (and hung) by then
                results = [p.send_delayed("amb-close", i, delay=10.0, msg_id=i) for i in ids]
            finally:
                a.resume()
            assert hang.stored, "broker-a did not store the first send"
            assert p._ambiguous.counts["noted"] == 1, p._ambiguous.counts
        # the noted copy was found on a and b's cancelled; the second id was never on a
        assert p._ambiguous.pending() == 0, p._ambiguous.counts
        assert p._ambiguous.counts["cancelled"] == 1, p._ambiguous.counts
        assert {r.broker_name for r in results} == {"broker-b"}
        got = drain(cluster.namesrv, "amb-close", "g", expected=len(ids) + 1, timeout=30)
        fired = {m.msg_id: m.broker_name for m in got if m.msg_id in ids}
        assert Counter(m.msg_id for m in got if m.msg_id in ids) == Counter(ids), got
        assert fired == {ids[0]: "broker-a", ids[1]: "broker-b"}, fired


def test_settle_does_not_wait_for_a_broker_that_does_not_answer() -> None:
    def cancel(r: SendResult) -> bool:
        raise ConnectionError("down")

    copies = AmbiguousCopies(cancel)
    try:
        copies.note(_result("b", time.time() * 1000 + 60_000), ("a",))
        t0 = time.monotonic()
        assert copies.settle(10.0) == 1  # left: broker a failed its round
        assert time.monotonic() - t0 < 5
    finally:
        copies.close()


def test_id_broker_is_asked_again_shortly_before_the_copy_is_due() -> None:
    """Nothing on the id's own broker when it answers again; a re-send may reach it later,
    so it is asked once more shortly before the message is due."""
    now = [time.time() * 1000]
    answers = iter([None, "scheduled"])
    cancels: list[str] = []

    def lookup(topic: str, msg_id: str, broker: str) -> str | None:
        return "scheduled" if broker == "b" else next(answers)

    copies = AmbiguousCopies(
        lambda r: cancels.append(r.broker_name) is None, lookup, clock_ms=lambda: now[0]
    )
    try:
        copies.note(_result("b", now[0] + 60_000), (), away_from=("a",))
        wait_until(lambda: copies.counts["asked_late"] == 0 and not copies.pending(), 5, "ask")
        assert cancels == [] and copies.counts["not_found"] == 0
        now[0] += 58_500  # 1.5 s before it is due
        wait_until(lambda: copies.counts["cancelled"] == 1, 5, "the late ask and cancel")
        assert cancels == ["a"] and copies.counts["asked_late"] == 1
    finally:
        copies.close()


def test_id_broker_asked_as_an_ambiguous_attempts_broker_still_gets_the_late_ask() -> None:
    """The id's own broker timed out (an ambiguous attempt) and a stand-in acknowledged:
    one copy to ask about, owed both the ambiguous asks and the id's late ask (a re-send
    may reach that broker after it answered "not found")."""
    now = [time.time() * 1000]
    answers = iter([None, None, None, None, "scheduled"])
    cancels: list[str] = []

    def lookup(topic: str, msg_id: str, broker: str) -> str | None:
        return "scheduled" if broker == "b" else next(answers)

    copies = AmbiguousCopies(
        lambda r: cancels.append(r.broker_name) is None, lookup, clock_ms=lambda: now[0]
    )
    try:
        copies.note(_result("b", now[0] + 60_000), ("a",), away_from=("a",))
        wait_until(lambda: not copies.pending(), 10, "the four asks")
        assert cancels == [] and copies.counts["not_found"] == 0
        now[0] += 58_500  # 1.5 s before it is due
        wait_until(lambda: copies.counts["cancelled"] == 1, 5, "the late ask and cancel")
        assert cancels == ["a"] and copies.counts["asked_late"] == 1
    finally:
        copies.close()


def test_late_ask_that_finds_nothing_settles_as_not_found() -> None:
    """The late ask is one ask: the id's own broker still has no copy shortly before it is
    due, so the copy is settled "not found" at once, not asked four more times a round
    apart until it is too late. The clock runs until the late ask is due, then stands
    there: the asks are counted, so four would show, and a slow host cannot make the one
    ask come after the message's time (the test would then see "too late")."""
    stand: list[float] = []  # once set, the copies' clock stands at this ms
    asked_a: list[float] = []
    cancels: list[str] = []

    def lookup(topic: str, msg_id: str, broker: str) -> str | None:
        if broker == "b":
            return "scheduled"
        asked_a.append(time.monotonic())
        return None

    copies = AmbiguousCopies(
        lambda r: cancels.append(r.broker_name) is None,
        lookup,
        clock_ms=lambda: stand[0] if stand else time.time() * 1000,
    )
    try:
        due = time.time() * 1000 + 60_000
        copies.note(_result("b", due), ("a",), away_from=("a",))
        wait_until(lambda: not copies.pending(), 10, "the four asks")
        assert copies.counts["not_found"] == 0  # deferred to its late ask
        before = len(asked_a)
        stand.append(due - 2_000)  # the late ask is due now (it comes 2 s before)
        wait_until(
            lambda: copies.counts["not_found"] + copies.counts["too_late"] == 1,
            10,
            "the late ask's answer",
        )
        assert copies.counts["not_found"] == 1 and copies.counts["asked_late"] == 1
        assert len(asked_a) - before == 1, asked_a  # one ask, not four a round apart
        assert cancels == [] and not copies.pending()
    finally:
        copies.close()


def test_id_broker_of_a_copy_due_soon_is_asked_again_two_rounds_on() -> None:
    """Due sooner than the late ask's lead: the id's own broker is still asked once more,
    two rounds after its "not found", when that is at least a round before it is due."""
    now = [time.time() * 1000]
    answers = iter([None, "scheduled"])
    cancels: list[str] = []

    def lookup(topic: str, msg_id: str, broker: str) -> str | None:
        return "scheduled" if broker == "b" else next(answers)

    copies = AmbiguousCopies(
        lambda r: cancels.append(r.broker_name) is None, lookup, clock_ms=lambda: now[0]
    )
    try:
        copies.note(_result("b", now[0] + 2_500), (), away_from=("a",))
        wait_until(lambda: not copies.pending(), 5, "the first ask")
        assert cancels == [] and copies.counts["not_found"] == 0
        now[0] += 1_000
        wait_until(lambda: copies.counts["cancelled"] == 1, 5, "the second ask and cancel")
        assert cancels == ["a"] and copies.counts["asked_late"] == 1
    finally:
        copies.close()


def _store_of(copies: dict[str, str]) -> tuple[Callable[..., str | None], Callable[..., bool]]:
    """lookup and cancel over one shared set of copies (broker -> state)."""
    lock = threading.Lock()

    def lookup(topic: str, msg_id: str, broker: str) -> str | None:
        return copies.get(broker)

    def cancel(r: SendResult) -> bool:
        with lock:
            if copies.get(r.broker_name) != "scheduled":
                return False
            copies[r.broker_name] = "cancelled"
            return True

    return lookup, cancel


def test_the_copy_on_the_better_ranked_broker_stays_even_if_not_acknowledged() -> None:
    """a ranks before b in the id's order: the acknowledged copy on b goes, a's stays."""
    mid = next(f"x{i}" for i in range(100) if id_order(f"x{i}", ["a", "b"])[0] == "a")
    store = {"a": "scheduled", "b": "scheduled"}
    lookup, cancel = _store_of(store)
    copies = AmbiguousCopies(cancel, lookup)
    try:
        acked = SendResult(mid, SendStatus.SEND_OK, "b", 0, int(time.time() * 1000) + 60_000, "t")
        copies.note(acked, ("a",))
        wait_until(lambda: copies.pending() == 0, 5, "the copies to be settled")
        assert store == {"a": "scheduled", "b": "cancelled"}, store
    finally:
        copies.close()


def test_two_clean_ups_keeping_opposite_copies_never_cancel_both() -> None:
    """A re-sent id: one send acknowledged by a (its attempt on b ambiguous), another by
    b (its attempt on a ambiguous), each producer cleaning up at once. Both keep the copy
    on the broker ranked first in the id's order; one copy is left, for many ids."""
    for i in range(20):
        mid = f"race-{i}"
        store = {"a": "scheduled", "b": "scheduled"}
        lookup, cancel = _store_of(store)
        due = int(time.time() * 1000) + 60_000
        p1, p2 = AmbiguousCopies(cancel, lookup), AmbiguousCopies(cancel, lookup)
        try:
            p1.note(SendResult(mid, SendStatus.SEND_OK, "a", 0, due, "t"), ("b",))
            p2.note(SendResult(mid, SendStatus.SEND_OK, "b", 0, due, "t"), ("a",))
            wait_until(
                lambda p1=p1, p2=p2: not p1.pending() and not p2.pending(), 5, "both settled"
            )
        finally:
            p1.close()
            p2.close()
        first = id_order(mid, ["a", "b"])[0]
        assert store[first] == "scheduled", (mid, store)
        assert list(store.values()).count("scheduled") == 1, (mid, store)


def test_copy_stays_when_the_acknowledged_one_is_gone() -> None:
    """Another producer may have cancelled the acknowledged copy (keeping this one): then
    this copy is the message, and it stays."""
    cancels: list[str] = []
    looked: list[str] = []
    state = {"a": "scheduled", "b": "cancelled"}

    def lookup(topic: str, msg_id: str, broker: str) -> str | None:
        looked.append(broker)
        return state[broker]

    copies = AmbiguousCopies(lambda r: cancels.append(r.broker_name) is None, lookup)
    try:
        copies.note(_result("b", time.time() * 1000 + 60_000), (), away_from=("a",))
        wait_until(lambda: copies.pending() == 0, 5, "the copy to be settled")
        assert looked == ["a", "b"] and cancels == []
        assert copies.counts["kept"] == 1 and copies.counts["noted_away"] == 1
        state["b"] = "fired"  # delivered from b: a's copy is the extra one
        copies.note(_result("b", time.time() * 1000 + 60_000), (), away_from=("a",))
        wait_until(lambda: copies.pending() == 0, 5, "the second copy to be settled")
        assert cancels == ["a"] and copies.counts["cancelled"] == 1
    finally:
        copies.close()


#: how far ahead the outage test's ids are due: the kill, the restart (``start`` waits up
#: to 30 s for it; a loaded host took 19 s), the re-sends and the late ask's lead must all
#: come before it
DUE_S = 45.0
#: the late ask's lead in the outage test (the producer's is 2 s): room on a loaded host
#: for its lookups and cancels before the copies are due
LATE_ASK_S = 10.0
#: budgets of the outage test's sends, lookups and cancels that a loaded host does not run
#: out of (a cancel retried after its first attempt timed out is answered "already
#: cancelled": the copy would be counted as kept, not cancelled)
OUTAGE_SEND_TIMEOUT = 30.0


def test_id_resent_across_its_brokers_outage_fires_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """a (the ids' own broker) is killed. Ids a acknowledged before are re-sent by another
    producer, acknowledged by b: once a is back, a's copies are found at once and b's
    cancelled. Ids first sent while a was down (to b) are not on a when that producer asks
    it; they are re-sent after that by a third producer, to a: a's new copies are found by
    the ask shortly before they are due (the test holds that ask until the re-send), and
    b's cancelled. Each id fires once, from a."""
    monkeypatch.setattr(_ambiguous, "_LATE_ASK_MS", LATE_ASK_S * 1000)
    with LocalCluster(brokers=2) as cluster:
        a = cluster.broker("broker-a")
        *ids, warm_a = _ids_of("broker-a", "broker-b", 13)
        warm_b = _ids_of("broker-b", "broker-a", 1)[0]
        assert all(id_owner(i, ["broker-a", "broker-b"]) == "broker-a" for i in ids)
        old, new = ids[:8], ids[8:]

        def both_in_route() -> bool:
            with NameServerClient(cluster.namesrv) as ns:
                return len(ns.get_route("away").queue_datas) == 2

        def producer() -> Producer:
            return Producer(cluster.namesrv, send_timeout=OUTAGE_SEND_TIMEOUT)

        with producer() as p1:
            # the topic on both brokers, so that both are in its route
            for w in (warm_a, warm_b):
                p1.send_delayed("away", "warm-up", delay=0.1, msg_id=w)
            wait_until(both_in_route, 10, "both in the route")
        with producer() as p1, producer() as p2:
            p2.send_delayed("away", "warm-up", delay=0.1)
            held = p2._http = _HeldLookups(p2._http, "broker-a", new, p2._core.content_type)
            first = [p1.send_delayed("away", i, delay=DUE_S, msg_id=i) for i in old]
            assert {r.broker_name for r in first} == {"broker-a"}
            a.kill()
            try:
                again = [
                    p2.send_delayed("away", i, deliver_at=r.deliver_at_ms / 1000, msg_id=i)
                    for i, r in zip(old, first, strict=True)
                ]
                during = [p2.send_delayed("away", i, delay=DUE_S, msg_id=i) for i in new]
            finally:
                a.start()
            assert {r.broker_name for r in again + during} == {"broker-b"}
            counts = p2._ambiguous.counts
            assert counts["noted_away"] == len(ids), counts
            # p2 asked a back about the new ids and found none: their late ask is owed
            wait_until(lambda: held.not_found == set(new), 30, "a's first answers on new ids")
            wait_until(both_in_route, 30, "a back in the route")
            with producer() as p3:
                after = [
                    p3.send_delayed("away", i, deliver_at=r.deliver_at_ms / 1000, msg_id=i)
                    for i, r in zip(new, during, strict=True)
                ]
            held.release.set()
            assert {r.broker_name for r in after} == {"broker-a"}
            wait_until(
                lambda: _all_settled(p2._ambiguous), DUE_S + 15, "the copies on a to be settled"
            )
            assert counts["cancelled"] == len(ids), counts
            assert counts["asked_late"] == len(new), counts
        got = drain(
            cluster.namesrv, "away", "g", expected=len(ids) + 3, timeout=DUE_S + 15, settle=0.5
        )
        by_id = Counter(m.msg_id for m in got)
        assert all(by_id[i] == 1 for i in ids), {i: n for i, n in by_id.items() if n != 1}
        # the copies kept are those on the ids' own broker, first in their order
        assert {m.broker_name for m in got if m.msg_id in ids} == {"broker-a"}


def test_async_producer_looks_up_and_cancels_a_copy_from_the_copies_thread() -> None:
    """The copies' thread reaches AsyncProducer's loop for its lookups and cancels."""

    async def main(namesrv: str) -> tuple[str | None, bool, str | None]:
        async with AsyncProducer(namesrv) as ap:
            r = await ap.send_delayed("amb-aio", "x", delay=30.0, msg_id="aio-1")
            ap._loop = asyncio.get_running_loop()  # set by the first noted copy
            state = await asyncio.to_thread(ap._lookup_copy, "amb-aio", "aio-1", r.broker_name)
            cancelled = await asyncio.to_thread(ap._cancel_copy, r)
            after = await asyncio.to_thread(ap._lookup_copy, "amb-aio", "aio-1", r.broker_name)
            return state, cancelled, after

    with LocalCluster(brokers=1) as cluster:
        assert asyncio.run(main(cluster.namesrv)) == ("scheduled", True, "cancelled")


def test_every_broker_before_the_acknowledging_one_is_asked() -> None:
    """Acknowledged by the id's third broker (its own and the next were down): a copy
    may be on either of them, say from a re-send while only the first was down."""
    asked: list[str] = []

    def lookup(topic: str, msg_id: str, broker: str) -> str | None:
        asked.append(broker)
        return "scheduled" if broker in ("b", "c") else None

    cancels: list[str] = []
    # the copies' clock stands 2.5 s before the message is due: a slow host cannot turn
    # the copy on b into one found "too late" to cancel
    now_ms = time.time() * 1000
    copies = AmbiguousCopies(
        lambda r: cancels.append(r.broker_name) is None, lookup, clock_ms=lambda: now_ms
    )
    try:
        copies.note(_result("c", now_ms + 2_500), (), away_from=("a", "b"))
        wait_until(lambda: copies.pending() == 0, 30, "both to be settled")
        assert copies.counts["noted_away"] == 2 and cancels == ["b"]
        assert sorted(set(asked)) == ["a", "b", "c"]
    finally:
        copies.close()
