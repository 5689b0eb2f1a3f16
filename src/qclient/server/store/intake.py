"""Turning submitted messages into message-log records: checks, then encoding."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

from qclient.protocol.limits import MAX_MSG_ID_CHARS, Rule, check_row
from qclient.server.store import record as rec
from qclient.server.store.types import InvalidRecordError, NewMessage, StoreConfig
from qclient.server.store.wheel import MAX_SIZE

# a message may be due this much past ``now + max_delay_ms``: the broker's clock and the
# caller's may differ slightly
_DELAY_SLACK_MS = 60_000
_MAX_TOPICS_REMEMBERED = 10_000
_TOPIC = operator.attrgetter("topic")
_DELIVER_AT = operator.attrgetter("deliver_at_ms")

#: the store's wording of each rule of the row checker
_ERRORS = {
    Rule.TOPIC: "invalid topic name",
    Rule.MSG_ID: f"msg_id must be 1-{MAX_MSG_ID_CHARS} printable ASCII characters",
    Rule.BODY_SIZE: "message too large",
    Rule.QUEUE_ID: "invalid queue id",
    Rule.KEY: "key too long",
    Rule.TAGS: "tags too long",
    Rule.PROPERTY_COUNT: "too many properties",
    Rule.PROPERTY_LENGTH: "a property key or value is too long",
    Rule.FLAG: "flag has unknown bits",
    Rule.BOTH_DELAYS: "deliver_at_ms out of range",
    Rule.DELAY: "deliver_at_ms out of range",
    Rule.DELIVER_AT: "deliver_at_ms out of range",
}


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

    def encode_plain(
        self,
        msgs: Sequence[rec.WireFields],
        deliver_ats: list[int],
        now: int,
        topics: Iterable[str] | None = None,
    ) -> list[bytes] | None:
        """Records of validated messages given with their deliver times, received ``now``
        (the bytes :meth:`encode` makes of the same NewMessages); None when one needs the
        full checks (then :meth:`encode` them as NewMessages)."""
        return self._encode_validated(msgs, now, topics, deliver_ats) if msgs else None

    def _validate(self, m: NewMessage, now: int) -> bytes:
        """One message's record: its types here, its limits by the protocol's row checker
        (deliver times up to ``now + max_delay_ms`` plus a little slack)."""
        topic, q, mid, d, body = m.topic, m.queue_id, m.msg_id, m.deliver_at_ms, m.body
        if type(topic) is not str:
            raise InvalidRecordError("invalid topic name")
        if type(q) is not int:
            raise InvalidRecordError("invalid queue id")
        if type(mid) is not str:
            raise InvalidRecordError(_ERRORS[Rule.MSG_ID])
        if type(d) is not int:
            raise InvalidRecordError(_ERRORS[Rule.DELIVER_AT])
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidRecordError("body must be bytes")
            body = bytes(body)
        key, tags, props, flag = m.key, m.tags, m.properties, m.flag
        try:
            rule = check_row(
                topic,
                mid,
                len(body),
                q,
                key,
                tags,
                props,
                flag,
                None,
                d,
                now,
                max_delay_ms=self._max_ahead_ms,
                max_size=self._max_record,
            )
        except (TypeError, AttributeError):  # a key, tags, properties or flag of a wrong type
            raise InvalidRecordError("bad message: a field of a wrong type") from None
        if rule is not None:
            raise InvalidRecordError(_ERRORS[rule])
        if topic not in self._topics_ok and len(self._topics_ok) < _MAX_TOPICS_REMEMBERED:
            self._topics_ok.add(topic)
        try:
            data = rec.encode(
                rec.KIND_MESSAGE,
                mid,
                topic,
                body,
                flag=flag,
                queue_id=q,
                received_ms=m.received_ms or now,
                deliver_at_ms=d,
                key=key,
                tags=tags,
                properties=props,
            )
        except (ValueError, TypeError, AttributeError, UnicodeEncodeError) as exc:
            raise InvalidRecordError(f"bad message: {exc}") from None
        if len(data) > self._max_record:
            raise InvalidRecordError("message too large")
        return data

    def _encode_validated(
        self,
        msgs: Sequence[rec.WireFields],
        now: int,
        names: Iterable[str] | None = None,
        deliver_ats: list[int] | None = None,
    ) -> list[bytes] | None:
        """Records of messages the caller has already validated (``submit(validated=True)``):
        only what the caller's checks do not cover is checked here (topic names, once per
        topic; record size). None when a message needs the full :meth:`_validate` (it has
        key, tags or properties, or something is off: then _validate names the problem).
        ``names``: the messages' distinct topics, if the caller has them; ``deliver_ats``:
        the messages' deliver times when they are not NewMessages."""
        topics: dict[str, bytes] = {}
        for topic in set(map(_TOPIC, msgs)) if names is None else names:
            if topic not in self._topics_ok:
                return None
            topics[topic] = topic.encode()
        try:
            out = rec.encode_messages(msgs, topics, now, deliver_ats)
        except Exception:
            return None
        if (
            out is None
            or max(map(len, out)) > self._max_record
            # the codec takes negative times
            or min(map(_DELIVER_AT, msgs) if deliver_ats is None else deliver_ats) < 0
        ):
            return None
        return out
