"""Limits of one message, shared by the SDK, the broker and the store (no I/O here)."""

from __future__ import annotations

__all__ = ["MAX_DELAY_MS", "MAX_MESSAGE_SIZE"]

#: the longest delay (and furthest deliver time ahead) a broker accepts by default
MAX_DELAY_MS = 40 * 86_400_000
#: the largest message body a broker accepts by default (bytes, before compression)
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
