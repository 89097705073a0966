"""``/jobs``: recalibration jobs. ``POST`` stores and enqueues a job and returns at once."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Request, Response, status

from backend.api.deps import OptionalPrincipal, SessionDep, SubmitLimited
from backend.api.params import PaginationDep
from backend.api.presenters import job_created, with_queue
from backend.api.schemas import JobCreatedPublic, JobPublic, JobsPublic
from backend.faults import public_reason
from backend.services import jobs as jobs_service
from backend.services.jobs import JobRequest

router = APIRouter(prefix="/jobs", tags=["jobs"])
log = logging.getLogger(__name__)


@router.post(
    "",
    response_model=JobCreatedPublic,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Submit a recalibration job",
    responses={202: {"description": "Stored and queued; follow it at the Location URL"},
               401: {"description": "No API token, or an unknown, revoked or expired one"},
               403: {"description": "The token lacks scope jobs:submit"},
               422: {"description": "Invalid request (unknown channel, end before start, unknown pinned version, "
                                    "more frames than the whole daily quota...)"},
               429: {"description": "Over a quota (concurrent jobs, frames per day) or the write rate limit; "
                                    "Retry-After says when to try again"},
               503: {"description": "Stored, but the broker could not be reached: the job is marked failed"}},
)
def create_job(req: JobRequest, session: SessionDep, response: Response, request: Request,
               principal: SubmitLimited) -> JobCreatedPublic:
    """Store a ``queued`` job, commit, send it to the broker and return at once.

    Needs a token with scope ``jobs:submit`` (401 without one, 403 without the scope); the
    job's owner is the token's user. An admin's job may feed the public catalogue; another
    user's job never does (its detections are its owner's, marked with its calibration set).
    It counts against its owner's quotas (concurrent jobs, frames per day) and write rate:
    over one, 429 with ``Retry-After`` and nothing stored; admins are exempt (``GET /api/v1/me``).

    The work runs in a Celery worker; poll ``GET /api/v1/jobs/{id}`` for its progress.
    When the broker cannot be reached (within about 1.2 s, ``backend.broker``) the job is
    marked ``failed`` with the reason and the answer is 503. When the request's deadline
    passed while the database held it (a frozen server that came back), the client was
    already answered 503: the job it knows nothing of is failed, not sent.
    """
    job = jobs_service.submit_job(session, req, owner=principal.user, publishes=principal.is_admin,
                                  enqueue=False, quota_for=principal)  # validates, checks quotas, commits
    deadline = getattr(request.state, "deadline", None)
    if deadline is not None and deadline.answered:
        log.error("job %s was stored after its request had been answered 503; failing it", job.id)
        jobs_service.fail_if_queued(session, job, "not sent: the request had been answered 503 (no answer within "
                                      f"{deadline.limit_s:g} s) before the job was stored")
        raise HTTPException(503, detail="the request took too long")  # nobody reads it
    try:
        jobs_service.enqueue_job(job.id)
    except Exception as exc:  # broker down or misconfigured: the job must not stay queued forever
        log.exception("could not enqueue job %s", job.id)
        reason = f"broker unreachable: {public_reason(exc)}"
        jobs_service.fail_if_queued(session, job, f"could not enqueue the job: {reason}")
        raise HTTPException(503, detail=f"job {job.id} was stored but could not be sent to the broker ({reason}); "
                                        "it is marked failed: submit it again later") from None
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    # with its queue position, ETA and calibration set, and its webhook's secret (shown once)
    return job_created(session, job, with_queue(session, [job])[0])


@router.get("", response_model=JobsPublic, summary="List jobs")
def read_jobs(session: SessionDep, page: PaginationDep, principal: OptionalPrincipal) -> JobsPublic:
    """The jobs the caller may see, newest first: public (the platform's and admins') jobs and
    the caller's own (anonymous: public ones; an admin: all)."""
    rows, total = jobs_service.list_jobs(session, principal, limit=page.limit, offset=page.offset)
    return JobsPublic(items=with_queue(session, rows), total=total,
                      limit=page.limit, offset=page.offset)


@router.get("/{job_id}", response_model=JobPublic, summary="One job and its progress")
def read_job(job_id: str, session: SessionDep, principal: OptionalPrincipal) -> JobPublic:
    """State (queued, running, succeeded, failed, cancelled), counts, progress fraction, error,
    timestamps and, while queued or running, ``queue``: its position and ETA in its lane.
    Another user's private job is 404."""
    return with_queue(session, [jobs_service.get_job(session, job_id, principal)])[0]
