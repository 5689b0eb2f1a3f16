"""Apache RocketMQ's own Java client as a peer: runs ``io.qclient.peer.Main`` (the jar that
``make java-peer`` builds from tools/rocketmq/java) as a child process and parses the JSON lines
it prints. Tests use it to check that a Java consumer reads exactly what qclient sent and that
qclient reads what Java sent; benchmarks use ``run_bench`` as the producer qclient is compared
with.

Every run has a bounded time: the child is killed when it overruns, and the error names the
tail of its stderr (the client's log). :class:`JavaProducers` keeps one JVM (``Main serve``)
with named producers for a benchmark's whole run: its phases interleave with qclient's on a
JVM that compiled its send path once, and several Java producers can measure together.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = [
    "JAR",
    "LIB",
    "JavaPeerError",
    "JavaProducers",
    "JavaRun",
    "java_peer_available",
    "read_timeline",
    "run_bench",
    "run_consume",
    "run_produce",
]

_ROOT = Path(__file__).resolve().parent.parent
_JAVA_DIR = _ROOT / "tools" / "rocketmq" / "java"
#: The peer's jar (``make java-peer``) and the RocketMQ jars it runs with (``make setup``).
JAR = _JAVA_DIR / "target" / "qclient-java-peer.jar"
LIB = _ROOT / "tools" / "rocketmq" / "lib"

#: JVM options of the short consume/produce runs: C1 only and the serial collector start a
#: small JVM with less CPU on a 2-core machine. Bench runs use the JVM's defaults, whose
#: C2-compiled send path is the one a Java service runs.
_QUICK_JVM = ("-Xms64m", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
_BENCH_JVM = ("-Xms256m", "-Xmx512m")
#: Seconds a JVM gets on top of its own bound to start, connect and shut down.
_SLACK_S = 30.0


class JavaPeerError(RuntimeError):
    """The Java peer exited with an unexpected status, overran its time, or printed no result."""


def java_peer_available() -> str | None:
    """Why the Java peer cannot run here (no java, no RocketMQ jars, jar missing or older than
    its sources), or None when it can."""
    if shutil.which("java") is None:
        return "java is not on PATH"
    if not any(LIB.glob("rocketmq-client-*.jar")):
        return f"no RocketMQ client jar in {LIB} (make setup)"
    if not JAR.is_file():
        return f"{JAR} is missing (make java-peer)"
    sources = [_JAVA_DIR / "pom.xml", *(_JAVA_DIR / "src").rglob("*.*")]
    jar_mtime = JAR.stat().st_mtime
    if any(p.stat().st_mtime > jar_mtime for p in sources):
        return f"{JAR} is older than its sources (make java-peer)"
    return None


def _run(
    subcommand: str,
    args: Sequence[str],
    timeout_s: float,
    jvm: Sequence[str],
    ok_codes: set[int],
    out_path: Path | None = None,
) -> list[dict[str, Any]]:
    """Run ``Main subcommand args`` and return its JSON lines; kill it after ``timeout_s``.
    With ``out_path`` its stdout goes to that file as it prints (``read_lines`` reads what
    is there so far)."""
    why = java_peer_available()
    if why is not None:
        raise JavaPeerError(why)
    with tempfile.TemporaryDirectory(prefix="qclient-javapeer-") as home:
        # user.home, java.io.tmpdir: what the client keeps on disk lands in the throwaway
        # directory.
        cmd = [
            "java",
            *jvm,
            f"-Duser.home={home}",
            f"-Djava.io.tmpdir={home}",
            "-cp",
            f"{JAR}{os.pathsep}{LIB}{os.sep}*",
            "io.qclient.peer.Main",
            subcommand,
            *args,
        ]
        err_path = Path(home) / "stderr.log"
        with (
            open(err_path, "wb") as err,
            open(out_path, "wb") if out_path else contextlib.nullcontext() as out_file,
        ):
            stdout = out_file if out_file is not None else subprocess.PIPE
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=err, cwd=home)
            try:
                out, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise JavaPeerError(
                    f"java peer {subcommand} overran {timeout_s:.0f} s and was killed; "
                    f"stderr tail:\n{_tail(err_path)}"
                ) from None
        if proc.returncode not in ok_codes:
            raise JavaPeerError(
                f"java peer {subcommand} exited {proc.returncode}; stderr tail:\n{_tail(err_path)}"
            )
    if out_path is not None:
        return read_lines(out_path)
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The whole JSON lines a peer has printed into ``path`` so far."""
    text = path.read_text() if path.exists() else ""
    return [
        json.loads(ln)
        for ln in text.splitlines(keepends=True)
        if ln.endswith("\n") and ln.startswith("{")
    ]


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _flags(**flags: object) -> list[str]:
    """``--name value`` for each flag that is not None (``_`` in a name becomes ``-``)."""
    out: list[str] = []
    for name, value in flags.items():
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += [f"--{name.replace('_', '-')}", text]
    return out


