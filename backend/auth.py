"""API tokens and scopes: who may submit, cancel and administer work.

Reads are anonymous. Writes need an **opaque bearer token** (``Authorization: Bearer lst_...``,
or the ``lstdp_session`` cookie the browser gets from ``POST /api/v1/session``) carrying a
scope:

``jobs:submit``
    submit recalibration jobs (and retry, re-run, save searches and webhooks of one's own);
``jobs:cancel``
    cancel one's own jobs;
``admin``
    everything above on everyone's jobs, promote calibration sets, manage tokens.

A token is 32 random bytes from :mod:`secrets` (``secrets.token_urlsafe``, 256 bits: no
dictionary or brute-force attack applies, so one SHA-256 stored at rest is enough, as GitHub
and PyPI store theirs), prefixed ``lst_`` so that secret scanners can find leaked ones. It is
shown once, when made (``lstdp token create``), and only its hash is stored. The FastAPI
dependencies that read a request's principal (``OptionalPrincipal``, ``require_scope``...)
live in :mod:`backend.api.deps`, on FastAPI's own security utilities
(:class:`fastapi.security.HTTPBearer` and :class:`~fastapi.security.APIKeyCookie`), which also
document the scheme in the OpenAPI; this module does not import the API.

The session cookie and CSRF: the browser sends a cookie on its own, so a page of another
site could make it write. Cookie-authenticated writes are safe from that by three checks
(:func:`check_cookie_write`): the cookie is ``SameSite=Strict`` (never sent on a request
another site starts), and a write (any method but GET, HEAD, OPTIONS) made with the cookie
is refused **403** when its ``Content-Type`` is not ``application/json`` (a cross-site form
cannot send that, and a cross-site ``fetch`` that does needs a CORS preflight this API never
grants) or when its ``Origin`` header, where sent, is not this host. Bearer tokens are never
sent by a browser on its own: they need none of this. A cookie whose session is no longer
valid is answered 401 and cleared (``Set-Cookie`` with ``Max-Age=0``).

Sessions: the cookie never holds the token. Signing in (:func:`create_session`) makes a
random session id (32 bytes, :func:`secrets.token_urlsafe`) for the cookie and stores only
its SHA-256 in ``sessions`` (:class:`~backend.models.BrowserSession`), with the token it was
made from and an expiry (``SESSION_LIFETIME_S``, never past the token's). A session
authenticates (:func:`authenticate_session`) while it is neither signed out
(:func:`revoke_session`) nor expired and its token is still active: revoking the token ends
every session made from it.

Errors: no token on a route that needs one, an unknown, revoked or expired token: **401**
(``WWW-Authenticate: Bearer``) with a message naming the scope; a valid token without the
scope: **403**. No message, log line or stored parameter ever holds a token: errors name the
token by its id and prefix only.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass

from fastapi import HTTPException, Request
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend.models import ApiToken, BrowserSession, utcnow
from backend.scopes import SCOPES  # the scopes a token may carry (their own module: the CLI reads them)
from pipelines.errors import DataError
from pipelines.utc import assume_utc

__all__ = ["SCOPES", "TOKEN_PREFIX", "SESSION_COOKIE", "Principal", "AuthError", "new_token", "hash_token",
           "create_token", "list_tokens", "revoke_token", "authenticate", "looks_like_token",
           "redact_tokens", "token_state", "check_cookie_write", "origin_matches", "clear_session_cookie_header",
           "SAFE_METHODS", "RedactTokensFilter", "install_log_redaction", "create_session",
           "authenticate_session", "revoke_session", "session_state", "unauthorized"]

#: Every token starts with this (for secret scanners, and to tell a token from other text).
TOKEN_PREFIX = "lst_"
#: The browser's session cookie (HttpOnly, SameSite=Strict, Secure over https), holding a random
#: session id (never the token).
SESSION_COOKIE = "lstdp_session"
#: ``last_used_at`` is written at most this often per token [s] (not one write per request).
LAST_USED_EVERY_S = 60.0
#: Longest token lifetime ``lstdp token create`` accepts [days].
MAX_EXPIRY_DAYS = 3650
#: Longest user name [characters] (``jobs.owner``).
MAX_USER_CHARS = 100


class AuthError(DataError):
    """A token that cannot be made or changed (unknown scope, unknown token id...)."""


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: the token's user and scopes (``token_id``, ``prefix``: which
    token, for messages; never the token itself)."""

    user: str
    scopes: frozenset[str]
    token_id: int | None = None
    prefix: str = ""

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def has(self, scope: str) -> bool:
        """Whether the token carries ``scope`` (``admin`` carries every scope)."""
        return self.is_admin or scope in self.scopes

    def may_act_on(self, owner: str | None) -> bool:
        """Whether this principal may change work owned by ``owner`` (its own, or any as admin)."""
        return self.is_admin or (owner is not None and owner == self.user)


