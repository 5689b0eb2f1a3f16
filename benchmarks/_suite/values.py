"""A result's values as report text: numbers formatted for tables, nested JSON flattened.

Shared by the report (tables) and the plots (throughput keys), so neither imports the other.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BULK_KEYS", "flatten", "fmt"]

#: keys that hold bulk data for plots, not numbers for tables
BULK_KEYS = {
    "samples_ms",
    "lateness_samples_ms",
    "timeline",
    "chaos_timeline",
    "throughput",
    "peers",
    "targets",
    "notes",
}


def fmt(v: Any) -> str:
    """One table cell: short numbers, no table-breaking characters."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    return str(v).replace("|", "\\|").replace("\n", " ")


def flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Scalars of a nested JSON value as (dotted key, value); bulk keys and long lists skipped."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in BULK_KEYS and not prefix:
                continue
            if k == "samples_ms":
                continue
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        if all(not isinstance(x, dict | list) for x in obj):
            if len(obj) <= 8:
                out.append((prefix, ", ".join(fmt(x) for x in obj)))
        else:
            for i, x in enumerate(obj):
                label = i
                if isinstance(x, dict):
                    label = x.get("name") or x.get("mode") or x.get("peer") or x.get("label") or i
                out += flatten(x, f"{prefix}[{label}]")
    else:
        out.append((prefix, obj))
    return out
