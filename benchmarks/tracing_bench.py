"""Cost of OpenTelemetry tracing on ``send_async`` throughput: opentelemetry not
installed (hidden) vs the API with no SDK configured (a no-op provider) vs the SDK's
``BatchSpanProcessor`` (spans built and batched, the exporter drops them, so export I/O
is not measured), sampling every trace and 1 in 10. Each run is its own process against
one shared ``LocalCluster`` of 1 broker; the modes are interleaved, round after round,
and the medians compared: msgs/s acknowledged and the client's CPU time per message
(all its threads). On a shared machine wall-clock msgs/s is noisy; the CPU time is
not, and the throughput a client-bound producer loses is ``1 - cpu_off / cpu_mode``.

Then the pieces, timed in a process of their own: the SDK's span (start + end) bare, with
the attributes qclient gives it, sampled out; qclient's hooks per ``send_async`` message
(the SDK's span included); and, from the runs, the garbage collector's CPU per message.
The SDK's span against ``send_async``'s own CPU is the floor no hook code can go under.

    python -m benchmarks.tracing_bench [--json] [--smoke] [--n N] [--rounds R]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MODES = ("off", "noop", "sdk", "sdk_sampled")
#: the goals: at most this much slower than without opentelemetry
GOALS = {"noop": 0.10, "sdk": 0.25, "sdk_sampled": 0.25}

_HIDE = """
import sys

class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(name)

sys.meta_path.insert(0, _Hide())
"""


def _provider(sampler: Any = None) -> Any:
    """An SDK tracer provider whose BatchSpanProcessor's exporter drops every span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    return provider


