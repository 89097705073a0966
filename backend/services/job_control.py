"""Cancel and retry recalibration jobs (``POST /jobs/{id}/cancel``, ``/retry``, ``lstdp cancel|retry``).

Cancel
------
:func:`cancel_job` stops a job at the next **frame boundary**, under the job's row lock
(:func:`backend.services.job_plan.lock_job`), so a cancel, the job's planning and its last
settlement run one after the other:

* a ``queued`` job (not planned yet) ends ``cancelled`` at once; its plan message, when it
  arrives, plans nothing (``plan_job`` acts on queued jobs only);
* of a ``running`` job, every pending frame whose product is still ``planned`` and that no
  other live job waits on is stopped: one conditional change ``planned -> failed`` with
  :func:`backend.state.cancel_reason` (a later job re-plans such a product), and its item
  is settled ``cancelled``. A product another live job also waits on stays ``planned``
  (only this job's item is settled). A frame being calibrated (``writing``) finishes and is
  written whole (no partial file: the writer renames a complete file) and is counted as
  usual; the job ends ``cancelled`` when its last such frame settles
  (:func:`backend.services.job_plan.count_item`, or the reconciler's ``recount_job``).
* A calibration message still in the broker finds its product failed and does nothing; a
  worker's claim also refuses a product whose every waiting job asked to cancel
  (:func:`backend.state.claim_product`, ``Claim("cancelled")``), and the GPU batch does
  not write such a frame. A cancelled job queues no follow-up detection.

Counts stay exact: ``total == done + failed + skipped + cancelled``, ``Job.cancelled``
being the number of its ``cancelled`` items.

Retry
-----
:func:`retry_job` runs again the failed and cancelled frames of a ``failed`` or
``cancelled`` job: each is planned again (:func:`backend.services.job_plan.plan_product`:
a failed product goes back to ``planned`` from a clean slate; a frame that failed at
planning, e.g. for a missing master, is planned anew), its item goes back to ``pending``,
the counts are recomputed from the items, ``retries`` goes up by one and the job moves
``-> running`` (``move_job(..., retry=True)``). Frames done or skipped are not touched.
:func:`send_retry` then sends the calibrations (CPU messages that calibrate then settle, or GPU batches for lane
``gpu``). When the job ends again its follow-up detections run again.

Errors are :class:`JobControlError` with the HTTP status to answer (404 unknown job, 403
another user's job, 409 a job in the wrong state); messages name the job, its owner and
its state, never a token.
"""

from __future__ import annotations

import logging

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.auth import Principal
from backend.models import ItemOutcome, Job, JobItem, JobState, Product, ProductState, utcnow
from backend.state import JOB_FINAL, cancel_reason, move_job, move_product, reason_text
from backend.services.job_plan import count_item, finish_job, frames_for_job, lock_job, plan_product
from backend.services import visibility
from pipelines.errors import DataError, failure_reason

log = logging.getLogger(__name__)

__all__ = ["JobControlError", "cancel_job", "retry_job", "send_retry", "stop_pending", "RETRYABLE"]

#: Job states a retry accepts.
RETRYABLE = frozenset({JobState.failed, JobState.cancelled})


