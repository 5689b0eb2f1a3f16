"""How ``RocketMQEngine.read_send`` judges a broker from a pipelined call (sans-I/O: the
answers are remoting commands as the broker sends them)."""

from __future__ import annotations

from qclient.engines.rocketmq.codes import ResponseCode
from qclient.engines.rocketmq.engine import RemotingCall, RocketMQEngine
from qclient.engines.rocketmq.remoting import RemotingCommand
from qclient.producer._plan import CallResult, Item
from qclient.protocol.wire import WireMessage
from qclient.routing.publish_info import TopicPublishInfo


def _call(n: int, first_answer_ms: float | None) -> RemotingCall:
    info = TopicPublishInfo.__new__(TopicPublishInfo)
    items = [Item(i, WireMessage("t", 0, f"id-{i}", b"x", delay_ms=5000), info) for i in range(n)]
    call = RocketMQEngine().send_call("broker-a", "127.0.0.1:1", items, 1.0)
    call.payload()  # one SEND_MESSAGE_V2 per delayed message
    call.first_answer_ms = first_answer_ms
    return call


def _ok(n: int) -> list[RemotingCommand]:
    return [RemotingCommand(code=ResponseCode.SUCCESS, flag=1) for _ in range(n)]


def test_a_pipelined_call_is_judged_by_one_requests_latency() -> None:
    engine = RocketMQEngine()
    call = _call(64, first_answer_ms=4.0)
    verdict = engine.read_send(call, CallResult(response=_ok(64), latency_ms=700.0))
    assert len(verdict.answers or []) == 64
    assert verdict.latency_ms == 4.0


def test_a_lone_request_is_judged_by_the_calls_latency() -> None:
    engine = RocketMQEngine()
    call = _call(1, first_answer_ms=4.0)
    verdict = engine.read_send(call, CallResult(response=_ok(1), latency_ms=9.0))
    assert verdict.latency_ms is None
