"""``QClientEngine``: sends, routes and probes against qclient's own name server and delay
broker, over HTTP (``qclient.transport``, ``qclient.routing.nameserver``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from ..._models import SendResult, SendStatus
from ...errors import BrokerUnavailableError, QClientError
from ...fault.detector import http_probe
from ...producer._ambiguous import is_ambiguous
from ...producer._plan import CallResult, HttpCall, Item
from ...protocol.wire import (
    BROKER_SEND,
    ENCODINGS,
    RETRYABLE_CODES,
    SEND_OK,
    SendRequest,
    SendResponse,
    decode,
    encode,
)
from ...routing.nameserver import AsyncNameServerClient, NameServerClient
from ...transport.errors import (
    Outcome,
    classify_exception,
    error_for_code,
    parse_error_response,
    response_outcome,
)
from ...transport.http import AsyncHttp, AsyncLeanHttp, Credentials, SyncHttp
from ..base import Engine, SendVerdict
from . import lifecycle

if TYPE_CHECKING:
    from ..._config import ProducerConfig

__all__ = ["QClientEngine"]

log = logging.getLogger(__name__)


class QClientEngine(Engine):
    """qclient's broker: one HTTP request per chunk, answered per message."""

    name = "qclient"

    def __init__(self, encoding: str = "msgpack") -> None:
        self.content_type = ENCODINGS[encoding]

    # lifecycle by id: the broker's own requests (``lifecycle.py``)
    plan_lookup = staticmethod(lifecycle.plan_lookup)
    plan_lookup_on = staticmethod(lifecycle.plan_lookup_on)
    plan_cancel_id = staticmethod(lifecycle.plan_cancel_id)
    plan_cancel = staticmethod(lifecycle.plan_cancel)
    plan_reschedule = staticmethod(lifecycle.plan_reschedule)

    def send_call(self, broker: str, addr: str, items: list[Item], timeout: float) -> HttpCall:
        wires = [it.wire for it in items]
        content_type = self.content_type

        def build(deadline_ms: int) -> bytes:
            # the broker stores nothing of it past the deadline: once the attempt has timed
            # out here, a late copy there cannot be stored (protocol.deadline)
            return encode(SendRequest(wires, deadline_ms), content_type)

        return HttpCall(broker, addr, BROKER_SEND, b"", timeout, items, build)

    def read_send(self, call: Any, res: CallResult) -> SendVerdict:
        broker = call.broker
        items: list[Item] = call.items
        if res.exc is not None or res.response is None:
            exc = res.exc or RuntimeError("no response")
            outcome, err = classify_exception(exc, broker=broker, timeout=call.timeout)
            log.warning(
                "send of %d message(s) to %s failed after %.0f ms: %s",
                len(items),
                broker,
                res.latency_ms,
                err,
            )
            return SendVerdict(outcome, None, err, ambiguous=is_ambiguous(res.exc))
        resp = res.response
        if resp.status != 200:
            code, message = parse_error_response(resp)
            outcome = response_outcome(code, resp.status)
            err = error_for_code(
                code, message, broker=broker, topic=items[0].wire.topic, status=resp.status
            )
            log.warning(
                "broker %s refused %d message(s): HTTP %d %s: %s",
                broker,
                len(items),
                resp.status,
                code,
                message,
            )
            return SendVerdict(outcome, None, err)
        try:
            answer = decode(resp.content, SendResponse, resp.media_type)
            if len(answer.results) != len(items):
                raise ValueError(f"{len(answer.results)} results for {len(items)} messages")
            if [r.msg_id for r in answer.results] != [it.wire.msg_id for it in items]:
                raise ValueError("results not in the order of the request's messages")
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            err = BrokerUnavailableError(
                f"broker {broker} sent a bad answer: {exc}", broker_name=broker
            )
            return SendVerdict(Outcome.BROKER, None, err)
        answers: list[SendResult | QClientError] = []
        retry: set[int] = set()
        ok = SendStatus.SEND_OK
        for i, (it, r) in enumerate(zip(items, answer.results, strict=True)):
            topic = it.wire.topic
            if r.status == SEND_OK:
                answers.append(SendResult(r.msg_id, ok, broker, r.queue_id, r.deliver_at_ms, topic))
                continue
            answers.append(error_for_code(r.status, r.error or "", broker=broker, topic=topic))
            if r.status in RETRYABLE_CODES:
                retry.add(i)
        outcome = Outcome.BROKER if retry else Outcome.OK
        return SendVerdict(outcome, answers, retry=frozenset(retry))

    # --- I/O objects ------------------------------------------------------------------

    def sync_transport(
        self, cfg: ProducerConfig, credentials: Credentials | None, *, lean: bool | None = None
    ) -> SyncHttp:
        return SyncHttp(
            content_type=self.content_type,
            credentials=credentials,
            verify=cfg.verify,
            lean=cfg.http_transport == "lean" if lean is None else lean,
        )

    def async_transport(
        self, cfg: ProducerConfig, credentials: Credentials | None, *, lean: bool | None = None
    ) -> AsyncHttp | AsyncLeanHttp:
        if lean is None:
            lean = cfg.http_transport == "lean"
        cls = AsyncLeanHttp if lean else AsyncHttp
        return cls(content_type=self.content_type, credentials=credentials, verify=cfg.verify)

    def name_server(self, cfg: ProducerConfig, transport: Any = None) -> NameServerClient:
        return NameServerClient(cfg.namesrv, timeout=cfg.namesrv_timeout, http=transport)

    def async_name_server(self, cfg: ProducerConfig) -> AsyncNameServerClient:
        return AsyncNameServerClient(cfg.namesrv, timeout=cfg.namesrv_timeout, verify=cfg.verify)

    def probe(self, transport: Any) -> Callable[[str, float], bool]:
        return http_probe(transport)