class JobControlError(DataError):
    """A cancel or retry that cannot be done; ``status`` is the HTTP status to answer
    (404 no such job, 403 not the principal's job, 409 the job's state does not allow it)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _when(t) -> str:
    return t.isoformat(timespec="seconds").replace("+00:00", "Z") if t is not None else "?"


def _job_for(session: Session, job_id: str, principal: Principal, verb: str) -> Job:
    """Job ``job_id`` under its row lock, if ``principal`` may act on it."""
    job = lock_job(session, job_id)
    if job is None or not visibility.allows(session, Job, job, principal):  # another's private job: unknown
        raise JobControlError(404, f"no job with id {job_id[:40]!r}")
    if not principal.may_act_on(job.owner):
        raise JobControlError(403, f"job {job.id} belongs to user {job.owner!r}: user {principal.user!r} may "
                                   f"{verb} only their own jobs (an admin token may {verb} anyone's)")
    return job


def _settle_cancelled(session: Session, job: Job, item: JobItem, reason: str) -> None:
    item.outcome = ItemOutcome.cancelled
    item.reason = reason_text(reason)
    item.settled_at = utcnow()
    job.cancelled = (job.cancelled or 0) + 1


def stop_pending(session: Session, job: Job) -> dict[str, int]:
    """Stop the pending frames of cancel-requested ``job`` (its row locked by the caller) at
    the frame boundary; the caller flushes and commits.

    Returns
    -------
    dict
        ``stopped`` (products failed with the cancel reason), ``released`` (items settled
        ``cancelled`` whose product another live job still waits on), ``settled`` (items
        whose product had finished: counted ``done``/``failed``), ``running`` (frames being
        calibrated: they finish and are counted).
    """
    out = {"stopped": 0, "released": 0, "settled": 0, "running": 0}
    reason = cancel_reason(job.id)
    rows = session.execute(
        select(JobItem, Product.state).outerjoin(Product, Product.id == JobItem.product_id)
        .where(JobItem.job_id == job.id, JobItem.outcome == ItemOutcome.pending)
        .order_by(JobItem.frame_id)).all()
    for item, pstate in rows:
        if item.product_id is None:  # its product was deleted: nothing will settle it
            _settle_cancelled(session, job, item, reason)
            out["stopped"] += 1
            continue
        if pstate in (ProductState.written, ProductState.failed):  # finished; its message not yet counted
            session.flush()
            count_item(session, job.id, item.product_id)
            session.refresh(job)
            out["settled"] += 1
            continue
        if pstate == ProductState.writing:
            out["running"] += 1
            continue
        others = session.scalar(
            select(func.count()).select_from(JobItem).join(Job, Job.id == JobItem.job_id)
            .where(JobItem.product_id == item.product_id, JobItem.job_id != job.id,
                   JobItem.outcome == ItemOutcome.pending, Job.state == JobState.running,
                   Job.cancel_requested_at.is_(None)))
        if others:
            _settle_cancelled(session, job, item, f"cancelled: job {job.id} was cancelled; its product "
                                                  f"{item.product_id} is still planned for another job")
            out["released"] += 1
            continue
        # lock the product only while still planned; one locked by a claim being taken is
        # left to it (it then calibrates whole and is counted)
        prod = session.scalar(select(Product).where(Product.id == item.product_id,
                                                    Product.state == ProductState.planned)
                              .with_for_update(skip_locked=True).execution_options(populate_existing=True))
        if prod is None:
            out["running"] += 1
            continue
        move_product(prod, ProductState.failed, reason)
        _settle_cancelled(session, job, item, reason)
        out["stopped"] += 1
    session.flush()
    return out


def cancel_job(session: Session, job_id: str, principal: Principal) -> Job:
    """Cancel job ``job_id`` on behalf of ``principal`` (its owner or an admin) and commit.

    Returns the job: ``cancelled`` when it ended at once (queued, or no frame was being
    calibrated), else ``running`` with ``cancel_requested_at`` set (it ends ``cancelled``
    when its frames being calibrated have settled). Asking again while it stops is not an
    error (the same answer).

    Raises
    ------
    JobControlError
        404 no such job, 403 another user's job, 409 the job has ended.
    """
    job = _job_for(session, job_id, principal, "cancel")
    if job.state in JOB_FINAL:
        session.rollback()
        raise JobControlError(409, f"job {job.id} has already ended ({job.state.value} at "
                                   f"{_when(job.finished_at)}): there is nothing to cancel")
    if job.cancel_requested_at is None:
        job.cancel_requested_at = utcnow()
        job.cancelled_by = principal.user
    if job.state == JobState.queued:
        move_job(job, JobState.cancelled)
        session.commit()
        log.info("job %s cancelled by %s before it was planned", job.id, principal.user)
        return job
    report = stop_pending(session, job)
    pending = session.scalar(select(func.count()).select_from(JobItem).where(
        JobItem.job_id == job.id, JobItem.outcome == ItemOutcome.pending))
    if job.state == JobState.running and not pending:
        finish_job(session, job)
    session.commit()
    log.info("job %s: cancel asked by %s: %s", job.id, principal.user, report)
    return job


def _recount(session: Session, job: Job) -> int:
    """Set ``job``'s counts and total from its items; returns how many are pending."""
    rows = dict(session.execute(select(JobItem.outcome, func.count()).where(JobItem.job_id == job.id)
                                .group_by(JobItem.outcome)).all())
    job.done = rows.get(ItemOutcome.done, 0)
    job.failed = rows.get(ItemOutcome.failed, 0)
    job.skipped = rows.get(ItemOutcome.skipped, 0)
    job.cancelled = rows.get(ItemOutcome.cancelled, 0)
    pending = rows.get(ItemOutcome.pending, 0)
    job.total = job.done + job.failed + job.skipped + job.cancelled + pending
    return pending


