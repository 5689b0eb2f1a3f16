"""The remoting drivers (blocking Connection, asyncio AsyncConnection) against a real
Apache RocketMQ NameServer: many requests in flight on one connection, pipelined batches,
timeouts on a paused server, fast failure when it dies.

GET_ROUTEINFO_BY_TOPIC (105) for a topic nobody created is the probe: the NameServer
answers TOPIC_NOT_EXIST (17) at once, with the topic in the remark, so each answer can be
matched to its request by content as well as by opaque. Requests from the server to the
client are tested in test_server_requests.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests._budget import OneAtATime

from qclient.engines.rocketmq import connection
from qclient.engines.rocketmq.aio import AsyncConnection, AsyncConnectionPool
from qclient.engines.rocketmq.connection import (
    Connection,
    RemotingConnectionError,
    RemotingTimeoutError,
)
from qclient.engines.rocketmq.local.runtime import JVM_OPTS_ENV
from qclient.engines.rocketmq.pool import ConnectionPool
from qclient.engines.rocketmq.remoting import (
    RemotingCommand,
    request,
)

LIB = Path(__file__).resolve().parents[3] / "tools" / "rocketmq" / "lib"
GET_ROUTEINFO_BY_TOPIC = 105
TOPIC_NOT_EXIST = 17
#: the timeout of calls that must be answered: a bound for a starved JVM on a busy host
OK = 30.0
#: the timeout of calls that must fail first (closed or killed server): they must fail
#: well before it
LONG = 60.0
#: C1 only: a NameServer here lives seconds and needs to start and answer, not reach peak
#: speed (a start at load 10-28 went from 10-26 s to ~3 s)
_JVM_FLAGS = [
    "-Xms128m",
    "-Xmx128m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    *os.environ.get(JVM_OPTS_ENV, "").split(),
]

pytestmark = [
    pytest.mark.skipif(
        shutil.which("java") is None or not any(LIB.glob("rocketmq-namesrv-*.jar")),
        reason="needs java and the RocketMQ jars in tools/rocketmq/lib",
    ),
    pytest.mark.jvm("rocketmq"),  # real NameServer JVMs
]

_LOGBACK = """<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file><encoder><pattern>%d %p %c{{1}} - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="F"/></root>
</configuration>
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Namesrv:
    """A NameServer JVM on 127.0.0.1:<free port>, home and logs in ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.addr = f"127.0.0.1:{self.port}"
        (tmp / "namesrv.conf").write_text(f"listenPort={self.port}\nbindAddress=127.0.0.1\n")
        (tmp / "logback.xml").write_text(_LOGBACK.format(log=tmp / "namesrv.log"))
        self._out = open(tmp / "stdout.txt", "wb")  # noqa: SIM115 (closed in stop)
        props = [f"-Duser.home={tmp}", f"-Drocketmq.home.dir={tmp}"]
        props.append(f"-Drmq.logback.configurationFile={tmp / 'logback.xml'}")
        main = ["org.apache.rocketmq.namesrv.NamesrvStartup", "-c", str(tmp / "namesrv.conf")]
        self.proc = subprocess.Popen(
            ["java", *_JVM_FLAGS, *props, "-cp", f"{LIB}/*", *main],
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready(tmp, deadline=time.monotonic() + 60)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, tmp: Path, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = (tmp / "stdout.txt").read_text(errors="replace")
                raise RuntimeError(f"namesrv exited {self.proc.returncode}: {out}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("namesrv did not accept connections within 60 s")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        """SIGSTOP, then wait until every JVM thread is stopped: the kernel may hold the
        stop pending a while (seen: over 200 ms, with the JVM still answering)."""
        self.signal(signal.SIGSTOP)
        try:
            _wait_for(self._stopped)
        except BaseException:
            self.resume()
            raise

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def _stopped(self) -> bool:
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:  # the thread exited
                continue
            if stat.rpartition(")")[2].split()[0] not in ("T", "t"):
                return False
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._out.close()


@pytest.fixture(scope="module")
def _shared_namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneAtATime[Namesrv]]:
    """The module's NameServer, stopped before a test starts one of its own."""
    shared = OneAtATime(lambda: Namesrv(tmp_path_factory.mktemp("namesrv")), Namesrv.stop)
    try:
        yield shared
    finally:
        shared.release()


@pytest.fixture
def namesrv(_shared_namesrv: OneAtATime[Namesrv]) -> Namesrv:
    """The module's NameServer; a test that pauses it resumes it."""
    return _shared_namesrv.get()


@pytest.fixture
def doomed_namesrv(tmp_path: Path, _shared_namesrv: OneAtATime[Namesrv]) -> Iterator[Namesrv]:
    """A NameServer of the test's own, which the test may kill (the module's is stopped
    first; these tests come last in the module, so it is not started again)."""
    _shared_namesrv.release()
    ns = Namesrv(tmp_path / "namesrv")
    try:
        yield ns
    finally:
        ns.stop()


