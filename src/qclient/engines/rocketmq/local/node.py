"""One local RocketMQ JVM (:class:`JvmNode`) and a one-shot blocking remoting call.

Every JVM is forked by one launcher thread that lives as long as the process, through a
wrapper that sets ``PR_SET_PDEATHSIG`` and execs it (``runtime.die_with_parent``): the
kernel SIGKILLs it when this Python process dies, however it dies. No Python code runs in
the forked child (no ``preexec_fn``), which keeps the sockets and thread-locals of this
process's other threads (a Spark driver's py4j connections) intact.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ....errors import ClusterError
from ..remoting import FrameDecoder, RemotingCommand, encode
from .cds import Archive, archive_for
from .runtime import LOOPBACK, JvmSpec, die_with_parent, jvm_argv, write_logback, write_properties

__all__ = ["JvmNode", "call"]

log = logging.getLogger(__name__)

_BOOT_LINE = b"boot success"

_launcher_lock = threading.Lock()
_launcher: tuple[int, ThreadPoolExecutor] | None = None


def _launch(fn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Run ``fn`` (a Popen) on the one launcher thread of this process: PR_SET_PDEATHSIG
    fires when the thread that forked the child ends, so the JVMs are forked by a thread
    that lives as long as the process, whichever thread starts a cluster or a node."""
    global _launcher
    with _launcher_lock:
        if _launcher is None or _launcher[0] != os.getpid():  # none yet, or forked since
            _launcher = (os.getpid(), ThreadPoolExecutor(1, "rocketmq-launcher"))
        pool = _launcher[1]
    return pool.submit(fn).result()


