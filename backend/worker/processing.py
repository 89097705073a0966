"""Processing orchestration: plan a job's products, calibrate one product, keep counts.

These functions load rows by id, call the pure science (:mod:`pipelines.calibration`),
write files atomically and move the explicit state machines:

* product: ``planned`` -> ``writing`` -> ``written`` | ``failed`` (with the reason);
* job: ``queued`` -> ``running`` -> ``succeeded`` | ``failed`` (with the reasons) |
  ``cancelled`` (asked to cancel, :mod:`backend.services.job_control`, once its frames
  being calibrated have finished).

The FITS file exists (fsynced, renamed) before the row says ``written``; with an object
store (``PRODUCT_STORE=s3://...``, :mod:`backend.store`) its objects are placed create-once
under the attempt's keys and read back before, and removed after a rollback unless the row
names them (:func:`settle_placed`). In both stores what is about to be placed is recorded
first (:mod:`backend.worker.placements`), so what a writer stopped between placing and
committing leaves is removed by the reconciler. The Celery tasks
in :mod:`backend.worker.tasks` are thin wrappers around them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

import numpy as np
from celery.exceptions import SoftTimeLimitExceeded

from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import __version__
from backend.clock import db_now
from backend.models import Frame, ItemOutcome, JobItem, JobState, Product, ProductState
from backend.services.ingest import header_to_json
# a job's items, its row lock and its end are shared with the API (cancel, retry):
# backend.services.job_plan; re-exported here for the worker's modules
from backend.services.job_plan import count_item, finish_job, frames_for_job, lock_job, plan_product, recount_job
from backend.services.manifests import product_digests, product_manifest
from backend.settings import Settings
from backend.state import claim_product, confirm_claim, move_job, move_product, reason_text
from backend.worker.placements import forget, intend
from pipelines.calibration import as_options
from pipelines.errors import DataError, failure_reason

log = logging.getLogger(__name__)

__all__ = ["plan_job", "plan_product", "calibrate_product", "write_product", "settle_placed",
           "give_back_on_storage_fault", "give_back_after_time_limit", "give_back_claim", "blocked_in", "RESEND",
           "count_item", "recount_job", "lock_job", "frames_for_job", "finish_job", "resident_master"]


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
    now = db_now(session)
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


def product_write_info(settings: Settings, prod: Product) -> dict:
    """What :func:`prepare_product_files` needs of ``prod`` and its frame, as plain values (read
    on the session's thread, so that a writer thread never touches the ORM objects)."""
    frame = prod.frame
    out = _product_path(settings, frame, prod)
    stamp = {"PRODID": prod.id, "PRODVER": prod.version, "CALSET": prod.calibration_set_id, "FRAMEID": frame.id,
             "FILENAME": out.name}
    return {"stamp": {k: v for k, v in stamp.items() if v is not None}, "out": out, "channel": frame.channel_code,
            "warnings": list((prod.parameters or {}).get("warnings", []))}


class PreparedProduct:
    """A product's files written and fsynced under temporary names in the store's ``.tmp/``
    (:func:`prepare_product_files`), and what the row needs of them; :meth:`commit` renames
    them, :meth:`discard` removes them."""

    def __init__(self, hdul, fits_file, quicklook, sha256: str, digests: dict):
        self.hdul, self.fits_file, self.quicklook = hdul, fits_file, quicklook
        self.sha256, self.digests = sha256, digests

    @property
    def header(self):
        """The written primary header."""
        return self.hdul[0].header

    def commit(self) -> None:
        """Rename the FITS file, then the quicklook, to their names (each atomic)."""
        self.fits_file.commit()
        self.quicklook.commit()

    def discard(self) -> None:
        """Remove what is still under a temporary name."""
        self.fits_file.discard()
        self.quicklook.discard()


def _stamped_hdul(info: dict, result, notes: tuple[str, ...]):
    from pipelines.products import build_product_hdul
    from pipelines.provenance import stamp_provenance

    stamp_provenance(result.header, info["stamp"])
    for w in info["warnings"]:
        result.header.add_history(f"calibration warning: {w}")
    for note in notes:
        result.header.add_history(note)
    return build_product_hdul(result, software_version=__version__)


def prepare_product_files(settings: Settings, info: dict, result, notes: tuple[str, ...] = ()) -> PreparedProduct:
    """Write the L2 FITS and quicklook of ``result`` into the product store's ``.tmp/``, fsynced,
    not yet renamed (no database work: a GPU worker's writer threads run it,
    :func:`backend.worker.gpu_batch.calibrate_products_batch`).

    ``info``: :func:`product_write_info` of the product. The FITS file's SHA-256 and the
    manifest's HDU digests are hashed as the file is written (uncompressed products; a
    compressed one's digests are computed from its arrays); the quicklook is drawn from the
    block average made on the device when the result has one (``L2Result.quicklook``).
    Pass the result to :func:`write_product` (``prepared=``), which confirms the claim and
    renames the files, or :meth:`PreparedProduct.discard` it.

    Raises
    ------
    OSError
        From the writing (nothing is left under a temporary name).
    """
    from pipelines.compression import compress_product_hdul
    from pipelines.fitsio import store_tmp_dir, write_fits_pending
    from pipelines.products import write_quicklook_png

    hdul = _stamped_hdul(info, result, notes)
    # the header and digests below are those of the calibrated arrays; the file may hold them
    # tile-compressed (PRODUCT_COMPRESSION, pipelines.compression; "none" writes hdul as is)
    stored = compress_product_hdul(hdul, getattr(settings, "product_compression", "none"))
    tmp = store_tmp_dir(settings.products)  # temporary files in the store's .tmp/, never beside products
    hdu_sha: list[str] = []  # the HDUs' digests, hashed by the lean writer as it writes (uncompressed only)
    out = info["out"]
    sha, fits_file = write_fits_pending(stored, out, tmp_dir=tmp, hdu_digests=hdu_sha if stored is hdul else None)
    try:
        ql = write_quicklook_png(result.data, result.dq, out.with_suffix(".png"), info["channel"], tmp_dir=tmp,
                                 reduced=getattr(result, "quicklook", None), defer=True)
        digests = product_digests(hdul, hdu_sha)
    except BaseException:
        fits_file.discard()
        raise
    return PreparedProduct(hdul, fits_file, ql, sha, digests)


def write_product(session: Session, settings: Settings, prod: Product, result, *, notes: tuple[str, ...] = (),
                  attempt: int | None = None, holder: str | None = None,
                  prepared: PreparedProduct | None = None) -> bool:
    """Write the L2 FITS and quicklook of ``result`` (an :class:`~pipelines.calibration.l2.flow.L2Result`)
    for ``prod`` and fill the row (state ``written``); the caller commits.

    ``notes`` become HISTORY lines of the product (e.g. the GPU worker's CPU fallback).
    ``attempt``: the claim this write belongs to (:func:`backend.state.claim_product`); it
    is confirmed before any file is touched, so a delivery whose claim was taken over writes
    nothing and returns False (``holder``: the claim's holder, ``Claim.holder``, checked too
    when given). With a claim, what the write is about to place (the final FITS and PNG path,
    or their objects) is first recorded and **committed**
    (:func:`backend.worker.placements.intend`: the session is committed here), then the claim
    is confirmed again, which locks the row until the caller's commit; the records are deleted
    in that commit (:func:`backend.worker.placements.forget`). So a writer that stops between
    placing and committing (killed, past its soft time limit, its disk full) leaves records
    that the reconciler settles (:func:`backend.worker.placements.sweep_placements`), with no
    manual step. The file is fsynced and renamed before the row says ``written`` (object
    store: the objects are placed and read back before, :func:`_place_objects`); after a
    rollback the caller calls :func:`settle_placed`. ``prepared``: the files already written
    under temporary names by :func:`prepare_product_files` (a writer thread, with the same
    ``notes``): renamed here once the claim is confirmed, discarded when it is not (a product
    store that is an object store ignores them). Returns True when written.
    """
    if attempt is not None:
        if not confirm_claim(session, prod.id, attempt, holder):
            if prepared is not None:
                prepared.discard()
            return False
        # the claim's holder as the row has it (the caller may give only the attempt)
        who = holder if holder is not None else session.scalar(select(Product.claimed_by).where(Product.id == prod.id))
        intend(session, prod.id, attempt, who or "", _refs(settings, prod, attempt, holder))
        session.info.setdefault(PLACED, []).append((prod.id, attempt, who or ""))
        session.commit()  # the records exist before anything is placed
        if not confirm_claim(session, prod.id, attempt, holder):  # taken over meanwhile: nothing placed
            if prepared is not None:
                prepared.discard()
            session.rollback()
            settle_placed(session, settings)
            return False
    from pipelines.compression import compress_product_hdul
    from pipelines.calibration.l2.quality import frame_quality

    frame = prod.frame
    if settings.product_store:  # an object store: objects of this attempt first, the row after
        if prepared is not None:
            prepared.discard()
        hdul = _stamped_hdul(product_write_info(settings, prod), result, notes)
        stored = compress_product_hdul(hdul, getattr(settings, "product_compression", "none"))
        out = _product_path(settings, frame, prod)
        fits_ref, sha, ql_ref = _place_objects(session, settings, prod, stored, result, out, attempt, holder)
        prod.path, prod.sha256, prod.quicklook_path = fits_ref, sha, ql_ref
        header, digests = hdul[0].header, product_digests(hdul)
    else:
        if prepared is None:
            prepared = prepare_product_files(settings, product_write_info(settings, prod), result, notes)
        try:
            prepared.commit()
        except BaseException:
            prepared.discard()
            raise
        prod.path = str(prepared.fits_file.path)
        prod.sha256 = sha = prepared.sha256
        prod.quicklook_path = str(prepared.quicklook.path)
        header, digests = prepared.header, prepared.digests
    prod.header = header_to_json(header)
    prod.stats = dict(result.stats)
    prod.quality_flags = int(frame_quality(header))  # QUALITY: frame-wide systematics flagged
    prod.manifest = product_manifest(prod, frame, header=header, file_sha256=sha, digests=digests,
                                     software_version=__version__)
    move_product(prod, ProductState.written)
    if attempt is not None:  # the row names what was placed: its records go in the same commit
        forget(session, prod.id, attempt, who or "")
    return True


def _refs(settings: Settings, prod: Product, attempt: int, holder: str | None) -> list[str]:
    """What the row's ``path`` and ``quicklook_path`` will hold when attempt ``attempt``
    writes ``prod``: the final FITS and PNG paths (local store), or their objects' URLs under
    the attempt's keys (:func:`_object_keys`)."""
    out = _product_path(settings, prod.frame, prod)
    if not settings.product_store:
        return [str(out), str(out.with_suffix(".png"))]
    from backend.store import product_store

    store = product_store(settings)
    return [store.ref(k) for k in _object_keys(settings, prod, out, attempt, holder)]


def _object_keys(settings: Settings, prod: Product, out: Path, attempt: int | None,
                 holder: str | None) -> tuple[str, str]:
    """The FITS and PNG keys of attempt ``attempt`` of ``prod`` (:func:`backend.store.attempt_tag`)."""
    from backend.store import attempt_tag

    rel = out.relative_to(settings.products).with_suffix("")
    tag = attempt_tag(prod.id, attempt or 0, holder)
    return f"{rel.as_posix()}{tag}.fits", f"{rel.as_posix()}{tag}.png"


#: ``Session.info`` entry listing the attempts this session recorded placements for
#: (:func:`backend.worker.placements.intend`) and has not yet committed a row for:
#: ``[(product id, attempt, holder), ...]`` (:func:`settle_placed`).
PLACED = "lstdp_placed_objects"


def _place_objects(session: Session, settings: Settings, prod: Product, hdul, result, out: Path,
                   attempt: int | None, holder: str | None) -> tuple[str, str, str]:
    """Write the FITS and quicklook of ``prod`` into the object store under this attempt's keys
    (:func:`backend.store.attempt_tag`), create-once and read back (:meth:`backend.store.ProductStore.put_file`).

    The keys were recorded (:func:`backend.worker.placements.intend`, committed) and listed in
    ``session.info[PLACED]`` before this is called (:func:`write_product`), so whatever fails
    later (the upload itself, the other upload, the row's commit, the soft time limit) the
    caller's :func:`settle_placed` removes what this attempt placed unless its row committed,
    and a writer killed meanwhile leaves them to the reconciler. Returns (FITS ref, FITS
    SHA-256, PNG ref).

    Raises
    ------
    backend.store.StoreError
        The store failed (the reason names the object).
    """
    import tempfile

    from backend.store import product_store
    from pipelines.fitsio import sha256_file, store_tmp_dir
    from pipelines.products import write_quicklook_png

    store = product_store(settings)
    fits_key, png_key = _object_keys(settings, prod, out, attempt, holder)
    # local scratch in PRODUCT_DIR/.tmp/: what a killed writer leaves there is swept by age as
    # the file store's temporary files are (pipelines.fitsio.partial_files; fsck partial_file)
    scratch = store_tmp_dir(settings.products)
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="upload.") as tmp:
        f = Path(tmp) / out.name
        hdul.writeto(f, checksum=True)
        sha = sha256_file(f)
        q = Path(tmp) / out.with_suffix(".png").name
        write_quicklook_png(result.data, result.dq, q, prod.frame.channel_code,
                            reduced=getattr(result, "quicklook", None))
        store.put_file(fits_key, f, sha, content_type="application/fits")
        store.put_file(png_key, q, sha256_file(q), content_type="image/png")
    return store.ref(fits_key), sha, store.ref(png_key)


