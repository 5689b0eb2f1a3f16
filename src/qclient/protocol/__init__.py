"""The small protocol module shared by the SDK and the servers (no I/O here)."""
