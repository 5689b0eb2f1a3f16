"""A simple pull consumer: at-least-once, offsets kept on the brokers per group.

``poll()`` long-polls every broker of the topic at once and returns what fired; the
offsets of what one ``poll()`` returned are committed by the next one (or by
``close()``), so a consumer that dies re-reads what it had not finished.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from types import TracebackType

import httpx
import msgspec

from . import _tracing
from ._models import ReceivedMessage
from .errors import AuthError, InvalidMessageError, ProducerClosedError, QClientError
from .protocol import wire
from .routing.nameserver import NameServerClient
from .routing.publish_info import master_addrs
from .transport.errors import classify_exception, error_for_code, parse_error_response
from .transport.http import Credentials, SyncHttp

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

_ROUTE_TTL = 5.0  # seconds between route look-ups while polling


class Consumer:
    """``Consumer(namesrv, topic, group)``; ``poll()`` returns delivered messages."""

    def __init__(
        self,
        namesrv: str | Sequence[str],
        topic: str,
        group: str,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        request_timeout: float = 5.0,
        verify: bool | str = True,
    ) -> None:
        if not wire.valid_topic(topic):
            raise InvalidMessageError(f"invalid topic name {topic!r}")
        if not wire.GROUP_RE.match(group):
            raise InvalidMessageError(f"invalid group name {group!r}")
        self.topic = topic
        self.group = group
        creds = Credentials(access_key, secret_key) if access_key and secret_key else None
        self._http = SyncHttp(content_type=wire.MSGPACK, credentials=creds, verify=verify)
        self._namesrv = NameServerClient(namesrv, timeout=request_timeout, http=self._http)
        self._timeout = request_timeout
        self._brokers: dict[str, str] = {}  # name -> addr
        self._route_at = 0.0
        self._inflight: dict[str, Future[wire.PullResponse]] = {}
        self._commits: dict[str, dict[int, int]] = {}  # broker -> queue -> next offset
        self._buffer: list[ReceivedMessage] = []
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="qclient-consumer")
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"Consumer(topic={self.topic!r}, group={self.group!r})"

    # --- public ---------------------------------------------------------------------

    def poll(self, max_messages: int = 32, timeout: float = 1.0) -> list[ReceivedMessage]:
        """Up to ``max_messages`` delivered messages, waiting up to ``timeout`` seconds."""
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        start_ns = time.time_ns()
        with self._lock:
            if self._closed:
                raise ProducerClosedError("consumer is closed")
            if not self._buffer:
                self._fetch(max_messages, timeout)
            out, self._buffer = self._buffer[:max_messages], self._buffer[max_messages:]
        _tracing.receive(self.topic, self.group, out, start_ns)
        return out

    def commit(self) -> None:
        """Commit what earlier polls returned now, instead of with the next poll."""
        with self._lock:
            self._commit_all()

    def close(self) -> None:
        """Commit what was returned, then release connections. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if not self._buffer:
                    self._commit_all()
            except QClientError as exc:
                log.warning("final offset commit failed: %s", exc)
            finally:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._namesrv.close()
                self._http.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------

    def _refresh_route(self, force: bool = False) -> None:
        if not force and self._brokers and time.monotonic() - self._route_at < _ROUTE_TTL:
            return
        try:
            route = self._namesrv.get_route(self.topic)
        except QClientError:
            if self._brokers:  # keep polling the brokers we know
                return
            raise
        self._brokers = master_addrs(route)
        self._route_at = time.monotonic()

    def _pull(
        self, broker: str, addr: str, commits: dict[int, int], max_messages: int, wait_ms: int
    ) -> wire.PullResponse:
        req = wire.PullRequest(self.topic, self.group, max_messages, wait_ms, commits)
        body = wire.encode(req, wire.MSGPACK)
        try:
            resp = self._http.request(
                "POST", addr, wire.BROKER_PULL, body, timeout=self._timeout + wait_ms / 1000
            )
        except httpx.HTTPError as exc:
            raise classify_exception(exc, broker=broker, timeout=self._timeout)[1] from None
        if resp.status == 404:  # topic not created on this broker yet: nothing to read
            return wire.PullResponse(broker, [])
        if resp.status != 200:
            code, message = parse_error_response(resp)
            raise error_for_code(code, message, broker=broker, topic=self.topic, status=resp.status)
        try:
            return wire.decode(resp.content, wire.PullResponse, resp.media_type)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise QClientError(f"broker {broker}: malformed pull response: {exc}") from None

    def _fetch(self, max_messages: int, timeout: float) -> None:
        self._refresh_route()
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            remaining = deadline - time.monotonic()
            wait_ms = max(0, int(remaining * 1000))
            for name, addr in self._brokers.items():
                if name not in self._inflight:
                    commits = self._commits.pop(name, {})
                    fut = self._pool.submit(self._pull, name, addr, commits, max_messages, wait_ms)
                    fut.commits = commits  # type: ignore[attr-defined]
                    self._inflight[name] = fut
            if not self._inflight:
                return
            done, _ = wait(
                list(self._inflight.values()),
                timeout=max(0.0, remaining) + 0.05,
                return_when=FIRST_COMPLETED,
            )
            errors: list[QClientError] = []
            for name, fut in list(self._inflight.items()):
                if fut not in done:
                    continue
                del self._inflight[name]
                try:
                    resp = fut.result()
                except QClientError as exc:
                    # Commits that did not reach the broker go with the next request.
                    pending = self._commits.setdefault(name, {})
                    for q, off in fut.commits.items():  # type: ignore[attr-defined]
                        pending[q] = max(pending.get(q, 0), off)
                    errors.append(exc)
                    continue
                self._accept(name, resp)
            if self._buffer:
                return
            # issue 6: refused credentials will not change by waiting; say so at once
            # (otherwise a poll could end with [] and the reason would be lost).
            refused = [e for e in errors if isinstance(e, AuthError)]
            if refused:
                raise refused[0]
            if errors and len(errors) == len(self._brokers):
                self._refresh_route(force=True)
                if time.monotonic() >= deadline:
                    raise errors[0]
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            elif errors:
                log.debug("pull failed on %d broker(s): %s", len(errors), errors[0])
            if time.monotonic() >= deadline:
                return

    def _accept(self, broker: str, resp: wire.PullResponse) -> None:
        pending = self._commits.setdefault(broker, {})
        for q, off in resp.next_offsets.items():
            pending[q] = max(pending.get(q, 0), off)
        for m in resp.messages:
            body = zlib.decompress(m.body) if m.flag & wire.FLAG_COMPRESSED else m.body
            self._buffer.append(
                ReceivedMessage(
                    msg_id=m.msg_id,
                    topic=m.topic,
                    body=body,
                    key=m.key,
                    tags=m.tags,
                    properties=dict(m.properties or {}),
                    deliver_at_ms=m.deliver_at_ms,
                    fired_at_ms=m.fired_at_ms,
                    broker_name=broker,
                    queue_id=m.queue_id,
                    offset=m.offset,
                )
            )

    def _commit_all(self) -> None:
        for name, fut in list(self._inflight.items()):
            # A long poll in flight still carries older commits; let it finish first.
            try:
                resp = fut.result(timeout=self._timeout + 30)
            except Exception:
                resp = None
            del self._inflight[name]
            if resp is not None:
                self._accept(name, resp)
        if self._buffer:
            return  # what is buffered was not returned yet: do not commit past it
        for name, commits in list(self._commits.items()):
            if not commits or name not in self._brokers:
                continue
            self._pull(name, self._brokers[name], commits, 0, 0)
            del self._commits[name]