#: The platform itself (CLI commands, the demo, the reconciler): admin over everything.
SYSTEM = Principal("system", frozenset({"admin"}))


def new_token() -> str:
    """A new opaque token: ``lst_`` and 43 URL-safe characters (32 random bytes, :func:`secrets.token_urlsafe`)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The SHA-256 (hex) stored for ``token``."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


_TOKEN_SHAPE = re.compile(r"lst_[A-Za-z0-9_\-]{20,}")


def looks_like_token(text: str) -> bool:
    return text.startswith(TOKEN_PREFIX) and len(text) >= len(TOKEN_PREFIX) + 20


def redact_tokens(text: str) -> str:
    """``text`` with anything shaped like a token (``lst_`` + 20 or more URL-safe characters)
    replaced by ``lst_***`` (for error messages and logs built from user input)."""
    return _TOKEN_SHAPE.sub("lst_***", text)


class RedactTokensFilter(logging.Filter):
    """A logging filter that rewrites a record's message and string arguments through
    :func:`redact_tokens` (and keeps every record). Installed by :func:`install_log_redaction`
    on the server's own loggers: uvicorn's access log writes each request line, query string
    included, so a token someone put in a URL would otherwise land in the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_tokens(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact_tokens(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact_tokens(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


#: The loggers :func:`install_log_redaction` guards (a logger's filters see only its own records).
REDACTED_LOGGERS = ("uvicorn.access", "uvicorn.error", "backend.api.app")


def install_log_redaction() -> None:
    """Put one :class:`RedactTokensFilter` on each of :data:`REDACTED_LOGGERS` (again: no-op)."""
    for name in REDACTED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokensFilter) for f in logger.filters):
            logger.addFilter(RedactTokensFilter())


def _check_scopes(scopes: list[str] | tuple[str, ...]) -> list[str]:
    out = sorted(set(scopes))
    bad = [s for s in out if s not in SCOPES]
    if bad:
        raise AuthError(f"unknown scope(s) {', '.join(map(repr, bad))}; expected {', '.join(SCOPES)}")
    if not out:
        raise AuthError(f"a token needs at least one scope: {', '.join(SCOPES)}")
    return out


def create_token(session: Session, user: str, scopes: list[str] | tuple[str, ...], *,
                 expires_in_days: float | None = 90.0, description: str = "",
                 now: dt.datetime | None = None) -> tuple[ApiToken, str]:
    """Make a token for ``user`` with ``scopes``; returns ``(row, token)``: the token is
    returned here only (the row holds its hash). The caller commits.

    Parameters
    ----------
    expires_in_days : float or None
        Lifetime [days], 0 < d <= :data:`MAX_EXPIRY_DAYS`; None: never expires.

    Raises
    ------
    AuthError
        Unknown or no scopes, an empty or too long user name, a lifetime out of range.
    """
    user = (user or "").strip()
    if not user or len(user) > MAX_USER_CHARS or any(c.isspace() for c in user) or looks_like_token(user):
        raise AuthError(f"a user name is 1-{MAX_USER_CHARS} characters without spaces")
    good = _check_scopes(scopes)
    now = now or utcnow()
    expires = None
    if expires_in_days is not None:
        if not 0 < expires_in_days <= MAX_EXPIRY_DAYS:
            raise AuthError(f"expiry must be between 0 and {MAX_EXPIRY_DAYS} days, got {expires_in_days:g}")
        expires = now + dt.timedelta(days=expires_in_days)
    token = new_token()
    row = ApiToken(user=user, prefix=token[:10], token_hash=hash_token(token), scopes=good,
                   description=(description or "")[:200], created_at=now, expires_at=expires)
    session.add(row)
    session.flush()
    return row, token


def list_tokens(session: Session, user: str | None = None) -> list[ApiToken]:
    """Tokens (newest first), of ``user`` when given."""
    q = select(ApiToken).order_by(ApiToken.id.desc())
    if user:
        q = q.where(ApiToken.user == user)
    return list(session.scalars(q))


def revoke_token(session: Session, token_id: int, *, now: dt.datetime | None = None) -> ApiToken:
    """Revoke token ``token_id`` (from then on it is answered 401); the caller commits.

    Raises
    ------
    AuthError
        No token with that id.
    """
    row = session.get(ApiToken, token_id)
    if row is None:
        raise AuthError(f"no token with id {token_id}")
    if row.revoked_at is None:
        row.revoked_at = now or utcnow()
    # its browser sessions end with it (authenticate_session also checks the token's state)
    session.execute(update(BrowserSession).where(BrowserSession.token_id == token_id,
                                                 BrowserSession.revoked_at.is_(None))
                    .values(revoked_at=row.revoked_at).execution_options(synchronize_session=False))
    session.flush()
    return row


def token_state(row: ApiToken, now: dt.datetime | None = None) -> str:
    """``active``, ``revoked`` or ``expired``."""
    now = now or utcnow()
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and assume_utc(row.expires_at) <= now:
        return "expired"
    return "active"


def authenticate(session: Session, token: str, *, now: dt.datetime | None = None) -> Principal:
    """The principal of ``token``.

    Raises
    ------
    fastapi.HTTPException
        401 for an unknown, revoked or expired token (the message says which, naming the
        token by its id and prefix only).
    """
    now = now or utcnow()
    digest = hash_token(token.strip())
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        raise unauthorized("the API token is not known (check it, or make one with `lstdp token create`)")
    state = token_state(row, now)
    if state != "active":
        when = row.revoked_at if state == "revoked" else row.expires_at
        raise unauthorized(f"API token {row.id} ({row.prefix}...) was {state} at "
                           f"{assume_utc(when).isoformat().replace('+00:00', 'Z')}")
    last = assume_utc(row.last_used_at) if row.last_used_at else None
    if last is None or (now - last).total_seconds() > LAST_USED_EVERY_S:
        # its own statement, committed by whoever commits the request's session (a read
        # commits nothing: then the time is not kept, which costs nothing)
        session.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now)
                        .execution_options(synchronize_session=False))
    return Principal(row.user, frozenset(row.scopes or ()), row.id, row.prefix)


