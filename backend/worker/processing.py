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

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend import __version__
from backend.models import Frame, Job, JobState, Product, ProductCalibrationFile, ProductState, utcnow
from backend.services.ingest import header_to_json
from backend.services.registry import params_hash, select_calibrations
from backend.settings import Settings
from backend.state import JOB_FINAL, MAX_REASON_CHARS, move_job, move_product, reason_text
from pipelines.calibration.options import as_options
from pipelines.errors import DataError, failure_reason

log = logging.getLogger(__name__)

__all__ = ["plan_job", "plan_product", "calibrate_product", "write_product", "count_item",
           "frames_for_job", "reap_stale_work", "resident_master", "STALE_AFTER_S"]

#: A product of a running job with no state change for this long [s] is taken as lost
#: (its worker died, or no worker consumes its queue). A full-size frame calibrates in
#: tens of seconds, so this leaves a wide margin.
STALE_AFTER_S = 1800.0


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
                 job_id: str | None) -> tuple[Product, bool]:
    """Get or create the product of ``frame`` under its calibration set.

    Returns ``(product, is_new_work)``; ``is_new_work`` is False when an identical product
    (same frame, calibration set and parameters) is already written: re-running a job adds
    nothing. Raises ``CalibrationMissingError`` (a ``DataError``) if a kind is missing.
    """
    opts = as_options(options)
    also = ("psf",) if opts.deconvolve_psf and frame.channel_code == "SDI" else ()
    sel = select_calibrations(session, frame.channel_code, frame.date_obs, pinned, naxis=frame.naxis1,
                              also_required=also)
    ph = params_hash(opts.identity())
    existing = session.scalar(select(Product).where(
        Product.frame_id == frame.id, Product.calibration_key == sel.key, Product.params_hash == ph))
    if existing is not None:
        if existing.state == ProductState.written:
            return existing, False
        move_product(existing, ProductState.planned)
        existing.job_id = job_id
        # planned again: its next outcome counts (a statement, not the attribute: the
        # session's copy of the mark may be stale after count_item's UPDATE)
        session.execute(update(Product).where(Product.id == existing.id).values(counted_for_job=None)
                        .execution_options(synchronize_session=False))
        _expire_count_mark(session, existing.id)
        return existing, True
    version = 1 + (session.scalar(select(func.max(Product.version)).where(Product.frame_id == frame.id)) or 0)
    prod = Product(frame_id=frame.id, level="L2", version=version, calibration_key=sel.key, params_hash=ph,
                   parameters={"options": options or {}, "pinned": pinned or {}, "warnings": sel.warnings},
                   software_version=__version__, state=ProductState.planned, job_id=job_id)
    session.add(prod)
    session.flush()
    for f in sel.files.values():
        session.add(ProductCalibrationFile(product_id=prod.id, calibration_file_id=f.id))
    session.flush()
    return prod, True


def plan_job(session: Session, job_id: str) -> list[int]:
    """Move a job to ``running``, plan its products and return the ids that need work.

    Frames whose calibration is missing are counted as failed with the reason; products
    already written are counted as skipped. The caller commits.
    """
    job = session.get(Job, job_id)
    if job is None:
        raise DataError(f"no job {job_id}")
    if job.state in JOB_FINAL:  # a late or redelivered message of a job that has ended
        log.warning("job %s already %s: not planned again", job_id, job.state.value)
        return []
    move_job(job, JobState.running)
    frames = frames_for_job(session, job)
    job.total = len(frames)
    job.done = job.failed = job.skipped = 0
    errors: list[str] = []
    todo: list[int] = []
    for frame in frames:
        try:
            for attempt in (1, 2):
                try:
                    with session.begin_nested():
                        prod, new = plan_product(session, frame, pinned=job.parameters.get("pinned_calibrations"),
                                                 options=job.parameters.get("options"), job_id=job.id)
                    break
                except IntegrityError:  # another job took this version number (or product) meanwhile
                    if attempt == 2:
                        raise
        except DataError as exc:
            job.failed += 1
            errors.append(f"frame {frame.id}: {exc}")
            continue
        if new:
            todo.append(prod.id)
        else:
            job.skipped += 1
    if errors:
        job.error = reason_text("; ".join(errors))
    if not todo:
        _finish(job)
    return todo


def _finish(job: Job) -> None:
    move_job(job, JobState.failed if job.failed else JobState.succeeded)


def _expire_count_mark(session: Session, product_id: int) -> None:
    """Forget the session's copy of ``counted_for_job`` after an UPDATE statement changed it."""
    prod = session.identity_map.get(session.identity_key(Product, product_id))  # no query
    if prod is not None:
        session.expire(prod, ["counted_for_job"])


