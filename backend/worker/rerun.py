"""The worker side of re-runs (:mod:`backend.services.reruns`): plan a ``rerun`` job,
recompute one frame, compare, settle; and the reconciler's step for lost re-run messages.

One frame (:func:`rerun_frame`):

1. claim its :class:`~backend.models.RerunItem` (one conditional UPDATE: an item that is
   finished, or held by a live claim younger than the lease, is left alone, so a
   redelivered or re-sent message does nothing twice; one started ``MAX_DELIVERIES`` times
   fails with the reason);
2. check the raw frame's and every calibration file's bytes on disk against the
   manifest's sha256 (and that the registry row still has that id and sha256): any
   mismatch fails the frame with both digests, nothing is computed;
3. calibrate with exactly those files and the manifest's options
   (:func:`pipelines.calibration.l2.flow.calibrate_frame`) on the lane's backend, write the L2
   file into the re-run store ``DATA_DIR/reruns/<job id>/`` (never the product store);
4. compare: the sha256 of every HDU's data (:func:`~backend.services.manifests.product_digests`)
   with the manifest's, and the arrays with the original file's when it is there
   (:func:`~backend.services.manifests.compare_arrays`): ``identical``,
   ``within_tolerance`` (other backend, within :data:`~backend.services.manifests.TOLERANCE`)
   or ``differs``;
5. settle its ``JobItem`` (``done``; ``failed`` with the reason when it could not be
   re-run) and recount the job from its items, ending it when none is pending, in one commit.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import numpy as np
from sqlalchemy import or_, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from backend import __version__
from backend.broker import InFlight, TaskName, send
from backend.models import CalibrationFile, Frame, ItemOutcome, Job, JobItem, JobState, Product, RerunItem, utcnow
from backend.services.job_plan import lock_job, recount_job
from backend.settings import Settings
from backend.state import claim_is_dead, give_up_reason, move_job, reason_text
from pipelines.calibration import as_options
from pipelines.errors import DataError, failure_reason
from pipelines.tmpfiles import sha256_file

log = logging.getLogger(__name__)

__all__ = ["rerun_dir", "plan_rerun", "send_rerun", "rerun_frame", "resend_lost_reruns", "file_sha256"]

_HASHES: dict[tuple[str, int, int], str] = {}


def rerun_dir(settings: Settings) -> Path:
    """The re-run store: ``DATA_DIR/reruns`` (one folder per re-run job)."""
    return settings.root / "reruns"


def file_sha256(path: str) -> str:
    """SHA-256 of the file's bytes now (kept per (path, mtime, size) in this process, so a
    file rewritten in place is hashed again)."""
    st = Path(path).stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    sha = _HASHES.get(key)
    if sha is None:
        sha = _HASHES[key] = sha256_file(path)
        if len(_HASHES) > 256:
            _HASHES.pop(next(iter(_HASHES)))
    return sha


def plan_rerun(session: Session, job_id: str) -> list[int]:
    """Move queued ``rerun`` job ``job_id`` to ``running`` with one pending item per frame and
    return the frame ids to send (the caller commits, then sends). A job not ``queued`` (a
    redelivered plan message) plans nothing again."""
    job = lock_job(session, job_id)
    if job is None:
        raise DataError(f"no job {job_id}")
    if job.state != JobState.queued:
        return []
    move_job(job, JobState.running)
    rows = list(session.scalars(select(RerunItem).where(RerunItem.job_id == job_id).order_by(RerunItem.frame_id)))
    job.total, job.done, job.failed, job.skipped = len(rows), 0, 0, 0
    now = utcnow()
    for r in rows:
        session.add(JobItem(job_id=job_id, frame_id=r.frame_id, product_id=None, outcome=ItemOutcome.pending))
        r.sent_at = now
    session.flush()
    if not rows:
        recount_job(session, job)
    return [r.frame_id for r in rows]


def send_rerun(job_id: str, frame_id: int, lane: str = "cpu") -> None:
    """Send one frame's re-run (task ``rerun_frame`` by name) to queue ``lane``."""
    send(TaskName.rerun_frame, [job_id, frame_id], queue="gpu" if lane == "gpu" else "cpu")


