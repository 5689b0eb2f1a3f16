"""Logging: the library only adds a NullHandler and never configures the root logger;
the servers log what ``--log-level`` lets through, as JSON lines with ``--log-format json``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .helpers import wait_until


def test_the_library_configures_no_logging_and_prints_nothing():
    code = textwrap.dedent(
        """
        import logging
        import qclient
        from qclient import Producer
        from qclient.errors import QClientError

        assert logging.getLogger().handlers == []
        handlers = logging.getLogger("qclient").handlers
        assert [type(h) for h in handlers] == [logging.NullHandler], handlers
        with Producer("127.0.0.1:1", send_timeout=0.3, start_detector_enable=False) as p:
            try:
                p.send("t", b"x")  # logs warnings on the way to failing
            except QClientError:
                pass
        assert logging.getLogger().handlers == []
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert proc.stderr == ""  # no "last resort" printing of the library's warnings


def test_server_logs_json_lines(tmp_path: Path):
    ready = tmp_path / "ready"
    log = tmp_path / "namesrv.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "qclient",
                "namesrv",
                "--port",
                "0",
                "--log-level",
                "debug",
                "--log-format",
                "json",
                "--ready-file",
                str(ready),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_until(ready.exists, 30, "the name server to listen")
    finally:
        proc.terminate()
        proc.wait(15)
    lines = [ln for ln in log.read_text().splitlines() if not ln.startswith("listening on")]
    assert lines, "no log line"
    for line in lines:
        doc = json.loads(line)
        assert {"ts", "level", "logger", "message"} <= doc.keys()
    assert any("serving on" in json.loads(ln)["message"] for ln in lines)


def test_bad_log_format_is_a_usage_error(capsys):
    from qclient.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["namesrv", "--log-format", "xml"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--log-format" in err and len(err.strip().splitlines()) == 1


def test_every_command_takes_the_logging_options():
    from qclient.cli import build_parser

    parser = build_parser()
    send = ["send", "--namesrv", "h:1", "--topic", "t", "--log-level", "debug", "b"]
    args = parser.parse_args(send)
    assert (args.log_level, args.log_format) == ("DEBUG", None)
    args = parser.parse_args(["topic", "create", "--namesrv", "h:1", "--log-format", "json", "t"])
    assert (args.log_level, args.log_format) == (None, "json")
    server = parser.parse_args(["namesrv"])
    assert (server.log_level, server.default_log_level) == (None, "INFO")
