"""``qclient dlq resend``: a group's dead-lettered messages back on their topics.

It reads ``%DLQ%<group>`` as the consumer group ``dlq-resend-<group>`` (so a message is
resent once however often the command runs) and sends each message to the topic its
properties name, with its body, key, tags and own properties (the dead-letter ones
dropped), through the public Producer and Consumer: it works on either engine. A
message's offset is committed only after its copy was acknowledged; the copy's id is
derived from the dead-lettered one, so a message resent again after a crash between
the two is stored once (on a qclient broker).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

__all__ = ["add_commands", "resend_group", "resend_msg_id"]

_MAX_NAME = 127


def resend_group(group: str) -> str:
    """The consumer group that reads ``group``'s DLQ for ``dlq resend``."""
    name = f"dlq-resend-{group}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.blake2b(group.encode(), digest_size=8).hexdigest()
    return f"dlq-resend-{group[: _MAX_NAME - 28]}-{digest}"


def resend_msg_id(group: str, dlq_msg_id: str) -> str:
    """The id of the resent copy of a dead-lettered message."""
    digest = hashlib.blake2b(f"{group}\n{dlq_msg_id}".encode(), digest_size=16).hexdigest()
    return f"RESEND-{digest}"


def add_commands(
    sub: Any,
    add_auth: Callable[[argparse.ArgumentParser], None],
    credentials: Callable[[argparse.Namespace], dict[str, Any]],
    parse_duration: Callable[[str], float],
    cli_error: type[Exception],
) -> None:
    """Register ``dlq resend`` on the ``qclient`` parser's subparsers."""

    def cmd_resend(args: argparse.Namespace) -> int:
        # (imported when run: every qclient command parses this module's arguments)
        from .consumer import Consumer
        from .consumer._failures import (
            PROP_ATTEMPTS,
            PROP_ORIGIN_MSG_ID,
            PROP_ORIGIN_TOPIC,
            PROP_REASON,
            dlq_topic,
        )
        from .producer import Producer

        dlq_props = {PROP_ORIGIN_TOPIC, PROP_ORIGIN_MSG_ID, PROP_ATTEMPTS, PROP_REASON}

        if args.max is not None and args.max < 1:
            raise cli_error("--max must be >= 1")
        creds = credentials(args)
        limit = args.max if args.max is not None else 1 << 62
        resent = skipped = 0
        with (
            Consumer(
                args.namesrv,
                dlq_topic(args.group),
                resend_group(args.group),
                auto_commit=False,
                **creds,
            ) as consumer,
            Producer(args.namesrv, start_detector_enable=False, **creds) as producer,
        ):
            idle_until = time.monotonic() + args.timeout
            while resent + skipped < limit and time.monotonic() < idle_until:
                wait = min(1.0, max(0.0, idle_until - time.monotonic()))
                batch = consumer.poll(min(32, limit - resent - skipped), timeout=wait)
                for m in batch:
                    topic = m.properties.get(PROP_ORIGIN_TOPIC)
                    if not topic:  # not a dead-lettered copy: nowhere to put it back
                        skipped += 1
                        print(json.dumps({"skipped": m.msg_id, "reason": "no origin topic"}))
                        continue
                    props = {k: v for k, v in m.properties.items() if k not in dlq_props}
                    result = producer.send(
                        topic,
                        m.body,
                        key=m.key,
                        tags=m.tags,
                        properties=props or None,
                        msg_id=resend_msg_id(args.group, m.msg_id),
                    )
                    resent += 1
                    line = {
                        "msg_id": result.msg_id,
                        "topic": topic,
                        "origin_msg_id": m.properties.get(PROP_ORIGIN_MSG_ID),
                        "broker": result.broker_name,
                    }
                    print(json.dumps(line), flush=True)
                if batch:
                    consumer.commit()  # after every copy of the batch was acknowledged
                    idle_until = time.monotonic() + args.timeout
        print(json.dumps({"resent": resent, "skipped": skipped}), flush=True)
        return 0

    p = sub.add_parser("dlq", help="dead-letter topics")
    dsub = p.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    r = dsub.add_parser("resend", help="put a group's dead-lettered messages back on their topics")
    r.add_argument("--namesrv", required=True)
    r.add_argument("--group", required=True, help="the group whose %%DLQ%%<group> to resend")
    r.add_argument("--max", type=int, default=None, help="stop after N messages")
    r.add_argument(
        "--timeout",
        type=parse_duration,
        default=5.0,
        help="stop after this long without a message (default 5s)",
    )
    add_auth(r)
    r.set_defaults(func=cmd_resend)
