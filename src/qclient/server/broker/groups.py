"""Consumer groups on the broker: member leases and per-queue ownership leases.

RocketMQ's clustering mode, kept small: every member of a group heartbeats each broker of
the topic (``POST /v1/groups/heartbeat``) with the queues of that broker it wants; the
broker answers with the group's live members and grants a queue only when nobody else
holds an unexpired lease on it. A group pull (``PullRequest.client_id``) is served and
committed only for queues the member holds, so a queue changes hands only after its old
owner released it (after committing) or its lease ran out. Leases live in memory: after
a broker restart members simply claim their queues again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from ...protocol import wire
from ...protocol.wire import ErrorCode
from .._http import ApiError, read_body, reply

__all__ = ["GroupTable", "group_heartbeat", "group_pull"]

_SWEEP_EVERY = 1024  # heartbeats between sweeps of groups nobody heartbeats any more


class GroupTable:
    """Members and queue owners per (group, topic); every lease in monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # (group, topic) -> client id -> (expires at, lease seconds)
        self._members: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
        # (group, topic) -> queue id -> (owner, expires at)
        self._owners: dict[tuple[str, str], dict[int, tuple[str, float]]] = {}
        self._beats = 0

    def heartbeat(
        self,
        group: str,
        topic: str,
        client_id: str,
        lease_s: float,
        want: Iterable[int],
        *,
        leave: bool = False,
    ) -> tuple[list[str], list[int]]:
        """Renew ``client_id``, release what it holds outside ``want``, grant free queues of
        ``want``; returns (live members sorted, queues it holds sorted)."""
        now = self._clock()
        key = (group, topic)
        self._beats += 1
        if self._beats % _SWEEP_EVERY == 0:
            self._sweep(now)
        members = self._members.setdefault(key, {})
        for cid, (exp, _) in list(members.items()):
            if exp <= now:
                del members[cid]
        owners = self._owners.setdefault(key, {})
        wanted = set() if leave else set(want)
        for q, (owner, exp) in list(owners.items()):
            if owner == client_id and q not in wanted:
                del owners[q]  # released
            elif exp <= now:
                del owners[q]  # its owner stopped renewing
        if leave:
            members.pop(client_id, None)
            return sorted(members), []
        if client_id not in members and len(members) >= wire.MAX_GROUP_MEMBERS:
            raise ApiError(
                400,
                ErrorCode.INVALID_REQUEST,
                f"group {group!r} already has {wire.MAX_GROUP_MEMBERS} members on {topic!r}",
            )
        members[client_id] = (now + lease_s, lease_s)
        held = []
        for q in sorted(wanted):
            cur = owners.get(q)
            if cur is None or cur[0] == client_id:
                owners[q] = (client_id, now + lease_s)
                held.append(q)
        return sorted(members), held

    def hold(self, group: str, topic: str, client_id: str, queues: Iterable[int]) -> set[int]:
        """The queues of ``queues`` that ``client_id`` holds now; renews those leases and
        its membership (a pull is a sign of life)."""
        now = self._clock()
        key = (group, topic)
        member = self._members.get(key, {}).get(client_id)
        if member is None or member[0] <= now:
            return set()
        lease_s = member[1]
        self._members[key][client_id] = (now + lease_s, lease_s)
        owners = self._owners.get(key, {})
        held = set()
        for q in queues:
            cur = owners.get(q)
            if cur is not None and cur[0] == client_id and cur[1] > now:
                owners[q] = (client_id, now + lease_s)
                held.add(q)
        return held

    def _sweep(self, now: float) -> None:
        for key, members in list(self._members.items()):
            live = {c: v for c, v in members.items() if v[0] > now}
            if live:
                self._members[key] = live
            else:
                del self._members[key]
                self._owners.pop(key, None)


def _check_names(topic: str, group: str) -> None:
    if not wire.valid_topic(topic):
        raise ApiError(400, ErrorCode.INVALID_TOPIC, f"invalid topic name {topic!r}")
    if not wire.GROUP_RE.match(group):
        raise ApiError(
            400,
            ErrorCode.INVALID_REQUEST,
            f"invalid group name {group!r}: must match {wire.TOPIC_PATTERN}",
        )


def _check_client_id(client_id: str) -> None:
    if not wire.PRINTABLE_128_RE.match(client_id):
        raise ApiError(
            400, ErrorCode.INVALID_REQUEST, "client_id must be 1-128 printable ASCII characters"
        )


