"""``/jobs/{id}/cancel`` and ``/jobs/{id}/retry``: stop a job at the next frame boundary, or
run its failed and cancelled frames again (:mod:`backend.services.job_control`)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Response, status

from backend.api.deps import CancelLimited, SessionDep, SubmitLimited
from backend.api.params import is_safe_key
from backend.api.schemas import JobPublic
from backend.faults import public_reason
from backend.models import JobState
from backend.services import job_control
from backend.services.job_control import JobControlError

router = APIRouter(prefix="/jobs", tags=["jobs"])
log = logging.getLogger(__name__)

_AUTH = {401: {"description": "No API token, or an unknown, revoked or expired one"},
         403: {"description": "The token lacks the scope, or the job is another user's (the message names its owner)"},
         404: {"description": "No such job"}}


def _known(job_id: str) -> str:
    if not is_safe_key(job_id, 36):
        raise HTTPException(404, detail=f"no job with id {job_id[:40]!r}")
    return job_id


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    summary="Cancel a job",
    responses={200: {"description": "The job has ended cancelled"},
               202: {"description": "Asked to cancel: frames being calibrated finish, then it ends cancelled"},
               409: {"description": "The job has already ended"}, **_AUTH},
)
def cancel_job(job_id: str, session: SessionDep, response: Response, principal: CancelLimited) -> JobPublic:
    """Stop job ``job_id`` at the next frame boundary (scope ``jobs:cancel``; the job's owner,
    or an admin for anyone's).

    Queued frames never start; frames being calibrated finish and are written whole; the
    job ends ``cancelled`` with ``total == done + failed + skipped + cancelled``. A job not
    yet planned ends at once (200); one with frames still being calibrated answers 202 with
    ``cancel_requested_at`` set and ends when they settle. Asking again while it stops
    answers the same.
    """
    try:
        job = job_control.cancel_job(session, _known(job_id), principal)
    except JobControlError as exc:
        raise HTTPException(exc.status, detail=str(exc)) from None
    response.status_code = status.HTTP_200_OK if job.state == JobState.cancelled else status.HTTP_202_ACCEPTED
    return JobPublic.model_validate(job)


@router.post(
    "/{job_id}/retry",
    response_model=JobPublic,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Retry a job's failed frames",
    responses={202: {"description": "Its failed and cancelled frames are planned and sent again"},
               409: {"description": "The job is not failed or cancelled"},
               503: {"description": "Planned again, but the broker could not be reached: the reconciler "
                                    "sends its frames once it is back"}, **_AUTH},
)
def retry_job(job_id: str, session: SessionDep, principal: SubmitLimited) -> JobPublic:
    """Run again the failed (and cancelled) frames of job ``job_id`` (scope ``jobs:submit``;
    the job's owner, or an admin).

    Only those frames run: their products are planned again (a frame that failed at
    planning, e.g. a missing master, is planned anew), their items go back to pending,
    ``retries`` goes up by one and the job runs again; its done and skipped frames and their
    products are untouched. When it ends again, its follow-up detections run again.
    """
    try:
        job, todo = job_control.retry_job(session, _known(job_id), principal)
    except JobControlError as exc:
        raise HTTPException(exc.status, detail=str(exc)) from None
    try:
        job_control.send_retry(session, job, todo)
    except Exception as exc:  # broker down: the products stay planned and the reconciler re-sends them
        log.exception("could not send the retried frames of job %s", job.id)
        raise HTTPException(503, detail=f"job {job.id} was planned again but the broker could not be reached "
                                        f"({public_reason(exc)}); its frames are sent once it is back "
                                        "(the reconciler re-sends them)") from None
    session.refresh(job)
    return JobPublic.model_validate(job)