def _claim(session: Session, job_id: str, frame_id: int, holder: str, lease_s: float) -> RerunItem | None:
    now = utcnow()
    lease_cut = now - dt.timedelta(seconds=lease_s)
    row = session.scalar(select(RerunItem).where(RerunItem.job_id == job_id, RerunItem.frame_id == frame_id)
                         .execution_options(populate_existing=True))
    if row is None or row.finished_at is not None:
        return None
    if row.claimed_by and row.claimed_by != holder and not claim_is_dead(row.claimed_by) and \
            row.claimed_at is not None and _aware(row.claimed_at) >= lease_cut:
        return None  # a live delivery holds it
    got = session.execute(
        update(RerunItem).where(RerunItem.job_id == job_id, RerunItem.frame_id == frame_id,
                                RerunItem.finished_at.is_(None), RerunItem.attempts == row.attempts)
        .values(attempts=RerunItem.attempts + 1, claimed_at=now, claimed_by=holder)
        .execution_options(synchronize_session=False))
    session.commit()
    if got.rowcount != 1:
        return None  # another delivery claimed it meanwhile
    return session.scalar(select(RerunItem).where(RerunItem.job_id == job_id, RerunItem.frame_id == frame_id)
                          .execution_options(populate_existing=True))


def _aware(t: dt.datetime | None) -> dt.datetime | None:
    return t.replace(tzinfo=dt.UTC) if t is not None and t.tzinfo is None else t


def _checked_inputs(session: Session, item: RerunItem) -> tuple[Frame, dict]:
    """The frame and the calibration masters by kind, after checking every byte against
    the manifest's sha256. Raises ``DataError`` with both digests on any mismatch."""
    from backend.worker.processing import resident_master

    frame = session.get(Frame, item.frame_id)
    if frame is None:
        raise DataError(f"frame {item.frame_id} no longer exists")
    try:
        raw_sha = file_sha256(frame.path)
    except OSError as exc:
        raise DataError(f"frame {frame.id}: raw file unreadable ({exc.strerror or exc})") from None
    if raw_sha != item.frame_sha256:
        raise DataError(f"frame {frame.id} ({frame.original_name}): its raw file has sha256 {raw_sha[:16]}..., the "
                        f"manifest says {item.frame_sha256[:16]}...: refusing to re-run on other input")
    cals = {}
    for f in item.calibration_files:
        row = session.get(CalibrationFile, f["id"])
        if row is None:
            raise DataError(f"calibration file {f['id']} ({f['kind']} v{f['version']}) is no longer registered")
        try:
            disk = file_sha256(row.path)
        except OSError as exc:
            raise DataError(f"calibration file {row.id} ({row.kind.value} v{row.version}) unreadable: "
                            f"{exc.strerror or exc}") from None
        if disk != f["sha256"] or row.sha256 != f["sha256"]:
            raise DataError(f"calibration file {row.id} ({row.kind.value} v{row.version}, "
                            f"{Path(row.path).name}): its bytes have sha256 {disk[:16]}... (registry "
                            f"{row.sha256[:16]}...), the manifest says {str(f['sha256'])[:16]}...: refusing to re-run "
                            "with other calibration data")
        cals[row.kind.value] = resident_master(row)
    return frame, cals


def _backend(settings: Settings, lane: str, options) -> str:
    if lane == "gpu" and options.device == "gpu":
        from backend.worker.gpu_batch import choose_backend

        return choose_backend(settings)[0]
    return "numpy"


