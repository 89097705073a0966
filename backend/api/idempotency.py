"""``Idempotency-Key``: every POST may carry one (as Stripe's API), so that a client may repeat a
write whose answer it did not get (a 503, a dropped connection) without writing twice.

:class:`IdempotencyMiddleware`, applied once around every route:

* the key (1 to 255 printable ASCII characters) is kept per principal: the SHA-256 of the
  request's credential (bearer token, else session cookie), ``anonymous`` without one; with
  the request's fingerprint, the SHA-256 of its method, path, query and body;
* the first request with a key stores a row (table ``idempotency_keys``) before it runs, and
  its answer (status, body, ``content-type`` and ``location``) when it ends with a status
  below 400; an answer of 400 or more (nothing was done: a bad request, a refused token, a
  quota, a 503 whose write did not happen) frees the key, so the same key may be sent again;
* a repeat with the same key and request gets the stored answer, with
  ``Idempotent-Replayed: true``; with another request (method, path or body) a 422; while
  the first is still in progress a 409 (an in-progress row older than :data:`STALE_S`, a
  process that died, is taken over);
* keys expire ``IDEMPOTENCY_TTL_S`` (24 h) after their first use; expired rows are deleted
  when a new key is stored;
* a key sent with a credential that no longer authenticates (revoked or expired token,
  signed-out or expired session) is ignored: the route runs and answers 401, and nothing
  stored is replayed to it; ``POST /api/v1/session`` (sign-in, whose answer is a cookie) is
  never keyed.

The rows are in the database, so several API processes share them. A request answered 503 at
its deadline goes on in the background and stores its own answer when it ends: a repeat then
gets it (the same write), or runs again if that answer was an error (the write did not
happen: a commit past the deadline is refused, :class:`backend.api.app.DeadlineMiddleware`).
Answers are kept uncompressed (the gzip of :func:`backend.api.app.add_text_compression` runs
inside this middleware, so a gzip answer is decoded first; a replay is sent uncompressed).
Secrets are never stored: in a JSON answer every string that is an API token (``lst_...``) or a
webhook secret (``whsec_...``) is replaced by null before the answer is kept (a body that is not
JSON and holds such a prefix is not kept at all), and the replay
says so in ``replay_note`` (the secret was shown once, in the first answer; a client that lost
it makes a new one). An answer over :data:`MAX_STORED_BYTES` is not kept either: its key stays
used, and a repeat is 409 saying the first request succeeded (never a second write).
``Set-Cookie`` is not replayed.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import logging
import re

import anyio
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from backend.auth import SESSION_COOKIE
from backend.db import get_sessionmaker
from backend.models import IdempotencyKey
from backend.settings import get_settings

__all__ = ["IdempotencyMiddleware", "HEADER", "STALE_S", "MAX_STORED_BYTES", "SECRET_PREFIXES", "redact_secrets"]

log = logging.getLogger(__name__)

HEADER = "idempotency-key"
#: An in-progress key older than this [s] belongs to a request whose process died: taken over.
STALE_S = 600.0
#: Largest answer stored for replay [bytes]; a larger one frees its key.
MAX_STORED_BYTES = 1 << 20
_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")
_REPLAYED_HEADERS = ("content-type", "content-encoding", "vary", "location", "retry-after")


def _credentials(headers: dict[bytes, bytes]) -> tuple[str | None, str | None]:
    """The request's ``(bearer token, session cookie value)``, each None where absent."""
    auth = headers.get(b"authorization", b"").decode("latin-1")
    bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
    cookie = None
    for part in headers.get(b"cookie", b"").split(b";"):
        name, _, value = part.strip().partition(b"=")
        if name == SESSION_COOKIE.encode() and value:
            cookie = value.decode("latin-1")
    return bearer, cookie


def _principal(headers: dict[bytes, bytes]) -> str:
    """Whose key space a key is in: the SHA-256 of the credential (bearer token, else session
    cookie), ``anonymous`` without one."""
    bearer, cookie = _credentials(headers)
    if bearer is not None:
        credential = b"Bearer " + bearer.encode("latin-1")
    elif cookie is not None:
        credential = b"cookie:" + cookie.encode("latin-1")
    else:
        return "anonymous"
    return hashlib.sha256(credential).hexdigest()


def _credential_live(headers: dict[bytes, bytes]) -> bool:
    """Whether the request's credential (bearer token, else session cookie) is one that
    authenticates now; True without one. A stored answer is never replayed to a credential
    that was revoked, signed out or expired since (it would read what a plain request may not).
    Reads only (no ``last_used_at`` write: that row may be locked by a request in progress)."""
    from backend.auth import _session_row, hash_token, session_state, token_state
    from backend.models import ApiToken

    bearer, cookie = _credentials(headers)
    if bearer is None and cookie is None:
        return True
    with _session() as session:
        try:
            if bearer is not None:
                row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(bearer)))
                return row is not None and token_state(row) == "active"
            browser = _session_row(session, cookie)
            return browser is not None and session_state(browser, session.get(ApiToken, browser.token_id)) == "active"
        finally:
            session.rollback()