class JvmNode:
    """One NameServer or broker JVM, with the interface of ``qclient.cluster.NodeHandle``:
    ``.name``, ``.role``, ``.addr``, ``.pid``, ``.running``, ``.log_path`` and signals."""

    def __init__(
        self, name: str, role: str, main: str, home: Path, spec: JvmSpec, group: str = ""
    ) -> None:
        self.name = name
        self.role = role
        #: a broker's brokerName (its replicas share it; the node's own name when alone)
        self.group = group or name
        self.host = LOOPBACK
        self.port = 0
        self.home = home
        self.conf_path = home / f"{name}.conf"
        self.logback_path = home / "logback.xml"
        self.log_path = home.parent / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: the command line of the JVM last spawned (before that: as configured)
        self.argv: list[str] = []
        self._configured_argv: list[str] = []
        self._main = main
        self._spec = spec
        #: the class data archive of this node's main class (None: sharing off)
        self._archive: Archive | None = None
        #: this node's running JVM writes the archive when it exits (see ``cds``)
        self._writes_archive = False
        self._log_pos = 0
        #: the log's size when the JVM was last spawned: what it wrote since starts here
        self._spawn_pos = 0
        self._booted = False
        self._accepting = False
        #: more to wait for once the port accepts (a broker: its route), set by the cluster:
        #: None when ready, else what is still missing
        self.ready_check: Callable[[], str | None] | None = None

    def __repr__(self) -> str:
        return f"<JvmNode {self.role} {self.name} {self.addr} pid={self.pid}>"

    @property
    def addr(self) -> str:
        """``127.0.0.1:port``, the remoting address clients dial (and routes list)."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def writes_archive(self) -> bool:
        """This node's JVM writes the class data archive when it stops cleanly (``cds``):
        a cluster's teardown stops it rather than kill it."""
        return self._writes_archive and self.running

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def configure(self, java: str, lib: Path, props: Mapping[str, Any]) -> None:
        """Write the node's properties and logback file and build its command line."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = int(props["listenPort"])
        write_properties(self.conf_path, props)
        write_logback(self.logback_path, self.log_path)
        self.argv = self._configured_argv = jvm_argv(
            java,
            lib,
            self._main,
            conf=self.conf_path,
            home=self.home,
            logback=self.logback_path,
            spec=self._spec,
        )
        self._archive = archive_for(java, lib, self._main, self._spec.classpath)

    def spawn(self) -> None:
        """Start the JVM without waiting; ``wait_ready()`` waits."""
        if self.running:
            raise ClusterError(f"{self.role} {self.name} is already running")
        if not self._configured_argv:
            raise ClusterError(f"{self.role} {self.name} is not configured (start the cluster)")
        self.log_path.touch()
        self._spawn_pos = self._log_pos = self.log_path.stat().st_size  # a restart appends
        self._booted = self._accepting = False
        self._settle_archive(published=False)  # a JVM that exited on its own wrote none
        cds: list[str] = []
        if self._archive is not None:
            cds, self._writes_archive = self._archive.flags()
        java, *rest = self._configured_argv
        self.argv = [java, *cds, *rest]
        argv, home, log_path = die_with_parent(self.argv), self.home, self.log_path

        def popen() -> subprocess.Popen[bytes]:
            with open(log_path, "ab") as logfile:
                return subprocess.Popen(
                    argv,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=home,
                )

        self.process = _launch(popen)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the node serves: its boot line, its port, then ``ready_check``."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.process
            if proc is None:
                raise ClusterError(f"{self.role} {self.name} was not started")
            if proc.poll() is not None:
                raise ClusterError(
                    f"{self.role} {self.name} exited with code {proc.returncode}; "
                    f"{self._first_error()}log {self.log_path}: {self.log_tail()}"
                )
            missing = self._missing()
            if missing is None:
                return
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"{self.role} {self.name} not ready after {timeout:.0f} s (waiting for "
                    f"{missing}); log {self.log_path}: {self.log_tail()}"
                )
            time.sleep(0.05)

    def _missing(self) -> str | None:
        """What the node does not do yet: log its boot line, accept on its port, pass
        ``ready_check``; None when ready."""
        if not self._booted:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_pos)
                chunk = f.read()
            # keep a line's worth of overlap: the boot line may be half written
            last_nl = chunk.rfind(b"\n")
            if _BOOT_LINE in chunk[: last_nl + 1]:
                self._booted = True
            elif last_nl >= 0:
                self._log_pos += last_nl + 1
            if not self._booted:
                return "its boot line"
        if not self._accepting:  # once: each probe shows as three lines in the node's log
            if not _accepts(self.host, self.port):
                return f"a connection to {self.addr}"
            self._accepting = True
        return None if self.ready_check is None else self.ready_check()

    def start(self, timeout: float = 60.0) -> None:
        """Start (again) with the same name, ports and data dir; wait until it serves."""
        self.spawn()
        self.wait_ready(timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._settle_archive(published=False)

    def _settle_archive(self, published: bool) -> None:
        """After the JVM that writes the class data archive exited: put the archive in
        place (a clean stop) or drop what it left (killed)."""
        if self._writes_archive and self._archive is not None:
            self._writes_archive = False
            if published:
                self._archive.published()
            else:
                self._archive.abandoned()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (RocketMQ's shutdown hooks flush and unregister) and wait; SIGKILL after
        ``timeout``."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            self._settle_archive(published=False)  # it exited on its own: not a clean stop
            return
        stopped = False
        try:
            proc.send_signal(signal.SIGCONT)  # a paused JVM cannot run its shutdown hooks
            proc.terminate()
            proc.wait(timeout)
            stopped = True
        except subprocess.TimeoutExpired:
            log.warning("%s %s did not stop in %.0f s; killing it", self.role, self.name, timeout)
            proc.kill()
            proc.wait(10)
        except ProcessLookupError:
            pass
        finally:
            self._settle_archive(published=stopped)

    def pause(self) -> None:
        """SIGSTOP: the JVM hangs, its sockets stay open."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def logged_since_spawn(self, text: str) -> bool:
        """True when the log holds ``text`` anywhere in what was written since the JVM was
        last spawned (an exception's cause may be far from the end, behind the shutdown
        hooks' lines)."""
        needle = text.encode()
        overlap = max(0, len(needle) - 1)  # a match may straddle two reads
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._spawn_pos)
                carry = b""
                while chunk := f.read(1 << 20):
                    if needle in carry + chunk:
                        return True
                    carry = (carry + chunk)[-overlap:] if overlap else b""
        except OSError:
            return False
        return False

    def _first_error(self) -> str:
        """``first error: <line>; `` for the first ERROR or exception this start logged
        (a JVM that exits at boot logs its cause early, then its shutdown), else ''."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._spawn_pos)
                text = f.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""
        for line in text.splitlines():
            if " ERROR " in line or "Exception" in line:
                return f"first error: {line.strip()[:500]}; "
        return ""

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of the node's log, joined by `` | ``."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
                text = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def call(addr: str, cmd: RemotingCommand, timeout: float = 5.0) -> RemotingCommand:
    """Send one request on a fresh blocking connection and return its response; OSError
    (a refused connection, a timeout, a closed stream) when there is none."""
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode(cmd))
        decoder = FrameDecoder()
        while True:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            data = sock.recv(65536)
            if not data:
                raise ConnectionResetError(f"{addr} closed the connection")
            for reply in decoder.feed(data):
                if reply.is_response and reply.opaque == cmd.opaque:
                    return reply