def _check_queue(queue_id: int, queues: int, what: str) -> None:
    if not 0 <= queue_id < queues:
        raise ApiError(400, ErrorCode.INVALID_REQUEST, f"{what} {queue_id}: no such queue")


def _check_commits(broker: Any, topic: str, commits: dict[int, int], queues: int) -> None:
    for queue_id, offset in commits.items():
        _check_queue(queue_id, queues, "commit for queue")
        top = broker.store.max_offset(topic, queue_id)
        if not 0 <= offset <= top:
            raise ApiError(
                400,
                ErrorCode.INVALID_REQUEST,
                f"commit offset {offset} for queue {queue_id} is outside 0..{top}",
            )


async def group_heartbeat(request: Any) -> Any:
    """``POST /v1/groups/heartbeat``: ``GroupHeartbeat`` -> ``GroupState``."""
    broker = request.app["broker"]
    body = await read_body(request, wire.GroupHeartbeat)
    _check_names(body.topic, body.group)
    _check_client_id(body.client_id)
    if not wire.MIN_GROUP_LEASE_MS <= body.lease_ms <= wire.MAX_GROUP_LEASE_MS:
        raise ApiError(
            400,
            ErrorCode.INVALID_REQUEST,
            f"lease_ms must be {wire.MIN_GROUP_LEASE_MS}..{wire.MAX_GROUP_LEASE_MS}",
        )
    cfg = broker.existing_topic(request, body.topic)
    for q in body.want:
        _check_queue(q, cfg.read_queue_nums, "want queue")
    _check_commits(broker, body.topic, body.commits, cfg.read_queue_nums)
    table: GroupTable = broker.groups
    held = table.hold(body.group, body.topic, body.client_id, body.commits)
    for q in held:  # commit before a release can hand the queue to another member
        broker.store.commit_offset(body.group, body.topic, q, body.commits[q])
    members, owned = table.heartbeat(
        body.group,
        body.topic,
        body.client_id,
        body.lease_ms / 1000,
        body.want,
        leave=body.leave,
    )
    if body.leave:  # its parked long polls: answer them now (they lost their queues)
        broker.fired.wake(body.topic)
    broker.counters["group_heartbeats"] += 1
    state = wire.GroupState(
        broker.config.name, members, cfg.read_queue_nums, owned, clock_ns=time.time_ns()
    )
    return reply(request, state)


async def group_pull(
    broker: Any, request: Any, body: wire.PullRequest, cfg: wire.TopicConfig
) -> Any:
    """A pull by a group member (topic and group names checked by the caller): only the
    queues it holds are committed and served. A long poll waits until one of those
    queues has messages (a fire in the topic's other queues does not end it), the
    member lost them all, or ``wait_ms`` passed (``Broker.long_poll``)."""
    assert body.client_id is not None
    _check_client_id(body.client_id)
    for q in body.queues:
        _check_queue(q, cfg.read_queue_nums, "queue")
    _check_commits(broker, body.topic, body.commits, cfg.read_queue_nums)
    table: GroupTable = broker.groups
    group, topic, cid = body.group, body.topic, body.client_id
    held = table.hold(group, topic, cid, set(body.queues) | set(body.commits))
    for q, off in body.commits.items():
        if q in held:
            broker.store.commit_offset(group, topic, q, off)
    served = sorted(q for q in body.queues if q in held)
    accepted = None if body.tags is None else frozenset(body.tags)
    ends: dict[int, int] = {}  # (tags) per queue, the offset after skipped messages

    def starts() -> dict[int, int]:
        out = {}
        for q in served:
            off = body.queues[q]
            # -1, or a position past the queue's end (a tail lost in a crash): committed
            if off < 0 or off > broker.store.max_offset(topic, q):
                off = broker.store.committed_offset(group, topic, q)
            out[q] = off
        return out

    def read() -> tuple[list[wire.PulledMessage], int | None]:
        return broker.read_from(topic, starts(), body.max_messages, body.hold, accepted, ends)

    def still_held() -> bool:  # after each wait: it may have lost queues meanwhile
        nonlocal served
        served = sorted(table.hold(group, topic, cid, served))
        return bool(served)

    messages = await broker.long_poll(
        topic,
        read,
        body.wait_ms if served else 0,
        body.hold,
        body.max_messages,
        still_held,
    )
    lost = sorted(q for q in body.queues if q not in served)
    ends = {q: off for q, off in ends.items() if q in served}
    return reply(request, broker.pull_answer(messages, lost, ends))