def _fingerprint(method: str, path: str, query: bytes, body: bytes) -> str:
    h = hashlib.sha256()
    for part in (method.encode(), path.encode(), query, hashlib.sha256(body).digest()):
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()


def _session():
    session = get_sessionmaker("api")()
    session.info["after_deadline"] = True  # the store's commits are not the request's write
    return session


def _claim(principal: str, key: str, fingerprint: str, method: str, path: str) -> tuple[str, IdempotencyKey | None]:
    """Store the key as in progress: ``("new", None)``; or the row already there:
    ``("replay" | "conflict" | "mismatch", row)``."""
    now = dt.datetime.now(dt.UTC)
    ttl = dt.timedelta(seconds=get_settings().idempotency_ttl_s)
    with _session() as session:
        row = session.get(IdempotencyKey, (principal, key))
        if row is not None and (_aware(row.expires_at) <= now or (
                row.status is None and _aware(row.created_at) <= now - dt.timedelta(seconds=STALE_S))):
            session.delete(row)  # expired, or the in-progress row of a process that died
            session.commit()
            row = None
        if row is None:
            session.execute(delete(IdempotencyKey).where(IdempotencyKey.expires_at <= now))
            session.add(IdempotencyKey(principal=principal, key=key, fingerprint=fingerprint, method=method,
                                       path=path[:2000], status=None, headers={}, body=None, created_at=now,
                                       expires_at=now + ttl))
            try:
                session.commit()
                return "new", None
            except IntegrityError:  # another process stored it meanwhile
                session.rollback()
                row = session.get(IdempotencyKey, (principal, key))
                if row is None:
                    return "conflict", None
        if row.fingerprint != fingerprint:
            return "mismatch", row
        return ("conflict" if row.status is None else "replay"), row


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


#: Prefixes of the secrets an answer may carry once (API tokens, webhook secrets): never stored.
SECRET_PREFIXES = ("lst_", "whsec_")
#: A whole secret: a prefix and 20 or more URL-safe characters (a token's 10-character
#: ``prefix`` field is not one).
_SECRET_RE = re.compile(r"^(?:lst_|whsec_)[A-Za-z0-9_\-]{20,}$")
#: Routes that are never idempotent by key: signing in answers a cookie, which a replay could
#: not give (the repeat is run again; signing in twice is harmless).
UNKEYED_PATHS = frozenset({"/api/v1/session"})
#: What a replay says where it left a secret out.
REPLAY_NOTE = ("replayed answer of an Idempotency-Key: the secrets of the first answer (shown once) are not kept "
               "and read null here")


def redact_secrets(body: bytes, content_type: str) -> bytes:
    """``body`` with every JSON string value that is a whole secret (one of
    :data:`SECRET_PREFIXES` and 20 or more URL-safe characters) replaced by null (and, where one
    was, ``replay_note`` set on the top-level object). A body that is not JSON is returned as it
    is when it holds no secret prefix at all, else None (not to be kept). Raises nothing."""
    if "json" not in content_type.lower():
        return None if any(p.encode() in body for p in SECRET_PREFIXES) else body
    try:
        doc = json.loads(body)
    except ValueError:
        return None if any(p.encode() in body for p in SECRET_PREFIXES) else body
    found = False

    def walk(node):
        nonlocal found
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, str) and _SECRET_RE.match(node):
            found = True
            return None
        return node

    doc = walk(doc)
    if not found:
        return body
    if isinstance(doc, dict):
        doc["replay_note"] = REPLAY_NOTE
    return json.dumps(doc).encode()


def _finish(principal: str, key: str, status: int | None, headers: dict[str, str], body: bytes | None) -> None:
    """Store the answer (``status`` below 400; secrets left out, :func:`redact_secrets`; an
    answer over :data:`MAX_STORED_BYTES` as status only, body null), or free the key (anything
    else, ``None``: no answer)."""
    with _session() as session:
        if status is not None and status < 400:
            kept = None
            encoding = headers.pop("content-encoding", "identity").strip().lower()
            if body is not None and encoding == "gzip":  # compressed inside us: keep the plain answer
                try:
                    body = gzip.decompress(body)
                except (OSError, EOFError):
                    body = None
            elif encoding not in ("", "identity"):
                body = None
            if body is not None and len(body) <= MAX_STORED_BYTES:
                kept = redact_secrets(body, headers.get("content-type", ""))
            session.execute(update(IdempotencyKey).where(
                IdempotencyKey.principal == principal, IdempotencyKey.key == key,
                IdempotencyKey.status.is_(None)).values(status=status, headers=headers, body=kept))
        else:
            session.execute(delete(IdempotencyKey).where(
                IdempotencyKey.principal == principal, IdempotencyKey.key == key, IdempotencyKey.status.is_(None)))
        session.commit()


