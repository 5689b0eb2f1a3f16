"""Rebalance benchmark: how soon a consumer group consumes a member's queues again after
the member is killed, closes or joins, and what comes twice.

    python -m benchmarks.rebalance_bench [--rate 1000] [--sessions 6,2] [--repeat 3]
        [--json] [--smoke]

A real ``LocalCluster`` (2 brokers, a topic of 8 queues on each), one group of 3 members,
each a child process (``benchmarks/_rebalance_member.py``) printing every message it
receives with the time, the queues it holds and its commits, and spending ``--work-ms``
on each message before it polls again (an application's processing: what a killed member
was processing is what it held uncommitted). Once the members share the
16 queues, ``--rate`` msgs/s are scheduled ahead to come due evenly for the whole phase,
so messages keep coming due on every queue. Phases, each on its own topic:

1. kill (once per ``--sessions`` value, the members' ``session_timeout``): a member (the
   middle one by client id, so both others take some of its queues) is SIGKILLed
   mid-stream, at a random point (``--seed``) of the members' heartbeat cycle. Takeover =
   from the SIGKILL to the first message a surviving member receives from each queue the
   dead one held (per queue p50 / max; the max is "all its queues consumed again");
   beside it, when the survivors' assignments first covered those queues. Redelivered =
   messages the dead member received that a survivor received again, against what it
   held uncommitted at its death (received at or past the last offset its consumer
   recorded as committed: an upper bound).
2. close: a member (chosen the same way) calls ``close()`` mid-stream, between two polls.
   Takeover from the call and from its return; redelivered (a clean close commits: none).
3. join: a 4th member starts mid-stream: from its consumer's creation to its first
   message and to every queue of its share consumed; the duplicates it caused.

Every phase (``--repeat`` rounds of them all): lost (scheduled, never received), early
(received before ``deliver_at``), duplicates (receipts past the first of each message).

What to expect: a killed member's leases run out ``session_timeout`` after its last pull,
and the others see it gone at their next heartbeat (every third of it), so a kill's
takeover is the lease plus up to a heartbeat interval; a closed member is gone at once,
and the others see that at their next heartbeat: up to a heartbeat interval.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks._suite.report import target
from benchmarks.peers.workload import percentile
from qclient import LocalCluster, MessageBatch, Producer
from qclient.consumer._group import GroupMember
from qclient.protocol import wire

REPO = Path(__file__).resolve().parents[1]
QUEUES = 8  # per broker: 16 over the cluster, 5 or 6 per member of 3
MEMBERS = 3
GROUP = "rebal"
SEND_CHUNK = 2048
#: the consumer's own default lease, read from the signature of the group member it is on
#: our engine (one home for it; ``Consumer`` picks its engine in ``__new__``)
DEFAULT_SESSION_S: float = inspect.signature(GroupMember).parameters["session_timeout"].default

Key = tuple[str, int]  # (broker name, queue id)


class BenchError(RuntimeError):
    """A phase could not run (a member or the cluster did not get ready in time)."""


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


@dataclass(frozen=True, slots=True)
class Receipt:
    t: float  # monotonic s when the member's poll returned it
    wall_ms: int
    msg_id: str
    queue: Key
    offset: int
    deliver_ms: int


@dataclass
class Member:
    """One child-process member and what it printed (see ``_rebalance_member``)."""

    proc: subprocess.Popen[str]
    spawned: float
    client_id: str = ""
    ready: float | None = None
    assignments: list[tuple[float, frozenset[Key]]] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    commits: list[tuple[float, Key, int]] = field(default_factory=list)
    closing: float | None = None
    closed: float | None = None
    killed: float | None = None
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, namesrv: str, topic: str, session_s: float, work_ms: float) -> Member:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        spawned = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._rebalance_member", namesrv, topic, GROUP,
             str(session_s), str(work_ms)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        m = cls(proc, spawned)
        m.reader = threading.Thread(target=m._read, daemon=True)
        m.reader.start()
        return m

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            p = line.split()
            if not p:
                continue
            kind = p[0]
            if kind == "R" and len(p) == 8:
                self.receipts.append(
                    Receipt(float(p[1]), int(p[2]), p[3], (p[4], int(p[5])), int(p[6]), int(p[7]))
                )
            elif kind == "A" and len(p) == 3:
                held = [] if p[2] == "-" else [x.rsplit(":", 1) for x in p[2].split(",")]
                self.assignments.append((float(p[1]), frozenset((b, int(q)) for b, q in held)))
            elif kind == "C" and len(p) == 5:
                self.commits.append((float(p[1]), (p[2], int(p[3])), int(p[4])))
            elif kind == "ready" and len(p) == 3:
                self.client_id, self.ready = p[1], float(p[2])
            elif kind == "closing":
                self.closing = float(p[1])
            elif kind == "closed":
                self.closed = float(p[1])

    def held(self) -> frozenset[Key]:
        """The queues it last said it holds."""
        return self.assignments[-1][1] if self.assignments else frozenset()

    def kill(self) -> float:
        """SIGKILL; returns the monotonic time the signal was sent."""
        t = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.killed = t
        self.proc.wait(10)
        return t

    def close(self, timeout: float) -> None:
        """Ask it to ``close()`` between two polls and wait until it did."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        _wait(lambda: self.closed is not None, timeout, "a member to close")
        self.proc.wait(10)

    def stop(self) -> None:
        """End the process (SIGTERM: its consumer closes; then SIGKILL) and its reader."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        if self.reader is not None:
            self.reader.join(5)


def create_topic(cluster: LocalCluster, topic: str) -> list[Key]:
    """``topic`` with ``QUEUES`` queues on every broker, once the route shows them all."""
    for b in cluster.brokers:
        resp = httpx.post(
            f"http://{b.addr}{wire.BROKER_TOPICS}",
            json={"topic": topic, "queues": QUEUES},
            timeout=10,
        )
        resp.raise_for_status()

    def in_route() -> bool:
        route = httpx.get(f"http://{cluster.namesrv}/v1/routes/{topic}", timeout=5).json()
        datas = route.get("queue_datas", [])
        return len(datas) == len(cluster.brokers) and all(
            q["read_queue_nums"] == QUEUES for q in datas
        )

    _wait(in_route, 20, f"the route of {topic} on every broker")
    return sorted((b.name, q) for b in cluster.brokers for q in range(QUEUES))


def converged(members: list[Member], queues: list[Key]) -> bool:
    """Every member holds a share, the shares are disjoint and cover every queue."""
    held = [m.held() for m in members]
    return all(held) and sum(map(len, held)) == len(queues) and set().union(*held) == set(queues)


def schedule(namesrv: str, topic: str, rate: float, seconds: float) -> tuple[dict[str, int], int]:
    """``rate x seconds`` messages due evenly from about a second on; returns (deliver_at
    ms by id, first due ms)."""
    total = max(1, int(rate * seconds))
    lead_ms = 1000 + total // 20  # sending ~20k msgs/s: all are stored before the first is due
    first = time.time_ns() // 1_000_000 + lead_ms
    step = seconds * 1000 / total
    due = [first + int(i * step) for i in range(total)]
    out: dict[str, int] = {}
    with Producer(namesrv, send_timeout=30.0) as p:
        for lo in range(0, total, SEND_CHUNK):
            chunk = due[lo : lo + SEND_CHUNK]
            batch = MessageBatch(topic, [b"r" * 64] * len(chunk), deliver_at_ms=chunk)
            for r in p.send_batch(batch):
                out[r.msg_id] = r.deliver_at_ms
    if time.time_ns() // 1_000_000 > first:
        print(f"warning: {topic}: sending ended past the first due time", file=sys.stderr)
    return out, first


def _mono_at(wall_ms: float) -> float:
    """The monotonic time at which the wall clock reads ``wall_ms``."""
    return time.monotonic() + (wall_ms - time.time_ns() / 1e6) / 1000


def _first_by_queue(receipts: Iterable[Receipt], queues: frozenset[Key], t0: float) -> dict:
    first: dict[Key, float] = {}
    for r in receipts:
        if r.queue in queues and r.t >= t0 and r.t < first.get(r.queue, float("inf")):
            first[r.queue] = r.t
    return first


def _takeover(first: dict[Key, float], queues: frozenset[Key], t0: float) -> dict[str, Any]:
    """Per queue: time from ``t0`` to its first receipt; p50 / max and queues never read."""
    s = sorted(first[q] - t0 for q in queues if q in first)
    return {
        "queues": len(queues),
        "per_queue_s": [round(x, 3) for x in s],
        "p50_s": round(percentile(s, 50), 3) if s else None,
        "all_s": round(s[-1], 3) if s and len(s) == len(queues) else None,
        "not_consumed_again": len(queues) - len(s),
    }


def _assigned_at(survivors: list[Member], queues: frozenset[Key], t0: float) -> float | None:
    """The first time from ``t0`` on that the survivors' assignments cover ``queues``."""
    events = sorted((t, i, held) for i, m in enumerate(survivors) for t, held in m.assignments)
    latest: dict[int, frozenset[Key]] = {}
    for t, i, held in events:
        latest[i] = held
        if t >= t0 and queues <= set().union(*latest.values()):
            return round(t - t0, 3)
    return None