def settle_placed(session: Session, settings: Settings) -> int:
    """After a rollback: settle what this session's attempts (:data:`PLACED`) placed without
    committing its row (:func:`backend.worker.placements.settle_attempt` with ``mine``): the
    files or objects their product row does not name (the row never committed, or another
    attempt settled it) are removed, in either store, and the attempt's records deleted. A
    row that names them (a commit that succeeded but whose answer was lost) keeps them. When
    the database or the store cannot be asked, the records stay and the reconciler settles
    them (:func:`backend.worker.placements.sweep_placements`). Returns the number removed."""
    from backend.worker.placements import settle_attempt

    placed = session.info.pop(PLACED, [])
    removed = 0
    for product_id, attempt, holder in placed:
        try:
            session.rollback()
            removed += len(settle_attempt(session, settings, product_id, attempt, holder, mine=True))
        except Exception:  # noqa: BLE001 - the reconciler settles what could not be settled here
            log.warning("could not settle what attempt %d of product %s placed: the reconciler settles it",
                        attempt, product_id, exc_info=True)
            try:
                session.rollback()
            except Exception:  # noqa: BLE001
                pass
    return removed


def _committed(session: Session) -> None:
    """Commit; the objects placed for the committed rows are now products (no longer to settle)."""
    session.commit()
    session.info.pop(PLACED, None)


