"""Access control of the servers: accounts, signed-request checks and topic scopes.

The auth file is JSON::

    {"accounts": [{"access_key": "app1", "secret_key": "...", "topics": ["orders", "bill_*"]}],
     "broker": {"access_key": "broker", "secret_key": "..."}}

``topics`` lists what an account may send to, consume from, cancel in and create (``*``
matches any run of characters, ``["*"]`` is everything). The optional ``broker`` entry is
what brokers sign their name-server heartbeats with; without it a broker signs with the
first account, and a name server accepts the signature of any account of its file.

Signatures are checked by :func:`auth_middleware` (see :mod:`qclient.protocol.auth` for
what is signed); a request is refused with 401 and a one-line reason when the signature
is missing, the access key unknown, the signature wrong, the timestamp outside the window
or the nonce already seen inside it. Topic scopes are checked by the handlers through
:meth:`Authorizer.check_topics` (403). Secrets never leave this module: not in reprs, log
lines or error messages.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachetools import TTLCache

from ..protocol import auth, wire
from ..protocol.wire import ErrorCode
from ._http import ApiError, Handler, Middleware, Request, Response

__all__ = [
    "Account",
    "AuthFileError",
    "Authorizer",
    "auth_middleware",
    "heartbeat_signer",
]

log = logging.getLogger(__name__)

#: paths served without a signature (the producers' detector probes them)
OPEN_PATHS = frozenset({wire.HEALTH, wire.METRICS})
#: a topic pattern: topic characters and ``*``
_PATTERN_RE = re.compile(r"^[A-Za-z0-9_%|*-]{1,127}\Z")
_NONCE_RE = re.compile(r"^[\x21-\x7e]{8,64}\Z")
_REQUIRED = (
    auth.HEADER_ACCESS_KEY,
    auth.HEADER_TIMESTAMP,
    auth.HEADER_NONCE,
    auth.HEADER_SIGNATURE,
)
#: at most one refusal log line per reason this often (a flood must not flood the log)
_LOG_EVERY_S = 10.0


class AuthFileError(ValueError):
    """The auth file is missing, not JSON, or not of the expected shape."""


def _compile(patterns: Sequence[str]) -> re.Pattern[str]:
    """One regex for a list of topic patterns; only ``*`` is special."""
    if not patterns:
        return re.compile(r"(?!)")  # matches nothing
    alternatives = "|".join(
        ".*".join(re.escape(part) for part in pat.split("*")) for pat in patterns
    )
    return re.compile(f"(?:{alternatives})\\Z")


@dataclass(frozen=True)
class Account:
    """One access key pair and the topics it may use; the secret is not in the repr."""

    access_key: str
    secret_key: str = field(repr=False)
    topics: tuple[str, ...] = ()
    _matcher: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_matcher", _compile(self.topics))

    def allows(self, topic: str) -> bool:
        """May this account use ``topic``?"""
        return self._matcher.match(topic) is not None


def _str_field(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise AuthFileError(f"{where}.{key} must be a non-empty string")
    return value


def _account(entry: Any, where: str, *, with_topics: bool) -> Account:
    if not isinstance(entry, dict):
        raise AuthFileError(f"{where} must be an object")
    allowed = (
        {"access_key", "secret_key", "topics"} if with_topics else {"access_key", "secret_key"}
    )
    unknown = set(entry) - allowed
    if unknown:
        raise AuthFileError(f"{where} has unknown field(s): {', '.join(sorted(unknown))}")
    access_key = _str_field(entry, "access_key", where)
    if not wire.PRINTABLE_128_RE.match(access_key):
        raise AuthFileError(f"{where}.access_key must be 1-128 printable ASCII characters")
    secret_key = _str_field(entry, "secret_key", where)
    topics: tuple[str, ...] = ()
    if with_topics:
        raw = entry.get("topics")
        if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
            raise AuthFileError(f"{where}.topics must be a list of topic names or patterns")
        for t in raw:
            if not _PATTERN_RE.match(t):
                raise AuthFileError(
                    f"{where}.topics: {t[:140]!r} is not a topic name or "
                    "pattern (topic characters and '*')"
                )
        topics = tuple(raw)
    return Account(access_key, secret_key, topics)


@dataclass(frozen=True)
class AuthFile:
    """What an auth file holds."""

    accounts: tuple[Account, ...]
    broker: Account | None = None

    @classmethod
    def parse(cls, data: Any) -> AuthFile:
        if not isinstance(data, dict):
            raise AuthFileError('the auth file must hold a JSON object with "accounts"')
        unknown = set(data) - {"accounts", "broker"}
        if unknown:
            raise AuthFileError(f"unknown top-level field(s): {', '.join(sorted(unknown))}")
        raw = data.get("accounts")
        if not isinstance(raw, list) or not raw:
            raise AuthFileError('"accounts" must be a non-empty list')
        accounts = tuple(_account(e, f"accounts[{i}]", with_topics=True) for i, e in enumerate(raw))
        broker = (
            _account(data["broker"], "broker", with_topics=False)
            if data.get("broker") is not None
            else None
        )
        keys = [a.access_key for a in accounts] + ([broker.access_key] if broker else [])
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise AuthFileError(f"access key(s) used more than once: {', '.join(dupes)}")
        return cls(accounts, broker)

    @classmethod
    def load(cls, path: str | Path) -> AuthFile:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise AuthFileError(f"cannot read auth file {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            # The position only: the message of a JSON error can quote the file (secrets).
            where = f"line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
            raise AuthFileError(f"auth file {path} is not valid JSON ({where})") from None
        try:
            return cls.parse(data)
        except AuthFileError as exc:
            raise AuthFileError(f"auth file {path}: {exc}") from None


class Authorizer:
    """Checks signed requests against the accounts of an auth file."""

    def __init__(
        self,
        accounts: Iterable[Account],
        *,
        broker: Account | None = None,
        max_skew_ms: int = auth.DEFAULT_MAX_SKEW_MS,
        max_nonces: int = 500_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.accounts: dict[str, Account] = {a.access_key: a for a in accounts}
        self.broker = broker
        self._secrets = frozenset(
            a.secret_key for a in (*self.accounts.values(), broker) if a is not None
        )
        self.max_skew_ms = max_skew_ms
        self.max_nonces = max_nonces
        self._clock = clock
        # A request must be remembered while its timestamp is inside the window: the
        # timestamp may lie up to max_skew ahead, so keep it for twice that. The key is
        # the first 64 bits of its signature (unique per secret, request, timestamp and
        # nonce; ~256 bytes an entry in all, so 500k entries stay near 128 MB).
        self._nonces: TTLCache[int, bool] = TTLCache(
            maxsize=max_nonces, ttl=2 * max_skew_ms / 1000, timer=time.monotonic
        )
        self.refused: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}

    @classmethod
    def from_file(cls, path: str | Path, **options: Any) -> Authorizer:
        """An authorizer for the accounts of ``path`` (raises :class:`AuthFileError`)."""
        f = AuthFile.load(path)
        return cls(f.accounts, broker=f.broker, **options)

    def __repr__(self) -> str:
        return f"<Authorizer {len(self.accounts)} account(s)>"

    # --- checks ---------------------------------------------------------------------

    def _refuse(self, request: Request, status: int, reason: str, message: str) -> ApiError:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged_at.get(reason, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self._logged_at[reason] = now
            log.warning(
                "refused %s %s from %s: %s (%d so far for this reason)",
                request.method,
                request.path,
                request.remote,
                message,
                self.refused[reason],
            )
        code = ErrorCode.FORBIDDEN if status == 403 else ErrorCode.UNAUTHORIZED
        return ApiError(status, code, message)

    def signers(self) -> Mapping[str, Account]:
        """Who may register brokers with a name server: the ``broker`` entry, or everyone."""
        return {self.broker.access_key: self.broker} if self.broker else self.accounts

    def signing_account(self) -> Account:
        """The account a broker signs its heartbeats with: the ``broker`` entry, or the
        file's first account (see module doc)."""
        return self.broker or next(iter(self.accounts.values()))

    async def verify(
        self, request: Request, accounts: Mapping[str, Account] | None = None
    ) -> Account:
        """The account (of ``accounts``, default: the file's accounts) that signed
        ``request``; raises a 401 :class:`ApiError` otherwise."""
        headers = request.headers
        missing = [h for h in _REQUIRED if not headers.get(h)]
        if missing:
            raise self._refuse(
                request,
                401,
                "missing",
                "missing signature: the request has "
                f"no {', '.join(missing)} header (give access_key/secret_key)",
            )
        access_key = headers[auth.HEADER_ACCESS_KEY]
        account = (self.accounts if accounts is None else accounts).get(access_key)
        if account is None:
            # Echo the key only when it is well-formed and not some account's secret
            # (keys and secrets swapped by mistake must not end up in the log).
            shown = (
                access_key[:64]
                if wire.PRINTABLE_128_RE.match(access_key) and access_key not in self._secrets
                else "(not shown)"
            )
            raise self._refuse(request, 401, "unknown_key", f"unknown access key {shown!r}")
        ts_text = headers[auth.HEADER_TIMESTAMP]
        if not ts_text.isascii() or not ts_text.isdigit() or len(ts_text) > 16:
            raise self._refuse(
                request,
                401,
                "bad_timestamp",
                "malformed timestamp: X-QC-Timestamp must be epoch milliseconds",
            )
        timestamp_ms = int(ts_text)
        skew_ms = int(self._clock() * 1000) - timestamp_ms
        if abs(skew_ms) > self.max_skew_ms:
            when = "ago" if skew_ms > 0 else "in the future"
            raise self._refuse(
                request,
                401,
                "expired",
                f"expired timestamp: the request was signed "
                f"{abs(skew_ms) / 1000:.0f} s {when}, the window is "
                f"{self.max_skew_ms / 1000:.0f} s (check the clocks)",
            )
        nonce = headers[auth.HEADER_NONCE]
        if not _NONCE_RE.match(nonce):
            raise self._refuse(
                request,
                401,
                "bad_nonce",
                "malformed nonce: X-QC-Nonce must be 8-64 printable characters",
            )
        body = await request.read()  # bounded by the app's client_max_size
        expected = auth.signature(
            account.secret_key, request.method, request.path, body, timestamp_ms, nonce
        )
        given = headers[auth.HEADER_SIGNATURE]
        if not given.isascii() or not auth.signatures_match(expected, given):
            raise self._refuse(
                request,
                401,
                "bad_signature",
                "bad signature: wrong secret key, or the request was altered after signing",
            )
        key = int(given[:16], 16)  # (hex: checked by the comparison above)
        self._nonces.expire()
        if key in self._nonces:
            raise self._refuse(
                request, 401, "replayed", "replayed nonce: this signed request was already received"
            )
        if len(self._nonces) >= self.max_nonces:
            # Evicting a live nonce would reopen the replay window: refuse instead.
            self.refused["nonce_cache_full"] = self.refused.get("nonce_cache_full", 0) + 1
            raise ApiError(
                503,
                ErrorCode.BROKER_BUSY,
                "too many signed requests inside the replay window; retry later",
            )
        self._nonces[key] = True
        return account

    def check_topics(self, request: Request, topics: Iterable[str]) -> None:
        """Raise 403 unless the request's account may use every one of ``topics``."""
        account: Account | None = request.get("qc_account")
        if account is None:  # the middleware did not run: refuse rather than allow
            raise self._refuse(request, 401, "missing", "missing signature")
        denied = sorted(t for t in set(topics) if not account.allows(t))
        if denied:
            shown = ", ".join(repr(t) for t in denied[:5])
            more = f" and {len(denied) - 5} more" if len(denied) > 5 else ""
            raise self._refuse(
                request,
                403,
                "forbidden",
                f"topic not allowed: access key {account.access_key!r} may not "
                f"use topic {shown}{more}",
            )

    def stats(self) -> dict[str, Any]:
        """Counters without secrets: accounts, refusals by reason, nonces remembered."""
        return {
            "accounts": len(self.accounts),
            "refused": dict(self.refused),
            "nonces": len(self._nonces),
        }


def auth_middleware(
    authorizer: Authorizer,
    *,
    paths: Iterable[str] | None = None,
    accounts: Mapping[str, Account] | None = None,
) -> Middleware:
    """A middleware: every request except ``/health`` and ``/metrics`` must be signed.

    ``paths`` limits the check to those paths (the name server's write endpoints);
    ``accounts`` replaces who may sign (the name server: :meth:`Authorizer.signers`).
    """
    only = frozenset(paths) if paths is not None else None

    async def middleware(request: Request, handler: Handler) -> Response:
        path = request.path
        if path in OPEN_PATHS or (only is not None and path not in only):
            return await handler(request)
        request["qc_account"] = await authorizer.verify(request, accounts)
        return await handler(request)

    return middleware


def heartbeat_signer(
    access_key: str, secret_key: str
) -> Callable[[str, str, bytes], dict[str, str]]:
    """A ``sign(method, path, body) -> headers`` callable for the broker's heartbeat."""

    def sign(method: str, path: str, body: bytes) -> dict[str, str]:
        return auth.sign_headers(access_key, secret_key, method, path, body)

    return sign
