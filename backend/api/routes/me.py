"""``GET /me``: who the request's token is, and where its user stands against the fair-use limits."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.schemas import JobQueuePublic, UTCDateTime
from backend.services import quotas

router = APIRouter(tags=["me"])


class TokenPublic(BaseModel):
    """The request's token, named by id and prefix (never the token)."""

    id: int | None
    prefix: str
    created_at: UTCDateTime | None
    expires_at: UTCDateTime | None = Field(description="null: it never expires")


class ConcurrentQuotaPublic(BaseModel):
    setting: str
    limit: int | None = Field(description="null: no limit (0) or exempt (admin)")
    usage: int = Field(description="jobs queued or running: recalibrations + movies")
    recalibrations: int
    movies: int
    remaining: int | None
    resets_at: UTCDateTime | None = Field(description="the earliest measured ETA of one's unfinished jobs")
    resets: str


class FramesQuotaPublic(BaseModel):
    setting: str
    limit: int | None = Field(description="null: no limit (0) or exempt (admin)")
    usage: int = Field(description="frames covered by one's jobs submitted in the last 24 h")
    jobs: int = Field(description="jobs counted")
    remaining: int | None
    resets_at: UTCDateTime | None = Field(description="when the oldest counted job leaves the 24 h window")
    resets: str


class QuotasPublic(BaseModel):
    concurrent_jobs: ConcurrentQuotaPublic
    frames_per_day: FramesQuotaPublic


class RateLimitPublic(BaseModel):
    setting: str
    limit: int | None = Field(description="writes per window; null: no limit (0) or exempt (admin)")
    window_s: float = Field(description="the fixed window [s]")
    used: int
    remaining: int | None
    window_start: UTCDateTime
    resets_at: UTCDateTime
    exempt: bool


class MyJobQueuePublic(JobQueuePublic):
    """One of one's queued or running jobs, where it stands in its lane."""

    job_id: str
    state: str


class MePublic(BaseModel):
    user: str
    scopes: list[str]
    admin: bool
    exempt: str | None = Field(description="why the limits are null (admins are exempt); null otherwise")
    token: TokenPublic
    quotas: QuotasPublic
    rate_limit: RateLimitPublic
    queue: list[MyJobQueuePublic] = Field(description="position and ETA of each of one's queued or running jobs")


@router.get(
    "/me",
    response_model=MePublic,
    summary="The token's user, scopes, quotas and rate limit",
    responses={401: {"description": "No API token (reads need none; this one describes a token), or a bad one"}},
)
def read_me(session: SessionDep, principal: OptionalPrincipal) -> MePublic:
    """The token's user and scopes; the token's id, prefix, creation and expiry (never the
    token); each quota (``concurrent_jobs``, ``frames_per_day``) with its ``limit``,
    ``usage``, ``remaining`` and ``resets_at`` (UTC); the write rate limit (``limit`` writes
    per ``window_s`` [s], ``used``, ``remaining``, ``resets_at``); and the position and ETA
    of each of the user's queued or running jobs. Admins are exempt: their limits are null
    and ``exempt`` says so."""
    if principal is None:
        raise HTTPException(401, detail="GET /api/v1/me describes an API token: send one (Authorization: Bearer "
                                        "<token>); reads need no token", headers={"WWW-Authenticate": "Bearer"})
    return MePublic.model_validate(quotas.me_summary(session, principal))
