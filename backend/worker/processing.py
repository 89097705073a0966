"""Processing orchestration: plan a job's products, calibrate one product, keep counts.

These functions load rows by id, call the pure science (:mod:`pipelines.calibration`),
write files atomically and move the explicit state machines:

* product: ``planned`` -> ``writing`` -> ``written`` | ``failed`` (with the reason);
* job: ``queued`` -> ``running`` -> ``succeeded`` | ``failed`` (with the reasons).

The FITS file exists (fsynced, renamed) before the row says ``written``. The Celery tasks
in :mod:`backend.worker.tasks` are thin wrappers around them.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import OrderedDict
from pathlib import Path

import numpy as np
from celery.exceptions import SoftTimeLimitExceeded

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from backend import __version__
from backend.models import (Frame, FollowUpState, ItemOutcome, Job, JobFollowUp, JobItem, JobState, Product,
                            ProductCalibrationFile, ProductState, utcnow)
from backend.services.calibration_sets import set_for
from backend.services import notify
from backend.services.ingest import header_to_json
from backend.services.registry import params_hash, select_calibrations
from backend.settings import Settings
from backend.state import MAX_REASON_CHARS, claim_product, confirm_claim, move_job, move_product, reason_text
from pipelines.calibration.options import as_options
from pipelines.detect.registry import follow_ups
from pipelines.errors import DataError, failure_reason

log = logging.getLogger(__name__)

__all__ = ["plan_job", "plan_product", "calibrate_product", "write_product", "count_item", "recount_job",
           "lock_job", "frames_for_job", "resident_master"]


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
    existing = session.scalar(select(Product).where(
        Product.frame_id == frame.id, Product.calibration_key == sel.key, Product.params_hash == ph))
    if existing is not None:
        if existing.calibration_set_id is None:
            existing.calibration_set_id = cal_set.id
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


def plan_job(session: Session, job_id: str) -> list[int]:
    """Move a queued job to ``running``, give it one item per frame and return the ids of the
    products to send for calibration.

    Frames whose calibration is missing become ``failed`` items with the reason; frames
    whose product is already written become ``skipped`` items. Idempotent: the plan is one
    transaction (the caller commits), so a job that is ``running`` was planned completely; a
    redelivered plan message of a running or ended job plans nothing again and returns
    ``[]`` (products whose messages were lost are re-sent by the reconciler).
    """
    job = lock_job(session, job_id)
    if job is None:
        raise DataError(f"no job {job_id}")
    if job.state != JobState.queued:  # a redelivered plan message: planned already
        log.warning("job %s already %s: not planned again", job_id, job.state.value)
        return []
    move_job(job, JobState.running)
    frames = frames_for_job(session, job)
    job.total = len(frames)
    job.done = job.failed = job.skipped = 0
    errors: list[str] = []
    todo: list[int] = []
    now = utcnow()
    for frame in frames:
        try:
            for attempt in (1, 2):
                try:
                    with session.begin_nested():
                        prod, new = plan_product(session, frame, pinned=job.parameters.get("pinned_calibrations"),
                                                 options=job.parameters.get("options"), job_id=job.id,
                                                 owner=job.owner)
                    break
                except IntegrityError:  # another job took this version number (or product) meanwhile
                    if attempt == 2:
                        raise
        except DataError as exc:
            job.failed += 1
            errors.append(f"frame {frame.id}: {exc}")
            session.add(JobItem(job_id=job.id, frame_id=frame.id, outcome=ItemOutcome.failed,
                                reason=reason_text(failure_reason(exc)), settled_at=now))
            continue
        if new:
            session.add(JobItem(job_id=job.id, frame_id=frame.id, product_id=prod.id, outcome=ItemOutcome.pending))
            if prod.state == ProductState.planned:  # one being written by another job is not sent again
                prod.sent_at = now
                todo.append(prod.id)
        else:
            job.skipped += 1
            session.add(JobItem(job_id=job.id, frame_id=frame.id, product_id=prod.id, outcome=ItemOutcome.skipped,
                                settled_at=now))
    if errors:
        job.error = reason_text("; ".join(errors))
    session.flush()
    if job.done + job.failed + job.skipped >= job.total:
        _finish(session, job)
    return todo


def _finish(session: Session, job: Job) -> None:
    """End ``job`` (``failed`` if any frame failed) and record its follow-up detections, in
    the caller's transaction: the rows exist exactly when the job has ended."""
    move_job(job, JobState.failed if job.failed else JobState.succeeded)
    notify.job_ended(session, job)  # its webhooks' deliveries, committed with the end (outbox)
    for name, channel in follow_ups((job.parameters or {}).get("channels", [])):
        session.add(JobFollowUp(job_id=job.id, detector=name, channel=channel, state=FollowUpState.queued))
    session.flush()


