"""``/tokens``: API token management (the HTTP side of ``lstdp token create|list|revoke``).

* ``GET /api/v1/tokens``: an admin sees every token (``?user=`` narrows it), anyone else
  their own; any valid token may ask.
* ``POST /api/v1/tokens``: an admin makes a token for a user; the answer holds the token,
  this once (only its SHA-256 is stored).
* ``DELETE /api/v1/tokens/{id}``: an admin, or the token's own user, revokes it; from then
  on it is answered 401.

No answer but the one of ``POST`` ever holds a token: tokens are shown by id and prefix
(``lst_`` and 6 characters), with their scopes, state (active, revoked, expired), expiry and
last use. Errors: 401 without a valid token, 403 (a non-admin making a token, listing or
revoking another user's), 404 (no such token), 422 (an unknown scope, a bad user name or
lifetime).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status
from pydantic import BaseModel, ConfigDict, Field

from backend.api.deps import AdminPrincipal, SessionDep, SignedInPrincipal
from backend.auth import (
    MAX_EXPIRY_DAYS,
    MAX_USER_CHARS,
    SCOPES,
    create_token,
    list_tokens,
    revoke_token,
    token_state,
)
from backend.models import ApiToken
from pipelines.utc import assume_utc

__all__ = ["router", "TokenPublic", "TokensPublic", "TokenCreate", "TokenCreated"]

router = APIRouter(prefix="/tokens", tags=["tokens"])

_AUTH_ERRORS = {401: {"description": "No API token, or an unknown, revoked or expired one"},
                403: {"description": "The token may not do this (not an admin, or another user's token)"}}


class TokenPublic(BaseModel):
    """One token as listed: never the token, only its prefix."""

    id: int
    user: str
    prefix: str = Field(description="the token's first characters (`lst_` and 6 more)")
    scopes: list[str]
    state: str = Field(description="active, revoked or expired")
    description: str
    created_at: dt.datetime
    expires_at: dt.datetime | None = Field(description="UTC; null: never expires")
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None = Field(description="UTC, to within a minute; null: never used")

    @classmethod
    def of(cls, row: ApiToken) -> TokenPublic:
        def utc(t):
            return assume_utc(t) if t is not None else None

        return cls(id=row.id, user=row.user, prefix=row.prefix, scopes=list(row.scopes or ()), state=token_state(row),
                   description=row.description or "", created_at=utc(row.created_at), expires_at=utc(row.expires_at),
                   revoked_at=utc(row.revoked_at), last_used_at=utc(row.last_used_at))


class TokensPublic(BaseModel):
    items: list[TokenPublic]
    total: int


class TokenCreate(BaseModel):
    """A token to make (admin only)."""

    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=MAX_USER_CHARS, description="whose token (the jobs' owner)")
    scopes: list[str] = Field(default_factory=lambda: ["jobs:submit", "jobs:cancel"], min_length=1, max_length=8,
                              description=f"of {', '.join(SCOPES)}")
    expires_in_days: float | None = Field(90.0, gt=0, le=MAX_EXPIRY_DAYS,
                                          description="lifetime [days]; null: never expires")
    description: str = Field("", max_length=200, description="what it is for")


class TokenCreated(TokenPublic):
    """The token just made, with the token itself: shown this once, store it now."""

    token: str = Field(description="the token, `lst_...`; only its SHA-256 is kept")


@router.get("", response_model=TokensPublic, summary="List API tokens (never the tokens themselves)",
            responses=_AUTH_ERRORS)
def read_tokens(session: SessionDep, principal: SignedInPrincipal,
                user: Annotated[str | None, Query(max_length=MAX_USER_CHARS,
                                                  description="only this user's (admin; others see their own)")] = None
                ) -> TokensPublic:
    """Newest first. An admin sees everyone's (or ``user``'s); anyone else their own, and 403
    when asking for another user's."""
    if not principal.is_admin:
        if user is not None and user != principal.user:
            raise HTTPException(403, detail=f"user {principal.user!r} may list only their own tokens, "
                                            f"not {user[:MAX_USER_CHARS]!r}'s (listing others' needs scope 'admin')")
        user = principal.user
    rows = list_tokens(session, user or None)
    return TokensPublic(items=[TokenPublic.of(r) for r in rows], total=len(rows))


@router.post("", response_model=TokenCreated, status_code=status.HTTP_201_CREATED,
             summary="Make an API token for a user (admin; the token is shown once)",
             responses={**_AUTH_ERRORS, 422: {"description": "Unknown scope, bad user name or lifetime"}})
def make_token(body: TokenCreate, session: SessionDep, principal: AdminPrincipal) -> TokenCreated:
    """Make a token of ``user`` with ``scopes`` and ``expires_in_days``; the answer's ``token`` is
    the only time it is shown."""
    row, token = create_token(session, body.user, body.scopes, expires_in_days=body.expires_in_days,
                              description=body.description or f"made by {principal.user} through the API")
    session.commit()
    return TokenCreated(**TokenPublic.of(row).model_dump(), token=token)


@router.delete("/{token_id}", response_model=TokenPublic, summary="Revoke an API token",
               responses={**_AUTH_ERRORS, 404: {"description": "No token with that id"}})
def delete_token(token_id: Annotated[int, Path(ge=1, le=2**31 - 1)], session: SessionDep,
                 principal: SignedInPrincipal) -> TokenPublic:
    """Revoke token ``token_id`` (an admin: any; anyone else: their own). Revoking a revoked
    token changes nothing and answers it as it is. Another user's token is 404, as an unknown id."""
    from backend.services import visibility

    visibility.get_visible(session, ApiToken, token_id, principal)
    row = revoke_token(session, token_id)
    session.commit()
    return TokenPublic.of(row)