def _totals(members: list[Member], scheduled: dict[str, int]) -> dict[str, Any]:
    counts: Counter[str] = Counter(r.msg_id for m in members for r in m.receipts)
    return {
        "scheduled": len(scheduled),
        "received_distinct": len(counts),
        "lost": len(set(scheduled) - set(counts)),
        "early": sum(1 for m in members for r in m.receipts if r.wall_ms < r.deliver_ms),
        "duplicates": sum(n - 1 for n in counts.values()),
        "strays": len(set(counts) - set(scheduled)),
    }


def _uncommitted(member: Member) -> set[str]:
    """What ``member`` received at or past the last offset it recorded as committed on
    that queue (all of a queue it recorded no commit for)."""
    last: dict[Key, int] = {}
    for _, key, off in member.commits:
        last[key] = off
    return {r.msg_id for r in member.receipts if r.offset >= last.get(r.queue, -1)}


def run_phase(
    cluster: LocalCluster,
    kind: str,
    session_s: float,
    rate: float,
    pre_s: float,
    post_s: float,
    round_no: int = 1,
    rng: random.Random | None = None,
    work_ms: float = 0.0,
) -> dict[str, Any]:
    """One phase (``kill``, ``close`` or ``join``) on a topic of its own."""
    topic = f"rebal-{kind}-{int(session_s * 1000)}-{round_no}"
    queues = create_topic(cluster, topic)
    members: list[Member] = []
    try:
        members = [Member.start(cluster.namesrv, topic, session_s, work_ms) for _ in range(MEMBERS)]
        _wait(lambda: converged(members, queues), 30, f"{MEMBERS} members to share the queues")
        # kill: the stream goes on past the lease, then long enough to see it consumed
        seconds = pre_s + session_s / 3 + (session_s if kind == "kill" else 0) + post_s
        scheduled, first_ms = schedule(cluster.namesrv, topic, rate, seconds)
        last_ms = max(scheduled.values())
        # the middle one of the sorted members: its queues are split over both others
        subject = sorted(members, key=lambda m: m.client_id)[MEMBERS // 2]
        # at a random point of the members' heartbeat cycle (every third of the lease):
        # the takeover waits for the others' next heartbeat, and a fixed event time would
        # land on the same point of that cycle in every run
        jitter = (rng or random.Random()).uniform(0, session_s / 3)
        event_at = _mono_at(first_ms + (pre_s + jitter) * 1000)
        _wait(lambda: time.monotonic() >= event_at, seconds + 10, "the event's time")
        _wait(lambda: len(subject.receipts) > 0, 10, "the member to receive")
        name = f"{kind} @{session_s:g}s" + (f" #{round_no}" if round_no > 1 else "")
        res: dict[str, Any] = {"name": name, "kind": kind, "session_timeout_s": session_s}
        survivors = [m for m in members if m is not subject]
        if kind == "kill":
            held = subject.held()
            t0 = subject.kill()
        elif kind == "close":
            held = subject.held()
            subject.close(10 + session_s)
            assert subject.closing is not None and subject.closed is not None
            t0 = subject.closing
            res["close_call_s"] = round(subject.closed - subject.closing, 3)
        else:
            t0 = time.monotonic()
            joiner = Member.start(cluster.namesrv, topic, session_s, work_ms)
            members.append(joiner)
            survivors = members
        end_by = _mono_at(last_ms) + session_s + 20

        def everything() -> bool:
            got = {r.msg_id for m in members for r in m.receipts}
            return len(got) >= len(scheduled)

        _wait(everything, max(1.0, end_by - time.monotonic()), "every message to arrive")
        if kind == "join":
            _wait(lambda: converged(members, queues), 10, "the 4 members to share the queues")
            # its share now: once the others stop (first, below) it takes over theirs
            share = joiner.held()
        time.sleep(0.5)  # strays and duplicates would show up now
    finally:
        for m in members:
            m.stop()
    res.update(_totals(members, scheduled))
    if kind in ("kill", "close"):
        first = _first_by_queue((r for m in survivors for r in m.receipts), held, t0)
        res["takeover"] = _takeover(first, held, t0)
        res["assigned_s"] = _assigned_at(survivors, held, t0)
        if kind == "close":
            assert subject.closed is not None
            res["takeover_after_return"] = _takeover(first, held, subject.closed)
        mine = {r.msg_id for r in subject.receipts}
        again = mine & {r.msg_id for m in survivors for r in m.receipts}
        res["member_received"] = len(mine)
        res["redelivered"] = len(again)
        if kind == "kill":
            uncommitted = _uncommitted(subject)
            res["uncommitted_at_death"] = len(uncommitted)
            res["redelivered_not_uncommitted"] = len(again - uncommitted)
    else:
        assert joiner.ready is not None
        first = _first_by_queue(joiner.receipts, share, joiner.ready)
        res["start_s"] = round(joiner.ready - t0, 3)  # process start and import
        res["takeover"] = _takeover(first, share, joiner.ready)
        res["first_message_s"] = round(min(first.values()) - joiner.ready, 3) if first else None
        res["assigned_s"] = _assigned_at([joiner], share, joiner.ready)
    return res


def _line(r: dict[str, Any]) -> str:
    tk = r["takeover"]
    more = ""
    if "uncommitted_at_death" in r:
        more = f", uncommitted at death {r['uncommitted_at_death']}"
    return (
        f"{r['name']}: queues consumed again p50 {tk['p50_s']} s, all {tk['all_s']} s "
        f"(assigned {r['assigned_s']} s) of {tk['queues']}; redelivered "
        f"{r.get('redelivered', '-')}{more}; lost {r['lost']}, early {r['early']}, "
        f"duplicates {r['duplicates']}"
    )


def summarize(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kind of phase and session timeout, over its rounds: the takeover range and the
    sums (``all_s_max`` is ``None`` when a round left a queue unconsumed)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in phases:
        groups.setdefault((r["kind"], r["session_timeout_s"]), []).append(r)
    out = []
    for (kind, session_s), rs in groups.items():
        alls = [r["takeover"]["all_s"] for r in rs]
        done = [a for a in alls if a is not None]
        row: dict[str, Any] = {
            "name": f"{kind} @{session_s:g}s",
            "kind": kind,
            "session_timeout_s": session_s,
            "rounds": len(rs),
            "all_s_min": min(done) if done else None,
            "all_s_max": max(done) if len(done) == len(alls) else None,
            "p50_s_median": percentile(sorted(r["takeover"]["p50_s"] or 0.0 for r in rs), 50),
            "lost": sum(r["lost"] for r in rs),
            "early": sum(r["early"] for r in rs),
            "duplicates": sum(r["duplicates"] for r in rs),
        }
        if kind != "join":
            row["redelivered"] = sum(r["redelivered"] for r in rs)
        if kind == "kill":
            row["uncommitted_at_death"] = sum(r["uncommitted_at_death"] for r in rs)
            row["every_redelivered_was_uncommitted"] = all(
                r["redelivered"] <= r["uncommitted_at_death"]
                and r["redelivered_not_uncommitted"] == 0
                for r in rs
            )
        out.append(row)
    return out


def targets(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in summary:
        worst, name = r["all_s_max"], f"{r['name']}"
        rounds = f"worst of {r['rounds']}" if r["rounds"] > 1 else "1 round"
        if r["kind"] == "kill":
            limit = r["session_timeout_s"] + 5
            out += [
                target(f"{name}: takeover, all its queues (s, {rounds})", worst,
                        f"<= {limit:g}", worst is not None and worst <= limit),
                target(f"{name}: redelivered", r["redelivered"],
                        f"<= {r['uncommitted_at_death']} (uncommitted at death)",
                        r["every_redelivered_was_uncommitted"]),
            ]  # fmt: skip
        elif r["kind"] == "close":
            out += [
                target(f"{name}: takeover, all its queues (s, {rounds})", worst, "<= 5",
                        worst is not None and worst <= 5),
                target(f"{name}: redelivered", r["redelivered"], "== 0",
                        r["redelivered"] == 0),
            ]  # fmt: skip
    lost = sum(r["lost"] for r in summary)
    early = sum(r["early"] for r in summary)
    out += [
        target("lost (every phase)", lost, "== 0", lost == 0),
        target("early (every phase)", early, "== 0", early == 0),
    ]
    return out


def run(
    rate: float,
    sessions: list[float],
    other_session: float,
    work_ms: float,
    pre_s: float,
    post_s: float,
    join: bool,
    repeat: int,
    seed: int,
) -> dict[str, Any]:
    rng = random.Random(seed)
    plan = [("kill", s) for s in sessions] + [("close", other_session)]
    if join:
        plan.append(("join", other_session))
    phases = []
    with LocalCluster(brokers=2) as cluster:
        for round_no, (kind, session_s) in (
            (i, step) for i in range(1, repeat + 1) for step in plan
        ):
            r = run_phase(cluster, kind, session_s, rate, pre_s, post_s, round_no, rng, work_ms)
            print(_line(r), file=sys.stderr)
            phases.append(r)
    summary = summarize(phases)
    return {
        "scenario": "rebalance",
        "due_rate_msgs_per_s": rate,
        "work_ms_per_msg": work_ms,
        "queues": 2 * QUEUES,
        "members": MEMBERS,
        "summary": summary,
        "phases": phases,
        "targets": targets(summary),
        "notes": [
            f"2 brokers x {QUEUES} queues, {MEMBERS} members (child processes) of one group, "
            f"{rate:g} msgs/s coming due throughout each phase; each member spends "
            f"{work_ms:g} ms on every message it receives before polling again",
            "takeover = from the SIGKILL / the close() call / the joiner's start to the first "
            "message a member receives from each queue that changed hands (p50 over those "
            "queues; all = the last of them); assigned = when the members' assignments first "
            "covered them",
            "uncommitted at death: what the killed member received at or past the last offset "
            "its consumer recorded as committed (an upper bound of what it really held)",
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1000.0, help="msgs/s coming due")
    p.add_argument(
        "--sessions",
        default=f"{DEFAULT_SESSION_S:g},2",
        help="session_timeout values (s) of the kill phases, comma-separated",
    )
    p.add_argument(
        "--session",
        type=float,
        default=DEFAULT_SESSION_S,
        help="session_timeout (s) of the close and join phases",
    )
    p.add_argument("--work-ms", type=float, default=1.0, help="ms each member spends on a message")
    p.add_argument("--pre", type=float, default=3.0, help="s of stream before the event")
    p.add_argument("--post", type=float, default=5.0, help="s of stream after it (plus the lease)")
    p.add_argument("--no-join", action="store_true", help="skip the join phase")
    p.add_argument("--repeat", type=int, default=3, help="rounds of every phase")
    p.add_argument("--seed", type=int, default=7, help="of the events' points in time")
    p.add_argument("--smoke", action="store_true", help="tiny run: one short kill, a close")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    a = p.parse_args()
    sessions = [float(s) for s in a.sessions.split(",") if s]
    join = not a.no_join
    if a.smoke:
        a.rate, sessions, a.session, a.pre, a.post = 300.0, [1.5], 1.5, 1.0, 1.5
        join, a.repeat = False, 1
    # SIGTERM (the runner's time limit) unwinds the members and the cluster
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t = time.monotonic()
    res = run(a.rate, sessions, a.session, a.work_ms, a.pre, a.post, join, max(1, a.repeat), a.seed)
    res["seed"] = a.seed
    res["run_s"] = round(time.monotonic() - t, 1)
    print(json.dumps(res) if a.json else json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
