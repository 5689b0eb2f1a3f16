"""Run every scenario script as a bounded subprocess and collect the JSON each one prints."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["SCENARIOS", "Scenario", "main", "run_scenario", "run_suite"]

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
DEFAULT_OUT = BENCH / "results"


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scenario script: its module under ``benchmarks`` and its time limits."""

    name: str
    module: str
    timeout_s: float
    #: a bound against a hang, not a speed goal: a 2-core host loaded by the test suite runs
    #: a smoke 3-4x slower than a quiet one (rebalance_bench: 49 s quiet, over 60 s loaded)
    smoke_timeout_s: float = 180.0
    #: extra arguments for the full run
    args: tuple[str, ...] = ()
    #: extra arguments for the smoke run
    smoke_args: tuple[str, ...] = ()
    #: False for a one-off decision experiment (its result is a record in docs/decisions/): the
    #: suite still runs it, ``make test`` does not smoke-run it
    smoke: bool = True
    #: the JVMs its smoke run starts, "rocketmq" (a cluster, RocketMQ's Java client) or
    #: "spark": ``make test`` runs it in that group's worker (docs/TESTING.md, the budget)
    jvm: str | None = None

    @property
    def path(self) -> Path:
        """The script file (or package directory) this scenario runs."""
        rel = self.module.split(".", 1)[1].replace(".", "/")
        pkg = BENCH / rel
        return pkg if pkg.is_dir() else BENCH / f"{rel}.py"

    def exists(self) -> bool:
        """Whether the script has been written yet."""
        return self.path.exists()


SCENARIOS: list[Scenario] = [
    Scenario("producer_bench", "benchmarks.producer_bench", 300),
    Scenario("tracing_bench", "benchmarks.tracing_bench", 600),
    Scenario("one_call_bench", "benchmarks.one_call_bench", 300),
    Scenario("broker_bench", "benchmarks.broker_bench", 600),
    Scenario("failover_bench", "benchmarks.failover_bench", 600),
    Scenario("store_bench", "benchmarks.store_bench", 1200),
    # --max-seconds 240 bounds its own sizes; the margin is start-up and the last restart
    Scenario("recovery_bench", "benchmarks.recovery_bench", 360),
    Scenario("lifecycle_bench", "benchmarks.lifecycle_bench", 600),
    Scenario("chaos_bench", "benchmarks.chaos_bench", 1500, smoke_timeout_s=120),
    Scenario("spark_bench", "benchmarks.spark_bench", 600, smoke_timeout_s=420, jvm="spark"),
    Scenario("http_stack_bench", "benchmarks.http_stack_bench", 300, smoke=False),
    Scenario("fsync_bench", "benchmarks.fsync_bench", 180, smoke=False),
    Scenario("consume_bench", "benchmarks.consume_bench", 900),  # 3 interleaved rounds per rate
    Scenario("rebalance_bench", "benchmarks.rebalance_bench", 600),
    Scenario("engines_bench", "benchmarks.engines_bench", 900, smoke_timeout_s=300, jvm="rocketmq"),
    Scenario("retry_bench", "benchmarks.retry_bench", 180),
    # 200,000 due at one instant, a group of two: our broker, then RocketMQ's (make bench)
    Scenario("spike_bench", "benchmarks.spike_bench", 600, smoke_timeout_s=120),
    Scenario(
        "spike_bench_rocketmq",
        "benchmarks.spike_bench",
        900,
        args=("--engine", "rocketmq"),
        smoke=False,
    ),
    # a consumer subscribed before its topic existed: each broker's first messages
    Scenario("new_topic_bench", "benchmarks.new_topic_bench", 180),
    Scenario(
        "new_topic_bench_rocketmq",
        "benchmarks.new_topic_bench",
        300,
        args=("--engine", "rocketmq"),
        smoke=False,
    ),
    # the same on RocketMQ's JVMs: in make bench only (make test smoke-runs the qclient one)
    Scenario(
        "retry_bench_rocketmq",
        "benchmarks.retry_bench",
        300,
        args=("--engine", "rocketmq"),
        smoke=False,
    ),
    # qclient's producer vs RocketMQ's Java producer: ~6 min, longer on a loaded host
    Scenario(
        "java_producer_bench",
        "benchmarks.java_producer_bench",
        900,
        smoke_timeout_s=360,
        jvm="rocketmq",
    ),
    Scenario("peers", "benchmarks.peers", 1200, smoke_timeout_s=120),
]