def _probe(topic: str) -> RemotingCommand:
    return request(GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


def _check_answer(req: RemotingCommand, resp: Any, topic: str) -> None:
    assert isinstance(resp, RemotingCommand), resp
    assert resp.is_response and resp.opaque == req.opaque
    assert resp.code == TOPIC_NOT_EXIST and resp.remark is not None
    assert f"topic: {topic}\n" in resp.remark


#: the timeout in the timeout tests, and how late its error may come
SHORT, SLACK = 0.3, 0.05


def _check_timeouts(durations: list[float]) -> bool:
    """Whether to stop measuring: every call took at least SHORT (less 2 ms: uvloop's timers
    tick in whole milliseconds) and the last came within SHORT + SLACK. Callers try up to
    three times: a busy 2-core host can deschedule this process for longer than SLACK,
    which says nothing about the driver."""
    assert all(d >= SHORT - 0.002 for d in durations), durations
    assert len(durations) < 3 or durations[-1] < SHORT + SLACK, durations
    return durations[-1] < SHORT + SLACK


def _wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


# --- blocking ------------------------------------------------------------------------------


@pytest.fixture(params=[False, True], ids=["reader-thread", "callers-read"])
def by_callers(request: pytest.FixtureRequest) -> bool:
    """Both ways a blocking connection reads: its reader thread, or its callers in turn."""
    return bool(request.param)


def test_64_threads_share_one_connection(namesrv: Namesrv, by_callers: bool) -> None:
    errors: list[BaseException] = []
    answered = [0] * 64
    with Connection(namesrv.addr, read_by_callers=by_callers) as conn:

        def worker(t: int) -> None:
            try:
                for i in range(50):
                    topic = f"t{t}-{i}"
                    req = _probe(topic)
                    _check_answer(req, conn.call(req, OK), topic)
                    answered[t] += 1
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(64)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors[:3]
        assert answered == [50] * 64
        assert conn.in_flight == 0 and not conn.closed


def test_call_many_answers_in_order(namesrv: Namesrv, by_callers: bool) -> None:
    with Connection(namesrv.addr, read_by_callers=by_callers) as conn:
        reqs = [_probe(f"many-{i}") for i in range(100)]
        answers = conn.call_many(reqs, OK)
        assert len(answers) == 100
        for i, (req, resp) in enumerate(zip(reqs, answers, strict=True)):
            _check_answer(req, resp, f"many-{i}")
        assert conn.call_many([], 1.0) == []


def test_timeout_on_paused_namesrv_then_close_fails_in_flight(
    namesrv: Namesrv, by_callers: bool
) -> None:
    with Connection(namesrv.addr, read_by_callers=by_callers) as conn:
        _check_answer(req := _probe("warm"), conn.call(req, OK), "warm")
        namesrv.pause()
        try:
            durations: list[float] = []
            while not durations or not _check_timeouts(durations):
                t0 = time.monotonic()
                with pytest.raises(RemotingTimeoutError):
                    conn.call(_probe("paused"), SHORT)
                durations.append(time.monotonic() - t0)
            durations = []
            while not durations or not _check_timeouts(durations):
                t0 = time.monotonic()
                answers = conn.call_many([_probe(f"paused-{i}") for i in range(5)], SHORT)
                durations.append(time.monotonic() - t0)
                assert all(isinstance(a, RemotingTimeoutError) for a in answers), answers
            assert conn.in_flight == 0 and not conn.closed
        finally:
            namesrv.resume()
        # the late answers are dropped; the connection still works
        _check_answer(req := _probe("resumed"), conn.call(req, OK), "resumed")

    # close() fails calls in flight at once
    with Connection(namesrv.addr, read_by_callers=by_callers) as conn:
        namesrv.pause()
        try:
            failures: queue.SimpleQueue[BaseException] = queue.SimpleQueue()

            def caller() -> None:
                try:
                    conn.call(_probe("never"), LONG)
                except BaseException as exc:
                    failures.put(exc)

            threads = [threading.Thread(target=caller) for _ in range(4)]
            for th in threads:
                th.start()
            _wait_for(lambda: conn.in_flight == 4)
            t0 = time.monotonic()
            conn.close()
            for th in threads:
                th.join(LONG / 6)
            assert time.monotonic() - t0 < LONG / 6  # at once, not after the timeout
            got = [failures.get_nowait() for _ in range(4)]
            assert all(isinstance(e, RemotingConnectionError) for e in got), got
            with pytest.raises(RemotingConnectionError):
                conn.call(_probe("after-close"), OK)
        finally:
            namesrv.resume()


def test_pool_replaces_closed_and_discarded(namesrv: Namesrv, by_callers: bool) -> None:
    pool = ConnectionPool(read_by_callers=by_callers)
    try:
        first = pool.get(namesrv.addr)
        first.close()
        second = pool.get(namesrv.addr)
        assert second is not first and not second.closed
        pool.discard(namesrv.addr)
        assert second.closed
        third = pool.get(namesrv.addr)
        _check_answer(req := _probe("pool"), third.call(req, OK), "pool")
    finally:
        pool.close()
    assert third.closed
    with pytest.raises(RemotingConnectionError):
        pool.get(namesrv.addr)


def test_idle_connection_closed_by_peer_is_replaced(
    doomed_namesrv: Namesrv, by_callers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer gone while nobody called: ``get`` opens a new connection (here: refused)
    instead of handing out the dead one, whichever way the connection reads."""
    monkeypatch.setattr(connection, "IDLE_CHECK_AFTER", 0.0)  # idle at once, not after 1 s
    ns = doomed_namesrv
    with ConnectionPool(connect_timeout=2.0, read_by_callers=by_callers) as pool:
        conn = pool.get(ns.addr)
        _check_answer(req := _probe("idle"), conn.call(req, OK), "idle")
        ns.signal(signal.SIGKILL)
        ns.proc.wait(10)
        if not by_callers:  # its reader thread notices by itself
            _wait_for(lambda: conn.closed)
        with pytest.raises(RemotingConnectionError, match="connect failed"):
            pool.get(ns.addr)
        assert conn.closed


def test_connect_refused() -> None:
    t0 = time.monotonic()
    with pytest.raises(RemotingConnectionError):
        Connection(f"127.0.0.1:{_free_port()}", connect_timeout=LONG)
    assert time.monotonic() - t0 < LONG / 6  # refused at once, not after the timeout


# --- asyncio -------------------------------------------------------------------------------


def _loop_factories() -> list[Any]:
    params: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        params.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip("no uvloop")))
    else:
        params.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return params


@pytest.fixture(params=_loop_factories())
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine to completion on the parametrized event loop (bounded to 120 s)."""
    factory = request.param

    def runner(coro: Coroutine[Any, Any, Any]) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(120):
                return await coro

        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(bounded())

    return runner


def test_async_many_tasks_share_one_connection(namesrv: Namesrv, run: Any) -> None:
    async def main() -> None:
        async with await AsyncConnection.connect(namesrv.addr) as conn:

            async def worker(t: int) -> int:
                for i in range(50):
                    topic = f"a{t}-{i}"
                    req = _probe(topic)
                    _check_answer(req, await conn.call(req, OK), topic)
                return 50

            assert await asyncio.gather(*(worker(t) for t in range(64))) == [50] * 64
            assert conn.in_flight == 0 and not conn.closed

            reqs = [_probe(f"amany-{i}") for i in range(100)]
            answers = await conn.call_many(reqs, OK)
            for i, (req, resp) in enumerate(zip(reqs, answers, strict=True)):
                _check_answer(req, resp, f"amany-{i}")

    run(main())


def test_async_timeout_on_paused_namesrv(namesrv: Namesrv, run: Any) -> None:
    async def main() -> None:
        async with await AsyncConnection.connect(namesrv.addr) as conn:
            _check_answer(req := _probe("warm"), await conn.call(req, OK), "warm")
            namesrv.pause()
            try:
                durations: list[float] = []
                while not durations or not _check_timeouts(durations):
                    t0 = time.monotonic()
                    with pytest.raises(RemotingTimeoutError):
                        await conn.call(_probe("paused"), SHORT)
                    durations.append(time.monotonic() - t0)
                durations = []
                while not durations or not _check_timeouts(durations):
                    t0 = time.monotonic()
                    answers = await conn.call_many([_probe(f"p{i}") for i in range(5)], SHORT)
                    durations.append(time.monotonic() - t0)
                    assert all(isinstance(a, RemotingTimeoutError) for a in answers), answers
                late = _probe("late")
                stuck = asyncio.ensure_future(conn.call(late, LONG))
                while conn.in_flight != 1:
                    await asyncio.sleep(0.005)
            finally:
                namesrv.resume()
            # answered once resumed; the answers to the timed-out calls were dropped
            _check_answer(late, await stuck, "late")
            _check_answer(req := _probe("resumed"), await conn.call(req, OK), "resumed")

            namesrv.pause()
            try:
                stuck = asyncio.ensure_future(conn.call(_probe("stuck"), LONG))
                while conn.in_flight != 1:
                    await asyncio.sleep(0.005)
                await conn.close()
                with pytest.raises(RemotingConnectionError):
                    await stuck
            finally:
                namesrv.resume()

    run(main())


def test_async_call_many_cancelled_leaves_nothing_in_flight(namesrv: Namesrv, run: Any) -> None:
    async def main() -> None:
        async with await AsyncConnection.connect(namesrv.addr) as conn:
            namesrv.pause()
            try:
                task = asyncio.ensure_future(
                    conn.call_many([_probe(f"c{i}") for i in range(5)], LONG)
                )
                while conn.in_flight != 5:
                    await asyncio.sleep(0.005)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert conn.in_flight == 0
            finally:
                namesrv.resume()
            # the cancelled call's answers come and are dropped; the connection serves on
            reqs = [_probe(f"after-{i}") for i in range(3)]
            first: list[float] = []
            answers = await conn.call_many(reqs, OK, first)
            for i, (req, resp) in enumerate(zip(reqs, answers, strict=True)):
                _check_answer(req, resp, f"after-{i}")
            assert len(first) == 1 and not conn.closed

    run(main())


def test_async_killed_namesrv_fails_calls_fast(doomed_namesrv: Namesrv, run: Any) -> None:
    ns = doomed_namesrv

    async def main() -> None:
        async with AsyncConnectionPool(connect_timeout=2.0) as pool:
            conn = await pool.get(ns.addr)
            assert await pool.get(ns.addr) is conn
            _check_answer(req := _probe("alive"), await conn.call(req, OK), "alive")
            ns.pause()
            singles = [asyncio.ensure_future(conn.call(_probe("d"), LONG)) for _ in range(8)]
            batch = asyncio.ensure_future(
                conn.call_many([_probe(f"d{i}") for i in range(10)], LONG)
            )
            while conn.in_flight != 18:
                await asyncio.sleep(0.005)
            t0 = time.monotonic()
            ns.signal(signal.SIGKILL)
            got = await asyncio.gather(*singles, return_exceptions=True)
            got += await batch
            assert time.monotonic() - t0 < LONG / 6  # against a 60 s timeout
            assert len(got) == 18
            assert all(isinstance(e, RemotingConnectionError) for e in got), got
            assert conn.closed
            t0 = time.monotonic()
            with pytest.raises(RemotingConnectionError):
                await conn.call(_probe("new"), LONG)
            assert time.monotonic() - t0 < LONG / 6  # at once, not after the timeout
            await asyncio.to_thread(ns.proc.wait, 10)  # see the blocking test
            t0 = time.monotonic()
            with pytest.raises(RemotingConnectionError):
                await pool.get(ns.addr)
            assert time.monotonic() - t0 < LONG / 6  # at once, not after the timeout

    run(main())


def test_killed_namesrv_fails_calls_fast(doomed_namesrv: Namesrv, by_callers: bool) -> None:
    ns = doomed_namesrv
    with ConnectionPool(connect_timeout=2.0, read_by_callers=by_callers) as pool:
        conn = pool.get(ns.addr)
        assert pool.get(ns.addr) is conn
        _check_answer(req := _probe("alive"), conn.call(req, OK), "alive")
        ns.pause()  # keeps the calls below in flight until the kill
        results: queue.SimpleQueue[object] = queue.SimpleQueue()

        def caller() -> None:
            try:
                results.put(conn.call(_probe("doomed"), LONG))
            except BaseException as exc:
                results.put(exc)

        def batch() -> None:
            results.put(conn.call_many([_probe(f"doomed-{i}") for i in range(10)], LONG))

        threads = [threading.Thread(target=caller) for _ in range(8)]
        threads.append(threading.Thread(target=batch))
        for th in threads:
            th.start()
        _wait_for(lambda: conn.in_flight == 18)
        t0 = time.monotonic()
        ns.signal(signal.SIGKILL)
        for th in threads:
            th.join(10)
        assert time.monotonic() - t0 < LONG / 6  # against a 60 s timeout
        got = [results.get_nowait() for _ in range(9)]
        batches = [r for r in got if isinstance(r, list)]
        singles = [r for r in got if not isinstance(r, list)]
        assert len(batches) == 1 and len(singles) == 8
        assert all(isinstance(e, RemotingConnectionError) for e in singles + batches[0])
        assert conn.closed
        t0 = time.monotonic()
        with pytest.raises(RemotingConnectionError):
            conn.call(_probe("new"), LONG)
        assert time.monotonic() - t0 < LONG / 6  # at once, not after the timeout
        # the dying JVM closes its connections before its listening socket: until it has
        # exited, a connect may still be accepted (by the kernel, into the backlog)
        ns.proc.wait(10)
        t0 = time.monotonic()
        with pytest.raises(RemotingConnectionError):
            pool.get(ns.addr)  # a new connection: refused
        assert time.monotonic() - t0 < LONG / 6  # at once, not after the timeout
