"""Measure what durable writes cost on this disk, to size the broker's group commit.

On a temp file on the same filesystem as ``--dir`` (default ``/work``), with 100 B records:
fsync/s and fdatasync/s at one record per sync (appending; overwriting a zero-filled
preallocated file; writing into a ``posix_fallocate``'d file), records/s with group commit
(N records in one write, then one fdatasync) for N in 1, 8, 32, 256, and O_DSYNC writes (one
record per write). Each case is bounded in time and
count and run ``--repeat`` times; the median is reported.

    python benchmarks/fsync_bench.py [--dir /work] [--duration 2.0] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RECORD = 100
GROUP_SIZES = (1, 8, 32, 256)
MAX_SYNCS = 100_000  # hard cap per run, on top of the time bound
PREALLOC_BYTES = 64 << 20


@dataclass
class Result:
    """One case, medians over repeats."""

    case: str
    group: int
    records_per_s: float
    syncs_per_s: float
    p50_ms: float
    p99_ms: float


def _record(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"r" * (RECORD - 8)


def _loop(
    fd: int, duration: float, group: int, sync: Callable[[int], None], wrap: int = 0
) -> tuple[int, float, list[float]]:
    """Write ``group`` records per step, then ``sync(fd)``; returns (syncs, wall, lat)."""
    lat: list[float] = []
    chunk = b"".join(_record(i) for i in range(group))
    start = time.perf_counter()
    end = start + duration
    while time.perf_counter() < end and len(lat) < MAX_SYNCS:
        t0 = time.perf_counter()
        if wrap and os.lseek(fd, 0, os.SEEK_CUR) + len(chunk) > wrap:
            os.lseek(fd, 0, os.SEEK_SET)  # stay inside the preallocated region
        os.write(fd, chunk)
        sync(fd)
        lat.append(time.perf_counter() - t0)
    return len(lat), time.perf_counter() - start, lat


def _no_sync(fd: int) -> None:
    """O_DSYNC: the write itself is durable."""


def run_case(d: Path, case: str, group: int, duration: float) -> tuple[float, float, float, float]:
    """One run of one case on a fresh file: (records/s, syncs/s, p50 ms, p99 ms)."""
    path = d / f"{case}-{group}.log"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    wrap = 0
    if case == "o_dsync":
        flags |= os.O_DSYNC
    fd = os.open(path, flags, 0o600)
    try:
        if case == "fdatasync_prealloc":
            # a preallocated, already-written and synced segment: no size/extent changes
            os.write(fd, b"\0" * PREALLOC_BYTES)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
            wrap = PREALLOC_BYTES
        elif case == "fdatasync_fallocate":
            # fallocate only: size is fixed, but ext4 extents start "unwritten"
            os.posix_fallocate(fd, 0, PREALLOC_BYTES)
            os.fsync(fd)
            wrap = PREALLOC_BYTES
        sync: Callable[[int], None] = {
            "fsync": os.fsync,
            "fdatasync": os.fdatasync,
            "fdatasync_prealloc": os.fdatasync,
            "fdatasync_fallocate": os.fdatasync,
            "group_commit": os.fdatasync,
            "o_dsync": _no_sync,
        }[case]
        n, wall, lat = _loop(fd, duration, group, sync, wrap)
    finally:
        os.close(fd)
        path.unlink()
    lat.sort()
    return (
        n * group / wall,
        n / wall,
        lat[len(lat) // 2] * 1e3,
        lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
    )


CASES: list[tuple[str, int]] = [
    ("fsync", 1),
    ("fdatasync", 1),
    ("fdatasync_prealloc", 1),
    ("fdatasync_fallocate", 1),
    *(("group_commit", g) for g in GROUP_SIZES),
    ("o_dsync", 1),
]


def measure(d: Path, duration: float, repeat: int) -> list[Result]:
    """Every case ``repeat`` times, interleaved so noise spreads evenly; medians."""
    runs: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {c: [] for c in CASES}
    for _ in range(repeat):
        for case, group in CASES:
            runs[(case, group)].append(run_case(d, case, group, duration))
    out = []
    for (case, group), rs in runs.items():
        med = [round(statistics.median(r[i] for r in rs), 3) for i in range(4)]
        out.append(Result(case, group, *med))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--dir",
        default=str(Path(__file__).resolve().parent.parent),
        help="a directory on the disk to measure (default: the repo)",
    )
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; median reported")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--smoke", action="store_true", help="tiny run: the same code paths")
    args = ap.parse_args()
    if args.smoke:
        args.duration, args.repeat = 0.1, 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="fsync-bench-", dir=args.dir) as tmp:
        d = Path(tmp)
        st = os.statvfs(d)
        results = measure(d, args.duration, args.repeat)
    print(
        f"dir: {args.dir} (dev {os.stat(args.dir).st_dev}, block {st.f_bsize}); "
        f"{RECORD} B records; {args.repeat} runs x {args.duration}s per case, medians"
    )
    print(f"{'case':<22}{'group':>6}{'records/s':>12}{'syncs/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for r in results:
        print(
            f"{r.case:<22}{r.group:>6}{r.records_per_s:>12.0f}{r.syncs_per_s:>10.0f}"
            f"{r.p50_ms:>9.3f}{r.p99_ms:>9.3f}"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "bench": "fsync",
                    "dir": args.dir,
                    "record_bytes": RECORD,
                    "repeat": args.repeat,
                    "duration_s": args.duration,
                    "results": [asdict(r) for r in results],
                }
            )
        )


if __name__ == "__main__":
    main()
