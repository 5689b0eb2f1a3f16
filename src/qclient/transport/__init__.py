"""HTTP transport of the SDK: httpx calls and the mapping of answers to typed errors."""

from .errors import (
    Outcome,
    classify_exception,
    error_for_code,
    parse_error_response,
    response_outcome,
)
from .http import AsyncHttp, Credentials, HttpResponse, SyncHttp, base_url

__all__ = [
    "AsyncHttp",
    "Credentials",
    "HttpResponse",
    "Outcome",
    "SyncHttp",
    "base_url",
    "classify_exception",
    "error_for_code",
    "parse_error_response",
    "response_outcome",
]