# -- browser sessions ----------------------------------------------------------------------------


def create_session(session: Session, token_id: int, *, lifetime_s: float,
                   now: dt.datetime | None = None) -> tuple[BrowserSession, str]:
    """Start a browser session of token ``token_id``; returns ``(row, session_id)``: the id
    (for the cookie) is returned here only, the row holds its SHA-256. It expires after
    ``lifetime_s`` [s], or when the token does if sooner. Flushed; the caller commits.

    Raises
    ------
    AuthError
        No token with that id.
    """
    now = now or utcnow()
    token = session.get(ApiToken, token_id)
    if token is None:
        raise AuthError(f"no token with id {token_id}")
    expires = now + dt.timedelta(seconds=lifetime_s)
    if token.expires_at is not None:
        expires = min(expires, assume_utc(token.expires_at))
    sid = secrets.token_urlsafe(32)
    row = BrowserSession(session_hash=hash_token(sid), token_id=token.id, user=token.user, created_at=now,
                         expires_at=expires, last_seen_at=now)
    session.add(row)
    session.flush()
    return row, sid


def session_state(row: BrowserSession, token: ApiToken | None, now: dt.datetime | None = None) -> str:
    """``active``, ``signed out``, ``expired``, or the token's state (``token revoked``,
    ``token expired``; ``token deleted`` without one)."""
    now = now or utcnow()
    if token is None:
        return "token deleted"
    if token.revoked_at is not None:
        return "token revoked"
    if row.revoked_at is not None:
        return "signed out"
    if assume_utc(row.expires_at) <= now:
        return "expired"
    if token_state(token, now) != "active":
        return f"token {token_state(token, now)}"
    return "active"


