"""Request signing shared by the SDK (signs) and the servers (verify).

``signature = HMAC-SHA256(secret, METHOD \\n PATH \\n sha256(body) \\n TIMESTAMP_MS \\n NONCE)``,
sent in the ``X-QC-*`` headers below. The timestamp bounds how long a captured request
stays valid; the nonce lets a server refuse a replay inside that window.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time

HEADER_ACCESS_KEY = "X-QC-Access-Key"
HEADER_TIMESTAMP = "X-QC-Timestamp"
HEADER_NONCE = "X-QC-Nonce"
HEADER_SIGNATURE = "X-QC-Signature"

#: how far a request's timestamp may be from the server's clock
DEFAULT_MAX_SKEW_MS = 5 * 60 * 1000


def string_to_sign(method: str, path: str, body: bytes, timestamp_ms: int, nonce: str) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return f"{method.upper()}\n{path}\n{digest}\n{timestamp_ms}\n{nonce}".encode()


def signature(
    secret_key: str, method: str, path: str, body: bytes, timestamp_ms: int, nonce: str
) -> str:
    msg = string_to_sign(method, path, body, timestamp_ms, nonce)
    return hmac.new(secret_key.encode(), msg, hashlib.sha256).hexdigest()


def sign_headers(
    access_key: str,
    secret_key: str,
    method: str,
    path: str,
    body: bytes,
    *,
    now_ms: int | None = None,
) -> dict[str, str]:
    """Headers that authenticate one request."""
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    nonce = os.urandom(12).hex()
    return {
        HEADER_ACCESS_KEY: access_key,
        HEADER_TIMESTAMP: str(ts),
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: signature(secret_key, method, path, body, ts, nonce),
    }


def signatures_match(expected: str, given: str) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(expected.encode(), given.encode())