def calibrate_product(session: Session, product_id: int, settings: Settings, *, holder: str | None = None) -> Product:
    """Claim and calibrate one product and write its L2 FITS and quicklook.

    The product is claimed first (:func:`backend.state.claim_product`): a delivery that
    finds it written, failed, or held by a live claim does nothing and returns it as it is;
    one that finds it past ``MAX_DELIVERIES`` claims fails it with the reason. Data errors
    leave the product ``failed`` with the reason (not raised); other exceptions also mark it
    ``failed`` and are re-raised so the task can retry them. A storage fault gives the claim
    back and pauses the lane (:func:`give_back_on_storage_fault`); the soft time limit gives
    the claim back for another delivery, or fails the product on its last one
    (:func:`give_back_after_time_limit`; the ids to send again at once are left in
    ``session.info[RESEND]``). ``holder``: who claims (:func:`backend.state.this_process`
    with the task's id and retry number).

    Raises
    ------
    DataError
        If there is no product ``product_id``.
    """
    from pipelines.calibration import calibrate_frame
    from pipelines.fitsio import read_image

    from backend.worker.storage_faults import clear_fault, lane_of, lane_paused, outlasted_reason

    prod = session.get(Product, product_id)
    if prod is None:
        raise DataError(f"no product {product_id}")
    lane = lane_of(prod.parameters)
    paused = lane_paused(session, lane)
    if paused is not None and outlasted_reason(paused, settings, db_now(session)) is None:
        # the store of this lane is failing: the frame waits (the reconciler re-sends it
        # when the lane is tried again, backend.worker.storage_faults), nothing fails
        log.info("product %s: lane %s paused until %s by %s; not calibrated now", product_id, lane,
                 paused.retry_at, paused.reason)
        session.commit()
        return prod
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
            clear_fault(session, lane)  # the store works (again)
            _committed(session)
        else:
            session.rollback()
            log.warning("product %s was taken over by another delivery while this one calibrated: not written",
                        product_id)
            prod = session.get(Product, product_id)
            session.refresh(prod)
    except OperationalError:  # a database fault: the claim stays ours and the task retries it
        session.rollback()
        settle_placed(session, settings)
        raise
    except Exception as exc:
        session.rollback()
        if soft_time_limit_in(exc):  # also when it interrupted SQLAlchemy, which wraps it
            # not by itself the frame's failure (a frozen host thawed, a store or database that
            # did not answer): the claim goes back first (what it placed is settled after it,
            # or by the reconciler if the hard limit comes first)
            if give_back_after_time_limit(session, settings, product_id, claim, lane, exc) == "again":
                session.info.setdefault(RESEND, []).append((product_id, lane))
            settle_placed(session, settings)
            return session.get(Product, product_id)
        settle_placed(session, settings)
        if isinstance(exc, DataError):
            if not give_back_on_storage_fault(session, settings, product_id, claim, lane, exc):
                _fail_claimed(session, product_id, claim, failure_reason(exc))
            return session.get(Product, product_id)
        if give_back_on_storage_fault(session, settings, product_id, claim, lane, exc):
            return session.get(Product, product_id)
        _fail_claimed(session, product_id, claim, failure_reason(exc))
        raise
    return prod