def _session_row(session: Session, session_id: str) -> BrowserSession | None:
    digest = hash_token(session_id.strip())
    row = session.scalar(select(BrowserSession).where(BrowserSession.session_hash == digest))
    return row if row is not None and hmac.compare_digest(row.session_hash, digest) else None


def authenticate_session(session: Session, session_id: str, *,
                         now: dt.datetime | None = None) -> tuple[Principal, BrowserSession]:
    """The principal of the browser session whose cookie holds ``session_id``, and its row.

    Raises
    ------
    fastapi.HTTPException
        401 for an unknown session (never made, or a cookie that holds something else, such
        as a token), one signed out, expired, or whose token is revoked or expired.
    """
    now = now or utcnow()
    row = _session_row(session, session_id)
    if row is None:
        raise unauthorized("the session is not known (signed out, or never made)")
    token = session.get(ApiToken, row.token_id)
    state = session_state(row, token, now)
    if state != "active":
        raise unauthorized(f"session {row.id} of API token {row.token_id} has ended ({state})")
    last = assume_utc(row.last_seen_at) if row.last_seen_at else None
    if last is None or (now - last).total_seconds() > LAST_USED_EVERY_S:
        session.execute(update(BrowserSession).where(BrowserSession.id == row.id).values(last_seen_at=now)
                        .execution_options(synchronize_session=False))
    return Principal(token.user, frozenset(token.scopes or ()), token.id, token.prefix), row


def revoke_session(session: Session, session_id: str, *, now: dt.datetime | None = None) -> BrowserSession | None:
    """Sign out: end the session whose cookie holds ``session_id`` (from then on that cookie
    is answered 401). Returns its row, None for an unknown id. Flushed; the caller commits."""
    row = _session_row(session, session_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = now or utcnow()
        session.flush()
    return row


def unauthorized(detail: str) -> HTTPException:
    """401 with ``detail`` and ``WWW-Authenticate: Bearer``."""
    return HTTPException(401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


#: Methods that never write: the CSRF checks of :func:`check_cookie_write` leave them alone.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def request_host(request: Request) -> str:
    """This server's ``host[:port]`` as the client addressed it (the ``Host`` header, lower case)."""
    return (request.headers.get("host") or request.url.netloc).strip().lower()


def origin_matches(request: Request) -> bool:
    """Whether the request's ``Origin`` header is absent or names this host (``scheme://host[:port]``,
    compared by ``host[:port]`` so a TLS-terminating proxy in front does not matter). ``Origin: null``
    (a sandboxed frame, a ``file:`` page) never matches."""
    from urllib.parse import urlsplit

    origin = request.headers.get("origin")
    if origin is None:
        return True
    try:
        netloc = urlsplit(origin.strip()).netloc.lower()
    except ValueError:
        return False
    return bool(netloc) and netloc == request_host(request)


def check_cookie_write(request: Request) -> None:
    """Refuse a write made with the session cookie that a page of another site could have made
    (the module docstring: CSRF).

    Raises
    ------
    fastapi.HTTPException
        403 when the method writes and the ``Content-Type`` is not ``application/json``, or the
        ``Origin`` header names another host.
    """
    if request.method.upper() in SAFE_METHODS:
        return
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise HTTPException(403, detail=f"a write made with the session cookie must be sent as application/json "
                                        f"(got {redact_tokens(ctype)[:60] or 'no Content-Type'}); this refuses "
                                        "cross-site form posts (CSRF). Scripts should send Authorization: Bearer")
    if not origin_matches(request):
        origin = redact_tokens(request.headers.get("origin", ""))[:100]
        raise HTTPException(403, detail=f"a write made with the session cookie must come from this site "
                                        f"({request_host(request)[:100]}), not from Origin {origin!r} (CSRF)")


def clear_session_cookie_header() -> str:
    """A ``Set-Cookie`` value that removes :data:`SESSION_COOKIE` (for error answers, which carry no
    :class:`~starlette.responses.Response` to call ``delete_cookie`` on)."""
    return f"{SESSION_COOKIE}=\"\"; HttpOnly; Max-Age=0; Path=/; SameSite=strict"
