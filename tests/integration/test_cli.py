"""The `qclient` command line against real processes; errors are one line, no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from qclient.protocol import wire

QCLIENT = [sys.executable, "-m", "qclient"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QCLIENT, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


@pytest.fixture(scope="module")
def dev_cluster():
    """`qclient dev --port 0` as the user runs it; its first line names the name server."""
    proc = subprocess.Popen(
        [*QCLIENT, "dev", "--brokers", "1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline().strip()  # bounded by the cluster's start timeout
        assert first.startswith("namesrv="), first
        yield proc, first.split("=", 1)[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_dev_send_route_topic_consume(dev_cluster):
    _proc, namesrv = dev_cluster
    r = run("topic", "create", "--namesrv", namesrv, "--queues", "2", "cli-topic")
    assert r.returncode == 0, r.stderr
    assert "created cli-topic with 2 queues" in r.stdout
    r = run("route", "--namesrv", namesrv, "cli-topic")
    assert r.returncode == 0, r.stderr
    route = json.loads(r.stdout)
    assert route["queue_datas"][0]["write_queue_nums"] == 2
    r = run(
        "send",
        "--namesrv",
        namesrv,
        "--topic",
        "cli-topic",
        "--delay",
        "300ms",
        "--key",
        "k1",
        "hello cli",
    )
    assert r.returncode == 0, r.stderr
    sent = json.loads(r.stdout)
    assert sent["status"] == "SEND_OK"
    r = run(
        "consume",
        "--namesrv",
        namesrv,
        "--topic",
        "cli-topic",
        "--group",
        "g",
        "--max",
        "1",
        "--timeout",
        "15",
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[0])
    assert got["msg_id"] == sent["msg_id"]
    assert got["body"] == "hello cli"
    assert got["fired_at_ms"] >= sent["deliver_at_ms"] - wire.DEFAULT_FIRE_AHEAD_MS


def test_dlq_resend_puts_dead_letters_back_on_their_topics(dev_cluster):
    from qclient import Consumer, Producer

    _proc, namesrv = dev_cluster
    assert run("topic", "create", "--namesrv", namesrv, "--queues", "2", "cli-dlq").returncode == 0
    with Producer(namesrv) as p:
        sent = {p.send("cli-dlq", f"m{i}", key=f"k{i}", tags="T", properties={"i": str(i)}).msg_id
                for i in range(2)}  # fmt: skip
    with Consumer(namesrv, "cli-dlq", "cli-g") as c:
        dead = 0
        deadline = time.monotonic() + 20
        while dead < 2 and time.monotonic() < deadline:
            for m in c.poll(8, timeout=0.5):
                c.dead_letter(m, "cannot parse")
                dead += 1
    assert dead == 2
    resent = []
    for args, n in ((("--max", "1"), 1), ((), 1), ((), 0)):  # a third run finds nothing new
        r = run("dlq", "resend", "--namesrv", namesrv, "--group", "cli-g", "--timeout", "3", *args)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(ln) for ln in r.stdout.splitlines()]
        assert lines[-1] == {"resent": n, "skipped": 0}
        resent += lines[:-1]
    assert {ln["origin_msg_id"] for ln in resent} == sent
    assert {ln["topic"] for ln in resent} == {"cli-dlq"}
    back = []
    with Consumer(namesrv, "cli-dlq", "cli-g") as c:  # the group gets them again
        deadline = time.monotonic() + 20
        while len(back) < 2 and time.monotonic() < deadline:
            back += c.poll(8, timeout=0.5)
    assert sorted(m.body for m in back) == [b"m0", b"m1"]
    assert {m.msg_id for m in back} == {ln["msg_id"] for ln in resent}
    for m in back:  # as sent: the dead-letter properties are gone
        i = m.body.decode()[1:]
        assert (m.key, m.tags, m.properties) == (f"k{i}", "T", {"i": i})


def test_dev_stops_its_children_on_sigterm():
    proc = subprocess.Popen(
        [*QCLIENT, "dev", "--brokers", "1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("namesrv=")
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0
    _gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive


@pytest.mark.parametrize(
    "args",
    [
        ("send", "--namesrv", "127.0.0.1:1", "--topic", "t", "--delay", "5s", "hi"),
        ("route", "--namesrv", "127.0.0.1:1", "t"),
        ("topic", "create", "--namesrv", "127.0.0.1:1", "t"),
        ("consume", "--namesrv", "127.0.0.1:1", "--topic", "t", "--group", "g", "--timeout", "1"),
        ("send", "--namesrv", "127.0.0.1:1", "--topic", "bad/topic", "hi"),
        (
            "broker",
            "--name",
            "b",
            "--data-dir",
            "/tmp/qclient-x",
            "--namesrv",
            "127.0.0.1:1",
            "--auth-file",
            "/nonexistent/auth.json",
        ),
    ],
)
def test_expected_errors_are_one_line_exit_1(args):
    r = run(*args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("qclient: error: ")
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("send", "--topic", "t", "hi"),
        ("send", "--namesrv", "x:1", "--topic", "t", "--delay", "5q", "hi"),
        ("send", "--namesrv", "x:1", "--topic", "t", "--at", "2030-01-01T00:00:00", "hi"),
        ("send", "--namesrv", "x:1", "--topic", "t", "--delay=-5s", "hi"),
        ("nosuchcommand",),
    ],
)
def test_usage_errors_are_one_line_exit_2(args):
    r = run(*args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_version_and_module_entry():
    r = run("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("qclient ")
    exe = os.path.join(os.path.dirname(sys.executable), "qclient")
    r2 = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
    assert r2.returncode == 0 and "namesrv" in r2.stdout


def test_demo_runs_and_reports(tmp_path):
    start = time.monotonic()
    r = run("demo", "--messages", "60", "--spread", "1s", timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = r.stdout.strip().splitlines()[-1]
    assert "60 scheduled, 60 delivered, 0 missing, 0 early" in summary
    assert time.monotonic() - start < 120
