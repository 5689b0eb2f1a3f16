"""Argument types and the expected-failure error shared by the ``qclient`` commands."""

from __future__ import annotations

import argparse
import re
from datetime import datetime

__all__ = ["CliError", "key_value", "parse_datetime", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


class CliError(Exception):
    """An expected failure: one line on stderr, exit 1."""


def parse_duration(text: str) -> float:
    """``"250ms"``, ``"5s"``, ``"2m"``, ``"1h"``, ``"3d"`` or plain seconds → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r} (use e.g. 500ms, 5s, 2m, 1h, 3d)"
        )
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_datetime(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid ISO 8601 time {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"time {text!r} has no UTC offset (add e.g. +00:00 or Z)")
    return value


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value
