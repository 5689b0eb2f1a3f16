"""The broker's checks of the messages of a send request: the protocol's row checker
(:func:`qclient.protocol.limits.check_row`) turned into HTTP errors, and a bulk fast path
that accepts exactly the batches whose every row it accepts (property-tested)."""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter

from ...protocol import limits
from ...protocol.limits import Rule, check_row
from ...protocol.wire import ErrorCode, WireMessage
from .._http import ApiError

__all__ = ["MessageChecks"]

_MSG_ID = attrgetter("msg_id")
_BODY = attrgetter("body")
_QUEUE_ID = attrgetter("queue_id")
_KEY = attrgetter("key")
_TAGS = attrgetter("tags")
_PROPERTIES = attrgetter("properties")
_FLAG = attrgetter("flag")
_DELAY_MS = attrgetter("delay_ms")
_DELIVER_AT_MS = attrgetter("deliver_at_ms")
_valid_topic = limits.TOPIC_RE.match


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


_BAD = (400, ErrorCode.INVALID_MESSAGE)
_DELAY = (400, ErrorCode.INVALID_DELAY)
#: each rule's status, error code and one line (``str.format`` fields: where, topic, size,
#: max_size, delay, max_delay)
_ERRORS: dict[str, tuple[int, str, str]] = {
    Rule.TOPIC: (
        400,
        ErrorCode.INVALID_TOPIC,
        "{where}.topic {topic!r} must match " + _braces(limits.TOPIC_PATTERN),
    ),
    Rule.MSG_ID: (
        *_BAD,
        f"{{where}}.msg_id must be 1-{limits.MAX_MSG_ID_CHARS} printable ASCII characters",
    ),
    Rule.BODY_SIZE: (
        413,
        ErrorCode.MESSAGE_TOO_LARGE,
        "{where}.body is {size} bytes, the limit is {max_size}",
    ),
    Rule.QUEUE_ID: (*_BAD, "{where}.queue_id out of range"),
    Rule.KEY: (*_BAD, f"{{where}}.key longer than {limits.MAX_KEY_CHARS} characters"),
    Rule.TAGS: (*_BAD, f"{{where}}.tags longer than {limits.MAX_TAGS_CHARS} characters"),
    Rule.PROPERTY_COUNT: (
        *_BAD,
        f"{{where}}.properties has more than {limits.MAX_PROPERTIES} entries",
    ),
    Rule.PROPERTY_LENGTH: (*_BAD, "{where}.properties entry too long"),
    Rule.FLAG: (*_BAD, "{where}.flag has unknown bits"),
    Rule.BOTH_DELAYS: (*_DELAY, "{where}: give delay_ms or deliver_at_ms, not both"),
    Rule.DELAY: (*_DELAY, "{where}.delay_ms must be 0..{max_delay}, got {delay}"),
    Rule.DELIVER_AT: (
        *_DELAY,
        "{where}.deliver_at_ms is more than {max_delay} ms ahead "
        "(the broker's maximum delay) or negative",
    ),
}


class MessageChecks:
    """The message checks of one broker's limits."""

    __slots__ = ("max_delay_ms", "max_size")

    def __init__(self, max_message_size: int, max_delay_ms: int) -> None:
        self.max_size = max_message_size
        self.max_delay_ms = max_delay_ms

    def message(self, i: int, m: WireMessage, now_ms: int) -> int:
        """Validate message ``i``; returns its deliver time (broker clock for delay_ms)."""
        rule = check_row(
            m.topic,
            m.msg_id,
            len(m.body),
            m.queue_id,
            m.key,
            m.tags,
            m.properties,
            m.flag,
            m.delay_ms,
            m.deliver_at_ms,
            now_ms,
            max_delay_ms=self.max_delay_ms,
            max_size=self.max_size,
        )
        if rule is not None:
            raise self._error(rule, f"messages[{i}]", m)
        if m.delay_ms is not None:
            return now_ms + m.delay_ms
        if m.deliver_at_ms is not None:
            return m.deliver_at_ms
        return now_ms

    def _error(self, rule: str, where: str, m: WireMessage) -> ApiError:
        """The HTTP error (status, code, one line) of a broken rule."""
        status, code, line = _ERRORS[rule]
        return ApiError(
            status,
            code,
            line.format(
                where=where,
                topic=m.topic[:140],
                size=len(m.body),
                max_size=self.max_size,
                delay=m.delay_ms,
                max_delay=self.max_delay_ms,
            ),
        )

    def batch(
        self,
        msgs: list[WireMessage],
        now_ms: int,
        topics: Iterable[str],
        max_queue: int,
    ) -> list[int] | None:
        """The deliver times of a batch every message of which passes :meth:`message`
        (each check done once per batch, in C loops: no per-message Python code), or
        None when some message may not pass or has a shape this fast path leaves alone --
        then :meth:`message`, message by message, gives the answer (and names the first
        bad message). Accepts exactly what :meth:`message` accepts, with the same
        deliver times. ``topics``: the batch's distinct topics; ``max_queue``: its
        highest queue id (the caller needs both too, so they are computed once)."""
        n = len(msgs)
        for topic in topics:
            if not _valid_topic(topic):
                return None
        ids = list(map(_MSG_ID, msgs))
        # ids joined by a space (itself not allowed in an id): printable ASCII, no other space
        joined = " ".join(ids)
        if not (joined.isascii() and joined.isprintable()) or joined.count(" ") != n - 1:
            return None
        lengths = list(map(len, ids))
        if min(lengths) < 1 or max(lengths) > limits.MAX_MSG_ID_CHARS:
            return None
        if max(map(len, map(_BODY, msgs))) > self.max_size:
            return None
        if min(map(_QUEUE_ID, msgs)) < 0 or max_queue >= limits.MAX_QUEUES:
            return None
        for attr, limit in ((_KEY, limits.MAX_KEY_CHARS), (_TAGS, limits.MAX_TAGS_CHARS)):
            if any(map(attr, msgs)):  # all None or "": nothing to check
                values = set(map(attr, msgs))
                values.discard(None)
                if max(map(len, values)) > limit:
                    return None
        if any(map(_PROPERTIES, msgs)):  # None or {} pass; entries: message by message
            return None
        if any(map(_FLAG, msgs)):
            for flag in set(map(_FLAG, msgs)):
                if flag & ~limits.KNOWN_FLAGS:
                    return None
        max_delay = self.max_delay_ms
        delays = list(map(_DELAY_MS, msgs))
        ats = list(map(_DELIVER_AT_MS, msgs))
        if ats.count(None) == n:
            if delays.count(None) == n:
                return [now_ms] * n
            if None in delays or min(delays) < 0 or max(delays) > max_delay:
                return None
            return [now_ms + d for d in delays]
        if delays.count(None) == n and None not in ats:
            if min(ats) < 0 or max(ats) - now_ms > max_delay:
                return None
            return ats
        return None
