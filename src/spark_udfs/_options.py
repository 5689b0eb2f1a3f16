"""Data source options: parsed case-insensitively into the sink's settings and the
``qclient.Producer`` keyword arguments.

Spark hands options over lower-cased in a case-insensitive mapping, so ``sendTimeout``,
``send_timeout`` and ``SEND_TIMEOUT`` all name the same option here: names are compared
with case, ``_``, ``-`` and ``.`` removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from qclient._config import ProducerConfig
from qclient.errors import QClientError

__all__ = ["PRODUCER_OPTIONS", "OptionError", "SinkOptions", "parse_options"]

log = logging.getLogger(__name__)


class OptionError(QClientError, ValueError):
    """A data source option is missing, unknown or has a value of the wrong kind."""


def _bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"option {name!r} must be true or false, got {raw!r}")


def _int(name: str, raw: Any) -> int:
    try:
        return int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, got {raw!r}") from None


def _float(name: str, raw: Any) -> float:
    try:
        return float(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name!r} must be a number, got {raw!r}") from None


def _str(name: str, raw: Any) -> str:
    text = str(raw).strip()
    if not text:
        raise OptionError(f"option {name!r} must not be empty")
    return text


#: Producer options whose default differs in the sink. Larger requests cost less CPU per
#: row on both sides (spark_bench: Spark 44 -> 29 us, brokers 19 -> 12 us per row). A
#: 30 s budget (Kafka's request.timeout.ms, under its Spark sink's 120 s
#: delivery.timeout.ms): a pipeline wants each row once more than an answer within 3 s,
#: and on a loaded host a 1 s attempt share timed out twice at a broker that stored the
#: rows, the last attempt went to the id's next broker, and rows due within a second
#: fired from both before the clean-up could cancel one (decision 0035).
SINK_PRODUCER_DEFAULTS: dict[str, Any] = {"batch_max_messages": 1000, "send_timeout": 30.0}

_SINK_CONVERTERS: dict[str, Callable[[str, Any], Any]] = {
    "topic": _str,
    "rows_per_send": _int,
    "max_in_flight": _int,
    "write_retries": _int,
    "retry_backoff": _float,
    "on_error": _str,
    "job_id": _str,
    "producer_factory": _str,
    "log_level": _str,
}

#: Options Spark itself sets or that belong to Spark, never ours to reject.
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

_SECRET = frozenset({"secret_key"})


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "").replace(".", "")


def _int_tuple(name: str, raw: Any) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(raw).split(",") if p.strip())
    except ValueError:
        raise OptionError(
            f"option {name!r} must be comma-separated integers, got {raw!r}"
        ) from None


def _bool_or_str(name: str, raw: Any) -> bool | str:
    try:
        return _bool(name, raw)
    except OptionError:
        return _str(name, raw)


def _converter_for_default(default: Any) -> Callable[[str, Any], Any]:
    if isinstance(default, bool):
        return _bool
    if isinstance(default, int):
        return _int
    if isinstance(default, float | timedelta):
        return _float  # a timedelta option is given in seconds
    if isinstance(default, tuple):
        return _int_tuple
    return _str


def _producer_params() -> dict[str, Callable[[str, Any], Any]]:
    """Converters for every option of the SDK's ``ProducerConfig`` but ``namesrv`` (and the
    engine, which the address names)."""
    out: dict[str, Callable[[str, Any], Any]] = {}
    for f in dataclasses.fields(ProducerConfig):
        if f.name in ("namesrv", "engine"):
            continue
        if f.name == "verify":
            out[f.name] = _bool_or_str
        elif f.default is not dataclasses.MISSING:
            out[f.name] = _converter_for_default(f.default)
    return out


#: Producer keyword -> converter: every option of ``qclient.Producer``, from
#: ``ProducerConfig``'s fields and their defaults' types.
PRODUCER_OPTIONS: dict[str, Callable[[str, Any], Any]] = {"namesrv": _str, **_producer_params()}


def _validate_producer(kwargs: dict[str, Any]) -> None:
    """Fail on the driver, before any task runs, for a value the producer would refuse."""
    args = dict(kwargs)
    namesrv = args.pop("namesrv")
    try:
        ProducerConfig.create(namesrv, **args)
    except (ValueError, TypeError) as exc:
        raise OptionError(f"invalid producer option: {exc}") from None


@dataclass(frozen=True, repr=False)
class SinkOptions:
    """Everything a writer needs, picklable; ``producer_kwargs`` go to ``qclient.Producer``."""

    topic: str | None  # required unless every row has a `topic` value
    producer_kwargs: dict[str, Any] = field(default_factory=dict)
    rows_per_send: int = 2000  # rows handed to one Producer.send_batch call
    max_in_flight: int = 2  # send_batch calls of one partition running at once
    write_retries: int = 2  # re-sends of rows a send_batch could not place
    retry_backoff: float = 0.2  # seconds before the first re-send, doubled each round
    on_error: str = "fail"  # "fail" the task, or "skip" (count, log, go on)
    job_id: str | None = None  # batch writes: fixes the id prefix, making re-runs idempotent
    producer_factory: str | None = None  # "module:callable" returning a Producer-like object
    log_level: str | None = None  # e.g. INFO: log level of spark_udfs in the worker processes

    @property
    def namesrv(self) -> str:
        return str(self.producer_kwargs["namesrv"])

    def cache_key(self) -> str:
        """A digest of the producer configuration (secrets included, but not readable)."""
        items = sorted((k, repr(v)) for k, v in self.producer_kwargs.items())
        raw = repr((self.producer_factory, items)).encode()
        return hashlib.sha256(raw).hexdigest()

    def __repr__(self) -> str:
        shown = {k: ("***" if k in _SECRET else v) for k, v in self.producer_kwargs.items()}
        return (
            f"SinkOptions(topic={self.topic!r}, producer={shown!r}, "
            f"rows_per_send={self.rows_per_send}, write_retries={self.write_retries}, "
            f"on_error={self.on_error!r}, job_id={self.job_id!r})"
        )

    __str__ = __repr__


#: Options of the sink itself (``SinkOptions``' fields but ``producer_kwargs``), with their
#: defaults (``topic``: None).
SINK_DEFAULTS: dict[str, Any] = {
    f.name: None if f.default is dataclasses.MISSING else f.default
    for f in dataclasses.fields(SinkOptions)
    if f.name != "producer_kwargs"
}


def parse_options(options: Mapping[str, Any], *, require_topic: bool = False) -> SinkOptions:
    """Turn data source options (any case) into ``SinkOptions``; unknown names are an error."""
    producer_convs = PRODUCER_OPTIONS
    by_norm: dict[str, tuple[str, Callable[[str, Any], Any], bool]] = {}
    for name, conv in producer_convs.items():
        by_norm[_norm(name)] = (name, conv, True)
    for name, conv in _SINK_CONVERTERS.items():
        by_norm[_norm(name)] = (name, conv, False)

    producer_kwargs: dict[str, Any] = {}
    sink: dict[str, Any] = dict(SINK_DEFAULTS)
    # Iterate over items(): the mapping Spark passes is case-insensitive, never dict() it.
    for raw_name, raw_value in options.items():
        key = _norm(str(raw_name))
        if key in _SPARK_OPTIONS or raw_value is None:
            continue
        entry = by_norm.get(key)
        if entry is None:
            known = ", ".join(sorted(set(producer_convs) | set(_SINK_CONVERTERS)))
            raise OptionError(f"unknown qclient option {raw_name!r}; known options: {known}")
        name, conv, is_producer = entry
        value = conv(name, raw_value)
        if is_producer:
            producer_kwargs[name] = value
        else:
            sink[name] = value

    if "namesrv" not in producer_kwargs:
        raise OptionError("option 'namesrv' is required (host:port[,host:port...])")
    if ("access_key" in producer_kwargs) != ("secret_key" in producer_kwargs):
        raise OptionError("options 'access_key' and 'secret_key' go together")
    for name, value in SINK_PRODUCER_DEFAULTS.items():
        producer_kwargs.setdefault(name, value)
    _validate_producer(producer_kwargs)
    if require_topic and not sink["topic"]:
        raise OptionError("option 'topic' is required")
    if sink["topic"] is not None:
        from qclient.protocol.wire import valid_topic

        if not valid_topic(sink["topic"]):
            raise OptionError(f"option 'topic' is not a valid topic name: {sink['topic']!r}")
    on_error = str(sink["on_error"]).lower()
    if on_error not in ("fail", "skip"):
        raise OptionError(f"option 'on_error' must be 'fail' or 'skip', got {sink['on_error']!r}")
    if sink["rows_per_send"] < 1:
        raise OptionError("option 'rows_per_send' must be at least 1")
    if sink["max_in_flight"] < 1:
        raise OptionError("option 'max_in_flight' must be at least 1")
    if sink["write_retries"] < 0:
        raise OptionError("option 'write_retries' must be 0 or more")
    sink["on_error"] = on_error
    return SinkOptions(producer_kwargs=producer_kwargs, **sink)