def _recompute(session: Session, settings: Settings, job: Job, item: RerunItem) -> None:
    """Steps 2-4 of the module docstring; fills ``item``'s result columns."""
    from backend.services.manifests import compare_arrays, device_of, product_digests
    from pipelines.calibration import calibrate_frame
    from pipelines.fitsio import read_image, store_tmp_dir, write_fits_atomic
    from pipelines.products import build_product_hdul, read_product
    from pipelines.provenance import stamp_provenance

    frame, cals = _checked_inputs(session, item)
    options = as_options(item.options)
    backend = _backend(settings, job.lane, options)
    raw = read_image(frame.path, dtype=np.float32)
    result = calibrate_frame(raw.data, raw.header, cals, options, backend=backend)
    used = str(result.header.get("BACKEND", backend)).lower()
    stamp_provenance(result.header, {"FRAMEID": frame.id, "FILENAME": f"rerun_f{frame.id}_p{item.product_id}.fits"})
    result.header.add_history(f"re-run of product {item.product_id} (job {job.id}); not a product of the archive")
    hdul = build_product_hdul(result, software_version=__version__)
    store = rerun_dir(settings)
    out = store / job.id / f"rerun_f{frame.id}_p{item.product_id}.fits"
    write_fits_atomic(hdul, out, tmp_dir=store_tmp_dir(store))
    digests = product_digests(hdul)  # every HDU, as the product's manifest (DIGEST_RECIPE)
    expected = dict(item.expected or {})
    same_backend = (expected.get("backend") or "numpy") == used
    comparison = None
    prod = session.get(Product, item.product_id) if item.product_id is not None else None
    original_path = None
    if prod is not None and prod.path:
        from backend.services.products import resolve_store_path

        original_path = resolve_store_path(prod.path, settings.products)  # an object: its cached copy
    if original_path is not None and original_path.is_file():
        a_data, a_dq, _ = read_product(original_path)
        comparison = compare_arrays(a_data, a_dq, result.data, result.dq, same_backend=same_backend)
        if not expected.get("data_sha256"):
            from astropy.io import fits

            with fits.open(original_path) as original:
                expected["data_sha256"] = product_digests(original)
    want = expected.get("data_sha256") or {}
    # data and DQ always; UNCERT and every HDU ('all') where the manifest has them (manifests
    # made before UNCERT was covered hold data and dq only)
    sha_equal = bool(want) and all(want.get(k) == digests[k] for k in ("data", "dq", "uncertainty", "all")
                                   if want.get(k) is not None)
    if comparison is None:
        comparison = {"identical": sha_equal, "verdict": "identical" if sha_equal else "differs",
                      "same_backend": same_backend,
                      "note": "the original product file is gone: compared by data sha256 only"}
    comparison["sha256_equal"] = sha_equal
    if comparison["verdict"] == "identical" and not sha_equal:
        comparison["verdict"] = "differs"  # equal arrays but another digest: the manifest's is not this data
    item.path, item.backend, item.data_sha256 = str(out), used, digests
    item.verdict, item.comparison = comparison["verdict"], comparison
    item.comparison["device"] = device_of(used)


def _settle(session: Session, job_id: str, frame_id: int, reason: str | None) -> bool:
    """Settle ``frame_id``'s item of ``job_id`` (done, or failed with ``reason``) and recount
    the job under its row lock; the caller commits. Returns whether this ended the job."""
    session.execute(update(JobItem).where(JobItem.job_id == job_id, JobItem.frame_id == frame_id,
                                          JobItem.outcome == ItemOutcome.pending)
                    .values(outcome=ItemOutcome.failed if reason else ItemOutcome.done, reason=reason,
                            settled_at=utcnow())
                    .execution_options(synchronize_session=False))
    job = lock_job(session, job_id)
    if reason:
        job.error = reason_text(f"{job.error}; {reason}" if job.error else reason)
    return job.state == JobState.running and recount_job(session, job)


def _finish_item(session: Session, job_id: str, frame_id: int, reason: str | None) -> RerunItem:
    item = session.get(RerunItem, (job_id, frame_id))
    item.finished_at = utcnow()
    item.reason = reason_text(reason) if reason else None
    session.flush()
    _settle(session, job_id, frame_id, item.reason and f"frame {frame_id}: {item.reason}")
    session.commit()
    return item