class _GcClock:
    """CPU time the garbage collector took while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        elif self.on:
            self.seconds += time.process_time() - self._t0


def _child(mode: str, namesrv: str, n: int) -> dict[str, Any]:
    if mode.startswith("sdk"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        sampled = mode == "sdk_sampled"
        trace.set_tracer_provider(
            _provider(ParentBased(TraceIdRatioBased(0.1)) if sampled else None)
        )
    from qclient import Message, Producer, tracing

    assert (mode != "off") == tracing.AVAILABLE
    body = b"x" * 100
    with Producer(namesrv) as p:
        for _ in range(min(n, 2000)):  # warm-up: route, connections, sender thread
            p.send_async(Message("tracing-bench", body))
        p.flush(60)
        gc_clock = _GcClock()
        gc_clock.on = True
        cpu0, t0 = time.process_time(), time.perf_counter()
        futures = [p.send_async(Message("tracing-bench", body)) for _ in range(n)]
        p.flush(120)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        gc_clock.on = False
        failed = sum(f.exception() is not None for f in futures)
    return {
        "mode": mode,
        "messages": n,
        "failed": failed,
        "msgs_per_s": n / wall,
        "cpu_us_per_msg": cpu / n * 1e6,
        "gc_us_per_msg": gc_clock.seconds / n * 1e6,
    }


def _per_call(fn: Any, n: int) -> float:
    """CPU µs per call of ``fn`` (one warm-up call first)."""
    fn()
    cpu0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - cpu0) / n * 1e6


def _pieces(n: int) -> dict[str, float]:
    """CPU µs per message of each piece of a traced ``send_async``, the SDK configured as
    in the ``sdk`` runs; requests of 256 messages (all spans started, then all ended, as
    the sender does); the pieces interleaved, 9 times each, medians."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
    from opentelemetry.trace import SpanKind

    trace.set_tracer_provider(_provider())
    from qclient import SendResult, SendStatus, _tracing
    from qclient.producer._plan import Item
    from qclient.protocol.wire import WireMessage
    from qclient.routing.publish_info import MessageQueue

    def resolve(broker: str) -> str:
        return "127.0.0.1:9876"

    size = 256
    queue = MessageQueue("t", "broker-a", 3)
    _, base = _tracing._base("t", queue.broker_name, queue.queue_id, resolve)
    attrs = {**base, "messaging.message.id": "0" * 32}
    tracer = trace.get_tracer("qclient")  # through the global provider, as qclient's
    never = _provider(TraceIdRatioBased(0.0)).get_tracer("qclient")
    kind = SpanKind.PRODUCER
    ids = [f"{i:032x}" for i in range(size)]
    results = [SendResult(i, SendStatus.SEND_OK, queue.broker_name, queue.queue_id, 0) for i in ids]

    def items(traced: bool) -> list[Item]:
        wires = [WireMessage(topic="t", queue_id=3, msg_id=i, body=b"x") for i in ids]
        defer = _tracing.defer_send if traced else lambda w: None
        return [Item(0, w, None, queue, trace=defer(w)) for w in wires]  # type: ignore[arg-type]

    def hooks() -> None:
        """What send_async and its sender add to a request's messages."""
        its = items(True)
        _tracing.start_many(its, resolve)
        _tracing.end_many([it.trace for it in its], results, resolve)

    def spans(tr: Any, **kw: Any) -> Callable[[], None]:
        def run() -> None:
            for sp in [tr.start_span("send t", kind=kind, **kw) for _ in range(size)]:
                sp.end()

        return run

    runs: dict[str, Callable[[], None]] = {
        "sdk_span_bare": spans(tracer),
        "sdk_span": spans(tracer, attributes=attrs),
        "sdk_span_sampled_out": spans(never, attributes=attrs),
        "hooks_per_message": hooks,
        "untraced_items": lambda: items(False) and None,
    }
    repeats = 9
    calls = max(1, n // size // repeats)
    got: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            got[name].append(_per_call(fn, calls) / size)
    hooks_net = [
        h - i for h, i in zip(got["hooks_per_message"], got.pop("untraced_items"), strict=True)
    ]
    got["hooks_per_message"] = hooks_net
    # differences taken within each repeat (the machine's speed drifts between repeats)
    got["per_attribute"] = [
        (a - b) / len(attrs) for a, b in zip(got["sdk_span"], got["sdk_span_bare"], strict=True)
    ]
    # the hooks' own CPU: what they add to the SDK's span
    got["hooks_own_per_message"] = [h - s for h, s in zip(hooks_net, got["sdk_span"], strict=True)]
    pieces = {k: round(statistics.median(v), 2) for k, v in got.items()}
    pieces["attributes"] = len(attrs)
    return pieces


def _run_child(mode: str, namesrv: str, n: int) -> dict[str, Any]:
    """One mode's run (``mode="pieces"``: the pieces, no cluster needed) in its own process."""
    call = f"_pieces({n})" if mode == "pieces" else f"_child({mode!r}, {namesrv!r}, {n})"
    code = (_HIDE if mode == "off" else "") + (
        "from benchmarks.tracing_bench import _child, _pieces\n"
        "import json\n"
        f"print(json.dumps({call}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed: {proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--smoke", action="store_true", help="tiny N, one round")
    ap.add_argument("--n", type=int, default=50_000, help="messages per run")
    ap.add_argument("--rounds", type=int, default=5, help="runs of each mode, interleaved")
    args = ap.parse_args()
    n, rounds = (100, 1) if args.smoke else (args.n, args.rounds)

    from qclient import LocalCluster

    # smoke: the script's paths once, cheaply (each mode is a process start); the no-op
    # and sampled paths are the sdk path's with other providers
    modes = ("off", "sdk") if args.smoke else MODES
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with LocalCluster(brokers=1) as cluster:
        if args.smoke:  # paths, not figures: the processes side by side
            with ThreadPoolExecutor(len(modes)) as pool:
                done = pool.map(lambda m: _run_child(m, cluster.namesrv, n), modes)
                for mode, res in zip(modes, done, strict=True):
                    runs[mode].append(res)
        else:
            for r in range(rounds):
                # rotate the order so no mode always runs first (or after the same one)
                k = r % len(modes)
                for mode in modes[k:] + modes[:k]:
                    res = _run_child(mode, cluster.namesrv, n)
                    runs[mode].append(res)
                    print(
                        f"round {r + 1} {mode:>11}: {res['msgs_per_s']:>9.0f} msgs/s "
                        f"{res['cpu_us_per_msg']:>6.1f} µs CPU/msg",
                        file=sys.stderr,
                    )
    med = {
        m: {
            "msgs_per_s": round(statistics.median(x["msgs_per_s"] for x in runs[m]), 1),
            "cpu_us_per_msg": round(statistics.median(x["cpu_us_per_msg"] for x in runs[m]), 2),
            "gc_us_per_msg": round(statistics.median(x["gc_us_per_msg"] for x in runs[m]), 2),
            "failed": sum(x["failed"] for x in runs[m]),
        }
        for m in modes
    }
    pieces = _run_child("pieces", "", 300 if args.smoke else 20_000)
    base = med["off"]
    traced = modes[1:]
    slower = {m: round(1 - med[m]["msgs_per_s"] / base["msgs_per_s"], 4) for m in traced}
    cpu_more = {m: round(med[m]["cpu_us_per_msg"] / base["cpu_us_per_msg"] - 1, 4) for m in traced}
    # a client-bound producer's msgs/s goes as 1 / CPU per message
    cpu_bound_loss = {
        m: round(1 - base["cpu_us_per_msg"] / med[m]["cpu_us_per_msg"], 4) for m in traced
    }
    out: dict[str, Any] = {
        "messages_per_run": n,
        "rounds": rounds,
        "median": med,
        "throughput_loss": slower,
        "cpu_increase": cpu_more,
        "cpu_bound_throughput_loss": cpu_bound_loss,
        "throughput": {f"send_async tracing {m}": med[m]["msgs_per_s"] for m in modes},
        "targets": [
            {
                "name": f"send_async throughput loss (from CPU/msg), {m}",
                "value": cpu_bound_loss[m],
                "target": f"<= {GOALS[m]}",
                "met": cpu_bound_loss[m] <= GOALS[m],
            }
            for m in traced
        ],
        "pieces_us": pieces,
        # the SDK's span with qclient's attributes, against send_async's own CPU: no hook
        # code can bring the sdk mode under this
        "sdk_span_vs_send_async": round(pieces["sdk_span"] / base["cpu_us_per_msg"], 4),
        "notes": [
            "off = opentelemetry hidden; noop = API without an SDK; sdk = TracerProvider "
            "with a BatchSpanProcessor whose exporter drops the spans; sdk_sampled = the "
            "same, ParentBased(TraceIdRatioBased(0.1))",
            "medians of interleaved runs, each in its own process, one 1-broker cluster",
        ],
    }
    for m in modes:
        print(
            f"{m:>11}: {med[m]['msgs_per_s']:>9.0f} msgs/s "
            f"{med[m]['cpu_us_per_msg']:>6.1f} µs CPU/msg"
            + (
                ""
                if m == "off"
                else f"  msgs/s {-slower[m] * 100:+.1f} %, CPU/msg {cpu_more[m] * 100:+.1f} %,"
                f" client-bound msgs/s {-cpu_bound_loss[m] * 100:+.1f} %"
            )
        )
    _print_pieces(pieces, med)
    if args.json:
        print(json.dumps(out))


def _print_pieces(p: dict[str, float], med: dict[str, dict[str, Any]]) -> None:
    off = med["off"]["cpu_us_per_msg"]
    gcs = ", ".join(f"{m} {v['gc_us_per_msg']:.1f}" for m, v in med.items())
    print(
        "pieces, µs CPU each (SDK: TracerProvider + BatchSpanProcessor, exporter drops):\n"
        f"  SDK span start + end, no attributes          {p['sdk_span_bare']:6.1f}\n"
        f"  the same with qclient's {p['attributes']:.0f} attributes        "
        f"{p['sdk_span']:6.1f}  ({p['per_attribute']:.1f} per attribute)\n"
        f"  the same, sampled out                        {p['sdk_span_sampled_out']:6.1f}\n"
        f"  qclient's hooks per send_async message        {p['hooks_per_message']:6.1f}"
        f"  (SDK span included; qclient's own {p['hooks_own_per_message']:.1f})\n"
        f"  garbage collection per message in the runs:  {gcs}\n"
        f"  send_async untraced {off:.1f}: the SDK span alone adds "
        f"{p['sdk_span'] / off * 100:.0f} % to it (the goal: at most {GOALS['sdk'] * 100:.0f} %)"
    )


if __name__ == "__main__":
    main()
