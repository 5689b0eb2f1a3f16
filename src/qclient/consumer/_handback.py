"""``retry_later`` and ``dead_letter``: a member hands a message it could not process back
to its group, through the group's retry topic or into its dead-letter topic.

The copy (``_retry.py``) goes first to the broker that delivered the message -- it is
there, and a copy of the same attempt sent again is stored once there -- then to the
other brokers the member knows. Each attempt carries a deadline, so a broker that
answers too late stores nothing and the next one's copy is the only one. Hand-backs to
one broker from several threads at once share requests (``_lane.py``). The call
returns once a broker acknowledged the copy as durable; the message itself is then
committed by the member's usual commit path (the next ``poll()``, or ``commit()``).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from functools import partial

from .._models import ReceivedMessage
from ..errors import (
    AuthError,
    BrokerUnavailableError,
    ConsumerClosedError,
    InvalidMessageError,
    QClientError,
)
from ..protocol import wire
from ..transport.errors import error_for_code
from ._group import DeliveryKey, GroupMember
from ._lane import Lane
from ._retry import dlq_copy, queue_for, retry_copy
from ._rpc import call

__all__ = ["HandBack"]

log = logging.getLogger(__name__)

#: messages remembered as returned by poll(), so that a hand-back can be checked
_TRACKED = 1 << 16
#: a delay no broker takes (and no wire int holds in ms): refused before sending
_MAX_DELAY_S = 2.0**53 / 1000

_Key = DeliveryKey


def _key(m: ReceivedMessage) -> DeliveryKey:
    return hash((id(m), m.broker_name, m.queue_id, m.offset, m.msg_id, m.attempt))


class HandBack(GroupMember):
    """The hand-back half of :class:`~qclient.consumer.Consumer`."""

    def _note_returned(self, out: list[ReceivedMessage]) -> None:
        returned = self._returned
        for m in out:
            returned[_key(m)] = False
        while len(returned) > _TRACKED:
            returned.popitem(last=False)

    def retry_later(self, message: ReceivedMessage, delay: float | timedelta | None = None) -> None:
        """Hand ``message`` back to this group: it is delivered again (to one member, as
        ``attempt + 1``, looking like the original) no earlier than ``delay`` seconds
        from now, or after the group's backoff for its attempt (``retry_delays``;
        RocketMQ's 10 s ... 2 h schedule by default) when ``delay`` is None. Once the
        message has had ``max_attempts`` deliveries it goes to the group's dead-letter
        topic ``%DLQ%<group>`` instead. Returns once the copy is durable; the message
        itself is then committed as any other that ``poll()`` returned (by the next
        ``poll()``, or ``commit()`` without auto-commit).

        ``InvalidMessageError`` for a message this consumer did not return (or handed
        back already) or a bad delay, ``ConsumerClosedError`` when closed: nothing is
        sent then."""
        key = self._check_back(message)
        if self.policy.dead_letters(message.attempt):
            reason = (
                f"retry_later at attempt {message.attempt}: "
                f"max_attempts is {self.policy.max_attempts}"
            )
            self._send_back(key, dlq_copy(message, self.group, reason), message.broker_name)
            return
        try:
            seconds = self.policy.delay_after(message.attempt, delay)
        except ValueError as exc:
            raise InvalidMessageError(str(exc)) from None
        if seconds > _MAX_DELAY_S:  # (beyond any broker's limit; it answers for smaller)
            raise InvalidMessageError(f"delay {seconds:g} s is too long")
        copy = retry_copy(message, self.group, seconds)
        name = self._send_back(key, copy, message.broker_name, retry=True)
        addr = self._addr_of(name)
        if addr and name not in self._retry_brokers and len(self._subs) > 1:
            # the retry topic exists there now: read it without waiting for the route
            self._retry_brokers[name] = addr
            self._subs[1].route_at = 0.0
            self._next_hb = 0.0

    def dead_letter(self, message: ReceivedMessage, reason: str) -> None:
        """Put ``message`` into the group's dead-letter topic ``%DLQ%<group>`` now,
        with ``reason`` (and the original topic, id and attempts) in its properties.
        Returns once the copy is durable; errors as :meth:`retry_later`'s."""
        if not isinstance(reason, str):
            raise InvalidMessageError(f"reason must be a string, got {type(reason).__name__}")
        key = self._check_back(message)
        self._send_back(key, dlq_copy(message, self.group, reason), message.broker_name)

    # --- internals ------------------------------------------------------------------

    def _check_back(self, message: ReceivedMessage) -> _Key:
        if self._closed:
            raise ConsumerClosedError("consumer is closed")
        if not isinstance(message, ReceivedMessage):
            raise InvalidMessageError(
                f"expected a ReceivedMessage from this consumer, got {type(message).__name__}"
            )
        full = _key(message)
        state = self._returned.get(full)
        if state is None:
            raise InvalidMessageError(
                f"message {message.msg_id} was not delivered by this consumer "
                f"(group {self.group!r}, or not among the last {_TRACKED} it returned)"
            )
        if state:
            raise InvalidMessageError(f"message {message.msg_id} was handed back already")
        return full

    def _addr_of(self, name: str) -> str | None:
        for sub in self._subs:
            addr = sub.brokers.get(name)
            if addr:
                return addr
        return self._retry_brokers.get(name) or None

    def _targets(self, prefer: str) -> list[tuple[str, str]]:
        """The brokers to try: the one that delivered the message, then the others."""
        out: dict[str, str] = {}
        addr = self._addr_of(prefer)
        if addr:
            out[prefer] = addr
        for sub in self._subs:
            for name, addr in dict(sub.brokers).items():
                out.setdefault(name, addr)
        return list(out.items())

    def _send_back(
        self, key: _Key, copy: wire.WireMessage, prefer: str, *, retry: bool = False
    ) -> str:
        """Send ``copy`` until a broker acknowledges it; the broker's name."""
        targets = self._targets(prefer)
        if not targets:
            raise BrokerUnavailableError(f"no broker known to take {copy.topic}")
        last: QClientError | None = None
        for name, addr in targets:
            if retry and len(self._subs) > 1:  # spread over the retry topic's queues there
                copy.queue_id = queue_for(copy.msg_id, self._subs[1].counts.get(name, 0))
            out = self._lane(name, addr).call(copy)
            if isinstance(out.error, InvalidMessageError) and out.batched > 1:
                # one bad copy refuses its whole request: this one alone decides
                out = Lane(partial(self._send_request, name, addr)).call(copy)
            err = out.error
            if err is not None:
                if isinstance(err, AuthError | InvalidMessageError):
                    raise err  # the next broker would answer the same
                if not isinstance(err, QClientError):
                    raise err
                last = err
                log.debug("hand-back of %s to %s failed: %s", copy.msg_id, name, err)
                continue
            r = out.result
            assert r is not None
            if r.status == wire.SEND_OK:
                self._returned[key] = True
                return name
            failed = error_for_code(r.status, r.error or "", broker=name, topic=copy.topic)
            if r.status not in wire.RETRYABLE_CODES:
                raise failed
            last = failed
        assert last is not None
        raise last

    def _lane(self, name: str, addr: str) -> Lane:
        lane = self._lanes.get((name, addr))
        if lane is None:
            lane = self._lanes.setdefault(
                (name, addr), Lane(partial(self._send_request, name, addr))
            )
        return lane

    def _send_request(
        self, name: str, addr: str, copies: list[wire.WireMessage]
    ) -> list[wire.MessageResult]:
        """One send request of ``copies`` to a broker, with a deadline (a broker that
        reads it too late stores none of it); their results in order."""
        deadline_ms = time.time_ns() // 1_000_000 + int(self._timeout * 1000)
        resp = call(
            self._http,
            name,
            addr,
            wire.BROKER_SEND,
            wire.SendRequest(copies, deadline_ms),
            wire.SendResponse,
            topic=copies[0].topic,
            timeout=self._timeout,
        )
        if resp is None or [r.msg_id for r in resp.results] != [c.msg_id for c in copies]:
            raise BrokerUnavailableError(f"broker {name}: no answer for the hand-back")
        return resp.results
