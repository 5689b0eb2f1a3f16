"""Spark outside ``local[N]``, from the installed pyspark package: a standalone cluster
(master and worker as separate JVM processes, executors in JVMs of their own) and a
Spark Connect server. Shared by ``tests/spark`` and ``benchmarks/spark_bench.py``.

Every process listens on 127.0.0.1 only, in a process group of its own, and is stopped
(SIGTERM, then SIGKILL) when its context manager exits, also on failure.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import zipfile
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

__all__ = [
    "QUICK_JVM",
    "ConnectServer",
    "SparkProcess",
    "StandaloneSpark",
    "sdk_zip",
    "spark_env",
    "spark_home",
]

#: Where the sources of qclient and spark_udfs are (the repo's src/).
SRC = Path(__file__).resolve().parent.parent / "src"


#: JVM options of short-lived Spark processes (tests): the C1 compiler only and the serial
#: collector. A test application's JVMs then use ~40% less CPU (87 -> 50 CPU seconds for
#: tests/spark/spark_app.py on a standalone cluster); a long-running pipeline (and
#: spark_bench) wants the default, whose C2-compiled hot paths are faster in the end.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_home() -> Path:
    """The installed pyspark package: it carries bin/spark-class, bin/spark-submit and jars/."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sdk_zip(dest: Path) -> Path:
    """A zip of the qclient and spark_udfs packages, as ``spark.submit.pyFiles`` /
    ``addPyFile`` / ``addArtifacts(pyfile=True)`` ship it to the Python workers."""
    out = dest / "qclient-sdk.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in ("qclient", "spark_udfs"):
            for path in sorted((SRC / package).rglob("*")):
                if path.is_file() and path.suffix in (".py", ".typed"):
                    zf.write(path, path.relative_to(SRC).as_posix())
    return out


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark process: loopback only, this interpreter for Python
    workers, and no PYTHONPATH (the code they run is shipped, not shared)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_HOSTNAME="localhost",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    env.update(extra)
    return env


#: how long a Spark master, worker or Connect server may take to start: a bound against a
#: hang, not a speed goal (a worker took over 60 s to register with its master on a 2-core
#: host at load 29, a core busy beside the test suite)
START_TIMEOUT_S = 240.0


class SparkProcess:
    """One Spark JVM started from ``bin/``, its output in ``log``."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first match of ``pattern`` in the log; fails if the process dies or time is up."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.text())
            if m:
                return m
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}) before {pattern!r}:\n"
                    + self.text()[-3000:]
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name}: no {pattern!r} after {timeout} s:\n" + self.text()[-3000:]
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the process group (the JVM and anything it started), then SIGKILL."""
        if self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


class _Processes:
    """Owns started processes; stops them in reverse order on exit."""

    def __init__(self) -> None:
        self._stack = ExitStack()

    def _start(self, *args: object, **kwargs: object) -> SparkProcess:
        p = SparkProcess(*args, **kwargs)  # type: ignore[arg-type]
        self._stack.callback(p.stop)
        return p

    def close(self) -> None:
        self._stack.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class StandaloneSpark(_Processes):
    """A standalone cluster: one master, one worker (``cores`` cores, ``memory``).

    ``master_url`` is ``spark://127.0.0.1:PORT``. The worker's processes get no
    PYTHONPATH: applications ship their Python code (``--py-files``, ``addPyFile``).
    """

    def __init__(
        self, work_dir: Path, *, cores: int = 2, memory: str = "1g", quick_jvm: bool = True
    ) -> None:
        super().__init__()
        self.work_dir = work_dir
        self.cores = cores
        self.memory = memory
        self.java_opts = QUICK_JVM if quick_jvm else ""
        self.master_url = ""

    def submit_args(self) -> list[str]:
        """``spark-submit`` arguments of an application on this cluster (its driver here)."""
        confs = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.executor.memory": "512m",
            "spark.driver.extraJavaOptions": self.java_opts,
            "spark.executor.extraJavaOptions": self.java_opts,
        }
        args = ["--master", self.master_url, "--driver-memory", "512m"]
        for k, v in confs.items():
            if v:
                args += ["--conf", f"{k}={v}"]
        return args

    def __enter__(self) -> StandaloneSpark:
        try:
            self._launch()
        except BaseException:
            self.close()
            raise
        return self

    def _launch(self) -> None:
        home = spark_home()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # the master's REST submission server listens on a fixed port (6066): off
        env = spark_env(
            SPARK_DAEMON_MEMORY="256m",
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=false",
            SPARK_DAEMON_JAVA_OPTS=self.java_opts,
        )
        cls = str(home / "bin" / "spark-class")
        self.master = self._start(
            "spark master",
            [
                cls,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            self.work_dir / "master.log",
            env,
        )
        m = self.master.wait_for(r"Starting Spark master at (spark://\S+)", START_TIMEOUT_S)
        self.master_url = m.group(1)
        self.master.wait_for(r"I have been elected leader", START_TIMEOUT_S)
        self.worker = self._start(
            "spark worker",
            [
                cls,
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(self.work_dir / "work"),
            ],
            self.work_dir / "worker.log",
            env,
        )
        self.worker.wait_for(r"Successfully registered with master", START_TIMEOUT_S)


class ConnectServer(_Processes):
    """A Spark Connect server (``bin/spark-submit --class ...SparkConnectServer``) on a
    free port, running its queries on ``master`` (``local[2]`` by default)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        master: str = "local[2]",
        memory: str = "1g",
        quick_jvm: bool = True,
    ) -> None:
        super().__init__()
        self.work_dir = work_dir
        self.master = master
        self.memory = memory
        self.java_opts = QUICK_JVM if quick_jvm else ""
        self.port = 0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def __enter__(self) -> ConnectServer:
        try:
            self._launch()
        except BaseException:
            self.close()
            raise
        return self

    def _launch(self) -> None:
        home = spark_home()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        confs = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.python.worker.reuse": "true",
            "spark.local.dir": str(self.work_dir / "local"),
        }
        if self.java_opts:
            confs["spark.driver.extraJavaOptions"] = self.java_opts
        argv = [
            str(home / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "qclient-connect",
            "--master",
            self.master,
            "--driver-memory",
            self.memory,
        ]
        for k, v in confs.items():
            argv += ["--conf", f"{k}={v}"]
        argv.append("spark-internal")
        self.server = self._start(
            "spark connect server", argv, self.work_dir / "connect.log", spark_env()
        )
        self.server.wait_for(r"Spark Connect server started", START_TIMEOUT_S)
