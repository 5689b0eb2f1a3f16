"""Hunt flaky tests: run chosen test modules (or the suite) N times the way ``make test``
runs them, with a process keeping one core busy beside them, and print failures per test.

    python tools/flake_hunt.py [--repeat N] [--no-hog] [--heaviest K] [PATH ...]
    make flake-hunt N=10 HEAVIEST=10            # the ten heaviest modules, ten times

``--heaviest K`` takes the K modules that took longest in the last ``make test`` (its
JUnit report, ``build/test-report.xml``). Each repetition is one pytest run with the
suite's options (three workers, the ``jvm`` group); a test counts as failed in a
repetition when it failed or errored there. The hog is one Python busy loop, started
before the first run and stopped after the last (a bound of its own ends it in any case).
Exit status 1 when any test failed in any repetition.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "build" / "test-report.xml"
#: the options ``make test`` gives pytest (Makefile), so a hunt meets the same scheduling
SUITE_ARGS = ["-q", "-n", "3", "--dist", "loadgroup", "--max-worker-restart=0"]
#: a repetition's bound: twice the 15-minute goal of a whole fresh-clone run
RUN_LIMIT_S = 30 * 60


def heaviest(report: Path, k: int) -> list[str]:
    """The ``k`` test modules with the most time in a JUnit report, heaviest first."""
    if not report.exists():
        sys.exit(f"flake_hunt: no {report.relative_to(ROOT)}: run `make test` first")
    per_module: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        path = case.get("classname", "").split(".")
        # classname is the module's dotted path, then the class for tests in a class
        for cut in range(len(path), 0, -1):
            candidate = Path(*path[:cut]).with_suffix(".py")
            if (ROOT / candidate).exists():
                per_module[str(candidate)] += float(case.get("time", 0.0))
                break
    return [m for m, _ in per_module.most_common(k)]


def outcomes(report: Path) -> dict[str, bool]:
    """Test id -> failed (a failure or an error), from one run's JUnit report."""
    result = {}
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        failed = case.find("failure") is not None or case.find("error") is not None
        result[name] = result.get(name, False) or failed
    return result


def start_hog(limit_s: float) -> subprocess.Popen[bytes]:
    """A process that keeps one core busy for at most ``limit_s`` seconds."""
    code = f"import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="*", help="test modules or node ids (default: the suite)")
    ap.add_argument("--repeat", "-n", type=int, default=10, help="repetitions (default 10)")
    ap.add_argument("--heaviest", type=int, default=0, help="add the K heaviest modules")
    ap.add_argument("--no-hog", action="store_true", help="run without the busy core")
    ap.add_argument("--pytest-arg", action="append", default=[], help="one more pytest option")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    paths = list(args.paths)
    if args.heaviest:
        paths += [m for m in heaviest(REPORT, args.heaviest) if m not in paths]
    print(f"flake hunt: {args.repeat} x {' '.join(paths) or 'the whole suite'}", flush=True)
    print(f"  with a busy core: {not args.no_hog}", flush=True)

    out_dir = ROOT / "build" / "flake-hunt"
    out_dir.mkdir(parents=True, exist_ok=True)
    failures: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    crashed: list[int] = []  # runs that left no report
    hog = None if args.no_hog else start_hog(args.repeat * RUN_LIMIT_S)
    try:
        for rep in range(1, args.repeat + 1):
            report = out_dir / f"run-{rep}.xml"
            report.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "pytest", *SUITE_ARGS, f"--junitxml={report}"]
            cmd += [*args.pytest_arg, *paths]
            t0 = time.monotonic()
            try:
                proc = subprocess.run(
                    cmd,
                    cwd=ROOT,
                    timeout=RUN_LIMIT_S,
                    check=False,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                code, tail = proc.returncode, proc.stdout.strip().splitlines()[-3:]
            except subprocess.TimeoutExpired:
                code, tail = -1, [f"run {rep} did not finish in {RUN_LIMIT_S} s"]
            took = time.monotonic() - t0
            got = outcomes(report) if report.exists() else {}
            for test, failed in got.items():
                runs[test] += 1
                failures[test] += failed
            if not got and code != 0:
                crashed.append(rep)
            summary = tail[-1] if tail else ""
            print(f"run {rep}/{args.repeat}: exit {code}, {took:.0f} s, {summary}", flush=True)
            if code not in (0, 1):  # not a test failure: a usage error, an interrupt, a crash
                print("\n".join(tail), flush=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()

    flaky = sorted((t for t in failures if failures[t]), key=lambda t: -failures[t])
    print(f"\n{len(runs)} tests, {args.repeat} runs; failures per test:")
    for test in flaky:
        print(f"  {failures[test]}/{runs[test]}  {test}")
    if not flaky and not crashed:
        print("  none")
    if crashed:
        print(f"runs with no report (timed out or crashed): {crashed}")
    return 1 if flaky or crashed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