def run_consume(
    namesrv_addr: str,
    topic: str,
    group: str,
    count: int,
    timeout_s: float,
    tags: str | None = None,
    settle_s: float | None = None,
    stop_file: Path | None = None,
    out_path: Path | None = None,
) -> list[dict[str, Any]]:
    """The messages a clustering Java consumer of ``group`` reads from the first offset of
    ``topic``, stopping at ``count`` (possibly a few more: the last pull batch is reported
    whole), ``settle_s`` after it when given (so copies beyond the count show up too), or
    after ``timeout_s`` (possibly fewer), or once ``stop_file`` exists: with ``out_path``, a
    caller reads the lines as they come (``read_lines``) and creates ``stop_file`` when it
    has seen enough. Each is a dict with uniqKey, msgId (the broker's
    offset id), topic, tags, keys, body_b64, properties, bornTimestamp, storeTimestamp,
    receivedMs, queueId, queueOffset, brokerName and reconsumeTimes. Duplicates are kept."""
    args = _flags(
        namesrv=namesrv_addr,
        topic=topic,
        group=group,
        count=count,
        timeout_ms=int(timeout_s * 1000),
        tags=tags,
        settle_ms=None if settle_s is None else int(settle_s * 1000),
        stop_file=stop_file,
    )
    lines = _run("consume", args, timeout_s + _SLACK_S, _QUICK_JVM, {0}, out_path)
    if not lines or not lines[-1].get("done"):
        raise JavaPeerError("java peer consume printed no final line")
    return lines[:-1]


def run_produce(
    namesrv_addr: str,
    topic: str,
    count: int,
    *,
    delay_ms: int | None = None,
    deliver_at_ms: int | None = None,
    tags: str | None = None,
    keys: str | None = None,
    props: Mapping[str, str] | None = None,
    body: str | None = None,
    group: str | None = None,
    send_timeout_ms: int | None = None,
    timeout_s: float = 60.0,
) -> list[dict[str, Any]]:
    """Send ``count`` messages one by one with the Java producer and return one dict per send:
    uniqKey, msgId (broker offset id), status, queueId, queueOffset, brokerName, recallHandle,
    deliverAtMs, keys, sentMs -- or index and error for a send that failed. ``{i}`` in
    ``body`` and ``keys`` is the message's index (default body ``java-peer-{i}``);
    ``delay_ms`` gives each message a deliver time of its send time plus the delay;
    ``send_timeout_ms`` the producer's ``sendMsgTimeout`` (the client's 3 s by default)."""
    args = _flags(
        namesrv=namesrv_addr,
        topic=topic,
        count=count,
        delay_ms=delay_ms,
        deliver_at_ms=deliver_at_ms,
        tags=tags,
        keys=keys,
        body=body,
        group=group,
        send_timeout_ms=send_timeout_ms,
    )
    for key, value in (props or {}).items():
        args += ["--prop", f"{key}={value}"]
    return _run("produce", args, timeout_s, _QUICK_JVM, {0, 1})