def rerun_frame(session: Session, settings: Settings, job_id: str, frame_id: int, *, holder: str) -> RerunItem | None:
    """Re-run frame ``frame_id`` of ``rerun`` job ``job_id`` (the module docstring's steps).

    Returns the item, or ``None`` when this delivery does nothing (finished, held by a live
    claim, or its job is not running).

    Raises
    ------
    sqlalchemy.exc.OperationalError
        A database fault: the claim is released (best effort) and the task retries.
    """
    job = session.get(Job, job_id)
    if job is None or job.state != JobState.running:
        return None
    item = _claim(session, job_id, frame_id, holder, settings.lease_s)
    if item is None:
        return None
    if item.attempts > settings.max_deliveries:
        return _finish_item(session, job_id, frame_id, give_up_reason(item.attempts - 1))
    try:
        _recompute(session, settings, job, item)
        session.flush()
        return _finish_item(session, job_id, frame_id, None)
    except OperationalError:
        session.rollback()
        try:
            session.execute(update(RerunItem).where(RerunItem.job_id == job_id, RerunItem.frame_id == frame_id,
                                                    RerunItem.claimed_by == holder)
                            .values(claimed_at=None, claimed_by=None).execution_options(synchronize_session=False))
            session.commit()
        except OperationalError:
            session.rollback()
        raise
    except Exception as exc:  # noqa: BLE001 - data errors and bugs alike end this frame failed with the reason
        session.rollback()
        if not isinstance(exc, DataError):
            log.exception("re-run of frame %s (job %s) failed", frame_id, job_id)
        return _finish_item(session, job_id, frame_id, failure_reason(exc))


def resend_lost_reruns(session: Session, settings: Settings, flight: InFlight | None, now: dt.datetime,
                       grace_s: float) -> tuple[list[tuple[str, int]], list[str]]:
    """The reconciler's step for re-runs: a pending frame of a running ``rerun`` job whose
    message is neither in the broker nor recently sent, and whose claim (if any) is dead or
    past the lease, is sent again; one started ``MAX_DELIVERIES`` times fails with the
    reason. Returns ``(resent, ended_job_ids)``."""
    if flight is None:
        return [], []
    cut = now - dt.timedelta(seconds=grace_s)
    lease_cut = now - dt.timedelta(seconds=settings.lease_s)
    rows = session.execute(
        select(RerunItem.job_id, RerunItem.frame_id, Job.lane).join(Job, Job.id == RerunItem.job_id)
        .join(JobItem, (JobItem.job_id == RerunItem.job_id) & (JobItem.frame_id == RerunItem.frame_id))
        .where(Job.state == JobState.running, Job.kind == "rerun", JobItem.outcome == ItemOutcome.pending,
               RerunItem.finished_at.is_(None), or_(RerunItem.sent_at.is_(None), RerunItem.sent_at < cut))).all()
    resent: list[tuple[str, int]] = []
    ended: list[str] = []
    for job_id, frame_id, lane in rows:
        if (job_id, frame_id) in flight.reruns:
            continue
        item = session.get(RerunItem, (job_id, frame_id))
        session.refresh(item, with_for_update=True)
        live = (item.claimed_by and not claim_is_dead(item.claimed_by) and item.claimed_at is not None
                and _aware(item.claimed_at) >= lease_cut)
        if item.finished_at is not None or live:
            session.commit()
            continue
        if (item.attempts or 0) >= settings.max_deliveries:
            item.finished_at, item.reason = utcnow(), give_up_reason(item.attempts)
            session.flush()
            if _settle(session, job_id, frame_id, f"frame {frame_id}: {item.reason}"):
                ended.append(job_id)
            session.commit()
            continue
        item.sent_at = now
        session.commit()
        send_rerun(job_id, frame_id, lane)
        resent.append((job_id, frame_id))
    return resent, ended
