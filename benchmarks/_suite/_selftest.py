"""A stand-in scenario for the runner's own tests: prints JSON, hangs, or prints garbage."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--mode", choices=["ok", "hang", "garbage", "fail"], default="ok")
    ap.add_argument("--pidfile", default="")
    args = ap.parse_args()
    if args.mode == "hang":
        # A child in the same process group, as a server started by a scenario would be.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if args.pidfile:
            with open(args.pidfile, "w") as f:
                f.write(str(child.pid))
        time.sleep(600)
    if args.mode == "fail":
        print("boom", file=sys.stderr)
        return 3
    print("free-form output first")
    if args.mode == "garbage":
        print("not json")
        return 0
    print(
        json.dumps(
            {
                "scenario": "selftest",
                "smoke": args.smoke,
                "value": 42,
                "throughput": {"selftest": 1000.0},
                "targets": [{"name": "value", "value": 42, "target": ">= 40", "met": True}],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
