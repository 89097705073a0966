"""FastAPI dependencies (``Annotated`` style, as the FastAPI full-stack template): the request's
database session (``SessionDep``), settings (``SettingsDep``), principal (``OptionalPrincipal``,
``require_scope`` and the ``*Principal`` aliases; the tokens and sessions themselves are
:mod:`backend.auth`) and the write rate limit (``WriteLimited``, ``SubmitLimited``,
``CancelLimited``; the quota logic is :mod:`backend.services.quotas`).

The layers below (``backend.services``, ``backend.auth``) never import this module, nor FastAPI
(``tests/test_architecture.py``)."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import Depends, HTTPException, Request, Response
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from backend.auth import (SCOPES, SESSION_COOKIE, Principal, authenticate, authenticate_session, check_cookie_write,
                          clear_session_cookie_header, unauthorized)
from backend.db import get_sessionmaker
from backend.models import utcnow
from backend.services import quotas
from backend.settings import Settings, get_settings

__all__ = ["get_session", "SessionDep", "SettingsDep", "current_principal", "OptionalPrincipal", "require_scope",
           "require_token", "SignedInPrincipal", "SubmitPrincipal", "CancelPrincipal", "AdminPrincipal",
           "write_limited", "WriteLimited", "SubmitLimited", "CancelLimited"]

log = logging.getLogger(__name__)


async def get_session() -> AsyncIterator[Session]:
    """One session per request on the API's engine (short timeouts, :func:`backend.db.db_timeouts`);
    committed by the handler that writes, closed after.

    ``async``: making the session does no I/O (the connection is checked out by its first
    statement, in the handler's worker thread), so FastAPI runs this on the event loop instead of
    handing it to a worker thread twice per request (enter and exit; measured in
    benchmarks/reports/events_api.md and events_api_load.md). Closing it runs on the event loop only when that cannot
    talk to the database (:func:`_ends_locally`); otherwise (a transaction is open: a write, a
    read outside autocommit) in a worker thread, so a database that does not answer never blocks
    the event loop.
    """
    session = get_sessionmaker("api")()
    try:
        yield session
    except BaseException as exc:
        try:
            await _end(session, session.rollback)
        except Exception as lost:  # the database dropped during the rollback: a clean 503, not a reset
            log.error("the rollback after %s failed: %s: %s", type(exc).__name__, type(lost).__name__, lost)
            from backend.faults import public_reason

            raise HTTPException(503, detail="the database connection was lost while the request's changes were "
                                            f"undone ({public_reason(lost)}); nothing was written; try again later",
                                headers={"Retry-After": "2"}) from lost
        raise
    finally:
        try:
            await _end(session, session.close)
        except Exception as lost:  # noqa: BLE001 - the answer is decided; the pool drops the connection
            log.warning("closing the request's session failed: %s: %s", type(lost).__name__, lost)


async def _end(session: Session, step) -> None:
    """Run ``step`` (``session.rollback`` or ``session.close``) even when the request was
    cancelled (a client gone, a deadline): shielded from cancellation, on the event loop when it
    sends nothing to the database, else in a worker thread with a limiter of its own (as
    FastAPI's ``contextmanager_in_threadpool`` does for sync dependencies: the default thread
    limiter may be full of requests waiting for a pooled connection that this close would return,
    a deadlock)."""
    with anyio.CancelScope(shield=True):
        if _ends_locally(session):
            step()
        else:
            await _in_thread(step)


async def _in_thread(step) -> None:
    """``step()`` in a worker thread of its own limiter (one thread, made per call)."""
    await anyio.to_thread.run_sync(step, limiter=anyio.CapacityLimiter(1))


def _ends_locally(session: Session) -> bool:
    """Whether rolling back and closing ``session`` sends nothing to the database: it holds no
    connection, or only psycopg connections in autocommit with no transaction open on the server
    (:func:`backend.db.autocommit_reads`; psycopg's ``rollback`` then returns at once, and
    SQLAlchemy's reset of the isolation level when the connection goes back to the pool is
    client-side)."""
    if not session.in_transaction():
        return True
    tx = session.get_transaction()
    conns = getattr(tx, "_connections", None)
    if not conns:
        return False
    import psycopg

    for conn, *_rest in conns.values():
        dbapi = getattr(getattr(conn, "connection", None), "dbapi_connection", None)
        if not isinstance(dbapi, psycopg.Connection) or not dbapi.autocommit \
                or dbapi.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False
    return True


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


# -- the request's principal (backend.auth: tokens, sessions) ------------------------------------


_bearer = HTTPBearer(auto_error=False, scheme_name="APIToken", bearerFormat="opaque (lst_...)",
                     description="An API token (`lstdp token create`), as `Authorization: Bearer lst_...`. "
                                 "Reads need none; writes need the scope each route names.")
_cookie = APIKeyCookie(name=SESSION_COOKIE, auto_error=False, scheme_name="SessionCookie",
                       description="The browser's session cookie (a random session id, not the token), made from "
                                   "a token by `POST /api/v1/session`.")


async def current_principal(
    request: Request,
    session: Annotated[Session, Depends(get_session)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    cookie: Annotated[str | None, Depends(_cookie)],
) -> Principal | None:
    """The request's principal: from the bearer token, else the session cookie; None when the
    request carries neither (an anonymous read). A token that is given but not valid is 401
    even where none is needed: a client is never silently downgraded to anonymous.

    ``async``: an anonymous request is answered on the event loop (no database work, no
    worker-thread hand-off); a token is looked up in a worker thread."""
    token = bearer.credentials if bearer is not None and bearer.credentials else None
    if token is None and request.headers.get("authorization", "").strip():
        raise unauthorized("the Authorization header must be `Bearer <token>`")
    from_cookie = token is None and bool(cookie)
    token = token or (cookie or None)
    if not token:
        return None
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(_token_principal, request, session, token, from_cookie)


def _token_principal(request: Request, session: Session, token: str, from_cookie: bool) -> Principal:
    """:func:`current_principal` for a request that carries ``token`` (blocking: database)."""
    if from_cookie:
        check_cookie_write(request)
        try:
            principal, _row = authenticate_session(session, token)
        except HTTPException as exc:  # the browser holds a dead token: say so, and drop it
            raise HTTPException(exc.status_code, detail=f"{exc.detail} (the browser's session cookie: sign in again)",
                                headers={**(exc.headers or {}), "Set-Cookie": clear_session_cookie_header()}) from None
    else:
        principal = authenticate(session, token)
    request.state.principal = principal
    return principal


OptionalPrincipal = Annotated[Principal | None, Depends(current_principal)]


def require_scope(scope: str):
    """A dependency that returns the request's principal, or answers 401 (no token) or 403
    (a token without ``scope``)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    def dependency(principal: OptionalPrincipal) -> Principal:
        if principal is None:
            raise unauthorized(f"this needs an API token with scope '{scope}' "
                               "(Authorization: Bearer <token>; make one with `lstdp token create`)")
        if not principal.has(scope):
            raise HTTPException(403, detail=f"API token {principal.token_id} ({principal.prefix}...) of user "
                                            f"{principal.user!r} lacks scope '{scope}' (it has: "
                                            f"{', '.join(sorted(principal.scopes)) or 'none'})")
        return principal

    dependency.__name__ = f"require_{scope.replace(':', '_')}"
    return dependency


def require_token(principal: OptionalPrincipal) -> Principal:
    """A dependency: the request's principal whatever its scopes, or 401 without a token (for
    what every signed-in user may do to their own things: list or revoke their tokens)."""
    if principal is None:
        raise unauthorized("this needs an API token (any scope; Authorization: Bearer <token>, or sign in; "
                           "make one with `lstdp token create`)")
    return principal


SignedInPrincipal = Annotated[Principal, Depends(require_token)]
SubmitPrincipal = Annotated[Principal, Depends(require_scope("jobs:submit"))]
CancelPrincipal = Annotated[Principal, Depends(require_scope("jobs:cancel"))]
AdminPrincipal = Annotated[Principal, Depends(require_scope("admin"))]


# -- the write rate limit (backend.services.quotas) ------------------------------------------------


def write_limited(scope: str | None = None):
    """A dependency that returns the request's principal after counting one write against
    its user's rate limit: 401 without a token, 403 when ``scope`` is given and missing
    (checked before anything is counted), 429 over the limit. It also sets the
    ``RateLimit-Limit``, ``RateLimit-Remaining`` and ``RateLimit-Reset`` [s] headers of the
    answer (not for admins, who are exempt)."""
    needs = require_scope(scope) if scope else None

    def _principal(principal: OptionalPrincipal) -> Principal:
        if principal is None:
            raise unauthorized("a write needs an API token (Authorization: Bearer <token>; make one with "
                               "`lstdp token create`); reads need none")
        return principal

    dep = needs if needs is not None else _principal

    def dependency(session: SessionDep, response: Response, principal: Principal = Depends(dep)) -> Principal:
        try:
            state = quotas.count_write(session, principal)
        except quotas.QuotaExceeded as exc:  # its 429 on any app, with or without the app's handler
            raise HTTPException(exc.status_code, detail=exc.detail, headers=exc.headers) from None
        if state.limit is not None:
            response.headers["RateLimit-Limit"] = str(state.limit)
            response.headers["RateLimit-Remaining"] = str(state.remaining)
            response.headers["RateLimit-Reset"] = str(max(0, math.ceil((state.resets_at - utcnow()).total_seconds())))
        return principal

    dependency.__name__ = f"write_limited_{(scope or 'any').replace(':', '_')}"
    return dependency


#: Any valid token, one write counted (add beside a route's scope dependency, after it).
WriteLimited = Annotated[Principal, Depends(write_limited())]
#: Scope ``jobs:submit`` (401/403 first), then one write counted.
SubmitLimited = Annotated[Principal, Depends(write_limited("jobs:submit"))]
#: Scope ``jobs:cancel`` (401/403 first), then one write counted.
CancelLimited = Annotated[Principal, Depends(write_limited("jobs:cancel"))]