def retry_job(session: Session, job_id: str, principal: Principal) -> tuple[Job, list[int]]:
    """Plan again the failed and cancelled frames of job ``job_id`` (``failed`` or
    ``cancelled``) and move it back to ``running``; commits.

    Returns
    -------
    (job, product_ids)
        The job (``running``, or ended again at once when nothing could be planned: every
        frame failed at planning again, or its product was written meanwhile) and the
        products to send for calibration (:func:`send_retry`).

    Raises
    ------
    JobControlError
        404 no such job, 403 another user's job, 409 a job that is not failed or cancelled.
    """
    job = _job_for(session, job_id, principal, "retry")
    if job.state not in RETRYABLE:
        state = job.state.value
        session.rollback()
        raise JobControlError(409, f"job {job.id} is {state}: only a failed or cancelled job can be retried")
    items = {i.frame_id: i for i in session.scalars(select(JobItem).where(JobItem.job_id == job.id))}
    params = job.parameters or {}
    now = utcnow()
    errors: list[str] = []
    todo: list[int] = []
    rerun = 0
    runs_again = 0  # frames that will run (not failed at planning again, not written meanwhile)
    for frame in frames_for_job(session, job):
        item = items.get(frame.id)
        if item is not None and item.outcome not in (ItemOutcome.failed, ItemOutcome.cancelled):
            continue  # done or skipped: untouched
        rerun += 1
        try:
            for attempt in (1, 2):
                try:
                    with session.begin_nested():
                        prod, new = plan_product(session, frame, pinned=params.get("pinned_calibrations"),
                                                 options=params.get("options"), job_id=job.id, owner=job.owner)
                    break
                except IntegrityError:  # another job made this product meanwhile
                    if attempt == 2:
                        raise
        except DataError as exc:
            why = reason_text(failure_reason(exc))
            errors.append(f"frame {frame.id}: {why}")
            if item is None:
                session.add(JobItem(job_id=job.id, frame_id=frame.id, outcome=ItemOutcome.failed, reason=why,
                                    settled_at=now))
            else:
                item.outcome, item.reason, item.settled_at, item.product_id = ItemOutcome.failed, why, now, None
            continue
        if item is None:
            item = JobItem(job_id=job.id, frame_id=frame.id)
            session.add(item)
        item.product_id = prod.id
        if new:
            runs_again += 1
            item.outcome, item.reason, item.settled_at = ItemOutcome.pending, None, None
            if prod.state == ProductState.planned:  # one being written for another job is not sent again
                prod.sent_at = now
                todo.append(prod.id)
        else:  # written meanwhile (by another job): nothing to redo
            item.outcome, item.reason, item.settled_at = ItemOutcome.skipped, None, now
    session.flush()
    if runs_again:  # the frames that run again count against the quotas of whoever retries (429 rolls all back)
        from backend.services.quotas import admit_frames, charge_job

        charge_job(session, job, admit_frames(session, principal, runs_again, what=f"the retry of job {job.id}",
                                              now=now), owner=principal.user, at=now)
    job.retries = (job.retries or 0) + 1
    job.cancel_requested_at = None
    job.cancelled_by = None
    job.error = None
    move_job(job, JobState.running, retry=True)
    job.error = reason_text("; ".join(errors)) if errors else None
    pending = _recount(session, job)
    if not pending:
        finish_job(session, job)
    session.commit()
    log.info("job %s retried by %s (retry %d): %d frame(s) planned again, %d sent", job.id, principal.user,
             job.retries, rerun, len(todo))
    return job, todo


def send_retry(session: Session, job: Job, product_ids: list[int]) -> None:
    """Send the calibrations of a retried job (after :func:`retry_job` committed): CPU messages
    (calibrate then settle), or GPU batches of ``GPU_BATCH_SIZE`` for lane ``gpu``.
    A message lost here (broker down) is re-sent by the reconciler (its product stays
    ``planned``), as are the follow-up detections of a job that ended again at once (queued,
    never sent: the reconciler's step 5 sends them within one interval).

    Raises
    ------
    kombu.exceptions.OperationalError
        The broker could not be reached.
    """
    from backend.broker import TaskName, send, send_calibration
    from backend.settings import get_settings

    if job.state in JOB_FINAL or not product_ids:
        return
    if job.lane == "gpu":
        size = get_settings().gpu_batch_size
        for i in range(0, len(product_ids), size):
            send(TaskName.calibrate_products_gpu_batch, [job.id, product_ids[i:i + size]], queue="gpu")
        return
    for pid in product_ids:
        send_calibration(pid, job.id, "cpu")