def soft_time_limit_in(exc: BaseException | None) -> bool:
    """Whether Celery's soft time limit (``SoftTimeLimitExceeded``, raised by a signal handler
    wherever the task is) is ``exc`` or behind it: SQLAlchemy wraps an exception raised while it
    runs a statement or an autoflush (``StatementError``, the original as ``orig``)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, SoftTimeLimitExceeded):
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__ or exc.__context__
    return False


def give_back_on_storage_fault(session: Session, settings: Settings, product_id: int, claim, lane: str,
                               exc: BaseException) -> bool:
    """Handle ``exc`` if it is a storage fault (:func:`backend.worker.storage_faults.storage_fault`):
    pause ``lane`` with the true reason and give the claim back (``planned``, the start not
    counted), or, once the fault has outlasted ``STORAGE_FAULT_BOUND_S``, fail the product
    with that reason; commits. Returns False (nothing done) for any other error."""
    from backend.worker.storage_faults import storage_fault

    err = storage_fault(exc)
    if err is None:
        return False
    log.warning("product %s: %s", product_id, err)
    reason = _pause_lane(session, settings, lane, err)
    if reason is not None:
        _fail_claimed(session, product_id, claim, reason)
        return True
    give_back_claim(session, product_id, claim, counted=False)  # the store failed, not this frame
    session.commit()
    return True


def _pause_lane(session: Session, settings: Settings, lane: str, err: OSError) -> str | None:
    """Record storage fault ``err`` on ``lane`` (:func:`backend.worker.storage_faults.record_fault`,
    the caller commits); returns the reason to fail the frame with once the fault has outlasted
    ``STORAGE_FAULT_BOUND_S`` (:func:`backend.worker.storage_faults.outlasted_reason`), else None."""
    from backend.worker.storage_faults import outlasted_reason, record_fault

    try:
        with session.begin_nested():
            row = record_fault(session, lane, err, settings)
    except IntegrityError:  # another worker paused the lane at the same moment: count this try on its row
        row = record_fault(session, lane, err, settings)
    return outlasted_reason(row, settings, row.last_at)


def give_back_claim(session: Session, product_id: int, claim, *, counted: bool, sent: bool = False) -> bool:
    """Put a product this delivery still holds (``claim``) back to ``planned`` for another
    delivery (the caller commits): ``counted`` keeps this start in ``attempts`` (towards
    ``MAX_DELIVERIES``), otherwise it is taken back. ``sent``: the caller sends its message
    again at once (``sent_at`` = the database's now; else the reconciler re-sends it). Returns
    False when another delivery holds it (left alone)."""
    if not confirm_claim(session, product_id, claim.attempt, claim.holder):
        return False
    prod = session.get(Product, product_id)
    session.refresh(prod)
    move_product(prod, ProductState.planned)
    if not counted:
        prod.attempts = max(0, (prod.attempts or 0) - 1)
    prod.claimed_at = prod.claimed_by = None
    if sent:
        prod.sent_at = db_now(session)
    return True


#: ``Session.info`` entry: ``[(product id, lane), ...]`` given back after the soft time limit
#: (:func:`give_back_after_time_limit`, ``"again"``) whose calibration the task sends again
#: now (``sent_at`` committed; if the send fails the reconciler re-sends it after its grace).
RESEND = "lstdp_resend"

#: Modules whose frames, when the soft time limit strikes inside them, say the task was waiting
#: on storage: the product store (:mod:`backend.store`, obstore's client) or the files of
#: :mod:`pipelines.fitsio` (raw frames read, products written, fsynced, renamed)
STORE_MODULES = ("backend.store", "obstore", "pipelines.fitsio")
#: ... or on the database (SQLAlchemy and its driver)
DATABASE_MODULES = ("sqlalchemy", "psycopg", "sqlite3")
#: Frames that say nothing of where the task was: the limit's own raising (billiard's and
#: Celery's signal handler) and the test hooks that stand in for a call (``tests.*``)
NEUTRAL_MODULES = ("billiard", "celery", "tests.")


def blocked_in(exc: BaseException | None) -> str | None:
    """Where the task was when Celery's soft time limit struck (``exc``, or an exception that
    wraps it: :func:`soft_time_limit_in`), from the innermost frame of the tracebacks from
    ``exc`` down to the ``SoftTimeLimitExceeded`` (not of what it interrupted), frames of
    :data:`NEUTRAL_MODULES` skipped: ``"store"`` in the product store's client or the file I/O
    (:data:`STORE_MODULES`), ``"database"`` in SQLAlchemy or its driver (:data:`DATABASE_MODULES`),
    None anywhere else (the science, an import, a sleep)."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        limit = isinstance(exc, SoftTimeLimitExceeded)
        if limit and exc.__cause__ is None:  # the one the signal raised (or re-raised as it was)
            break
        exc = getattr(exc, "orig", None) or exc.__cause__ or (None if limit else exc.__context__)
    where = None
    for e in chain:
        tb = e.__traceback__
        while tb is not None:
            module = tb.tb_frame.f_globals.get("__name__") or ""
            if module.startswith(STORE_MODULES):
                where = "store"
            elif module.startswith(DATABASE_MODULES):
                where = "database"
            elif not module.startswith(NEUTRAL_MODULES):
                where = None
            tb = tb.tb_next
    return where


