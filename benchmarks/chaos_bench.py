"""Chaos soak: faults on repeat while traffic flows, then every acknowledgement checked.

On a 3-broker ``LocalCluster`` (fsync on), producers of every kind -- sync threads,
``send_async``, ``AsyncProducer``, ``send_batch`` -- send delayed messages (most due
within ``--short-max`` s, some up to ``--long-max`` s; a few re-send an acknowledged id on
purpose), while a nemesis with a fixed seed kills -9, SIGSTOPs, cleanly stops and
restarts brokers and the name server (overlapping, never every broker at once, except
once for ``--all-down`` s), and consumer-group members (child processes) join and are
killed. Then a fresh consumer group reads every queue from the start and the run checks:
every acknowledged message delivered (lost), none early, none with changed content,
duplicates (copies stored twice, on two brokers or two offsets), errors that reached
callers per fault kind, send-latency p99 per phase, and recovery times.

    python -m benchmarks.chaos_bench [--json] [--smoke] [--duration 60] [--seed 17]
        [--plot chaos_timeline.png]

Exit status 1 when a hard check fails (lost, early, wrong content, a fault that did not
heal); the JSON is printed first either way.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import random
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._chaos import (
    TOPIC,
    Band,
    Clock,
    Ledger,
    Members,
    Nemesis,
    Receipt,
    faults_at,
    summary,
)
from benchmarks._chaos_member import body_for
from benchmarks._suite.report import target
from qclient import AsyncProducer, Consumer, LocalCluster, Message, Producer
from qclient.errors import QClientError
from qclient.fault.strategy import id_owner
from qclient.protocol import wire

log = logging.getLogger("benchmarks.chaos_bench")

SEND_TIMEOUT = 3.0
PRODUCER_KINDS = ("sync", "send_async", "async_producer", "batch")
RESEND_FRACTION = 0.03


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

    def _next(self, rng: random.Random, kind: str) -> tuple[str, dict[str, float]]:
        """A new id and delay, or (now and then) an acknowledged id again, same time."""
        if rng.random() < RESEND_FRACTION:
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

        async def one(ap: AsyncProducer, mid: str, when: dict[str, float]) -> None:
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


def audit(namesrv: str, ledger: Ledger, deadline: float) -> list[Any]:
    """Read every queue from offset 0 with a fresh group until each acknowledged id is
    seen and the last is due, or ``deadline`` (time.monotonic)."""
    with ledger.lock:  # a send_async callback may still be adding its last ones
        want = set(ledger.acked)
        last_due = max((d for d, _, _ in ledger.acked.values()), default=0)
    got: list[Any] = []
    seen: set[str] = set()
    with Consumer(namesrv, TOPIC, f"audit-{int(time.time())}") as c:
        while time.monotonic() < deadline:
            try:
                batch = c.poll(1024, timeout=0.5)
            except QClientError:
                time.sleep(0.2)
                continue
            received_ms = time.time_ns() // 1_000_000
            for m in batch:
                m.extra["received_ms"] = received_ms
            got.extend(batch)
            seen.update(m.msg_id for m in batch)
            if want <= seen and time.time() * 1000 > last_due + 2000 and not batch:
                break
    return got


def classify(
    ledger: Ledger,
    by_id: dict[str, set[tuple[str, int, int]]],
    dup_ids: dict[str, int],
    bands: list[Band],
    end: float,
    brokers: list[str],
) -> tuple[dict[str, int], dict[str, int], int, list[dict[str, Any]]]:
    """Duplicates by kind, the preventable ones by kind, how many would have been but for
    the kept copy's broker being down, and samples.

    Kinds: ``resent_first_home`` / ``resent_first_away`` (a caller re-sent an acknowledged
    id; its first copy on the id's own broker, or elsewhere because that one was down),
    ``ambiguous`` (one acknowledgement, an extra copy on another broker: an attempt that
    timed out but stored), ``same_broker`` (two copies on one broker), ``unacked`` (never
    acknowledged, stored twice). Preventable: the message's delay outlasted the faults --
    an extra copy's broker was back (and the copy stored) >= 2 s before it was due, time
    enough to cancel it, and the kept copy's broker was up then. While the kept copy's
    broker is down the producers leave the extra copy (it fires on time, the kept one
    again when its broker is back: a duplicate rather than a late delivery).
    """
    kinds: Counter[str] = Counter()
    preventable: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    keep_down = 0
    wall0 = ledger.clock.wall_ms(0)
    for mid, n in dup_ids.items():
        held = sorted({b for b, _, _ in by_id[mid]})
        if mid not in ledger.acked:
            kind, keep = "unacked", ""
        else:
            acks = ledger.acks[mid]
            if mid in ledger.resent and len(acks) > 1:
                home = id_owner(mid, brokers)
                kind = "resent_first_home" if acks[0][0] == home else "resent_first_away"
                # the producers keep the copy away from the id's broker
                keep = next((b for b, _ in acks if b != home), acks[-1][0])
            elif len(held) == 1:
                kind, keep = "same_broker", held[0]
            else:
                kind, keep = "ambiguous", acks[0][0]
        kinds[kind] += n
        if kind == "unacked":
            continue
        deliver_ms = ledger.acked[mid][0]
        due = (deliver_ms - wall0) / 1000
        extra = [b for b in held if b != keep]
        # the extra copy's broker was back (after its last fault that began before the
        # copy was due), and the copy stored (a re-send's acknowledgement), >= 2 s before
        # it was due
        ok = False
        for broker in extra:
            ends = [b.t1 if b.t1 >= 0 else end for b in bands if b.target == broker and b.t0 <= due]
            stored = [t for b, t in ledger.acks[mid] if b == broker]
            if ends and due - max(ends + stored) >= 2.0:
                ok = True
        if ok and any(
            b.t0 <= due and (b.t1 < 0 or b.t1 >= due - 2.0) for b in bands if b.target == keep
        ):
            ok = False
            keep_down += n
        if ok:
            preventable[kind] += n
        if (ok and len(samples) < 16) or sum(1 for s in samples if s["kind"] == kind) < 4:
            acks = ledger.acks[mid]
            samples.append(
                {
                    "kind": kind,
                    "preventable": ok,
                    "id": mid,
                    "home": id_owner(mid, brokers),
                    "acks": [(b, round(t, 2)) for b, t in acks],
                    "copies": held,
                    "due_at_s": round(due, 2),
                    "faults_at_ack": sorted(
                        faults_at(bands, acks[-1][1], end, before=SEND_TIMEOUT)
                    ),
                }
            )
    return dict(kinds), dict(preventable), keep_down, samples


def analyse(
    ledger: Ledger,
    copies: list[Any],
    receipts: list[Receipt],
    bands: list[Band],
    end: float,
    brokers: list[str],
) -> dict[str, Any]:
    """The checks and figures of one run."""
    acked = ledger.acked
    by_id: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
    early = wrong = 0
    for m in copies:
        by_id[m.msg_id].add((m.broker_name, m.queue_id, m.offset))
        # received before its time, or fired earlier than brokers fire ahead (consumers
        # hold such messages until their time)
        if m.extra["received_ms"] < m.deliver_at_ms or m.fired_at_ms < wire.firing_time_ms(
            m.deliver_at_ms
        ):
            early += 1
        if m.body != body_for(m.msg_id):
            wrong += 1
    early += sum(r.received_ms < r.deliver_at_ms for r in receipts)
    lost = [mid for mid in acked if mid not in by_id]
    dup_ids = {mid: len(s) - 1 for mid, s in by_id.items() if len(s) > 1}
    dups = sum(dup_ids.values())
    dup_kinds, preventable, keep_down, samples = classify(
        ledger, by_id, dup_ids, bands, end, brokers
    )

    kinds = Counter(b.kind for b in bands)
    errors_by_fault: dict[str, int] = Counter()
    kill_errors_by_producer: Counter[str] = Counter()
    error_samples = []
    for (t, kind, _err), text in zip(ledger.errors, ledger.error_texts, strict=True):
        on = faults_at(bands, t, end, before=SEND_TIMEOUT + 0.5)
        if "all_down" in on:
            on = {"all_down"}  # every broker down: every send fails, whatever else is on
        elif len(error_samples) < 20:
            error_samples.append(
                {"t_s": round(t, 2), "by": kind, "faults": sorted(on), "error": text}
            )
        for k in on or {"none"}:
            errors_by_fault[k] += 1
        if "kill" in on:
            kill_errors_by_producer[kind] += 1
    phases: dict[str, list[float]] = defaultdict(list)
    for t, lat, _kind in ledger.sends:
        on = faults_at(bands, t, end)
        phases["+".join(sorted(on)) if on else "calm"].append(lat)
        for k in on:
            phases[f"any {k}"].append(lat)
    recovery: dict[str, list[float]] = defaultdict(list)
    for b in bands:
        if b.recovery_s is not None and b.kind != "pause":
            recovery[b.kind].append(b.recovery_s)
    # back in use: the first acknowledgement by a broker after its fault ended
    back: dict[str, list[float]] = defaultdict(list)
    acks_by_broker: dict[str, list[float]] = defaultdict(list)
    for _d, broker, t in acked.values():
        acks_by_broker[broker].append(t)
    for ts in acks_by_broker.values():
        ts.sort()
    for b in bands:
        if b.target.startswith("broker") and b.t1 >= 0:
            after = [t for t in acks_by_broker.get(b.target, []) if t >= b.t1]
            if after:
                back[b.kind].append(round(after[0] - b.t1, 2))
    first_receipt: dict[str, float] = {}
    redelivered = Counter()
    for r in receipts:
        if r.msg_id in first_receipt:
            redelivered[r.msg_id] += 1
        else:
            first_receipt[r.msg_id] = r.t
    n_acked = len(acked)
    kills = kinds.get("kill", 0)
    kill_errors = errors_by_fault.get("kill", 0)
    return {
        "acknowledged": n_acked,
        "failed_messages": ledger.failed_messages,
        "delivered_distinct": len(by_id),
        "lost": len(lost),
        "lost_ids_sample": lost[:10],
        "early": early,
        "wrong_content": wrong,
        "duplicates": dups,
        "duplicates_pct": round(100 * dups / n_acked, 3) if n_acked else 0.0,
        "duplicates_by_kind": dup_kinds,
        "duplicates_due_after_fault": sum(preventable.values()),
        "preventable_by_kind": preventable,
        "preventable_kept_copy_down": keep_down,
        "duplicate_samples": samples,
        "resent_ids": len(ledger.resent),
        "errors_to_callers": len(ledger.errors),
        "errors_by_fault": dict(errors_by_fault),
        "errors_by_type": dict(Counter(e for _, _, e in ledger.errors)),
        "errors_per_kill": round(kill_errors / kills, 2) if kills else 0.0,
        "errors_per_kill_by_producer": {
            k: round(kill_errors_by_producer[k] / kills, 2) if kills else 0.0
            for k in PRODUCER_KINDS
        },
        "error_samples": error_samples,
        "faults": dict(kinds),
        "send_latency_by_phase": {k: summary(v) for k, v in sorted(phases.items())},
        "recovery_s": {k: summary([x * 1000 for x in v]) for k, v in recovery.items()},
        "back_in_use_s": {k: max(v) for k, v in back.items()},
        "member_receipts": len(receipts),
        "member_redeliveries": sum(redelivered.values()),
        "member_delivered_distinct": len(first_receipt),
        "_first_receipts": first_receipt,
    }


def timeline(ledger: Ledger, first_receipt: dict[str, float], bands: list[Band]) -> dict[str, Any]:
    """Send latency and delivery rate over time, with the faults as bands."""
    sends = ledger.sends
    step = max(1, len(sends) // 5000)
    sample = sends[::step]
    per_s = Counter(int(t) for t in first_receipt.values())
    span = range(0, max(per_s, default=0) + 1)
    return {
        "t_s": [round(t, 3) for t, _, _ in sample],
        "latency_ms": [round(lat, 2) for _, lat, _ in sample],
        "rate_t_s": list(span),
        "delivered_per_s": [per_s.get(s, 0) for s in span],
        "bands": [[round(b.t0, 2), round(b.t1, 2), b.kind, b.target] for b in bands],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with LocalCluster(brokers=3, heartbeat_interval=0.5, broker_expire=3.0) as cluster:
        clock = Clock()  # the run begins once the cluster serves
        ledger = Ledger(clock)
        members = Members(cluster.namesrv, clock, session_s=3.0)
        nemesis = Nemesis(
            cluster,
            members,
            clock,
            seed=args.seed,
            until=args.duration - 4,
            gap_s=(args.gap_min, args.gap_max),
            all_down_at=args.duration * 0.6,
            all_down_s=args.all_down,
        )
        traffic = Traffic(cluster.namesrv, ledger, args)
        try:
            for _ in range(2):
                members.join()
            traffic.start()
            time.sleep(1.0)  # calm first: a baseline phase
            nemesis.start()
            while clock() < args.duration:
                time.sleep(0.2)
            traffic.stop.set()
            nemesis.halt()
            nemesis.join(120)
            traffic.wait_sent(SEND_TIMEOUT * 5)
            end = clock()
            with ledger.lock:
                last_due = max((d for d, _, _ in ledger.acked.values()), default=0)
            wait_s = max(0.0, last_due / 1000 - time.time()) + args.grace
            # the producers stay open until every message is due, as a service's would:
            # they cancel the copies they noted (some shortly before those are due)
            copies = audit(cluster.namesrv, ledger, time.monotonic() + wait_s)
            traffic.join()
        finally:
            traffic.stop.set()
            traffic.release.set()
            nemesis.halt()
            nemesis.heal()
            members.close()
    brokers = [b.name for b in cluster.brokers]
    out = analyse(ledger, copies, members.receipts, nemesis.bands, end, brokers)
    first = out.pop("_first_receipts")
    out["timeline_data"] = timeline(ledger, first, nemesis.bands)
    out["events"] = [[round(t, 2), e] for t, e in nemesis.events]
    out["ambiguous_copies"] = dict(traffic.ambiguous)
    out["nemesis_failures"] = nemesis.failures
    out["member_errors"] = members.errors
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument(
        "--smoke", action="store_true", help="the ~60 s run of make test (40 s of faults)"
    )
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--rate", type=float, default=15.0, help="sends/s of one sync thread")
    ap.add_argument("--short-max", type=float, default=10.0, help="most delays: 0.5..this s")
    ap.add_argument("--long-max", type=float, default=300.0, help="the rest: 0.5..this s")
    ap.add_argument("--long-fraction", type=float, default=0.1)
    ap.add_argument("--gap-min", type=float, default=2.0, help="s between nemesis actions")
    ap.add_argument("--gap-max", type=float, default=5.0)
    ap.add_argument("--all-down", type=float, default=3.0, help="s every broker is down once")
    ap.add_argument("--grace", type=float, default=20.0, help="s to wait for the last ones")
    ap.add_argument("--plot", type=Path, help="also draw the timeline PNG here")
    args = ap.parse_args()
    if args.smoke:
        args.duration, args.short_max, args.long_max, args.grace = 40.0, 5.0, 12.0, 10.0
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # SIGTERM (the runner's time limit) unwinds the cluster and the members
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t = time.monotonic()
    out = run(args)
    out["run_s"] = round(time.monotonic() - t, 1)
    out["seed"] = args.seed
    out["duration_s"] = args.duration
    tl = out.pop("timeline_data")
    out["chaos_timeline"] = {"chaos_bench": {**tl, "events": out.pop("events")}}
    out["targets"] = [
        target("lost", out["lost"], "== 0", out["lost"] == 0),
        target("early", out["early"], "== 0", out["early"] == 0),
        target("wrong content", out["wrong_content"], "== 0", out["wrong_content"] == 0),
        target(
            "errors per broker kill", out["errors_per_kill"], "<= 2", out["errors_per_kill"] <= 2
        ),
        target(
            "duplicates % of acknowledged",
            out["duplicates_pct"],
            "<= 0.1",
            out["duplicates_pct"] <= 0.1,
        ),
        target(
            "duplicates due after the fault",
            out["duplicates_due_after_fault"],
            "== 0",
            out["duplicates_due_after_fault"] == 0,
        ),
    ]
    if args.plot:
        from benchmarks._suite.plots import plot_chaos_timeline

        plot_chaos_timeline(out["chaos_timeline"], args.plot)
    hard = out["lost"] or out["early"] or out["wrong_content"] or out["nemesis_failures"]
    text = json.dumps(out)
    if args.json:
        print(text)
    else:
        brief = {k: v for k, v in out.items() if k not in ("chaos_timeline",)}
        print(json.dumps(brief, indent=1))
        print(headline(out))
    if hard:
        print(
            f"chaos_bench: FAILED: lost={out['lost']} early={out['early']} "
            f"wrong_content={out['wrong_content']} nemesis={out['nemesis_failures']}",
            file=sys.stderr,
        )
        sys.exit(1)


def headline(out: dict[str, Any]) -> str:
    """The run in three lines: duplicates by kind, preventable ones, errors per kill."""
    kinds = out["duplicates_by_kind"]
    home, away = kinds.get("resent_first_home", 0), kinds.get("resent_first_away", 0)
    other = out["duplicates"] - home - away - kinds.get("ambiguous", 0)
    per = ", ".join(f"{k} {v}" for k, v in out["errors_per_kill_by_producer"].items())
    return (
        f"duplicates: {out['duplicates']} ({out['duplicates_pct']} % of "
        f"{out['acknowledged']} acknowledged): re-sent caller id {home + away} (first copy "
        f"on its broker {home}, elsewhere {away}), ambiguous {kinds.get('ambiguous', 0)}, "
        f"other {other}\n"
        f"preventable (due >= 2 s after the extra copy's broker was back and the copy stored, "
        f"the kept copy's broker up): {out['duplicates_due_after_fault']} "
        f"{out['preventable_by_kind']}; with the kept copy's broker down then: "
        f"{out['preventable_kept_copy_down']}\n"
        f"errors per broker kill: {out['errors_per_kill']} ({per or 'none'}); "
        f"seed {out['seed']}"
    )


if __name__ == "__main__":
    main()
