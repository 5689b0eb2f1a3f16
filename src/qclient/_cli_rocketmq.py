"""The CLI's route and topic commands against a RocketMQ cluster (``rocketmq://`` names)."""

from __future__ import annotations

import argparse

from ._cli_args import CliError
from .engines.rocketmq.admin import create_topic
from .engines.rocketmq.nameserver import RocketMQNameServer
from .engines.rocketmq.pool import ConnectionPool
from .protocol import wire

__all__ = ["route", "topic_create"]


def route(args: argparse.Namespace, addrs: tuple[str, ...]) -> int:
    """Print the topic's route as the NameServers have it (no auto-create route)."""
    with RocketMQNameServer(addrs) as ns:
        found = ns.route(args.topic)
    print(wire.encode(found).decode())
    return 0


def topic_create(args: argparse.Namespace, addrs: tuple[str, ...]) -> int:
    """Create the topic on every master of the cluster."""
    if args.access_key or args.secret_key:
        raise CliError("the rocketmq engine does not support access keys here")
    pool = ConnectionPool()
    try:
        masters = create_topic(pool, addrs, args.topic, args.queues)
    finally:
        pool.close()
    for name, addr in masters.items():
        print(f"created {args.topic} with {args.queues} queues on {name} ({addr})")
    return 0