def count_item(session: Session, job_id: str | None, product_id: int) -> tuple[Job | None, bool]:
    """Settle job ``job_id``'s item for finished product ``product_id`` and end the job when
    all its items are settled.

    Idempotent per (job, product): one conditional ``UPDATE job_items ... WHERE outcome =
    'pending'`` settles the item (``done`` if the product is ``written``, ``failed`` with its
    reason if ``failed``); a redelivered or duplicated message, or one for a product that is
    not finished yet, settles nothing. The job's counts go up under its row lock, so
    concurrent settlements add up and exactly one sees the last item. The caller commits.

    Returns
    -------
    (job, closed)
        The job (``None`` without a job), and whether this call ended it: true for exactly
        one call per job, the one after whose commit the follow-ups are sent.
    """
    if not job_id:
        return None, False
    prod = session.scalar(select(Product).where(Product.id == product_id).execution_options(populate_existing=True))
    if prod is None or prod.state not in (ProductState.written, ProductState.failed):
        return session.get(Job, job_id), False
    ok = prod.state == ProductState.written
    reason = None if ok else reason_text(f"product {product_id} (frame {prod.frame_id}): {prod.error}")
    settled = session.execute(
        update(JobItem).where(JobItem.job_id == job_id, JobItem.product_id == product_id,
                              JobItem.outcome == ItemOutcome.pending)
        .values(outcome=ItemOutcome.done if ok else ItemOutcome.failed, reason=reason, settled_at=utcnow())
        .execution_options(synchronize_session=False))
    if settled.rowcount != 1:  # settled already (or not this job's): nothing to add
        job = session.get(Job, job_id)
        if job is not None:
            session.refresh(job)
        return job, False
    col = Job.done if ok else Job.failed
    values = {col: col + 1}
    if reason:
        values["error"] = func.substr(func.coalesce(Job.error + "; ", "") + reason, 1, MAX_REASON_CHARS)
    session.execute(update(Job).where(Job.id == job_id).values(values).execution_options(synchronize_session=False))
    job = session.scalar(select(Job).where(Job.id == job_id).execution_options(populate_existing=True))
    if job.state == JobState.running and job.done + job.failed + job.skipped >= job.total:
        _finish(session, job)
        return job, True
    return job, False


def recount_job(session: Session, job: Job) -> bool:
    """Set ``job``'s counts from its items (the source of truth) and end it if every item is
    settled; for the reconciler, under the job's row lock. Returns whether it ended the job."""
    rows = dict(session.execute(select(JobItem.outcome, func.count()).where(JobItem.job_id == job.id)
                                .group_by(JobItem.outcome)).all())
    done, failed = rows.get(ItemOutcome.done, 0), rows.get(ItemOutcome.failed, 0)
    skipped, pending = rows.get(ItemOutcome.skipped, 0), rows.get(ItemOutcome.pending, 0)
    if (job.done, job.failed, job.skipped) != (done, failed, skipped):
        log.warning("job %s counts %s/%s/%s repaired from its items to %s/%s/%s", job.id, job.done, job.failed,
                    job.skipped, done, failed, skipped)
        job.done, job.failed, job.skipped = done, failed, skipped
    if job.total != done + failed + skipped + pending:
        job.total = done + failed + skipped + pending
    if job.state == JobState.running and pending == 0:
        _finish(session, job)
        return True
    return False


#: Calibration masters a worker process keeps loaded, by (path, sha256): a full-size set
#: of one channel is a few hundred MB, so a handful of entries covers a recalibration run.
MASTER_CACHE_SIZE = 8
_MASTERS: OrderedDict[tuple[str, str], object] = OrderedDict()


def resident_master(f):
    """The loaded master of calibration file row ``f``, kept in this process (LRU).

    Loading a full-size master (and deriving its bad-pixel map, seconds at 4608 px) once
    per worker instead of once per frame. The file's SHA-256 is checked against the
    registry when it is loaded.

    Raises
    ------
    DataError
        If the file changed on disk since it was registered, or is not a master.
    """
    from pipelines.calibration.flow import load_calibration_master

    key = (f.path, f.sha256)
    ci = _MASTERS.get(key)
    if ci is None:
        ci = load_calibration_master(f.path)
        if ci.sha256 and ci.sha256 != f.sha256:
            raise DataError(f"calibration file {f.id} ({f.kind.value} v{f.version}) changed on disk since it was "
                            f"registered (sha256 {ci.sha256[:12]} != {f.sha256[:12]})")
        ci.id, ci.version = f.id, f.version
        _MASTERS[key] = ci
        while len(_MASTERS) > MASTER_CACHE_SIZE:
            _MASTERS.popitem(last=False)
    else:
        _MASTERS.move_to_end(key)
    return ci


def _product_path(settings: Settings, frame: Frame, prod: Product) -> Path:
    t = frame.date_obs
    stamp = t.strftime("%Y%m%dT%H%M%S")
    chan = frame.channel_code.lower().replace("-", "")
    return settings.products / frame.channel_code / t.strftime("%Y/%m/%d") / \
        f"lst_{chan}_l2_{stamp}_f{frame.id}_v{prod.version}.fits"


