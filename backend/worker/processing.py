"""Processing orchestration: plan a job's products, calibrate one product, keep counts.

These functions load rows by id, call the pure science (:mod:`pipelines.calibration`),
write files atomically and move the explicit state machines:

* product: ``planned`` -> ``writing`` -> ``written`` | ``failed`` (with the reason);
* job: ``queued`` -> ``running`` -> ``succeeded`` | ``failed`` (with the reasons) |
  ``cancelled`` (asked to cancel, :mod:`backend.services.job_control`, once its frames
  being calibrated have finished).

The FITS file exists (fsynced, renamed) before the row says ``written``. The Celery tasks
in :mod:`backend.worker.tasks` are thin wrappers around them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

import numpy as np
from celery.exceptions import SoftTimeLimitExceeded

from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from backend import __version__
from backend.models import Frame, ItemOutcome, JobItem, JobState, Product, ProductState, utcnow
from backend.services.ingest import header_to_json
# a job's items, its row lock and its end are shared with the API (cancel, retry):
# backend.services.job_plan; re-exported here for the worker's modules
from backend.services.job_plan import count_item, finish_job, frames_for_job, lock_job, plan_product, recount_job
from backend.services.manifests import product_digests, product_manifest
from backend.settings import Settings
from backend.state import claim_product, confirm_claim, move_job, move_product, reason_text
from pipelines.calibration import as_options
from pipelines.errors import DataError, failure_reason

log = logging.getLogger(__name__)

__all__ = ["plan_job", "plan_product", "calibrate_product", "write_product", "count_item", "recount_job",
           "lock_job", "frames_for_job", "finish_job", "resident_master"]


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
    job.done = job.failed = job.skipped = job.cancelled = 0
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
    if job.done + job.failed + job.skipped + (job.cancelled or 0) >= job.total:
        finish_job(session, job)
    return todo


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
    from pipelines.calibration import load_calibration_master

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
    """Write the L2 FITS and quicklook of ``result`` (an :class:`~pipelines.calibration.l2.flow.L2Result`)
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
    from pipelines.compression import compress_product_hdul
    from pipelines.calibration.l2.quality import frame_quality
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
    # the header and digests below are those of the calibrated arrays; the file may hold them
    # tile-compressed (PRODUCT_COMPRESSION, pipelines.compression; "none" writes hdul as is)
    sha = write_fits_atomic(compress_product_hdul(hdul, getattr(settings, "product_compression", "none")), out, tmp_dir=tmp)
    ql = out.with_suffix(".png")
    write_quicklook_png(result.data, result.dq, ql, frame.channel_code, tmp_dir=tmp)
    prod.path = str(out)
    prod.sha256 = sha
    prod.quicklook_path = str(ql)
    prod.header = header_to_json(hdul[0].header)
    prod.stats = dict(result.stats)
    prod.quality_flags = int(frame_quality(hdul[0].header))  # QUALITY: frame-wide systematics flagged
    prod.manifest = product_manifest(prod, frame, header=hdul[0].header, file_sha256=sha,
                                     digests=product_digests(hdul), software_version=__version__)
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
    from pipelines.calibration import calibrate_frame
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
