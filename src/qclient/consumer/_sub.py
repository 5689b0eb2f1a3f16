"""One topic a group member reads -- the group's topic, or the group's retry topic -- and
the member's state for it: route, share, leases, offsets, held messages.

Each topic's queues are shared among the group's members on their own (RocketMQ
allocates every subscribed topic separately), so a member keeps this state per topic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

from .._models import ReceivedMessage
from ..protocol import wire
from ._hold import ClockOffset, HeldMessages

__all__ = ["Key", "Subscription"]

Key = tuple[str, int]  # (broker name, queue id)


class Subscription:
    """A member's state for one topic (guarded by the member's lock)."""

    def __init__(
        self,
        topic: str,
        *,
        retry: bool,
        convert: Callable[[wire.PulledMessage, str], ReceivedMessage],
        clocks: dict[str, ClockOffset],
    ) -> None:
        self.topic = topic
        #: the group's retry topic: it may not exist (yet); its absence is no error
        self.retry = retry
        #: (the retry topic) the member's account may not read it: not read at all
        self.refused = False
        self.brokers: dict[str, str] = {}  # name -> addr
        self.route_at = 0.0
        self.counts: dict[str, int] = {}  # broker -> read queues
        #: brokers of the route that answered the last heartbeat "no such topic"
        self.missing_on: set[str] = set()
        self.members: list[str] = []
        self.target: dict[str, set[int]] = {}  # this member's share
        self.owned: dict[str, set[int]] = {}  # what the brokers granted
        self.pos: dict[Key, int] = {}  # next offset to fetch
        self.delivered: dict[Key, int] = {}  # next offset after what poll() returned
        self.ack: dict[Key, int] = {}  # may be committed
        self.committed: dict[Key, int] = {}
        self.inflight: dict[str, Future[tuple[wire.PullResponse, int]]] = {}
        self.sent: dict[str, tuple[dict[int, int], dict[int, int]]] = {}  # queues, commits
        # fetched, not returned: each message until its deliver time (brokers fire a few
        # ms ahead, see _hold.py), and what may be committed
        self.held = HeldMessages(convert, clocks)

    def __repr__(self) -> str:
        return f"Subscription({self.topic!r})"

    def pending_commits(self, broker: str) -> dict[int, int]:
        """Offsets of ``broker``'s held queues that may be committed and are not yet."""
        owned = self.owned.get(broker, set())
        out = {}
        for q in owned:
            off = self.ack.get((broker, q))
            if off is not None and off > self.committed.get((broker, q), -1):
                out[q] = off
        return out

    def committed_ok(self, broker: str, commits: dict[int, int], lost: Sequence[int]) -> None:
        """The broker acknowledged ``commits`` (except for the ``lost`` queues)."""
        for q, off in commits.items():
            if q not in lost:
                key = (broker, q)
                self.committed[key] = max(self.committed.get(key, 0), off)

    def release(self, limit: int) -> list[ReceivedMessage]:
        """Held messages that are due, up to ``limit``; what may be committed moves."""
        out, commit = self.held.release(limit)
        self.delivered.update(commit)
        return out

    def set_owned(self, broker: str, owned: set[int]) -> None:
        for q in self.owned.get(broker, set()) - owned:
            self.drop(broker, q)
        if owned:
            self.owned[broker] = owned
        else:
            self.owned.pop(broker, None)

    def drop(self, broker: str, q: int) -> None:
        """Forget a queue no longer held: its held (not returned) messages go back, and
        so do offsets not committed yet -- committing them later could move the group's
        offset backwards, or past copies a crashed broker fires again."""
        key = (broker, q)
        for d in (self.pos, self.delivered, self.ack, self.committed):
            d.pop(key, None)
        self.owned.get(broker, set()).discard(q)
        self.held.drop(broker, q)

    def accept(
        self, broker: str, resp: wire.PullResponse, queues: dict[int, int], keep: frozenset[str]
    ) -> None:
        """Hold what a pull of ``queues`` (queue -> offset asked from) answered, for the
        queues this member still holds at the position asked; ``keep``: the tags the
        group receives (empty: all), checked again here after the broker's filter."""
        owned = self.owned.get(broker, set())
        pos = self.pos
        fetched: list[wire.PulledMessage] = []
        append = fetched.append
        accepted: dict[int, bool] = {}  # per queue, decided at its first message
        last: dict[int, int] = {}  # per queue, the offset of its last message here
        for m in resp.messages:
            q = m.queue_id
            ok = accepted.get(q)
            if ok is None:
                # not owned: released while the pull was in flight (the next owner reads
                # it); position moved: the queue was dropped and taken again meanwhile
                expected = pos.get((broker, q), -1)
                ok = accepted[q] = q in owned and q in queues and expected in (queues[q], m.offset)
            if not ok:
                continue
            last[q] = m.offset
            if keep and m.tags not in keep:
                continue  # skipped: its offset is committed with what follows it
            append(m)
        ends: dict[int, int] = {}
        for q, end in resp.next_offsets.items():
            ok = accepted.get(q)
            if ok is None:  # only skipped messages: accept as above, by the position
                ok = q in owned and q in queues and pos.get((broker, q), -1) == queues[q]
            if ok and end > last.get(q, -1):
                ends[q] = end
        for q, off in last.items():
            pos[(broker, q)] = max(off + 1, ends.get(q, 0))
        for q, end in ends.items():
            if q not in last:
                pos[(broker, q)] = end
        self.delivered.update(self.held.add(broker, fetched, ends))
