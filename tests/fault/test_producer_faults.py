"""Against real (fake) brokers on loopback: hung brokers, per-attempt timeouts, detector."""

from __future__ import annotations

import time

from tests.producer.fakes import fake_cluster, wait_until

from qclient import Producer


def test_hung_broker_costs_one_attempt_share_and_is_avoided() -> None:
    with (
        fake_cluster() as (ns, (a, _b)),
        # 9 s, 3 s an attempt: with a busy core the healthy broker answered after a 1 s
        # share once, and that send's third attempt went back to the hung one
        Producer(ns.addr, send_timeout=9.0, detect_interval=0.2) as p,
    ):
        p.send("t", b"warm")
        a.mode = "hang"  # accepts, reads, never answers (as under SIGSTOP)
        before = a.sends
        worst = 0.0
        for i in range(60):
            t0 = time.monotonic()
            r = p.send_delayed("t", f"m{i}", delay=5)
            worst = max(worst, time.monotonic() - t0)
            assert r.broker_name == "broker-b"
        # Counted, not timed (a loaded host stretches any wall-clock bound): every send
        # succeeded inside its 9 s budget, so the hung attempt gave up at its share and
        # left the rest for the retry; after it the broker is avoided. A slow warm-up
        # send may have isolated it already, so the hung one may have cost nothing.
        hung = a.sends - before
        assert hung <= 1, hung
        if hung:
            assert worst >= 2.9, worst  # it waited its share (9 s over 3 attempts)
        fa = next(f for f in p.fault_items() if f.name == "broker-a")
        assert not fa.available and not fa.reachable
        # the broker comes back: the detector ends the isolation, traffic returns
        a.mode = "ok"
        a.release.set()
        assert wait_until(lambda: all(f.available and f.reachable for f in p.fault_items()), 5.0)
        a.release.clear()
        # traffic returns: a send reaches broker-a again (bounded: on a loaded host the
        # first one back may be slow enough to isolate it once more, for a while)
        names: set[str] = set()
        deadline = time.monotonic() + 20.0
        for _ in range(400):
            names.add(p.send("t", b"z").broker_name)
            if names == {"broker-a", "broker-b"} or time.monotonic() > deadline:
                break
            if "broker-a" not in names:
                time.sleep(0.05)
        assert names == {"broker-a", "broker-b"}


def test_fault_tolerance_off_pays_every_time() -> None:
    with (
        fake_cluster() as (ns, (a, _b)),
        # 4 s per attempt: a hit costs its whole share, and the healthy broker's answer
        # must fit in a share on a loaded host (0.3 s and 2 s did not, at load 18)
        Producer(ns.addr, send_timeout=8.0, retry_times=1, send_latency_fault_enable=False) as p,
    ):
        p.send("t", b"warm")
        a.mode = "hang"
        hits = 0
        for _ in range(40):  # every send whose first pick is the hung broker pays a timeout
            before = a.sends
            t0 = time.monotonic()
            assert p.send("t", b"x").broker_name == "broker-b"
            if a.sends > before:
                hits += 1
                assert time.monotonic() - t0 >= 3.9  # its attempt share: 8 s / 2
            if hits >= 2:
                break
        assert hits >= 2
        assert p.fault_items() == []
        # runtime toggle: on from now; at most one more attempt goes to the hung broker
        p.send_latency_fault_enable = True
        before = a.sends
        for _ in range(8):
            p.send("t", b"y")
        assert a.sends - before <= 1


def test_send_failure_refreshes_route_at_once() -> None:
    with (
        fake_cluster() as (ns, (a, _b)),
        Producer(ns.addr, route_refresh_interval=30.0, start_detector_enable=False) as p,
    ):
        p.send("t", b"warm")
        calls = ns.calls
        a.mode = "busy"  # 503 BROKER_BUSY: a retryable broker error
        for _ in range(8):
            assert p.send("t", b"x").broker_name == "broker-b"
        assert wait_until(lambda: ns.calls > calls, 3.0)  # not after 30 s


def test_async_producer_hung_broker_bounded_per_send() -> None:
    import asyncio

    from qclient import AsyncProducer

    async def main(addr: str) -> list[float]:
        async with AsyncProducer(addr, send_timeout=3.0) as ap:
            await ap.send("t", b"warm")
            out = []
            for i in range(30):
                t0 = time.monotonic()
                r = await ap.send_delayed("t", f"m{i}", delay=1)
                out.append(time.monotonic() - t0)
                assert r.broker_name == "broker-b"
            return out

    with fake_cluster() as (ns, (a, _b)):
        a.mode = "hang"
        before = a.sends
        took = asyncio.run(main(ns.addr))
        hung = a.sends - before
        a.release.set()
    # counted, not timed (a loaded host stretches any wall-clock bound): every send,
    # the warm-up's too, succeeded inside its budget, and at most one attempt went to the
    # hung broker, so it gave up at its share and the broker was avoided afterwards
    assert hung <= 1, hung
    assert len(took) == 30  # and none raised
