"""``/session``: the browser's sign-in. A token pasted once starts a server-side session whose
random id is the ``lstdp_session`` cookie.

``POST /api/v1/session`` with ``{"token": "lst_..."}`` checks the token
(:func:`backend.auth.authenticate`: 401 for an unknown, revoked or expired one), starts a
session (:func:`backend.auth.create_session`: a ``sessions`` row holding the SHA-256 of a
random id) and sets the cookie to that id: ``HttpOnly`` (page scripts cannot read it),
``SameSite=Strict`` (never sent on a request another site starts), ``Secure`` when the
request came over https (directly, or through a trusted proxy's ``X-Forwarded-Proto``:
``FORWARDED_ALLOW_IPS``), ``Path=/``, ``Max-Age`` the session's lifetime
(``SESSION_LIFETIME_S``, never past the token's expiry). The answer is the principal (user,
scopes, the token's id, prefix and expiry), never the token. ``GET`` says who the browser is
signed in as; ``DELETE`` signs out: the session ends server-side (the old cookie value no
longer authenticates, wherever it was copied) and the cookie is cleared.

The cookie never holds the token: a stolen cookie is one revocable, expiring session, not a
90-day credential. Revoking the token ends every session made from it at the next request.
Writes made with the cookie pass the
CSRF checks of :func:`backend.auth.check_cookie_write`; ``POST /session`` itself is checked the
same way (JSON only, same ``Origin``), so another site cannot sign a browser in as someone else.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Cookie, HTTPException, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from backend.api.deps import SessionDep
from backend.auth import (
    SCOPES,
    SESSION_COOKIE,
    Principal,
    authenticate,
    authenticate_session,
    check_cookie_write,
    create_session,
    looks_like_token,
    revoke_session,
)
from backend.models import ApiToken, utcnow
from backend.settings import get_settings
from pipelines.utc import assume_utc

__all__ = ["router", "SessionRequest", "SessionPublic"]

router = APIRouter(prefix="/session", tags=["session"])


class SessionRequest(BaseModel):
    """The token to sign in with (``lst_...``, as ``lstdp token create`` printed it)."""

    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=200, description="an API token, `lst_...`")


class SessionPublic(BaseModel):
    """Who the browser is signed in as; never the token."""

    signed_in: bool
    user: str | None = None
    scopes: list[str] = Field(default_factory=list, description=f"of {', '.join(SCOPES)}")
    token_id: int | None = None
    prefix: str | None = Field(None, description="the token's first characters, `lst_` and 6 more")
    expires_at: dt.datetime | None = Field(None, description="the token's expiry (UTC); null: never")
    session_expires_at: dt.datetime | None = Field(None, description="when the cookie ends (UTC)")


def _describe(principal: Principal, row: ApiToken | None, cookie_end: dt.datetime | None = None) -> SessionPublic:
    return SessionPublic(signed_in=True, user=principal.user, scopes=sorted(principal.scopes),
                         token_id=principal.token_id, prefix=principal.prefix,
                         expires_at=assume_utc(row.expires_at) if row is not None and row.expires_at else None,
                         session_expires_at=cookie_end)


@router.post(
    "",
    response_model=SessionPublic,
    summary="Sign in: turn an API token into the browser's session cookie",
    responses={401: {"description": "An unknown, revoked or expired token"},
               403: {"description": "Not sent as application/json, or from another site's page (CSRF)"},
               422: {"description": "No token in the body, or not shaped like one"}},
)
def sign_in(body: SessionRequest, request: Request, response: Response, session: SessionDep) -> SessionPublic:
    """Check ``token``, start a session and set the ``lstdp_session`` cookie to its random id
    (HttpOnly, SameSite=Strict, Secure over https, Max-Age ``SESSION_LIFETIME_S``, never past
    the token's expiry); answer the principal."""
    check_cookie_write(request)  # a login CSRF would sign the browser in as the attacker
    token = body.token.strip()
    if not looks_like_token(token):
        raise HTTPException(422, detail="body.token: not an API token (they start with 'lst_'; make one with "
                                        "`lstdp token create`)")
    principal = authenticate(session, token)
    now = utcnow()
    browser, sid = create_session(session, principal.token_id, lifetime_s=get_settings().session_lifetime_s, now=now)
    session.commit()  # the session, and the token's last_used_at
    row = session.get(ApiToken, principal.token_id)
    end = assume_utc(browser.expires_at)
    max_age = max(int((end - now).total_seconds()), 1)
    response.set_cookie(SESSION_COOKIE, sid, max_age=max_age, path="/", secure=request.url.scheme == "https",
                        httponly=True, samesite="strict")
    response.headers["Cache-Control"] = "no-store"
    return _describe(principal, row, end)


@router.get("", response_model=SessionPublic, summary="Who the browser is signed in as")
def read_session(request: Request, response: Response, session: SessionDep,
                 cookie: Annotated[str | None, Cookie(alias=SESSION_COOKIE, include_in_schema=False)] = None
                 ) -> SessionPublic:
    """``signed_in`` false without a cookie, or when its session has ended (signed out,
    expired, its token revoked or expired: then the cookie is cleared); else the principal.
    Reads the cookie only: a bearer token is not a session."""
    response.headers["Cache-Control"] = "no-store"
    if not cookie:
        return SessionPublic(signed_in=False)
    try:
        principal, browser = authenticate_session(session, cookie)
    except HTTPException:
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
        return SessionPublic(signed_in=False)
    session.commit()
    row = session.get(ApiToken, principal.token_id) if principal.token_id is not None else None
    return _describe(principal, row, assume_utc(browser.expires_at))


@router.delete("", status_code=status.HTTP_204_NO_CONTENT,
               summary="Sign out: end the session server-side and clear its cookie", response_class=Response)
def sign_out(session: SessionDep,
             cookie: Annotated[str | None, Cookie(alias=SESSION_COOKIE, include_in_schema=False)] = None) -> Response:
    """End the session the ``lstdp_session`` cookie names (its value no longer authenticates,
    wherever it was copied) and clear the cookie. The token stays valid (revoke it with
    ``DELETE /api/v1/tokens/{id}`` to end every session made from it). Needs nothing, so that a
    dead cookie can always be dropped; a cross-site request cannot send the cookie
    (SameSite=Strict), so it cannot sign anyone out."""
    if cookie:
        revoke_session(session, cookie)
        session.commit()
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
