"""Apache RocketMQ's own Java client as a peer: runs ``io.qclient.peer.Main`` (the jar that
``make java-peer`` builds from tools/rocketmq/java) as a child process and parses the JSON lines
it prints. Tests use it to check that a Java consumer reads exactly what qclient sent and that
qclient reads what Java sent; benchmarks use ``run_bench`` as the producer qclient is compared
with.

Every run has a bounded time: the child is killed when it overruns, and the error names the
tail of its stderr (the client's log).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "JAR",
    "LIB",
    "JavaPeerError",
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
    subcommand: str, args: Sequence[str], timeout_s: float, jvm: Sequence[str], ok_codes: set[int]
) -> list[dict[str, Any]]:
    """Run ``Main subcommand args`` and return its JSON lines; kill it after ``timeout_s``."""
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
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=home)
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
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


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
) -> list[dict[str, Any]]:
    """The messages a clustering Java consumer of ``group`` reads from the first offset of
    ``topic``, stopping at ``count`` (possibly a few more: the last pull batch is reported
    whole) or after ``timeout_s`` (possibly fewer). Each is a dict with uniqKey, msgId (the
    broker's offset id), topic, tags, keys, body_b64, properties, bornTimestamp,
    storeTimestamp, receivedMs, queueId, queueOffset, brokerName and reconsumeTimes."""
    args = _flags(
        namesrv=namesrv_addr,
        topic=topic,
        group=group,
        count=count,
        timeout_ms=int(timeout_s * 1000),
        tags=tags,
    )
    lines = _run("consume", args, timeout_s + _SLACK_S, _QUICK_JVM, {0})
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
    ok, key, uniqKey, thread, error."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
