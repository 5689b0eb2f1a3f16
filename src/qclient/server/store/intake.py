"""Turning submitted messages into message-log records: checks, then encoding."""

from __future__ import annotations

import operator
from collections.abc import Iterable

from qclient.server.store import record as rec
from qclient.server.store._files import check_name
from qclient.server.store.types import InvalidRecordError, NewMessage, StoreConfig
from qclient.server.store.wheel import MAX_SIZE

# a message may be due this much past ``now + max_delay_ms``: the broker's clock and the
# caller's may differ slightly
_DELAY_SLACK_MS = 60_000
_MAX_TOPICS_REMEMBERED = 10_000
_TOPIC = operator.attrgetter("topic")
_DELIVER_AT = operator.attrgetter("deliver_at_ms")


class Intake:
    """Checks and encodes messages; remembers topic names already checked."""

    def __init__(self, config: StoreConfig):
        self._topics_ok: set[str] = set()
        self._max_ahead_ms = config.max_delay_ms + _DELAY_SLACK_MS
        self._max_record = min(config.max_record_bytes, MAX_SIZE)

    def encode(
        self,
        msgs: list[NewMessage],
        now: int,
        *,
        validated: bool = False,
        topics: Iterable[str] | None = None,
    ) -> list[bytes]:
        """One record per message; raises InvalidRecordError naming the first problem."""
        datas = self._encode_validated(msgs, now, topics) if validated and msgs else None
        if datas is None:
            datas = [self._validate(m, now) for m in msgs]
        return datas

    def _validate(self, m: NewMessage, now: int) -> bytes:
        topic = m.topic
        if topic not in self._topics_ok:
            try:
                check_name(topic)
            except ValueError as exc:
                raise InvalidRecordError(str(exc)) from None
            if len(self._topics_ok) < _MAX_TOPICS_REMEMBERED:
                self._topics_ok.add(topic)
        q = m.queue_id
        if type(q) is not int or not 0 <= q < 65536:
            raise InvalidRecordError("invalid queue id")
        mid = m.msg_id
        if type(mid) is not str or not 0 < len(mid) <= 1024:
            raise InvalidRecordError("msg_id must be a non-empty string of at most 1024 chars")
        d = m.deliver_at_ms
        if type(d) is not int or not 0 <= d <= now + self._max_ahead_ms:
            raise InvalidRecordError("deliver_at_ms out of range")
        body = m.body
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidRecordError("body must be bytes")
            body = bytes(body)
        try:
            data = rec.encode(
                rec.KIND_MESSAGE,
                mid,
                topic,
                body,
                flag=m.flag,
                queue_id=q,
                received_ms=m.received_ms or now,
                deliver_at_ms=d,
                key=m.key,
                tags=m.tags,
                properties=m.properties,
            )
        except (ValueError, TypeError, AttributeError, UnicodeEncodeError) as exc:
            raise InvalidRecordError(f"bad message: {exc}") from None
        if len(data) > self._max_record:
            raise InvalidRecordError("message too large")
        return data

    def _encode_validated(
        self, msgs: list[NewMessage], now: int, names: Iterable[str] | None = None
    ) -> list[bytes] | None:
        """Records of messages the caller has already validated (``submit(validated=True)``):
        only what the caller's checks do not cover is checked here (topic names, once per
        topic; record size). None when a message needs the full :meth:`_validate` (it has
        key, tags or properties, or something is off: then _validate names the problem).
        ``names``: the messages' distinct topics, if the caller has them."""
        topics: dict[str, bytes] = {}
        for topic in set(map(_TOPIC, msgs)) if names is None else names:
            if topic not in self._topics_ok:
                return None
            topics[topic] = topic.encode()
        try:
            out = rec.encode_messages(msgs, topics, now)
        except Exception:
            return None
        if (
            out is None
            or max(map(len, out)) > self._max_record
            or min(map(_DELIVER_AT, msgs)) < 0  # the codec takes negative times
        ):
            return None
        return out
