"""Producer throughput: a ``send_delayed`` loop, ``send_batch`` (of ``Message`` objects and
of a ``MessageBatch``'s columns), ``send_async`` and ``AsyncProducer`` (gather of sends,
and send_batch), in one run against one ``LocalCluster`` of 2 brokers; 100-byte bodies;
msgs/s acknowledged (durable), the ratio to the loop, and the client's CPU time per
message (all its threads).

    python -m benchmarks.producer_bench [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from qclient import AsyncProducer, LocalCluster, Message, MessageBatch, Producer

BODY = b"x" * 100


def measure(fn: Callable[[], int]) -> dict[str, float]:
    """Run ``fn`` (returns messages acknowledged); msgs/s and client CPU µs per message."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    n = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "messages": n,
        "seconds": round(wall, 3),
        "msgs_per_s": round(n / wall, 1),
        "cpu_us_per_msg": round(cpu / n * 1e6, 1),
    }


def encoding_bench(batch: int = 256, body: int = 100, rounds: int = 200) -> dict[str, Any]:
    """Encode + decode one ``SendRequest`` of ``batch`` messages: JSON vs MessagePack
    (both msgspec, typed) vs a hand-rolled binary framing (struct)."""
    import struct

    from qclient.protocol.wire import JSON, MSGPACK, SendRequest, WireMessage, decode, encode

    msgs = [
        WireMessage(
            topic="orders",
            queue_id=i % 4,
            msg_id=f"{i:036x}",
            body=b"x" * body,
            key=f"k{i}",
            delay_ms=60_000,
        )
        for i in range(batch)
    ]
    req = SendRequest(messages=msgs)
    head = struct.Struct("!HHQI")

    def frame_encode(r: SendRequest) -> bytes:
        out = bytearray()
        for m in r.messages:
            t, i, k = m.topic.encode(), m.msg_id.encode(), (m.key or "").encode()
            out += head.pack(len(t), len(i), m.delay_ms or 0, len(m.body))
            out += t + i + bytes([len(k)]) + k + m.body
        return bytes(out)

    def frame_decode(data: bytes) -> list[WireMessage]:
        pos, out, mv = 0, [], memoryview(data)
        while pos < len(data):
            lt, li, delay, lb = head.unpack_from(data, pos)
            pos += head.size
            topic = str(mv[pos : pos + lt], "utf-8")
            pos += lt
            mid = str(mv[pos : pos + li], "ascii")
            pos += li
            lk = data[pos]
            key = str(mv[pos + 1 : pos + 1 + lk], "utf-8")
            pos += 1 + lk
            out.append(
                WireMessage(
                    topic=topic,
                    queue_id=0,
                    msg_id=mid,
                    body=bytes(mv[pos : pos + lb]),
                    key=key,
                    delay_ms=delay,
                )
            )
            pos += lb
        return out

    codecs = {
        "json (msgspec)": (lambda r: encode(r, JSON), lambda d: decode(d, SendRequest, JSON)),
        "msgpack (msgspec)": (
            lambda r: encode(r, MSGPACK),
            lambda d: decode(d, SendRequest, MSGPACK),
        ),
        "binary framing (struct)": (frame_encode, frame_decode),
    }
    out: dict[str, Any] = {}
    for name, (enc, dec) in codecs.items():
        data = enc(req)
        best_enc = best_dec = float("inf")
        for _ in range(7):  # best of 7: the machine is shared, the minimum is the codec
            t0 = time.perf_counter()
            for _ in range(rounds):
                enc(req)
            t1 = time.perf_counter()
            for _ in range(rounds):
                dec(data)
            t2 = time.perf_counter()
            best_enc, best_dec = min(best_enc, t1 - t0), min(best_dec, t2 - t1)
        n = rounds * batch
        out[name] = {
            "bytes_per_msg": round(len(data) / batch, 1),
            "encode_us_per_msg": round(best_enc / n * 1e6, 3),
            "decode_us_per_msg": round(best_dec / n * 1e6, 3),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--smoke", action="store_true", help="tiny N")
    ap.add_argument("--loop-seconds", type=float, default=5.0)
    ap.add_argument("--n", type=int, default=100_000, help="messages for batch/async runs")
    ap.add_argument(
        "--encoding-only",
        action="store_true",
        help="only the wire-encoding comparison (no cluster)",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    enc = encoding_bench(rounds=5 if args.smoke else 50)
    print(f"{'batch encoding (256 x 100 B)':<28}{'B/msg':>8}{'enc us/msg':>12}{'dec us/msg':>12}")
    for name, e in enc.items():
        print(
            f"{name:<28}{e['bytes_per_msg']:>8.1f}{e['encode_us_per_msg']:>12.3f}"
            f"{e['decode_us_per_msg']:>12.3f}"
        )
    if args.encoding_only:
        if args.json:
            print(json.dumps({"encoding": enc}))
        return
    loop_s, n = (1.0, 2000) if args.smoke else (args.loop_seconds, args.n)
    res: dict[str, dict[str, float]] = {}
    with LocalCluster(2, broker_expire=60.0) as cluster:
        ns = cluster.namesrv
        with Producer(ns) as p:
            p.send_delayed("bench", BODY, delay=60)  # route + connections warm

            def loop() -> int:
                end, k = time.monotonic() + loop_s, 0
                while time.monotonic() < end:
                    p.send_delayed("bench", BODY, delay=60)
                    k += 1
                return k

            res["send_delayed loop"] = measure(loop)

            def batch() -> int:
                msgs = [Message("bench", BODY, delay=60) for _ in range(n)]
                for i in range(0, n, 5000):
                    p.send_batch(msgs[i : i + 5000])
                return n

            res["send_batch"] = measure(batch)

            def columns() -> int:
                for i in range(0, n, 5000):
                    k = min(5000, n - i)
                    p.send_batch(MessageBatch("bench", [BODY] * k, delay_ms=[60_000] * k))
                return n

            res["send_batch(MessageBatch)"] = measure(columns)

            def send_async() -> int:
                futures = [p.send_async(Message("bench", BODY, delay=60)) for _ in range(n)]
                p.flush()
                bad = sum(f.exception() is not None for f in futures)
                if bad:
                    raise SystemExit(f"send_async: {bad} of {n} failed")
                return n

            res["send_async"] = measure(send_async)

        def aio(kind: str) -> int:
            async def run() -> int:
                async with AsyncProducer(ns) as ap_:
                    await ap_.send_delayed("bench", BODY, delay=60)
                    if kind == "gather":
                        # one task per message: fewer messages, in rounds of 1000
                        rounds = max(1, n // 10_000)
                        for _ in range(rounds):
                            await asyncio.gather(
                                *(ap_.send_delayed("bench", BODY, delay=60) for _ in range(1000))
                            )
                        return rounds * 1000
                    msgs = [Message("bench", BODY, delay=60) for _ in range(n)]
                    await asyncio.gather(
                        *(ap_.send_batch(msgs[i : i + 5000]) for i in range(0, n, 5000))
                    )
                    return n

            return asyncio.run(run())

        res["AsyncProducer gather(send_delayed)"] = measure(lambda: aio("gather"))
        res["AsyncProducer send_batch"] = measure(lambda: aio("batch"))
    base = res["send_delayed loop"]["msgs_per_s"]
    for r in res.values():
        r["ratio_to_loop"] = round(r["msgs_per_s"] / base, 1)
    print(f"{'mode':<36}{'msgs/s':>10}{'x loop':>8}{'CPU us/msg':>12}")
    for name, r in res.items():
        print(
            f"{name:<36}{r['msgs_per_s']:>10.0f}{r['ratio_to_loop']:>8.1f}"
            f"{r['cpu_us_per_msg']:>12.1f}"
        )
    if args.json:
        sa = res["send_async"]
        out: dict[str, Any] = {
            "smoke": args.smoke,
            "modes": res,
            "encoding": enc,
            "throughput": {k: v["msgs_per_s"] for k, v in res.items()},
            "targets": [
                {
                    "name": "send_async / loop",
                    "value": sa["ratio_to_loop"],
                    "target": ">= 20",
                    "met": sa["ratio_to_loop"] >= 20,
                },
                {
                    "name": "send_async msgs/s (100 B)",
                    "value": sa["msgs_per_s"],
                    "target": ">= 30000",
                    "met": sa["msgs_per_s"] >= 30000,
                },
            ],
            "notes": ["2 brokers on the same 2-core machine as the client; delay 60 s"],
        }
        print(json.dumps(out))


if __name__ == "__main__":
    main()
