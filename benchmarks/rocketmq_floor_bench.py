"""How low the SDK's CPU per RocketMQ send can go: the floors under ``send_delayed``.

One RocketMQ broker (``LocalCluster(brokers=1, engine="rocketmq")``), one thread, the same
100 B delayed message, four loops run in interleaved blocks of ``--block`` calls (so each
sees the same minutes of a shared host), figures the median over blocks:

- ``bare``: build the request, ``sendall``, ``recv``, decode (``_engines_work.bare_request``);
- ``connection``: the same request through the producer's ``Connection`` (callers read);
- ``leanest``: the least a send does and keep the SDK's rules: validate the message
  (``ProducerCore.wire``), choose a queue, build, ``call_many`` on the pooled connection,
  record the latency in the fault table and the counters, make the ``SendResult``;
- ``send_delayed``: the SDK.

Then the cold-cache effect without any broker: ``send_delayed`` over a transport that
answers at once, with a sleep of 0, 0.5 and 2 ms in each call (a real round trip takes the
thread off the CPU for about 0.5 ms). A decision experiment (decision 0025), run by hand:

    python -m benchmarks.rocketmq_floor_bench [--json] [--blocks 15] [--block 200]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

from benchmarks._engines_work import bare_request
from benchmarks.one_call_bench import BODY, TOPIC
from qclient import LocalCluster, Producer
from qclient._models import SendResult, SendStatus
from qclient.engines.rocketmq import engine as rmq_engine
from qclient.engines.rocketmq.connection import parse_addr
from qclient.engines.rocketmq.remoting import FrameDecoder, RemotingCommand, encode
from qclient.protocol.wire import BrokerData, QueueData, TopicRoute
from qclient.transport.errors import Outcome

DELAY_S = 3600


def interleaved(fns: Mapping[str, Callable[[], object]], blocks: int, block: int) -> dict[str, Any]:
    """CPU us per call (median over blocks, and the least block) and p50 ms of each loop."""
    for fn in fns.values():
        for _ in range(300):
            fn()
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    lat: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(blocks):
        for k, fn in fns.items():
            c0 = time.process_time()
            for _ in range(block):
                t = time.perf_counter()
                fn()
                lat[k].append(time.perf_counter() - t)
            cpu[k].append((time.process_time() - c0) / block * 1e6)
    out: dict[str, Any] = {}
    for k in fns:
        out[k] = {
            "cpu_us": round(statistics.median(cpu[k]), 1),
            "cpu_us_least_block": round(min(cpu[k]), 1),
            "p50_ms": round(statistics.median(lat[k]) * 1000, 3),
        }
    return out


def on_broker(blocks: int, block: int) -> dict[str, Any]:
    with LocalCluster(brokers=1, engine="rocketmq") as c, Producer(c.namesrv) as p:
        b = c.brokers[0]
        addr, name = b.addr, getattr(b, "group", b.name)  # RocketMQ's brokerName
        prefix = uuid.uuid4().hex[:24]
        count = [0]
        sock = socket.create_connection(parse_addr(addr), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        dec = FrameDecoder()

        def bare() -> None:
            count[0] += 1
            sock.sendall(encode(bare_request(prefix, count[0], name)))
            while not dec.feed(sock.recv(65536)):
                pass

        p.send_delayed(TOPIC, BODY, delay=DELAY_S)  # the route, the connection
        core = p._core
        pool = cast(Any, p._http).pool
        conn = pool.get(addr)

        def connection() -> None:
            count[0] += 1
            conn.call(bare_request(prefix, count[0], name), 5.0)

        def leanest() -> SendResult:
            w = core.wire(TOPIC, BODY, None, None, None, DELAY_S, None, None)
            info = p._info(TOPIC)
            q = core.select(info)
            w.queue_id = q.queue_id
            now = time.time_ns() // 1_000_000
            at = now + (w.delay_ms or 0)
            cmd = rmq_engine._single(w, q.broker_name, at, now)
            t = time.perf_counter()
            answer = pool.get(info.broker_addrs[q.broker_name]).call_many([cmd], 5.0)[0]
            ok = isinstance(answer, RemotingCommand) and answer.code == 0
            core.record(
                q.broker_name,
                (time.perf_counter() - t) * 1000,
                Outcome.OK if ok else Outcome.BROKER,
            )
            core.stats.done(1, 0)
            return SendResult(w.msg_id, SendStatus.SEND_OK, q.broker_name, w.queue_id, at, w.topic)

        def sdk() -> None:
            p.send_delayed(TOPIC, BODY, delay=DELAY_S)

        try:
            fns = {"bare": bare, "connection": connection, "leanest": leanest, "send_delayed": sdk}
            res = interleaved(fns, blocks, block)
        finally:
            sock.close()
    base = res["bare"]["cpu_us"]
    res["over_bare_cpu_us"] = {k: round(v["cpu_us"] - base, 1) for k, v in res.items()}
    return res


class _Answering:
    """A transport that answers every request at once (SUCCESS), after ``sleep`` s."""

    pool = None

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    def perform(self, call: Any, on_write: Callable[[], None] | None = None) -> list[Any]:
        cmds = call.payload()
        for cmd in cmds:
            encode(cmd)
        if on_write is not None:
            on_write()
        if self.sleep:
            time.sleep(self.sleep)
        return [RemotingCommand(code=0, flag=1, opaque=cmd.opaque) for cmd in cmds]

    def close(self) -> None:
        return None


def cold_caches(n: int) -> dict[str, float]:
    """CPU us per ``send_delayed`` with no broker, by the sleep in each call."""
    out: dict[str, float] = {}
    for sleep in (0.0, 0.0005, 0.002):
        p = Producer("rocketmq://127.0.0.1:1", start_detector_enable=False)
        try:
            brokers = ("b1", "b2")
            route = TopicRoute(
                topic=TOPIC,
                queue_datas=[
                    QueueData(broker_name=b, read_queue_nums=4, write_queue_nums=4, perm=6)
                    for b in brokers
                ],
                broker_datas=[
                    BrokerData(broker_name=b, addrs={0: f"127.0.0.1:{i}"})
                    for i, b in enumerate(brokers, 2)
                ],
            )
            p._core.store_route(TOPIC, route)
            p._http.close()
            p._http = _Answering(sleep)
            for _ in range(300):
                p.send_delayed(TOPIC, BODY, delay=DELAY_S)
            c0 = time.process_time()
            for _ in range(n):
                p.send_delayed(TOPIC, BODY, delay=DELAY_S)
            out[f"sleep_{sleep * 1000:g}_ms"] = round((time.process_time() - c0) / n * 1e6, 1)
        finally:
            p.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--block", type=int, default=200)
    a = ap.parse_args()
    res = {"broker": on_broker(a.blocks, a.block), "cold_caches": cold_caches(2000)}
    if a.json:
        print(json.dumps(res))
        return
    for k, v in res["broker"].items():
        print(f"{k:18} {v}")
    print(f"{'no broker':18} {res['cold_caches']}")


if __name__ == "__main__":
    main()
