"""``qclient lookup``, ``qclient cancel`` and ``qclient reschedule``: a message by its id."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ._models import MessageInfo

__all__ = ["add_commands"]


def _producer(args: argparse.Namespace, credentials: dict[str, Any]) -> Any:
    from .producer import Producer

    return Producer(args.namesrv, start_detector_enable=False, **credentials)


def _info_json(info: MessageInfo) -> str:
    fired = info.fired_at
    return json.dumps(
        {
            "msg_id": info.msg_id,
            "topic": info.topic,
            "state": str(info.state),
            "broker": info.broker_name,
            "queue_id": info.queue_id,
            "deliver_at": info.deliver_at.isoformat(),
            "deliver_at_ms": info.deliver_at_ms,
            "fired_at": fired.isoformat() if fired is not None else None,
            "fired_at_ms": info.fired_at_ms,
            "copies": info.copies,
        }
    )


def add_commands(
    sub: Any,
    add_auth: Callable[[argparse.ArgumentParser], None],
    credentials: Callable[[argparse.Namespace], dict[str, Any]],
    parse_duration: Callable[[str], float],
    parse_datetime: Callable[[str], Any],
    cli_error: type[Exception],
) -> None:
    """Register the three subcommands on the ``qclient`` parser's subparsers."""

    def cmd_lookup(args: argparse.Namespace) -> int:
        with _producer(args, credentials(args)) as producer:
            info = producer.lookup(args.topic, args.msg_id)
        if info is None:
            raise cli_error(
                f"message {args.msg_id} of topic {args.topic} is unknown to every broker"
            )
        print(_info_json(info))
        return 0

    def cmd_cancel(args: argparse.Namespace) -> int:
        with _producer(args, credentials(args)) as producer:
            if not producer.cancel(topic=args.topic, msg_id=args.msg_id):
                info = producer.lookup(args.topic, args.msg_id)
                why = "it is unknown" if info is None else f"it is {info.state}"
                raise cli_error(f"message {args.msg_id} was not cancelled: {why}")
        print(json.dumps({"msg_id": args.msg_id, "cancelled": True}))
        return 0

    def cmd_reschedule(args: argparse.Namespace) -> int:
        with _producer(args, credentials(args)) as producer:
            r = producer.reschedule(args.topic, args.msg_id, delay=args.delay, deliver_at=args.at)
        print(
            json.dumps(
                {
                    "msg_id": r.msg_id,
                    "status": str(r.status),
                    "broker": r.broker_name,
                    "queue_id": r.queue_id,
                    "deliver_at": r.deliver_at.isoformat(),
                    "deliver_at_ms": r.deliver_at_ms,
                }
            )
        )
        return 0

    for name, func, text in (
        ("lookup", cmd_lookup, "print a message's state and times (exit 1 if unknown)"),
        ("cancel", cmd_cancel, "cancel a scheduled message by id"),
        ("reschedule", cmd_reschedule, "move a scheduled message to a new time"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--namesrv", required=True)
        p.add_argument("--topic", required=True)
        if name == "reschedule":
            when = p.add_mutually_exclusive_group(required=True)
            when.add_argument("--delay", type=parse_duration, help="e.g. 5m, 250ms, 2h")
            when.add_argument("--at", type=parse_datetime, help="ISO 8601 with a UTC offset")
        add_auth(p)
        p.add_argument("msg_id", metavar="MSG_ID")
        p.set_defaults(func=func)
