"""Driver-side check of the DataFrame's columns against the sink's (pyspark.sql.types
only, so the foreachBatch helper works on Spark 3.x, which has no Python data sources)."""

from __future__ import annotations

from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegralType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from ._sink import COLUMNS, SinkSchemaError

__all__ = ["check_schema"]

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


def check_schema(schema: StructType, *, has_topic_option: bool) -> None:
    """Raise ``SinkSchemaError`` for a missing ``value``, an unknown or a wrong-typed column."""
    names = [f.name for f in schema.fields]
    if "value" not in names:
        raise SinkSchemaError(
            f"the DataFrame needs a 'value' column (string or binary); it has {names}"
        )
    for f in schema.fields:
        if f.name not in _EXPECTED:
            raise SinkSchemaError(
                f"unknown column {f.name!r} for the qclient sink; the columns are "
                f"{', '.join(COLUMNS)} (select or rename before writing)"
            )
        if not _type_ok(f.name, f.dataType):
            raise SinkSchemaError(
                f"column {f.name!r} must be {_EXPECTED[f.name]}, got {f.dataType.simpleString()}"
            )
    if not has_topic_option and "topic" not in names:
        raise SinkSchemaError("set the 'topic' option or give the DataFrame a 'topic' column")