def select(only: list[str] | None) -> list[Scenario]:
    """The scenarios named in ``only`` (all when empty); unknown names raise ValueError."""
    if not only:
        return list(SCENARIOS)
    known = {s.name: s for s in SCENARIOS}
    # "broker" is accepted for "broker_bench"
    names = [n if n in known else f"{n}_bench" for n in only]
    unknown = [o for o, n in zip(only, names, strict=True) if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]


def _supports_smoke(sc: Scenario, env: dict[str, str]) -> bool | str:
    """Whether the script takes ``--smoke``; a script whose ``--help`` fails is broken,
    not short of the flag: the reason (its last line of stderr) instead."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", sc.module, "--help"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "--help did not finish in 60 s"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"--help failed ({out.returncode}): {last}"
    return "--smoke" in out.stdout


def _kill_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def _last_json(stdout: str) -> dict[str, Any] | None:
    """The JSON object that ends the output: its last line, or (tolerated) a pretty-printed
    object that starts at the beginning of a line further up."""
    text = stdout.rstrip()
    if not text:
        return None
    lines = text.splitlines()
    try:
        value = json.loads(lines[-1])
        return value if isinstance(value, dict) else None
    except ValueError:
        pass
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                value = json.loads("\n".join(lines[i:]))
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
    return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_scenario(
    sc: Scenario, *, smoke: bool, logs: Path, extra_args: tuple[str, ...] = (), tick: Any = None
) -> dict[str, Any]:
    """Run one scenario with its time limit; never raises. ``tick()`` is called ~1/s."""
    rec: dict[str, Any] = {"module": sc.module}
    if not sc.exists():
        return {**rec, "status": "missing", "reason": f"{sc.path.relative_to(REPO)} not written"}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("MPLBACKEND", "Agg")
    if smoke:
        supports = _supports_smoke(sc, env)
        if isinstance(supports, str):
            return {**rec, "status": "error", "reason": supports}
        if not supports:
            return {**rec, "status": "skipped", "reason": "script has no --smoke flag"}
    args = ["--json", *(("--smoke", *sc.smoke_args) if smoke else sc.args), *extra_args]
    timeout = sc.smoke_timeout_s if smoke else sc.timeout_s
    logs.mkdir(parents=True, exist_ok=True)
    out_path, err_path = logs / f"{sc.name}.out", logs / f"{sc.name}.log"
    rec.update(args=args, timeout_s=timeout, log=str(err_path))
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        # Own process group: on a time-out the whole tree (servers included) is signalled.
        proc = subprocess.Popen(
            [sys.executable, "-m", sc.module, *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        timed_out = False
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout:
                    timed_out = True
                    _kill_group(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        _kill_group(proc.pid, signal.SIGKILL)
                        proc.wait(10)
                    break
                if tick is not None:
                    tick()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(1.0)
        except BaseException:
            _kill_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            _kill_group(proc.pid, signal.SIGKILL)
            raise
        finally:
            # Anything the script left behind in its group goes too.
            _kill_group(proc.pid, signal.SIGKILL)
    rec["elapsed_s"] = round(time.monotonic() - t0, 2)
    rec["exit_code"] = proc.returncode
    result = _last_json(out_path.read_text(errors="replace"))
    if timed_out:
        rec.update(status="timeout", reason=f"no result within {timeout:.0f} s")
    elif proc.returncode != 0:
        rec.update(
            status="error", reason=f"exit {proc.returncode}: {_tail(err_path, 8) or '(no stderr)'}"
        )
    elif result is None:
        rec.update(status="error", reason="last stdout line is not a JSON object")
    else:
        rec["status"] = "ok"
    if result is not None:
        rec["result"] = result
    return rec


def _last_line(path: Path, width: int = 50) -> str:
    """The last non-empty line of a log, cut to ``width`` characters (for the progress bar)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 2048))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:width] if lines else ""


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _host() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        import psutil

        info["mem_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:
        pass
    return info


def run_suite(
    scenarios: list[Scenario],
    *,
    smoke: bool,
    out_dir: Path,
    peer_args: tuple[str, ...] = (),
    progress: bool = True,
    merge: bool = False,
) -> dict[str, Any]:
    """Run the scenarios in order, write latest.json and REPORT.md; returns the results.

    With ``merge``, scenarios not run now keep their results from the existing latest.json.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    results: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "smoke": smoke,
        "git": _git_commit(),
        "host": _host(),
        "scenarios": {},
    }
    if merge:
        try:
            old = json.loads((out_dir / "latest.json").read_text())
            kept = {
                k: v
                for k, v in old.get("scenarios", {}).items()
                if k not in {sc.name for sc in scenarios}
            }
            for rec in kept.values():
                rec["from_earlier_run"] = old.get("started_at")
            results["scenarios"].update(kept)
            results["merged_from"] = old.get("started_at")
        except (OSError, ValueError):
            pass
    bar: Any = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(
                total=len(scenarios),
                unit="scenario",
                file=sys.stderr,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}] {postfix}",
            )
        except ImportError:
            bar = None
    try:
        for sc in scenarios:
            t0 = time.monotonic()

            def tick(name: str = sc.name, t0: float = t0) -> None:
                if bar is not None:
                    last = _last_line(out_dir / "logs" / f"{name}.log")
                    bar.set_postfix_str(f"{name} {time.monotonic() - t0:.0f}s {last}")

            tick()
            extra = peer_args if sc.name == "peers" else ()
            rec = run_scenario(sc, smoke=smoke, logs=out_dir / "logs", extra_args=extra, tick=tick)
            results["scenarios"][sc.name] = rec
            msg = f"{sc.name}: {rec['status']}"
            if rec.get("reason") and rec["status"] != "ok":
                msg += f" ({rec['reason'].splitlines()[0][:120]})"
            if bar is not None:
                bar.update(1)
                bar.write(msg, file=sys.stderr)
            else:
                print(msg, file=sys.stderr)
    finally:
        if bar is not None:
            bar.close()
    order = {sc.name: i for i, sc in enumerate(SCENARIOS)}
    results["scenarios"] = dict(
        sorted(results["scenarios"].items(), key=lambda kv: order.get(kv[0], len(order)))
    )
    results["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    (out_dir / "latest.json").write_text(json.dumps(results, indent=1) + "\n")
    from benchmarks._suite.report import write_report

    write_report(results, out_dir)
    return results


def main(argv: list[str] | None = None) -> int:
    """CLI of `python -m benchmarks`."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="every scenario with tiny N")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    ap.add_argument("--peers", default="", help="comma-separated peer labels (peers scenario)")
    ap.add_argument("--peers-n", type=int, default=None, help="messages per peer phase")
    ap.add_argument(
        "--setup-peers",
        action="store_true",
        help="run benchmarks/setup_peers.sh first (apt-get + pip; a no-op when installed)",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep earlier results (latest.json) of the scenarios not run now",
    )
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if args.list:
        for sc in SCENARIOS:
            state = "" if sc.exists() else "  (missing)"
            print(f"{sc.name:<18} {sc.module}{state}")
        return 0
    try:
        scenarios = select([s for s in args.only.split(",") if s])
    except ValueError as exc:
        print(f"benchmarks: {exc}", file=sys.stderr)
        return 2
    if args.setup_peers:
        env = {**os.environ, "PYTHON": sys.executable}
        rc = subprocess.run(["bash", str(BENCH / "setup_peers.sh")], env=env, check=False)
        if rc.returncode != 0:
            print(
                "benchmarks: setup_peers.sh failed; peers not installed are skipped",
                file=sys.stderr,
            )
    peer_args: tuple[str, ...] = ()
    if args.peers:
        peer_args += ("--only", args.peers)
    if args.peers_n:
        peer_args += ("--n", str(args.peers_n))
    results = run_suite(
        scenarios,
        smoke=args.smoke,
        out_dir=args.out,
        peer_args=peer_args,
        progress=not args.no_progress,
        merge=args.merge,
    )
    print(f"wrote {args.out / 'latest.json'} and {args.out / 'REPORT.md'}")
    bad = [n for n, r in results["scenarios"].items() if r["status"] in ("error", "timeout")]
    if bad:
        print(f"failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