def run_bench(
    namesrv_addr: str,
    topic: str,
    mode: str,
    *,
    count: int | None = None,
    threads: int | None = None,
    body_size: int = 100,
    delay_ms: int | None = None,
    latency_fault_enable: bool | None = None,
    duration_s: int | None = None,
    out: Path | None = None,
    rate: int | None = None,
    warmup: int | None = None,
    inflight: int | None = None,
    key_prefix: str | None = None,
    group: str | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """One Java producer run (mode one-call, threads, async or faults; see Bench.java) and its
    summary: count, ok, errors, error_kinds, elapsed_s, msgs_per_s, p50/p90/p99/p999/max/mean
    latency in ms, and the producer's effective settings. ``out`` (required for faults)
    receives the timeline of every send; read it with :func:`read_timeline`. The run is
    bounded by ``count`` and ``duration_s``; ``timeout_s`` (default: the duration, or 600 s,
    plus slack) kills it."""
    args = _flags(
        namesrv=namesrv_addr,
        topic=topic,
        mode=mode,
        count=count,
        threads=threads,
        body_size=body_size,
        delay_ms=delay_ms,
        latency_fault_enable=latency_fault_enable,
        duration_s=duration_s,
        out=out,
        rate=rate,
        warmup=warmup,
        inflight=inflight,
        key_prefix=key_prefix,
        group=group,
    )
    bound = timeout_s if timeout_s is not None else (duration_s or 600) + _SLACK_S
    lines = _run("bench", args, bound, _BENCH_JVM, {0})
    if not lines:
        raise JavaPeerError("java peer bench printed no summary")
    return lines[-1]


def read_timeline(path: Path) -> list[dict[str, Any]]:
    """The sends of a bench timeline, ordered by start: startMs, endMs (epoch ms, fractional),
    ok, key, uniqKey, broker (the broker name that acknowledged it), thread, error."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# --- one JVM, named producers (Main serve) ---------------------------------------------------


class JavaRun:
    """A measurement under way in a :class:`JavaProducers` JVM."""

    def __init__(self, owner: JavaProducers, run_id: str) -> None:
        self._owner = owner
        self.id = run_id
        #: epoch ms at which the measured phase began (set by :meth:`wait_measuring`)
        self.start_ms: float | None = None

    def wait_measuring(self, timeout_s: float) -> float:
        """Wait until the measured phase begins (after the warm-up); its start, epoch ms."""
        line = self._owner._next(self.id, timeout_s, ("measuring",))
        self.start_ms = float(line["startMs"])
        return self.start_ms

    def result(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the run's end; its summary (see :func:`run_bench`)."""
        while True:
            line = self._owner._next(self.id, timeout_s, ("measuring", "done"))
            if line["event"] == "done":
                summary: dict[str, Any] = line["summary"]
                return summary
            self.start_ms = float(line["startMs"])


class JavaProducers:
    """``with JavaProducers() as jp:`` one JVM running ``Main serve``: :meth:`open` starts a
    named ``DefaultMQProducer`` (the client's defaults but for the loopback settings and what
    is given), :meth:`run` / :meth:`start` measure on it like :func:`run_bench` (the same flags,
    plus ``producer``, ``warmup_topic`` and ``start_at_ms``). Leaving the block ends the JVM
    (killed when it does not exit within 10 s); every wait has a deadline, and a JVM that
    died raises :class:`JavaPeerError` with its stderr tail."""

    def __init__(self) -> None:
        self._home: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._queues: dict[str, queue.Queue[dict[str, Any] | None]] = {}
        self._lock = threading.Lock()
        self._runs = 0
        self._eof = False

    def __enter__(self) -> JavaProducers:
        why = java_peer_available()
        if why is not None:
            raise JavaPeerError(why)
        self._home = tempfile.TemporaryDirectory(prefix="qclient-javaserve-")
        home = self._home.name
        self._err = open(Path(home) / "stderr.log", "wb")  # closed in __exit__
        cmd = [
            "java",
            *_BENCH_JVM,
            f"-Duser.home={home}",
            f"-Djava.io.tmpdir={home}",
            "-cp",
            f"{JAR}{os.pathsep}{LIB}{os.sep}*",
            "io.qclient.peer.Main",
            "serve",
        ]
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, cwd=home
            )
            threading.Thread(target=self._read, name="java-serve-reader", daemon=True).start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(OSError, ValueError):
                assert proc.stdin is not None
                proc.stdin.write(b"exit\n")
                proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._err is not None:
            self._err.close()
        if self._home is not None:
            self._home.cleanup()

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def _read(self) -> None:
        """The reader thread: each JSON line to the queue of its id; at EOF a None to all."""
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            if not raw.startswith(b"{"):
                continue
            line = json.loads(raw)
            self._queue(str(line.get("id"))).put(line)
        with self._lock:
            self._eof = True
            for q in self._queues.values():
                q.put(None)

    def _queue(self, key: str) -> queue.Queue[dict[str, Any] | None]:
        with self._lock:
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = queue.Queue()
                if self._eof:
                    q.put(None)
            return q

    def _send(self, words: Sequence[str]) -> None:
        if any(not w or any(c.isspace() for c in w) for w in words):
            raise ValueError(f"serve command words must be non-empty without spaces: {words}")
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write((" ".join(words) + "\n").encode())
        self._proc.stdin.flush()

    def _next(self, key: str, timeout_s: float, events: Sequence[str]) -> dict[str, Any]:
        """The next line of ``key`` (one of ``events``); JavaPeerError on an error line, the
        JVM's death or the deadline."""
        try:
            line = self._queue(key).get(timeout=timeout_s)
        except queue.Empty:
            raise JavaPeerError(
                f"java serve: no {'/'.join(events)} for {key} within {timeout_s:.0f} s; "
                f"stderr tail:\n{self.stderr_tail()}"
            ) from None
        if line is None:
            self._queue(key).put(None)  # later waits see the end too
            raise JavaPeerError(f"java serve exited; stderr tail:\n{self.stderr_tail()}")
        if line.get("event") not in events:
            raise JavaPeerError(f"java serve: {key}: {line}")
        return line

    def stderr_tail(self) -> str:
        """The last lines the JVM logged."""
        return _tail(Path(self._home.name) / "stderr.log") if self._home else ""

    def open(
        self,
        name: str,
        namesrv_addr: str,
        *,
        latency_fault_enable: bool | None = None,
        send_timeout_ms: int | None = None,
        poll_namesrv_ms: int | None = None,
        group: str | None = None,
        timeout_s: float = 60.0,
    ) -> dict[str, Any]:
        """Start producer ``name``; its effective settings."""
        flags = _flags(
            namesrv=namesrv_addr,
            group=group,
            latency_fault_enable=latency_fault_enable,
            send_timeout_ms=send_timeout_ms,
            poll_namesrv_ms=poll_namesrv_ms,
        )
        self._send(["open", name, *flags])
        settings: dict[str, Any] = self._next(name, timeout_s, ("opened",))["producer"]
        return settings

    def close(self, name: str, timeout_s: float = 60.0) -> None:
        """Shut producer ``name`` down."""
        self._send(["close", name])
        self._next(name, timeout_s, ("closed",))

    def start(self, producer: str, topic: str, mode: str, **flags: Any) -> JavaRun:
        """Begin a measurement on ``producer`` (flags as :func:`run_bench`'s, ``_`` for ``-``,
        plus ``warmup_topic`` and ``start_at_ms``); it runs in a thread of the JVM's own."""
        with self._lock:
            self._runs += 1
            run_id = f"run{self._runs}"
        args = _flags(producer=producer, topic=topic, mode=mode, **flags)
        self._send(["run", run_id, *args])
        return JavaRun(self, run_id)

    def run(
        self, producer: str, topic: str, mode: str, timeout_s: float = 600.0, **flags: Any
    ) -> dict[str, Any]:
        """One measurement on ``producer``, waited for; its summary."""
        t0 = time.monotonic()
        r = self.start(producer, topic, mode, **flags)
        r.wait_measuring(timeout_s)
        return r.result(max(1.0, timeout_s - (time.monotonic() - t0)))
