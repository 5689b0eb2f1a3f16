"""A stopgap Apache RocketMQ cluster for the consumer tests: one NameServer and two
brokers (broker-a, broker-b) as JVMs on 127.0.0.1, timer precision 100 ms, until
``qclient.engines.rocketmq.local.RocketMQCluster`` is available.

Every JVM binds and advertises 127.0.0.1 only, on free ports, with a small heap and its
home, store and logs under one temporary directory; :meth:`RmqCluster.close` kills them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from qclient.engines.rocketmq.admin import cluster_info
from qclient.engines.rocketmq.codes import RequestCode
from qclient.engines.rocketmq.connection import ConnectionPool, RemotingError
from qclient.engines.rocketmq.nameserver import RocketMQNameServer
from qclient.engines.rocketmq.remoting import request
from qclient.errors import QClientError

__all__ = ["LIB", "RmqBroker", "RmqCluster", "java_available"]

LIB = Path(__file__).resolve().parents[3] / "tools" / "rocketmq" / "lib"

_JVM = (
    "java",
    "-Xms256m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/sun.nio.ch=ALL-UNNAMED",
)
_LOGBACK = """<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5p [%t] %logger{{24}} - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="F"/></root>
</configuration>
"""
_BOOT_S = 90.0  # a JVM's start on a busy 2-core machine


def java_available() -> str | None:
    """Why the cluster cannot run here, or None."""
    if shutil.which("java") is None:
        return "java is not on PATH"
    if not any(LIB.glob("rocketmq-broker-*.jar")):
        return f"no RocketMQ jars in {LIB}"
    return None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _broker_port() -> int:
    """A port p with p-2 (the broker's fast channel) and p+1 (its HA port) free too."""
    for _ in range(50):
        port = _free_port()
        if port > 1026 and all(_port_free(p) for p in (port - 2, port + 1)):
            return port
    raise RuntimeError("no free port triple on 127.0.0.1")


class _Jvm:
    """``java main -c <role>.conf`` in ``home``; output to ``<role>.out``."""

    def __init__(self, home: Path, role: str, main: str, conf: dict[str, object]) -> None:
        self.home = home
        self.role = role
        self.main = main
        self.conf = conf
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        home, role = self.home, self.role
        home.mkdir(parents=True, exist_ok=True)
        (home / f"{role}.conf").write_text("".join(f"{k}={v}\n" for k, v in self.conf.items()))
        (home / f"{role}.logback.xml").write_text(_LOGBACK.format(log=home / f"{role}.log"))
        out_path = home / f"{role}.out"
        out_path.write_bytes(b"")
        cmd = [
            *_JVM,
            f"-Duser.home={home}",
            f"-Drocketmq.home.dir={home}",
            f"-Drmq.logback.configurationFile={home / f'{role}.logback.xml'}",
            "-cp",
            f"{LIB}{os.sep}*",
            self.main,
            "-c",
            str(home / f"{role}.conf"),
        ]
        with open(out_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + _BOOT_S
        while b"boot success" not in out_path.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{role} did not start:\n{out_path.read_text()[-2000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL and reap (no-op when not running)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(30)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)


class RmqBroker(_Jvm):
    """One master broker; ``addr`` is its remoting address."""

    def __init__(self, home: Path, name: str, namesrv: str) -> None:
        port = _broker_port()
        self.name = name
        self.addr = f"127.0.0.1:{port}"
        super().__init__(
            home,
            "broker",
            "org.apache.rocketmq.broker.BrokerStartup",
            {
                "brokerClusterName": "DefaultCluster",
                "brokerName": name,
                "brokerId": 0,
                "namesrvAddr": namesrv,
                "listenPort": port,
                "bindAddress": "127.0.0.1",
                "brokerIP1": "127.0.0.1",
                "brokerIP2": "127.0.0.1",
                "storePathRootDir": home / "store",
                "storePathCommitLog": home / "store" / "commitlog",
                "mappedFileSizeCommitLog": 32 * 1024 * 1024,
                "mappedFileSizeConsumeQueue": 60000,
                "mappedFileSizeTimerLog": 8 * 1024 * 1024,
                "maxIndexNum": 10000,
                "maxHashSlotNum": 4000,
                "timerWheelEnable": "true",
                "timerPrecisionMs": 100,
                "autoCreateTopicEnable": "true",
                "autoCreateSubscriptionGroup": "true",
                "flushDiskType": "ASYNC_FLUSH",
            },
        )

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)


class RmqCluster:
    """NameServer + ``brokers`` masters under ``home``; a context manager."""

    def __init__(self, home: Path, brokers: int = 2) -> None:
        ns_port = _free_port()
        self.namesrv_addr = f"127.0.0.1:{ns_port}"
        self.namesrv = f"rocketmq://{self.namesrv_addr}"
        self._ns = _Jvm(
            home / "namesrv",
            "namesrv",
            "org.apache.rocketmq.namesrv.NamesrvStartup",
            {"listenPort": ns_port, "bindAddress": "127.0.0.1"},
        )
        self.brokers = [
            RmqBroker(home / f"broker-{chr(97 + i)}", f"broker-{chr(97 + i)}", self.namesrv_addr)
            for i in range(brokers)
        ]
        self._pool = ConnectionPool(connect_timeout=3.0)

    def start(self) -> RmqCluster:
        """Start the JVMs; return once the NameServer knows every broker."""
        try:
            self._ns.start()
            for b in self.brokers:
                b.start()
            want = {b.name for b in self.brokers}
            deadline = time.monotonic() + _BOOT_S
            while not want <= set(self._masters()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"brokers {want} not registered within {_BOOT_S} s")
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        return self

    def _masters(self) -> dict[str, str]:
        try:
            return cluster_info(self._pool, [self.namesrv_addr]).masters()
        except (RemotingError, OSError, QClientError):
            return {}

    def create_topic(self, topic: str, queues: int = 4, timeout: float = 30.0) -> None:
        """Create ``topic`` on every broker (UPDATE_AND_CREATE_TOPIC); return once the
        NameServer routes all of them."""
        fields = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(queues),
            "writeQueueNums": str(queues),
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
        }
        for b in self.brokers:
            cmd = request(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(fields))
            answer = self._pool.get(b.addr).call(cmd, 10.0)
            if answer.code != 0:
                raise RuntimeError(f"create {topic} on {b.name}: {answer.code} {answer.remark}")
        want = {b.name for b in self.brokers}
        deadline = time.monotonic() + timeout
        with RocketMQNameServer([self.namesrv_addr], pool=self._pool) as ns:
            while True:
                route = ns.get_route(topic)
                names = {q.broker_name for q in route.queue_datas if q.read_queue_nums == queues}
                if not route.auto_create and names >= want:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topic {topic} not routed on {want} within {timeout} s")
                time.sleep(0.1)

    def close(self) -> None:
        self._pool.close()
        for b in self.brokers:
            b.resume()
            b.kill()
        self._ns.kill()

    def __enter__(self) -> RmqCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