def time_limit_reason(settings: Settings, attempt: int, where: str | None) -> str:
    """Why a product fails after the soft time limit struck on its last delivery (``attempt``,
    its ``MAX_DELIVERIES``-th start), ``where``: :func:`blocked_in`."""
    waited = {"store": " while it waited on storage (file or object-store I/O)",
              "database": " while it waited on the database"}
    return (f"calibration passed the soft time limit of {settings.task_soft_time_limit_s:.0f} s "
            f"(TASK_SOFT_TIME_LIMIT_S){waited.get(where, '')} on its delivery {attempt} of at most "
            f"{settings.max_deliveries} (MAX_DELIVERIES); no delivery of this frame finished")


def give_back_after_time_limit(session: Session, settings: Settings, product_id: int, claim, lane: str,
                               exc: BaseException, *, sent: bool = True) -> str:
    """After Celery's soft time limit (``exc``, :func:`soft_time_limit_in`) struck a calibration
    that holds ``claim``: not by itself the frame's failure (a host frozen past its limit and
    thawed, a store or database that did not answer, a loaded machine). Commits.

    * Its last delivery (``claim.attempt`` >= ``MAX_DELIVERIES``): the product fails with
      :func:`time_limit_reason` (bounded: a frame that passes the limit every time stops).
    * Waiting on storage (:func:`blocked_in` ``"store"``): a storage fault, the lane
      pauses with that reason (``ETIMEDOUT``, :mod:`backend.worker.storage_faults`; the
      reconciler re-sends the frame once the lane is tried again) and the claim goes back,
      this start counted; the fault's own bound (``STORAGE_FAULT_BOUND_S``) fails it too.
    * Otherwise the claim goes back, this start counted, ``sent_at`` set when ``sent`` (the
      caller sends the calibration again now).

    Returns ``"failed"``, ``"paused"`` (given back, lane paused), ``"again"`` (given back, to
    send), or ``"taken"`` (another delivery holds the product: left alone).
    """
    import errno

    where = blocked_in(exc)
    log.warning("product %s: soft time limit on delivery %d of %d%s", product_id, claim.attempt,
                settings.max_deliveries, f" (waiting on the {where})" if where else "")
    if claim.attempt >= settings.max_deliveries:
        if not confirm_claim(session, product_id, claim.attempt, claim.holder):
            session.commit()
            return "taken"
        _fail_claimed(session, product_id, claim, time_limit_reason(settings, claim.attempt, where))
        return "failed"
    if where == "store":
        err = OSError(errno.ETIMEDOUT, f"storage did not answer a calibration within its soft time limit of "
                                       f"{settings.task_soft_time_limit_s:.0f} s (TASK_SOFT_TIME_LIMIT_S)")
        reason = _pause_lane(session, settings, lane, err)
        if reason is not None:
            _fail_claimed(session, product_id, claim, reason)
            return "failed"
        given = give_back_claim(session, product_id, claim, counted=True)
        session.commit()
        return "paused" if given else "taken"
    given = give_back_claim(session, product_id, claim, counted=True, sent=sent)
    session.commit()
    return "again" if given else "taken"


def _fail_claimed(session: Session, product_id: int, claim, reason: str) -> None:
    """Fail a product this delivery still holds (``claim``, a ``backend.state.Claim``;
    another delivery that took it over keeps it)."""
    if confirm_claim(session, product_id, claim.attempt, claim.holder):
        prod = session.get(Product, product_id)
        session.refresh(prod)
        move_product(prod, ProductState.failed, reason)
    session.commit()
