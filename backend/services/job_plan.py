"""A job's frames and its end, shared by the worker and the API.

The worker plans jobs and settles their items (:mod:`backend.worker.processing`); the API
cancels and retries them (:mod:`backend.services.job_control`) and must not import the
worker (tests/test_architecture.py). Both use these functions, which only read and write
rows (no file, no broker):

* :func:`frames_for_job`: the frames a job covers;
* :func:`plan_product`: get or create the product of one frame under its calibration set;
* :func:`lock_job`: the job's row lock, so plans, settlements, cancels and retries of one
  job run one after the other;
* :func:`count_item`, :func:`recount_job`: settle a job's items as its products finish,
  and end it with the last one;
* :func:`finish_job`: end a job (``succeeded``/``failed``, or ``cancelled`` when it was
  asked to) and queue its follow-up detections.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from backend import __version__
from backend.clock import db_now
from backend.models import (Frame, FollowUpState, ItemOutcome, Job, JobFollowUp, JobItem, JobState, Product,
                            ProductCalibrationFile, ProductState)
from backend.services.calibration_sets import set_for
from backend.services.registry import params_hash, select_calibrations
from backend.state import MAX_REASON_CHARS, is_cancel_reason, move_job, move_product, reason_text, requeue_follow_up
from pipelines.calibration import as_options
from pipelines.detect.follow_ups import follow_ups

log = logging.getLogger(__name__)

__all__ = ["frames_for_job", "plan_product", "lock_job", "finish_job", "count_item", "recount_job"]


def frames_for_job(session: Session, job: Job) -> list[Frame]:
    """The frames a recalibration job covers: its channels, DATE-OBS within its ``start``..``end``
    (ISO 8601, UTC), ordered by DATE-OBS."""
    p = job.parameters
    start = dt.datetime.fromisoformat(p["start"])
    end = dt.datetime.fromisoformat(p["end"])
    return list(session.scalars(
        select(Frame).where(Frame.channel_code.in_(p["channels"]), Frame.date_obs >= start, Frame.date_obs <= end)
        .order_by(Frame.date_obs, Frame.id)))


def plan_product(session: Session, frame: Frame, *, pinned: dict | None, options: dict | None,
                 job_id: str | None, owner: str | None = None) -> tuple[Product, bool]:
    """Get or create the product of ``frame`` under its calibration set (found or made,
    :func:`backend.services.calibration_sets.set_for`, ``owner``'s when it is not the default
    set); the product's version is the set's id.

    Returns ``(product, is_new_work)``; ``is_new_work`` is False when an identical product
    (same frame, calibration set and parameters) is already written: re-running a job adds
    nothing. A product another job is calibrating right now (``planned``/``writing``) is
    shared: this job waits on it too, and no second calibration is sent. Raises
    ``CalibrationMissingError`` (a ``DataError``) if a kind is missing.
    """
    opts = as_options(options)
    also = ("psf",) if opts.deconvolve_psf and frame.channel_code == "SDI" else ()
    sel = select_calibrations(session, frame.channel_code, frame.date_obs, pinned, naxis=frame.naxis1,
                              also_required=also)
    ph = params_hash(opts.identity())
    cal_set = set_for(session, frame, sel, opts, pinned=pinned, owner=owner)
    existing = session.scalar(select(Product).where(Product.frame_id == frame.id, Product.version == cal_set.id))
    if existing is not None:
        if existing.state == ProductState.written:
            return existing, False
        if existing.state == ProductState.failed:  # a failed product is tried again, from a clean slate
            move_product(existing, ProductState.planned)
            existing.attempts = 0
            existing.claimed_at = existing.claimed_by = None
        existing.job_id = job_id
        return existing, True
    prod = Product(frame_id=frame.id, level="L2", version=cal_set.id, calibration_set_id=cal_set.id,
                   calibration_key=sel.key, params_hash=ph,
                   parameters={"options": options or {}, "pinned": pinned or {}, "warnings": sel.warnings},
                   software_version=__version__, state=ProductState.planned, job_id=job_id)
    session.add(prod)
    session.flush()
    for f in sel.files.values():
        session.add(ProductCalibrationFile(product_id=prod.id, calibration_file_id=f.id))
    session.flush()
    return prod, True


def lock_job(session: Session, job_id: str) -> Job | None:
    """Take ``job_id``'s row write lock for the rest of the transaction (PostgreSQL: the row;
    SQLite: the database) and return the job as committed: two deliveries of one job's plan
    message, or two settlements closing it, run one after the other."""
    session.execute(update(Job).where(Job.id == job_id).values(deliveries=Job.deliveries)
                    .execution_options(synchronize_session=False))
    return session.scalar(select(Job).where(Job.id == job_id).execution_options(populate_existing=True))


def finish_job(session: Session, job: Job) -> None:
    """End ``job`` and record its follow-up detections, in the caller's transaction: the rows
    exist exactly when the job has ended.

    A job asked to cancel (``cancel_requested_at``) ends ``cancelled`` and queues no
    detection; any other ends ``failed`` if any frame failed, else ``succeeded``. A job
    that ends again after a retry queues its follow-ups again (its existing rows, keyed by
    (job, detector, channel), go back to ``queued``).
    """
    from backend.services import notify

    if job.cancel_requested_at is not None:
        move_job(job, JobState.cancelled)
        notify.job_ended(session, job)  # its webhooks' deliveries, committed with the end (outbox)
        session.flush()
        return
    move_job(job, JobState.failed if job.failed else JobState.succeeded)
    notify.job_ended(session, job)  # its webhooks' deliveries, committed with the end (outbox)
    for name, channel in follow_ups((job.parameters or {}).get("channels", [])):
        row = session.get(JobFollowUp, (job.id, name, channel))
        if row is None:
            session.add(JobFollowUp(job_id=job.id, detector=name, channel=channel, state=FollowUpState.queued))
        else:
            requeue_follow_up(row)
    session.flush()


def count_item(session: Session, job_id: str | None, product_id: int) -> tuple[Job | None, bool]:
    """Settle job ``job_id``'s item for finished product ``product_id`` and end the job when
    all its items are settled.

    Idempotent per (job, product): one conditional ``UPDATE job_items ... WHERE outcome =
    'pending'`` settles the item (``done`` if the product is ``written``, ``failed`` with its
    reason if ``failed``); a redelivered or duplicated message, or one for a product that is
    not finished yet, settles nothing. A product failed by a cancel
    (:func:`backend.state.is_cancel_reason`) settles the item of a job that asked to cancel
    as ``cancelled``. The job's row lock (:func:`lock_job`) is taken before the product is
    read, so the settlement and a retry of the job (:func:`backend.services.job_control.retry_job`,
    under the same lock) run one after the other; the counts go up under it, so concurrent
    settlements add up and exactly one sees the last item. The caller commits.

    Returns
    -------
    (job, closed)
        The job (``None`` without a job), and whether this call ended it: true for exactly
        one call per job, the one after whose commit the follow-ups are sent.
    """
    if not job_id:
        return None, False
    # the job's row lock first, then the product as committed after it: a retry (which holds
    # the lock while it plans the product again and puts its item back to pending) is waited
    # for, so a product read as failed by the cancel before the retry never settles the item
    # the retry re-opened ("cancelled" while the product is then written: a succeeded job
    # reading 24 / 25 with 25 products written)
    if lock_job(session, job_id) is None:
        return None, False
    prod = session.scalar(select(Product).where(Product.id == product_id).execution_options(populate_existing=True))
    if prod is None or prod.state not in (ProductState.written, ProductState.failed):
        return session.get(Job, job_id), False
    ok = prod.state == ProductState.written
    stopped = False
    if not ok and is_cancel_reason(prod.error):
        asked = session.scalar(select(Job.cancel_requested_at).where(Job.id == job_id))
        stopped = asked is not None
    reason = None if ok else reason_text(f"product {product_id} (frame {prod.frame_id}): {prod.error}")
    outcome = ItemOutcome.done if ok else ItemOutcome.cancelled if stopped else ItemOutcome.failed
    settled = session.execute(
        update(JobItem).where(JobItem.job_id == job_id, JobItem.product_id == product_id,
                              JobItem.outcome == ItemOutcome.pending)
        .values(outcome=outcome, reason=reason, settled_at=db_now(session))
        .execution_options(synchronize_session=False))
    if settled.rowcount != 1:  # settled already (or not this job's): nothing to add
        job = session.get(Job, job_id)
        if job is not None:
            session.refresh(job)
        return job, False
    col = Job.done if ok else Job.cancelled if stopped else Job.failed
    values = {col: col + 1}
    if reason and not stopped:
        values["error"] = func.substr(func.coalesce(Job.error + "; ", "") + reason, 1, MAX_REASON_CHARS)
    session.execute(update(Job).where(Job.id == job_id).values(values).execution_options(synchronize_session=False))
    job = session.scalar(select(Job).where(Job.id == job_id).execution_options(populate_existing=True))
    if job.state == JobState.running and job.done + job.failed + job.skipped + (job.cancelled or 0) >= job.total:
        finish_job(session, job)
        return job, True
    return job, False


def recount_job(session: Session, job: Job) -> bool:
    """Set ``job``'s counts from its items (the source of truth) and end it if every item is
    settled; for the reconciler, under the job's row lock. Returns whether it ended the job."""
    rows = dict(session.execute(select(JobItem.outcome, func.count()).where(JobItem.job_id == job.id)
                                .group_by(JobItem.outcome)).all())
    done, failed = rows.get(ItemOutcome.done, 0), rows.get(ItemOutcome.failed, 0)
    skipped, pending = rows.get(ItemOutcome.skipped, 0), rows.get(ItemOutcome.pending, 0)
    cancelled = rows.get(ItemOutcome.cancelled, 0)
    if (job.done, job.failed, job.skipped, job.cancelled or 0) != (done, failed, skipped, cancelled):
        log.warning("job %s counts %s/%s/%s/%s repaired from its items to %s/%s/%s/%s (done/failed/skipped/"
                    "cancelled)", job.id, job.done, job.failed, job.skipped, job.cancelled, done, failed, skipped,
                    cancelled)
        job.done, job.failed, job.skipped, job.cancelled = done, failed, skipped, cancelled
    if job.total != done + failed + skipped + cancelled + pending:
        job.total = done + failed + skipped + cancelled + pending
    if job.state == JobState.running and pending == 0:
        finish_job(session, job)
        return True
    return False
