"""Driver-side check of the DataFrame's columns against the sink's (pyspark.sql.types
only, so the foreachBatch helper works on Spark 3.x, which has no Python data sources)."""

from __future__ import annotations

import logging
import uuid

from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegralType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from ._sink import COLUMNS, SinkSchemaError, resembled_column

__all__ = ["check_schema"]

log = logging.getLogger(__name__)

_EXPECTED = {
    "value": "string or binary",
    "key": "string",
    "topic": "string",
    "deliver_at": "timestamp",
    "delay_ms": "an integer type (long)",
    "tags": "string",
    "properties": "map<string,string>",
    "msg_id": "string",
}


def _type_ok(name: str, dt: DataType) -> bool:
    if name == "value":
        return isinstance(dt, StringType | BinaryType)
    if name == "deliver_at":
        return isinstance(dt, TimestampType)  # not TIMESTAMP_NTZ: its instant is unknown
    if name == "delay_ms":
        return isinstance(dt, IntegralType)
    if name == "properties":
        return (
            isinstance(dt, MapType)
            and isinstance(dt.keyType, StringType)
            and isinstance(dt.valueType, StringType)
        )
    return isinstance(dt, StringType)


#: What this process has warned about already: a stream's writer is made anew for every
#: micro-batch, and one warning per query is enough.
_warned: set[tuple[tuple[str, ...], str]] = set()
_WARNED_MAX = 1024


def _first_warning(ignored: tuple[str, ...], key: str) -> bool:
    if (ignored, key) in _warned:
        return False
    if len(_warned) >= _WARNED_MAX:
        _warned.clear()
    _warned.add((ignored, key))
    return True


def check_schema(
    schema: StructType, *, has_topic_option: bool, warn_key: str | None = None
) -> list[str]:
    """Check the DataFrame's columns; return the ones the sink ignores.

    Raises ``SinkSchemaError`` for a missing ``value``, a wrong-typed sink column, or a
    column whose name looks like a misspelt sink column (a silently ignored ``delay``
    would deliver every row at once). Other columns are ignored, as Spark's Kafka sink
    ignores the columns it does not use, and one warning names them (once per
    ``warn_key`` in this process, e.g. per streaming query; ``None``: every time).
    """
    if warn_key is None:
        warn_key = uuid.uuid4().hex
    names = [f.name for f in schema.fields]
    ignored: list[str] = []
    for f in schema.fields:
        if f.name not in _EXPECTED:
            resembled = resembled_column(f.name)
            if resembled is not None:
                raise SinkSchemaError(
                    f"column {f.name!r} looks like the sink column {resembled!r}: rename it "
                    f"to {resembled!r}, or drop it to write without it (the sink's columns "
                    f"are {', '.join(COLUMNS)})"
                )
            ignored.append(f.name)
            continue
        if not _type_ok(f.name, f.dataType):
            raise SinkSchemaError(
                f"column {f.name!r} must be {_EXPECTED[f.name]}, got {f.dataType.simpleString()}"
            )
    if "value" not in names:
        raise SinkSchemaError(
            f"the DataFrame needs a 'value' column (string or binary); it has {names}"
        )
    if not has_topic_option and "topic" not in names:
        raise SinkSchemaError("set the 'topic' option or give the DataFrame a 'topic' column")
    if ignored and _first_warning(tuple(ignored), warn_key):
        log.warning(
            "qclient sink: ignoring column%s %s (not sink columns: %s)",
            "s" if len(ignored) > 1 else "",
            ", ".join(repr(n) for n in ignored),
            ", ".join(COLUMNS),
        )
    return ignored
