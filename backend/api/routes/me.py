"""``GET /me``: who the request's token is, and where its user stands against the fair-use limits."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from backend.api.deps import SessionDep
from backend.auth import OptionalPrincipal
from backend.services import quotas

router = APIRouter(tags=["me"])


@router.get(
    "/me",
    summary="The token's user, scopes, quotas and rate limit",
    responses={401: {"description": "No API token (reads need none; this one describes a token), or a bad one"}},
)
def read_me(session: SessionDep, principal: OptionalPrincipal) -> dict[str, Any]:
    """The token's user and scopes; the token's id, prefix, creation and expiry (never the
    token); each quota (``concurrent_jobs``, ``frames_per_day``) with its ``limit``,
    ``usage``, ``remaining`` and ``resets_at`` (UTC); the write rate limit (``limit`` writes
    per ``window_s`` [s], ``used``, ``remaining``, ``resets_at``); and the position and ETA
    of each of the user's queued or running jobs. Admins are exempt: their limits are null
    and ``exempt`` says so."""
    if principal is None:
        raise HTTPException(401, detail="GET /api/v1/me describes an API token: send one (Authorization: Bearer "
                                        "<token>); reads need no token", headers={"WWW-Authenticate": "Bearer"})
    return quotas.me_summary(session, principal)
