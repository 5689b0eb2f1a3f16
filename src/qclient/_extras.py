"""Optional parts of the install: which modules an extra provides, and the one-line error
that names the extra when they are missing."""

from __future__ import annotations

import importlib.util

__all__ = ["missing_server_extra"]

#: what the name server and the broker import beyond the SDK (pyproject's "server" extra)
SERVER_MODULES = ("multidict", "prometheus_client")


def missing_server_extra(what: str) -> str | None:
    """None if the servers can run here, else the one-line reason naming the extra."""
    missing = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"{what} needs the server extra: pip install 'qclient[server]' "
        f"(missing: {', '.join(missing)})"
    )