def count_item(session: Session, job_id: str | None, product_id: int) -> tuple[Job | None, bool]:
    """Count one finished product towards its job and close the job when all are in.

    Idempotent per (product, job): the count is taken by one ``UPDATE products SET
    counted_for_job`` that only a first message for a finished (``written`` or ``failed``)
    product wins; a redelivered or duplicated message, or one for a product that is not
    finished yet, counts nothing.

    Returns
    -------
    (job, closed)
        The job (``None`` without a job), and whether this call ended it: true for exactly
        one call per job, the one whose follow-ups are queued.
    """
    if not job_id:
        return None, False
    claimed = session.execute(
        update(Product)
        .where(Product.id == product_id,
               Product.state.in_([ProductState.written, ProductState.failed]),
               or_(Product.counted_for_job.is_(None), Product.counted_for_job != job_id))
        .values(counted_for_job=job_id)
        .execution_options(synchronize_session=False))
    _expire_count_mark(session, product_id)
    if claimed.rowcount != 1:  # counted already, or not finished: nothing to add
        job = session.get(Job, job_id)
        if job is not None:
            session.refresh(job)
        return job, False
    prod = session.get(Product, product_id)
    ok = prod is not None and prod.state == ProductState.written
    col = Job.done if ok else Job.failed
    session.execute(update(Job).where(Job.id == job_id).values({col: col + 1}))
    if not ok and prod is not None and prod.error:
        job = session.get(Job, job_id)
        msg = f"product {product_id} (frame {prod.frame_id}): {prod.error}"
        session.execute(update(Job).where(Job.id == job_id).values(
            error=func.substr(func.coalesce(Job.error + "; ", "") + msg, 1, MAX_REASON_CHARS)))
    session.flush()
    job = session.get(Job, job_id)
    session.refresh(job)
    if job.state == JobState.running and job.done + job.failed + job.skipped >= job.total:
        _finish(job)
        session.flush()
        return job, True
    return job, False


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


def write_product(session: Session, settings: Settings, prod: Product, result, *, notes: tuple[str, ...] = ()) -> None:
    """Write the L2 FITS and quicklook of ``result`` (an :class:`~pipelines.calibration.flow.L2Result`)
    for ``prod`` and fill the row (state ``written``); the caller commits.

    ``notes`` become HISTORY lines of the product (e.g. the GPU worker's CPU fallback).
    The file is fsynced and renamed before the row says ``written``.
    """
    from pipelines.fitsio import store_tmp_dir, write_fits_atomic
    from pipelines.products import build_product_hdul, write_quicklook_png
    from pipelines.provenance import stamp_provenance

    frame = prod.frame
    stamp_provenance(result.header, {"PRODID": prod.id, "PRODVER": prod.version, "FRAMEID": frame.id,
                                     "FILENAME": _product_path(settings, frame, prod).name})
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


def calibrate_product(session: Session, product_id: int, settings: Settings) -> Product:
    """Calibrate one planned product and write its L2 FITS and quicklook.

    Data errors leave the product ``failed`` with the reason (not raised); other
    exceptions also mark it ``failed`` and are re-raised so the task can retry them.
    """
    from pipelines.calibration.flow import calibrate_frame
    from pipelines.fitsio import read_image

    prod = session.get(Product, product_id)
    if prod is None:
        raise DataError(f"no product {product_id}")
    if prod.state == ProductState.written:
        return prod
    frame = prod.frame
    move_product(prod, ProductState.writing)
    session.commit()
    try:
        raw = read_image(frame.path, dtype=np.float32)  # 16-bit DN exactly, half the memory
        cals = {f.kind.value: resident_master(f) for f in prod.calibration_files}
        result = calibrate_frame(raw.data, raw.header, cals, as_options(prod.parameters.get("options")))
        write_product(session, settings, prod, result)
        session.commit()
    except DataError as exc:
        session.rollback()
        prod = session.get(Product, product_id)
        move_product(prod, ProductState.failed, failure_reason(exc))
        session.commit()
    except Exception as exc:
        session.rollback()
        prod = session.get(Product, product_id)
        move_product(prod, ProductState.failed, failure_reason(exc))
        session.commit()
        raise
    return prod


def _queue_of(parameters: dict | None) -> str:
    try:
        return as_options((parameters or {}).get("options")).device
    except DataError:  # options no worker would take: its products wait on the default queue
        return "cpu"


def reap_stale_work(session: Session, *, stale_after_s: float = STALE_AFTER_S,
                    now: dt.datetime | None = None) -> int:
    """Fail the products of running jobs that were lost.

    A worker killed mid-task, a message lost by the broker, or a job sent to a queue no
    worker consumes would otherwise leave products ``planned``/``writing`` and their job
    ``running`` for ever. Lost means:

    * ``writing`` with no state change for ``stale_after_s`` (a worker took it and died: a
      frame takes seconds to minutes), or
    * ``planned`` for ``stale_after_s`` *and* no product of the same queue (``cpu``/``gpu``)
      was taken or finished by a worker in that time: products waiting behind a long
      backlog on a queue whose workers are busy are not lost.

    Each such product becomes ``failed`` with the reason and counts towards its job, which
    then ends (``failed``, with the reasons) like any other. Returns the number of products
    reaped. The caller commits.
    """
    now = now or utcnow()
    cutoff = now - dt.timedelta(seconds=stale_after_s)
    stuck = list(session.scalars(
        select(Product).join(Job, Product.job_id == Job.id).where(
            Job.state == JobState.running,
            Product.state.in_([ProductState.planned, ProductState.writing]),
            Product.updated_at < cutoff,
        )))
    if any(p.state == ProductState.planned for p in stuck):
        busy = {_queue_of(params) for params in session.scalars(
            select(Product.parameters).where(
                Product.updated_at >= cutoff, Product.updated_at <= now,
                Product.state.in_([ProductState.writing, ProductState.written, ProductState.failed])))}
        stuck = [p for p in stuck if p.state == ProductState.writing or _queue_of(p.parameters) not in busy]
    for prod in stuck:
        was = prod.state.value
        queue = _queue_of(prod.parameters)
        move_product(prod, ProductState.failed,
                     f"lost: {was} for more than {stale_after_s / 60:.0f} min with no progress "
                     f"(worker died, message lost, or no worker consumes queue '{queue}')")
        session.flush()
        count_item(session, prod.job_id, prod.id)
    return len(stuck)
