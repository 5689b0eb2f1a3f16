"""The broker's pull handler: plain pulls and the reads and long polls that group pulls
(``groups.py``) share, with the group's tag filter applied on the broker.

A pull that carries ``tags`` is served only the messages whose tags is one of them; the
others are skipped where they are read, never sent, and ``PullResponse.next_offsets``
moves past them so the reader commits them with what it was served.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ...protocol import wire
from ...protocol.wire import ErrorCode
from .._http import ApiError, Request, Response, read_body, reply
from ..store import DelayStore, FiredMessage
from .config import BrokerConfig
from .groups import group_pull
from .waiters import FireWaiters

__all__ = ["PullHandlers"]

#: messages one read of a queue looks at per message it may serve, when a tag filter
#: skips some (and at most _MAX_SCAN): a read stays short however few match
_SCAN_PER_ROOM = 4
_MAX_SCAN = 2048


class PullHandlers:
    """The pull handlers of :class:`~qclient.server.broker.app.Broker` (its base class)."""

    config: BrokerConfig
    store: DelayStore
    fired: FireWaiters
    counters: dict[str, int]
    #: an existing topic the request may read; else the request's 403 or 404
    existing_topic: Callable[[Request, str], wire.TopicConfig]

    @property
    def fire_ahead_ms(self) -> int:
        return self.store.config.fire_ahead_ms

    async def pull(self, request: Request) -> Response:
        body = await read_body(request, wire.PullRequest)
        if not wire.valid_topic(body.topic):
            raise ApiError(400, ErrorCode.INVALID_TOPIC, f"invalid topic name {body.topic!r}")
        if not wire.GROUP_RE.match(body.group):
            raise ApiError(
                400,
                ErrorCode.INVALID_REQUEST,
                f"invalid group name {body.group!r}: must match {wire.TOPIC_PATTERN}",
            )
        if not 0 <= body.max_messages <= self.config.max_pull_messages:
            raise ApiError(
                400,
                ErrorCode.INVALID_REQUEST,
                f"max_messages must be 0..{self.config.max_pull_messages}",
            )
        if not 0 <= body.wait_ms <= self.config.max_pull_wait_ms:
            raise ApiError(
                400, ErrorCode.INVALID_REQUEST, f"wait_ms must be 0..{self.config.max_pull_wait_ms}"
            )
        if body.tags is not None and (
            len(body.tags) > wire.MAX_PROPERTIES
            or any(not t or len(t) > wire.MAX_TAGS_CHARS for t in body.tags)
        ):
            raise ApiError(
                400,
                ErrorCode.INVALID_REQUEST,
                f"tags: at most {wire.MAX_PROPERTIES} non-empty tags of at most "
                f"{wire.MAX_TAGS_CHARS} characters",
            )
        cfg = self.existing_topic(request, body.topic)
        if body.client_id is not None:
            return await group_pull(self, request, body, cfg)
        for queue_id, offset in body.commits.items():
            if not 0 <= queue_id < cfg.read_queue_nums:
                raise ApiError(
                    400, ErrorCode.INVALID_REQUEST, f"commit for queue {queue_id}: no such queue"
                )
            top = self.store.max_offset(body.topic, queue_id)
            if not 0 <= offset <= top:
                raise ApiError(
                    400,
                    ErrorCode.INVALID_REQUEST,
                    f"commit offset {offset} for queue {queue_id} is outside 0..{top}",
                )
        for queue_id, offset in body.commits.items():
            self.store.commit_offset(body.group, body.topic, queue_id, offset)
        topic, group, queues = body.topic, body.group, cfg.read_queue_nums
        accepted = None if body.tags is None else frozenset(body.tags)
        ends: dict[int, int] = {}

        def read() -> tuple[list[wire.PulledMessage], int | None]:
            offsets = {q: self.store.committed_offset(group, topic, q) for q in range(queues)}
            return self.read_from(topic, offsets, body.max_messages, body.hold, accepted, ends)

        messages = await self.long_poll(topic, read, body.wait_ms, body.hold, body.max_messages)
        return reply(request, self.pull_answer(messages, None, ends))

    def pull_answer(
        self,
        messages: list[wire.PulledMessage],
        lost: list[int] | None = None,
        ends: dict[int, int] | None = None,
    ) -> wire.PullResponse:
        """The answer to a pull (plain or a group member's) that found ``messages``;
        ``ends``: per queue, the offset after messages a tag filter skipped."""
        next_offsets: dict[int, int] = dict(ends) if ends else {}
        for m in messages:
            next_offsets[m.queue_id] = max(next_offsets.get(m.queue_id, 0), m.offset + 1)
        self.counters["pulled"] += len(messages)
        return wire.PullResponse(
            self.config.name,
            messages,
            next_offsets,
            lost or [],
            clock_ns=time.time_ns(),
            fire_ahead_ms=self.fire_ahead_ms,
        )

    async def long_poll(
        self,
        topic: str,
        read: Callable[[], tuple[list[wire.PulledMessage], int | None]],
        wait_ms: int,
        hold: bool,
        limit: int,
        still: Callable[[], bool] = lambda: True,
    ) -> list[wire.PulledMessage]:
        """``read()``'s messages, waiting up to ``wait_ms`` while there are none -- for a
        holding pull (``hold``), while none is due within ``wire.hold_answer_ms`` and
        fewer than ``limit`` came -- until something fires in ``topic`` (for a holding
        pull with messages: something due before the earliest of them), the earliest
        message held back is due (holding: is due that soon), or ``still()`` (checked
        after each wait) turns False.

        So at a steady rate a holding reader is answered every 10 ms or so with what
        fired meanwhile, each message ~30 ms before its time: a broker (or a reader)
        stalled for less delays nothing.
        """
        seq = self.fired.seq
        soon_ms = wire.hold_answer_ms(self.fire_ahead_ms) if hold else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            messages, wake_ms = read()  # (without messages: when the held-back one is due)
            earliest = None  # (holding) the earliest deliver time among the messages
            if messages:
                if soon_ms is None or len(messages) >= limit:
                    return messages
                earliest = min(m.deliver_at_ms for m in messages)
                wake_ms = earliest - soon_ms
                if wake_ms <= time.time_ns() // 1_000_000:
                    return messages
            left = deadline - loop.time()
            if left <= 0 or limit <= 0:
                return messages
            if wake_ms is not None:
                left = min(left, max(0.0, wake_ms / 1000 - time.time()))
            await self.fired.wait(topic, left, seq, earliest)
            if not still():
                return messages
            seq = self.fired.seq

    def read_from(
        self,
        topic: str,
        offsets: dict[int, int],
        limit: int,
        hold: bool,
        tags: frozenset[str] | None = None,
        ends: dict[int, int] | None = None,
    ) -> tuple[list[wire.PulledMessage], int | None]:
        """Up to ``limit`` fired messages of the queues in ``offsets`` (queue -> start).
        Messages fire up to ``fire_ahead_ms`` before their time: with ``hold`` (the
        reader keeps each until its ``deliver_at_ms``) they are all served; without it a
        queue's messages stop at the first one not due yet, whose deliver time (the
        earliest among the queues) comes second.

        ``tags``: serve only messages whose tags is one of these; ``ends`` is then set,
        per queue whose read skipped messages, to the offset after them."""
        out: list[wire.PulledMessage] = []
        if limit <= 0 or not offsets:
            return out, None
        due_by = None if hold or not self.fire_ahead_ms else time.time_ns() // 1_000_000
        held_due: int | None = None
        offsets = dict(offsets)
        max_bytes = self.config.max_pull_bytes
        # Fair share per queue first, then fill up from whichever has more.
        share = max(1, limit // len(offsets))
        size = 0  # bound the bytes of one answer too, not only its count
        drained: set[int] = set()  # gave less than asked: nothing more to read now
        for rounds in (share, limit):
            for q in sorted(offsets):
                room = min(rounds, limit - len(out))
                if room <= 0 or size >= max_bytes:
                    break
                if q in drained:
                    continue
                scan_end = None  # (tags) the offset after the messages looked at
                if tags is None:
                    got = self.store.pull(topic, q, offsets[q], room)
                    exhausted = len(got) < room
                else:
                    got, scan_end, exhausted = self._matching(topic, q, offsets[q], room, tags)
                if exhausted:
                    drained.add(q)
                cut = len(got)  # messages of got served
                if due_by is not None:
                    for i, f in enumerate(got):
                        if f.deliver_at_ms > due_by:  # the rest of the queue waits for it
                            if held_due is None or f.deliver_at_ms < held_due:
                                held_due = f.deliver_at_ms
                            cut = i
                            drained.add(q)
                            break
                for i in range(cut):
                    f = got[i]
                    if out and size + len(f.body) > max_bytes:
                        cut = i
                        break
                    size += len(f.body)
                    out.append(
                        wire.PulledMessage(
                            msg_id=f.msg_id,
                            topic=f.topic,
                            body=f.body,
                            queue_id=f.queue_id,
                            offset=f.offset,
                            deliver_at_ms=f.deliver_at_ms,
                            fired_at_ms=f.fired_at_ms,
                            key=f.key,
                            tags=f.tags,
                            properties=f.properties,
                            flag=f.flag,
                        )
                    )
                    offsets[q] = f.offset + 1
                if scan_end is not None and ends is not None:
                    stop = got[cut].offset if cut < len(got) else scan_end
                    if stop > offsets[q]:  # skipped messages after the last one served
                        offsets[q] = ends[q] = stop
        return out, held_due

    def _matching(
        self, topic: str, q: int, start: int, room: int, tags: frozenset[str]
    ) -> tuple[list[FiredMessage], int, bool]:
        """Up to ``room`` messages of queue ``q`` from ``start`` whose tags is in ``tags``,
        looking at a bounded number; returns them, the offset after the last message
        looked at, and whether the queue's visible end was reached."""
        out: list[FiredMessage] = []
        pos = start
        budget = min(_MAX_SCAN, max(room, 64) * _SCAN_PER_ROOM)
        while budget > 0:
            want = min(budget, max(room - len(out), 32))
            got = self.store.pull(topic, q, pos, want)
            budget -= len(got)
            for f in got:
                pos = f.offset + 1
                if f.tags is not None and f.tags in tags:
                    out.append(f)
                    if len(out) >= room:
                        return out, pos, False
            if len(got) < want:
                return out, pos, True
        return out, pos, False
