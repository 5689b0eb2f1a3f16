"""Fixtures shared by the server tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(mnt: Path, leave: int) -> Path:
    """A ballast file on ``mnt`` that leaves about ``leave`` bytes free."""
    ballast = mnt / "ballast"
    with open(ballast, "ab") as f:
        chunk = bytes(1 << 20)
        while free_bytes(mnt) > leave + len(chunk):
            f.write(chunk)
            f.flush()
        with contextlib.suppress(OSError):  # ENOSPC when asked to leave nothing
            f.write(bytes(max(0, free_bytes(mnt) - leave)))
            f.flush()
    return ballast


@pytest.fixture
def small_fs() -> Iterator[Callable[[Path, int], Path]]:
    """``small_fs(dir, mb)`` mounts a ``mb`` MiB tmpfs on ``dir`` (made if missing), the
    size-limited disk of the disk-full tests; every mount is undone at the end. Skips the
    test where mounting is not allowed (not root)."""
    mounted: list[Path] = []

    def mount(path: Path, mb: int) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode:
            pytest.skip(f"cannot mount a size-limited tmpfs here: {r.stderr.strip()}")
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for p in reversed(mounted):
            subprocess.run(["umount", "-l", str(p)], check=False, capture_output=True)