async def _json(send, status: int, detail: str, extra: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": body})


class IdempotencyMiddleware:
    """Honour ``Idempotency-Key`` on every POST (module docstring). Requests without the header,
    and other methods, pass through untouched."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        raw_key = headers.get(HEADER.encode())
        if raw_key is None:
            await self.app(scope, receive, send)
            return
        if scope["path"] in UNKEYED_PATHS:
            await self.app(scope, receive, send)
            return
        key = raw_key.decode("latin-1")
        if not _KEY_RE.match(key):
            await _json(send, 422, "Idempotency-Key must be 1 to 255 printable ASCII characters (no spaces)")
            return
        chunks, more = [], True
        while more:  # the whole body (at most MAX_BODY_BYTES, BodySizeLimitMiddleware), for its hash
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        principal = _principal(headers)
        fingerprint = _fingerprint(scope["method"], scope["path"], scope.get("query_string", b""), body)
        replayed = False

        async def replay_receive():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            live = await anyio.to_thread.run_sync(_credential_live, headers)
            if not live:  # a signed-out cookie, a revoked or unknown token: the route answers 401
                await self.app(scope, replay_receive, send)
                return
            outcome, row = await anyio.to_thread.run_sync(_claim, principal, key, fingerprint, scope["method"],
                                                          scope["path"])
        except Exception as exc:  # noqa: BLE001 - the database: nothing was done, say so
            from backend.faults import public_reason

            log.error("could not check Idempotency-Key on %s: %s", scope["path"], exc)
            await _json(send, 503, f"the Idempotency-Key could not be checked: the database is unavailable "
                                   f"({public_reason(exc)}); nothing was done, try again later", [(b"retry-after", b"2")])
            return
        if outcome == "mismatch":
            await _json(send, 422, f"Idempotency-Key {key[:40]!r} was first used with another request "
                                   f"({row.method} {row.path[:200]} with another body); use a new key for a new request")
            return
        if outcome == "conflict":
            await _json(send, 409, f"the first request with Idempotency-Key {key[:40]!r} is still in progress; "
                                   "repeat it once that one has been answered", [(b"retry-after", b"1")])
            return
        if outcome == "replay" and row.body is None:
            await _json(send, 409, f"the first request with Idempotency-Key {key[:40]!r} succeeded (HTTP {row.status}, "
                                   f"{_aware(row.created_at):%Y-%m-%dT%H:%M:%SZ}); its answer was too large to keep, "
                                   "so it is not replayed and nothing was done again")
            return
        if outcome == "replay":
            stored = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (row.headers or {}).items()]
            await send({"type": "http.response.start", "status": row.status,
                        "headers": [*stored, (b"content-length", str(len(row.body or b"")).encode()),
                                    (b"idempotent-replayed", b"true")]})
            await send({"type": "http.response.body", "body": row.body or b""})
            return

        status: int | None = None
        kept: dict[str, str] = {}
        out: list[bytes] = []

        async def recording_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                for k, v in message.get("headers") or []:
                    name = k.decode("latin-1").lower()
                    if name in _REPLAYED_HEADERS:
                        kept[name] = v.decode("latin-1")
            elif message["type"] == "http.response.body" and sum(map(len, out)) <= MAX_STORED_BYTES:
                out.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, replay_receive, recording_send)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(_finish, principal, key, status, kept, b"".join(out))
                except Exception:  # noqa: BLE001 - the key then stays in progress until STALE_S
                    log.exception("could not store the answer of Idempotency-Key %r", key[:40])


#: The header's OpenAPI parameter, added to every POST (:func:`document_idempotency`).
PARAMETER = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": "Makes the POST safe to repeat (as Stripe's API): a repeat with the same key and request gets "
                   "the first answer (`Idempotent-Replayed: true`); the same key with another request is 422; "
                   "while the first is in progress, 409. Kept per credential for IDEMPOTENCY_TTL_S (24 h). An "
                   "answer of 400 or more frees the key. Any unique string, e.g. a UUID.",
}


def document_idempotency(app):
    """Make ``app.openapi()`` list :data:`PARAMETER` on every POST operation (idempotent)."""
    build = app.openapi

    def openapi():
        schema = build()
        for methods in schema.get("paths", {}).values():
            op = methods.get("post")
            if isinstance(op, dict):
                params = op.setdefault("parameters", [])
                if not any(p.get("name") == PARAMETER["name"] for p in params):
                    params.append(dict(PARAMETER))
        return schema

    app.openapi = openapi
    return app
