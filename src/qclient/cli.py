"""The ``qclient`` command line (also ``python -m qclient``).

Expected failures (bad arguments, unreachable name server, refused credentials) print
one line on stderr and exit non-zero, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import qclient

from . import _cli_dlq, _cli_lifecycle, _logging
from ._cli_args import CliError, key_value, parse_datetime, parse_duration
from ._cli_servers import cmd_broker, cmd_demo, cmd_dev, cmd_namesrv
from ._config import (
    DEFAULT_BROKER_EXPIRE,
    DEFAULT_BROKER_PORT,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HOST,
    DEFAULT_MAX_DELAY,
    DEFAULT_MIN_FREE_MB,
    DEFAULT_NAMESRV_PORT,
    DEFAULT_QUEUES,
)
from .errors import QClientError

log = logging.getLogger("qclient.cli")


# --- commands -----------------------------------------------------------------------


def _credentials(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "access_key": args.access_key or os.environ.get("QCLIENT_ACCESS_KEY"),
        "secret_key": args.secret_key or os.environ.get("QCLIENT_SECRET_KEY"),
    }


def cmd_send(args: argparse.Namespace) -> int:
    from .producer import Producer

    props = dict(args.property or [])
    with Producer(args.namesrv, start_detector_enable=False, **_credentials(args)) as producer:
        if args.delay is not None or args.at is not None:
            result = producer.send_delayed(
                args.topic,
                args.body,
                delay=args.delay,
                deliver_at=args.at,
                key=args.key,
                tags=args.tags,
                properties=props or None,
                msg_id=args.msg_id,
            )
        else:
            result = producer.send(
                args.topic,
                args.body,
                key=args.key,
                tags=args.tags,
                properties=props or None,
                msg_id=args.msg_id,
            )
    print(
        json.dumps(
            {
                "msg_id": result.msg_id,
                "status": str(result.status),
                "broker": result.broker_name,
                "queue_id": result.queue_id,
                "deliver_at": result.deliver_at.isoformat(),
                "deliver_at_ms": result.deliver_at_ms,
            }
        )
    )
    return 0


def _engine(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    from .engines import parse_namesrv

    try:
        return parse_namesrv(args.namesrv)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def cmd_route(args: argparse.Namespace) -> int:
    from .protocol import wire
    from .routing.nameserver import NameServerClient

    engine, addrs = _engine(args)
    if engine == "rocketmq":
        from . import _cli_rocketmq

        return _cli_rocketmq.route(args, addrs)
    with NameServerClient(addrs) as ns:
        route = ns.get_route(args.topic)
    print(wire.encode(route).decode())
    return 0


def cmd_topic_create(args: argparse.Namespace) -> int:
    from .protocol import wire
    from .routing.nameserver import NameServerClient
    from .transport.errors import error_for_code, parse_error_response
    from .transport.http import Credentials, SyncHttp

    engine, addrs = _engine(args)
    if engine == "rocketmq":
        from . import _cli_rocketmq

        return _cli_rocketmq.topic_create(args, addrs)
    creds = _credentials(args)
    credentials = (
        Credentials(creds["access_key"], creds["secret_key"])
        if creds["access_key"] and creds["secret_key"]
        else None
    )
    http = SyncHttp(content_type=wire.JSON, credentials=credentials)
    try:
        with NameServerClient(addrs, http=http) as ns:
            brokers = ns.list_brokers().brokers
        if not brokers:
            raise CliError("no broker is registered with the name server")
        body = wire.encode(wire.CreateTopicRequest(args.topic, args.queues))
        for b in brokers:
            try:
                resp = http.request("POST", b.addr, wire.BROKER_TOPICS, body, timeout=5.0)
            except Exception as exc:
                raise CliError(f"broker {b.broker_name} at {b.addr}: {exc}") from None
            if resp.status != 200:
                code, message = parse_error_response(resp)
                raise error_for_code(code, message, broker=b.broker_name, topic=args.topic)
            print(f"created {args.topic} with {args.queues} queues on {b.broker_name} ({b.addr})")
    finally:
        http.close()
    return 0


def cmd_consume(args: argparse.Namespace) -> int:
    from .consumer import Consumer

    got = 0
    # --follow: until Ctrl-C / SIGTERM (then commit and leave the group), or --max if given
    limit = args.max if args.max is not None else (1 << 62 if args.follow else 100)
    deadline = time.monotonic() + (float("inf") if args.follow else args.timeout)
    stop: list[int] = []
    if args.follow:  # stop between polls: every message printed is committed, no more
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
        signal.signal(signal.SIGINT, lambda signum, frame: stop.append(signum))
    with Consumer(args.namesrv, args.topic, args.group, **_credentials(args)) as consumer:
        while got < limit and time.monotonic() < deadline and not stop:
            remaining = deadline - time.monotonic()
            batch = consumer.poll(min(32, limit - got), timeout=min(1.0, remaining))
            for m in batch:
                print(
                    json.dumps(
                        {
                            "msg_id": m.msg_id,
                            "topic": m.topic,
                            "key": m.key,
                            "tags": m.tags,
                            "body": m.body.decode("utf-8", "replace"),
                            "broker": m.broker_name,
                            "queue_id": m.queue_id,
                            "offset": m.offset,
                            "deliver_at_ms": m.deliver_at_ms,
                            "fired_at_ms": m.fired_at_ms,
                            "properties": m.properties,
                        }
                    ),
                    flush=True,
                )
            got += len(batch)
    return 0


# --- parser -------------------------------------------------------------------------


def _add_auth(p: argparse.ArgumentParser) -> None:
    p.add_argument("--access-key", help="access key (or QCLIENT_ACCESS_KEY)")
    p.add_argument("--secret-key", help="secret key (or QCLIENT_SECRET_KEY)")


def _add_logging(p: argparse.ArgumentParser, level: str | None) -> None:
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=_logging.LEVELS,
        help=f"default QCLIENT_LOG_LEVEL, else {level or 'ERROR'}",
    )
    p.add_argument(
        "--log-format",
        choices=_logging.FORMATS,
        help="text lines or one JSON object per line (default text, or QCLIENT_LOG_FORMAT)",
    )


def _add_client_logging(sub: argparse._SubParsersAction) -> None:
    """``--log-level/--log-format`` on every command that has no such options yet."""
    for p in sub.choices.values():
        nested = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        for n in nested:
            _add_client_logging(n)
        if not nested and not any("--log-level" in a.option_strings for a in p._actions):
            _add_logging(p, None)


def _add_server(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on")
    p.add_argument("--port", type=int, default=port, help="port (0 = a free one)")
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", help="private key of --tls-cert (PEM)")
    _add_logging(p, "INFO")
    p.set_defaults(default_log_level="INFO")
    p.add_argument("--ready-file", help=argparse.SUPPRESS)
    p.add_argument("--exit-with-parent", type=int, help=argparse.SUPPRESS)


class _Version(argparse.Action):
    """``--version``, reading the installed version only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"qclient {qclient.__version__}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="qclient", description="Delayed messages: SDK, name server, delay broker."
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("namesrv", help="run a name server in the foreground")
    _add_server(p, DEFAULT_NAMESRV_PORT)
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=DEFAULT_HEARTBEAT_INTERVAL,
        help="seconds between broker heartbeats the brokers are told to use",
    )
    p.add_argument(
        "--broker-expire",
        type=float,
        default=DEFAULT_BROKER_EXPIRE,
        help="seconds without a heartbeat after which a broker leaves the routes",
    )
    p.add_argument(
        "--auth-file", help="accept broker (un)registrations signed by this file's broker entry"
    )
    p.set_defaults(func=cmd_namesrv)

    p = sub.add_parser("broker", help="run a broker in the foreground")
    p.add_argument("--name", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--namesrv", required=True, help="HOST:PORT[,HOST:PORT]")
    _add_server(p, DEFAULT_BROKER_PORT)
    p.add_argument("--advertise-addr", help="HOST:PORT registered with the name servers")
    p.add_argument("--read-only", action="store_true", help="register without the write perm")
    p.add_argument("--auth-file", help="accept only signed requests of these accounts")
    p.add_argument("--tls-ca", help="CA bundle (PEM) that verifies https:// name servers")
    p.add_argument("--no-auto-create-topics", action="store_true")
    p.add_argument("--default-queues", type=int, default=DEFAULT_QUEUES)
    p.add_argument(
        "--heartbeat-interval", type=float, default=DEFAULT_HEARTBEAT_INTERVAL, help="seconds"
    )
    p.add_argument(
        "--min-free-mb",
        type=float,
        default=DEFAULT_MIN_FREE_MB,
        help="refuse sends (DISK_FULL) below this much free space in --data-dir (0: never)",
    )
    p.add_argument(
        "--max-delay",
        type=parse_duration,
        default=DEFAULT_MAX_DELAY.total_seconds(),
        help=f"longest accepted delay (default {DEFAULT_MAX_DELAY.days}d)",
    )
    p.add_argument(
        "--store-option",
        type=key_value,
        action="append",
        metavar="KEY=VALUE",
        help="storage tunable, e.g. bucket_ms=60000 (repeatable)",
    )
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("dev", help="run a name server and N brokers until Ctrl-C")
    p.add_argument(
        "--engine",
        choices=("qclient", "rocketmq"),
        default="qclient",
        help="qclient's own brokers, or Apache RocketMQ 5 JVMs (fetched by make setup)",
    )
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--data-dir")
    p.add_argument("--host", default=DEFAULT_HOST)
    p.add_argument(
        "--port", type=int, default=DEFAULT_NAMESRV_PORT, help="name server port (0 = free)"
    )
    p.add_argument("--heartbeat-interval", type=float, default=5.0)
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser("demo", help="the main job on an embedded cluster")
    p.add_argument("--messages", type=int, default=300)
    p.add_argument(
        "--spread",
        type=parse_duration,
        default=4.0,
        help="delays are spread over this long (default 4s)",
    )
    p.add_argument("--brokers", type=int, default=2)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("send", help="send one message and print its result")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=parse_duration, help="e.g. 5s, 250ms, 2h")
    when.add_argument("--at", type=parse_datetime, help="ISO 8601 with a UTC offset")
    p.add_argument("--key")
    p.add_argument("--tags")
    p.add_argument("--msg-id")
    p.add_argument("--property", type=key_value, action="append", metavar="KEY=VALUE")
    _add_auth(p)
    p.add_argument("body")
    p.set_defaults(func=cmd_send)

    p = sub.add_parser("route", help="print a topic's route")
    p.add_argument("--namesrv", required=True)
    p.add_argument("topic")
    p.set_defaults(func=cmd_route)

    p = sub.add_parser("topic", help="topic administration")
    tsub = p.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    tc = tsub.add_parser("create", help="create a topic on every broker")
    tc.add_argument("--namesrv", required=True)
    tc.add_argument("--queues", type=int, default=DEFAULT_QUEUES)
    _add_auth(tc)
    tc.add_argument("topic")
    tc.set_defaults(func=cmd_topic_create)

    p = sub.add_parser("consume", help="print delivered messages")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--max", type=int, default=None, help="stop after N (default 100)")
    p.add_argument("--timeout", type=parse_duration, default=10.0)
    p.add_argument("--follow", action="store_true", help="keep printing until Ctrl-C")
    _add_auth(p)
    p.set_defaults(func=cmd_consume)

    _cli_lifecycle.add_commands(
        sub, _add_auth, _credentials, parse_duration, parse_datetime, CliError
    )
    _cli_dlq.add_commands(sub, _add_auth, _credentials, parse_duration, CliError)
    _add_client_logging(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = str(
        getattr(args, "log_level", None)
        or os.environ.get("QCLIENT_LOG_LEVEL")
        or getattr(args, "default_log_level", "ERROR")
    )
    fmt = getattr(args, "log_format", None) or os.environ.get("QCLIENT_LOG_FORMAT", "text")
    try:
        _logging.configure(level, fmt)
    except ValueError as exc:  # a bad QCLIENT_LOG_LEVEL / QCLIENT_LOG_FORMAT
        print(f"qclient: error: {exc}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (CliError, QClientError, OSError, ValueError) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"qclient: error: {msg}", file=sys.stderr)
        return 1
