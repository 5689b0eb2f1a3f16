"""Cost of OpenTelemetry tracing on ``send_async`` throughput: opentelemetry not
installed (hidden) vs the API with no SDK configured (a no-op provider) vs the SDK's
``BatchSpanProcessor`` (spans built and batched, the exporter drops them, so export I/O
is not measured), sampling every trace and 1 in 10. Each run is its own process against
one shared ``LocalCluster`` of 1 broker; the modes are interleaved, round after round,
and the medians compared: msgs/s acknowledged and the client's CPU time per message
(all its threads). On a shared machine wall-clock msgs/s is noisy; the CPU time is
not, and the throughput a client-bound producer loses is ``1 - cpu_off / cpu_mode``.

    python -m benchmarks.tracing_bench [--json] [--smoke] [--n N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
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


def _child(mode: str, namesrv: str, n: int) -> dict[str, Any]:
    if mode.startswith("sdk"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        sampled = mode == "sdk_sampled"
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)) if sampled else None)
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
    from qclient import Message, Producer, tracing

    assert (mode != "off") == tracing.AVAILABLE
    body = b"x" * 100
    with Producer(namesrv) as p:
        for _ in range(min(n, 2000)):  # warm-up: route, connections, sender thread
            p.send_async(Message("tracing-bench", body))
        p.flush(60)
        cpu0, t0 = time.process_time(), time.perf_counter()
        futures = [p.send_async(Message("tracing-bench", body)) for _ in range(n)]
        p.flush(120)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        failed = sum(f.exception() is not None for f in futures)
    return {
        "mode": mode,
        "messages": n,
        "failed": failed,
        "msgs_per_s": n / wall,
        "cpu_us_per_msg": cpu / n * 1e6,
    }


def _run_child(mode: str, namesrv: str, n: int) -> dict[str, Any]:
    code = (_HIDE if mode == "off" else "") + (
        "from benchmarks.tracing_bench import _child\n"
        "import json, sys\n"
        f"print(json.dumps(_child({mode!r}, {namesrv!r}, {n})))\n"
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
            "failed": sum(x["failed"] for x in runs[m]),
        }
        for m in modes
    }
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
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
