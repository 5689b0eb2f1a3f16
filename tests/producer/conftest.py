"""Shared helpers of the producer unit tests: wire bodies for respx routes."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from qclient.protocol.wire import (
    MSGPACK,
    BrokerData,
    ErrorBody,
    ErrorResponse,
    MessageResult,
    QueueData,
    SendRequest,
    SendResponse,
    TopicRoute,
    base_url,
    decode,
    encode,
)
from qclient.transport import http as transport_http
from qclient.transport.lean import LeanResponse

NS1 = "127.0.0.1:19876"
NS2 = "127.0.0.1:19877"
BROKERS = {"broker-a": "127.0.0.1:10911", "broker-b": "127.0.0.1:10912"}


def route(
    topic: str = "t", brokers: dict[str, str] | None = None, queues: int = 4, perm: int = 6
) -> TopicRoute:
    brokers = BROKERS if brokers is None else brokers
    return TopicRoute(
        topic=topic,
        queue_datas=[
            QueueData(broker_name=n, read_queue_nums=queues, write_queue_nums=queues, perm=perm)
            for n in brokers
        ],
        broker_datas=[BrokerData(broker_name=n, addrs={0: a}) for n, a in brokers.items()],
    )


def msgpack_response(obj: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=encode(obj, MSGPACK), headers={"content-type": MSGPACK})


def error_response(status: int, code: str, message: str = "x") -> httpx.Response:
    return msgpack_response(ErrorResponse(error=ErrorBody(code=code, message=message)), status)


def ok_send(broker: str):
    """A respx side effect acting as a healthy broker: every message SEND_OK."""

    def handler(request: httpx.Request) -> httpx.Response:
        req = decode(request.content, SendRequest, MSGPACK)
        return msgpack_response(
            SendResponse(
                broker_name=broker,
                results=[
                    MessageResult(
                        msg_id=m.msg_id,
                        status="SEND_OK",
                        queue_id=m.queue_id,
                        deliver_at_ms=m.deliver_at_ms or 1,
                    )
                    for m in req.messages
                ],
            )
        )

    return handler


class HttpxBackedLean:
    """``LeanTransport``'s interface over httpx's own transport, which respx intercepts: the
    respx tests run the SDK's code above the transport unchanged (the lean transport itself
    is tested against real servers in tests/transport)."""

    def __init__(self, **_: object) -> None:
        self._t = httpx.HTTPTransport(trust_env=False)

    def request(
        self,
        method: str,
        addr: str,
        path: str,
        body: bytes = b"",
        headers: object = (),
        *,
        timeout: float,
        on_write: Callable[[], None] | None = None,
    ) -> LeanResponse:
        if on_write is not None:
            on_write()
        req = httpx.Request(
            method,
            base_url(addr) + path,
            content=body or None,
            headers=list(headers),  # type: ignore[call-overload]
            extensions={"timeout": httpx.Timeout(timeout).as_dict()},
        )
        resp = self._t.handle_request(req)
        content = resp.read()
        return LeanResponse(resp.status_code, dict(resp.headers), content)

    def close(self) -> None:
        self._t.close()


@pytest.fixture
def respx_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sync requests go through httpx's transport, so that respx sees them."""
    monkeypatch.setattr(transport_http, "LeanTransport", HttpxBackedLean)
