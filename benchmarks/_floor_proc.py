"""Start a floor server (``benchmarks._floor_server`` / ``benchmarks._floor_pull``) as a
child process that prints its port, and stop it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

__all__ = ["floor_process"]


@contextlib.contextmanager
def floor_process(module: str, *args: str) -> Iterator[tuple[int, int]]:
    """``(port, pid)`` of ``python -m module *args`` once it printed its port; killed on exit."""
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        if not port:
            raise RuntimeError(f"{module} did not start (exit {proc.poll()})")
        yield int(port), proc.pid
    finally:
        proc.kill()
        proc.wait(10)