def write_product(session: Session, settings: Settings, prod: Product, result, *, notes: tuple[str, ...] = (),
                  attempt: int | None = None, holder: str | None = None) -> bool:
    """Write the L2 FITS and quicklook of ``result`` (an :class:`~pipelines.calibration.flow.L2Result`)
    for ``prod`` and fill the row (state ``written``); the caller commits.

    ``notes`` become HISTORY lines of the product (e.g. the GPU worker's CPU fallback).
    ``attempt``: the claim this write belongs to (:func:`backend.state.claim_product`); it
    is confirmed, and the row locked, before any file is touched, so a delivery whose claim
    was taken over writes nothing and returns False (``holder``: the claim's holder,
    ``Claim.holder``, checked too when given). The file is fsynced and renamed before
    the row says ``written``. Returns True when written.
    """
    if attempt is not None and not confirm_claim(session, prod.id, attempt, holder):
        return False
    from pipelines.fitsio import store_tmp_dir, write_fits_atomic
    from pipelines.products import build_product_hdul, write_quicklook_png
    from pipelines.provenance import stamp_provenance

    frame = prod.frame
    stamp = {"PRODID": prod.id, "PRODVER": prod.version, "CALSET": prod.calibration_set_id, "FRAMEID": frame.id,
             "FILENAME": _product_path(settings, frame, prod).name}
    stamp_provenance(result.header, {k: v for k, v in stamp.items() if v is not None})
    for w in (prod.parameters or {}).get("warnings", []):
        result.header.add_history(f"calibration warning: {w}")
    for note in notes:
        result.header.add_history(note)
    hdul = build_product_hdul(result, software_version=__version__)
    out = _product_path(settings, frame, prod)
    tmp = store_tmp_dir(settings.products)  # temporary files in the store's .tmp/, never beside products
    sha = write_fits_atomic(hdul, out, tmp_dir=tmp)
    ql = out.with_suffix(".png")
    write_quicklook_png(result.data, result.dq, ql, frame.channel_code, tmp_dir=tmp)
    prod.path = str(out)
    prod.sha256 = sha
    prod.quicklook_path = str(ql)
    prod.header = header_to_json(hdul[0].header)
    prod.stats = dict(result.stats)
    move_product(prod, ProductState.written)
    return True


def calibrate_product(session: Session, product_id: int, settings: Settings, *, holder: str | None = None) -> Product:
    """Claim and calibrate one product and write its L2 FITS and quicklook.

    The product is claimed first (:func:`backend.state.claim_product`): a delivery that
    finds it written, failed, or held by a live claim does nothing and returns it as it is;
    one that finds it past ``MAX_DELIVERIES`` claims fails it with the reason. Data errors
    leave the product ``failed`` with the reason (not raised); other exceptions also mark it
    ``failed`` and are re-raised so the task can retry them. ``holder``: who claims
    (:func:`backend.state.this_process` with the task's id and retry number).

    Raises
    ------
    DataError
        If there is no product ``product_id``.
    """
    from pipelines.calibration.flow import calibrate_frame
    from pipelines.fitsio import read_image

    claim = claim_product(session, product_id, lease_s=settings.lease_s, max_deliveries=settings.max_deliveries,
                          holder=holder)
    if claim.status == "missing":
        raise DataError(f"no product {product_id}")
    prod = session.get(Product, product_id)
    if claim.status != "claimed":
        if claim.status == "busy":
            log.info("product %s is being calibrated by %s: this delivery does nothing", product_id, prod.claimed_by)
        return prod
    frame = prod.frame
    try:
        raw = read_image(frame.path, dtype=np.float32)  # 16-bit DN exactly, half the memory
        cals = {f.kind.value: resident_master(f) for f in prod.calibration_files}
        result = calibrate_frame(raw.data, raw.header, cals, as_options(prod.parameters.get("options")))
        if write_product(session, settings, prod, result, attempt=claim.attempt, holder=claim.holder):
            session.commit()
        else:
            session.rollback()
            log.warning("product %s was taken over by another delivery while this one calibrated: not written",
                        product_id)
            prod = session.get(Product, product_id)
            session.refresh(prod)
    except OperationalError:  # a database fault: the claim stays ours and the task retries it
        session.rollback()
        raise
    except DataError as exc:
        session.rollback()
        _fail_claimed(session, product_id, claim, failure_reason(exc))
        prod = session.get(Product, product_id)
    except SoftTimeLimitExceeded:
        session.rollback()
        _fail_claimed(session, product_id, claim,
                      f"calibration passed the soft time limit of {settings.task_soft_time_limit_s:.0f} s "
                      "(TASK_SOFT_TIME_LIMIT_S)")
        prod = session.get(Product, product_id)
    except Exception as exc:
        session.rollback()
        _fail_claimed(session, product_id, claim, failure_reason(exc))
        raise
    return prod


def _fail_claimed(session: Session, product_id: int, claim, reason: str) -> None:
    """Fail a product this delivery still holds (``claim``, a ``backend.state.Claim``;
    another delivery that took it over keeps it)."""
    if confirm_claim(session, product_id, claim.attempt, claim.holder):
        prod = session.get(Product, product_id)
        session.refresh(prod)
        move_product(prod, ProductState.failed, reason)
    session.commit()
