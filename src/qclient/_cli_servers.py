"""The ``qclient`` commands that run servers: namesrv, broker, dev, demo."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from typing import Any

from ._cli_args import CliError
from ._config import DEFAULT_HOST
from ._extras import missing_server_extra

__all__ = ["cmd_broker", "cmd_demo", "cmd_dev", "cmd_namesrv"]

log = logging.getLogger("qclient.cli")


def _run_server(coro: Any) -> None:
    """Run a server coroutine on uvloop when it is installed (measured:
    docs/decisions/0001-http-stack-aiohttp-uvloop.md)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def _need_server_extra(what: str) -> None:
    missing = missing_server_extra(what)
    if missing:
        raise CliError(missing)


def cmd_namesrv(args: argparse.Namespace) -> int:
    _need_server_extra("qclient namesrv")
    from .server.namesrv import NameServerConfig, run

    cfg = NameServerConfig(
        host=args.host,
        port=args.port,
        heartbeat_interval_ms=int(args.heartbeat_interval * 1000),
        broker_expire_ms=int(args.broker_expire * 1000),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        auth_file=args.auth_file,
        ready_file=args.ready_file,
        exit_with_parent=args.exit_with_parent,
    )
    if args.auth_file and not os.path.isfile(args.auth_file):
        raise CliError(f"auth file {args.auth_file} does not exist")
    _run_server(run(cfg))
    return 0


_STORE_BOOL_KEYS = {"fsync", "id_index", "visible_before_sync", "firing_thread"}
_STORE_INT_KEYS = {
    "segment_bytes",
    "bucket_ms",
    "load_ahead_ms",
    "dedupe_window_ms",
    "dedupe_max_ids",
    "max_pending_messages",
    "sync_interval_ms",
    "fire_ahead_ms",
    "checkpoint_interval_ms",
    "offsets_write_ms",
    "retain_fired_ms",
}


def _store_options(pairs: list[tuple[str, str]]) -> dict[str, int | bool]:
    out: dict[str, int | bool] = {}
    for key, value in pairs:
        if key in _STORE_BOOL_KEYS:
            out[key] = value.lower() in ("1", "true", "yes", "on")
        elif key in _STORE_INT_KEYS:
            try:
                out[key] = int(value)
            except ValueError:
                raise CliError(f"--store-option {key} needs an integer, got {value!r}") from None
        else:
            raise CliError(
                f"unknown --store-option {key!r} "
                f"(known: {', '.join(sorted(_STORE_BOOL_KEYS | _STORE_INT_KEYS))})"
            )
    return out


def cmd_broker(args: argparse.Namespace) -> int:
    from .protocol.wire import split_addrs

    _need_server_extra("qclient broker")
    from .server.broker import BrokerConfig, run

    namesrv = list(split_addrs(args.namesrv))  # ValueError: one line, exit 1
    if args.auth_file and not os.path.isfile(args.auth_file):
        raise CliError(f"auth file {args.auth_file} does not exist")
    cfg = BrokerConfig(
        name=args.name,
        data_dir=args.data_dir,
        namesrv=namesrv,
        host=args.host,
        port=args.port,
        advertise_addr=args.advertise_addr,
        read_only=args.read_only,
        auth_file=args.auth_file,
        auto_create_topics=not args.no_auto_create_topics,
        default_queue_nums=args.default_queues,
        heartbeat_interval_ms=int(args.heartbeat_interval * 1000),
        max_delay_ms=int(args.max_delay * 1000),
        store=_store_options(args.store_option or []),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        ready_file=args.ready_file,
        exit_with_parent=args.exit_with_parent,
        min_free_bytes=int(args.min_free_mb * 2**20),
    )
    _run_server(run(cfg))
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from .cluster import LocalCluster

    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.engine == "rocketmq":
        if args.host != DEFAULT_HOST:
            raise CliError("the rocketmq engine's processes bind 127.0.0.1 only")
        cluster: Any = LocalCluster(
            brokers=args.brokers,
            data_dir=args.data_dir,
            engine="rocketmq",
            namesrv_port=args.port,
        )
    else:
        cluster = LocalCluster(
            brokers=args.brokers,
            data_dir=args.data_dir,
            namesrv_port=args.port,
            host=args.host,
            heartbeat_interval=args.heartbeat_interval,
        )
    with cluster:
        print(f"namesrv={cluster.namesrv}", flush=True)
        for b in cluster.brokers:
            print(f"broker={b.name} addr={b.addr} pid={b.pid}", flush=True)
        print(f"data in {cluster.data_dir}; Ctrl-C to stop", file=sys.stderr, flush=True)
        while not stop:
            time.sleep(0.2)
            for node in [cluster.namesrv_node, *cluster.brokers]:
                if not node.running:
                    raise CliError(f"{node.role} {node.name} exited; see {node.log_path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(messages=args.messages, spread=args.spread, brokers=args.brokers)
