"""Server processes the bench starts: free ports, bounded start-up waits, kill -9, stop."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

__all__ = ["ServerProcess", "StartTimeout", "free_port", "port_open"]


class StartTimeout(RuntimeError):
    """A server did not become ready within its bounded wait."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _kill_tree(pid: int, sig: int) -> list[psutil.Process]:
    """Send ``sig`` to a process and all its descendants; returns the processes signalled."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    try:
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        procs = [root]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.send_signal(sig)
    return procs


class ServerProcess:
    """A server started from argv, ready when ``ready()`` is true; restartable on the same data.

    The process stays in the bench's process group (no new session), so a runner that kills
    the bench's group on a time-out takes the servers with it.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready: Callable[[], bool],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.ready = ready
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The pid of the started process, if running."""
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float) -> float:
        """Start and wait until ready; returns the seconds it took. Raises StartTimeout."""
        t0 = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
            )
        log.debug("%s: started pid %s: %s", self.name, self.proc.pid, " ".join(self.argv))

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise _Exited()
            return self.ready()

        deadline = t0 + timeout
        while time.monotonic() < deadline:
            try:
                if up():
                    return time.monotonic() - t0
            except _Exited:
                code = self.proc.returncode if self.proc else "?"
                self.stop()
                raise StartTimeout(
                    f"{self.name} exited with {code} while starting: {self._log_tail()}"
                ) from None
            except Exception:
                pass
            time.sleep(0.05)
        self.stop()
        raise StartTimeout(f"{self.name} did not start in {timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        """The server log's last non-empty line (the data dir may be gone later)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        lines = [ln.strip() for ln in lines if ln.strip()]
        return lines[-1][:200] if lines else "(empty log)"

    def kill9(self) -> None:
        """SIGKILL the server and every process it started; waits until they are gone."""
        if self.proc is None:
            return
        procs = _kill_tree(self.proc.pid, signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.proc = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server tree, wait up to ``timeout``, then SIGKILL what is left."""
        if self.proc is None:
            return
        procs = _kill_tree(self.proc.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.proc = None

    def __repr__(self) -> str:
        return f"ServerProcess({self.name!r}, pid={self.pid})"


class _Exited(Exception):
    """The server process exited while we waited for it."""


def env_with(**extra: str) -> dict[str, str]:
    """The current environment plus ``extra``."""
    env = dict(os.environ)
    env.update(extra)
    return env
