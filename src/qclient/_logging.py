"""Logging set-up of the command line and the servers it runs (never of the library).

The library only logs under the ``qclient`` tree, with a ``NullHandler``; a process that
``qclient`` itself is the main program of configures the root logger here: text lines,
or one JSON object per line (``--log-format json``) for log shippers.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "configure"]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: LogRecord attributes that are not caller-supplied ``extra`` fields
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, ``exc`` when there is a traceback, and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in doc:
                doc[key] = value
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure(level: str, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Route every record at ``level`` or above to ``stream`` (stderr) as ``fmt``; like
    ``logging.basicConfig``, a root logger that has handlers already (``main()`` called
    inside another program) is left as it is."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r} (use {' or '.join(FORMATS)})")
    if level.upper() not in LEVELS:
        raise ValueError(f"unknown log level {level!r} (use one of {', '.join(LEVELS)})")
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    root.addHandler(handler)
    root.setLevel(level.upper())
