"""The GPU worker's service: calibrate a batch of planned products on one device.

:func:`calibrate_products_batch` is what the Celery task
``pipelines.tasks.calibrate_products_gpu_batch`` (queue ``gpu``) runs. It claims the
products of the batch, streams their raw frames through the process's
:class:`~pipelines.calibration.l2.batch.BatchExecutor` (calibration masters resident on the
device across batches, host-to-device copies overlapped with compute) and, as each frame
comes back, writes its L2 FITS and quicklook, moves the product to ``written`` or
``failed`` (with the reason) and counts it towards its job (:func:`~backend.services.job_plan.count_item`) in the
same commit. One bad frame fails that product only; the job ends ``failed`` with the
reasons, as the CPU path does. A frame whose every waiting job was cancelled while the
batch ran is not written (the frame boundary of a cancel): its product fails with
:func:`backend.state.cancel_reason` and counts as ``cancelled``.

Retries and redeliveries are idempotent: each product is claimed first
(:func:`backend.state.claim_product`); one already ``written`` or ``failed``, or held by a
live claim of another delivery, is left alone.

No GPU on a GPU worker
----------------------
A job asks for ``device: gpu`` for speed; the product's values do not depend on the
device beyond float32 rounding (``benchmarks/gpu_check.py`` checks that parity), and
``device`` is not part of a product's identity. So a GPU worker that finds no usable GPU
(CuPy missing, no CUDA device) or is configured ``ARRAY_BACKEND=numpy`` calibrates the
batch with NumPy rather than failing the job: the product records what happened
(``BACKEND = 'numpy'`` and a HISTORY line giving the reason), the worker logs a warning,
and the task's return value names the backend used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.orm import Session

from backend.models import Product, ProductState
from backend.worker.processing import (PLACED, count_item, give_back_after_time_limit, give_back_claim,
                                       give_back_on_storage_fault, prepare_product_files, product_write_info,
                                       resident_master, settle_placed, soft_time_limit_in, write_product)
from backend.worker.storage_faults import lane_of
from backend.settings import Settings
from backend.state import Claim, cancel_reason, cancelling_waiter, claim_product, move_product
from pipelines.array_backend import cupy_available
from pipelines.calibration import as_options
from pipelines.errors import DataError, failure_reason

log = logging.getLogger(__name__)

__all__ = ["BatchReport", "calibrate_products_batch", "fail_unfinished", "settle_after_time_limit", "gpu_executor",
           "choose_backend"]

_EXECUTORS: dict[str, object] = {}


def choose_backend(settings: Settings) -> tuple[str, str | None]:
    """The array backend a GPU worker uses, and the reason when it is not CuPy.

    Returns
    -------
    (backend, note)
        ``("cupy", None)`` when ``ARRAY_BACKEND=cupy`` and CuPy sees a GPU; otherwise
        ``("numpy", reason)``.
    """
    if settings.array_backend != "cupy":
        return "numpy", (f"device gpu requested; this worker is configured ARRAY_BACKEND={settings.array_backend}: "
                         "calibrated with NumPy on the CPU")
    if not cupy_available():
        return "numpy", ("device gpu requested; this worker has no usable GPU (CuPy not importable or no CUDA "
                         "device): calibrated with NumPy on the CPU")
    return "cupy", None


def gpu_executor(backend: str):
    """This process's :class:`~pipelines.calibration.l2.batch.BatchExecutor` for ``backend``
    (made once: its resident masters serve every later batch)."""
    from pipelines.calibration import BatchExecutor

    from pipelines.products import QUICKLOOK_SIZE

    ex = _EXECUTORS.get(backend)
    if ex is None:  # the quicklook's block average made on the device with the product
        ex = _EXECUTORS[backend] = BatchExecutor(backend, quicklook_size=QUICKLOOK_SIZE)
    return ex


@dataclass
class BatchReport:
    """What one batch did (JSON-ready through :meth:`as_dict`).

    ``job_finished`` is True when one of this batch's products was the last of its job
    (the caller then queues the job's follow-ups once); ``job_parameters`` are the job's.
    """

    backend: str
    written: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    job_finished: bool = False
    job_state: str | None = None
    job_parameters: dict = field(default_factory=dict)
    note: str | None = None

    def as_dict(self) -> dict:
        return {"backend": self.backend, "written": self.written, "failed": {str(k): v for k, v in self.failed.items()},
                "skipped": self.skipped, "job_state": self.job_state, "note": self.note}


def _count(session: Session, report: BatchReport, job_id: str | None, product_id: int) -> None:
    if not job_id:
        return
    job, closed = count_item(session, job_id, product_id)
    if job is not None:
        report.job_state = job.state.value
        report.job_parameters = dict(job.parameters or {})
        if closed:
            report.job_finished = True  # this product closed the job


def _fail(session: Session, report: BatchReport, job_id: str | None, product_id: int, reason: str) -> None:
    prod = session.get(Product, product_id)
    session.refresh(prod)
    if prod.state not in (ProductState.planned, ProductState.writing):
        return  # finished meanwhile (another delivery): its outcome stands
    move_product(prod, ProductState.failed, reason)
    session.flush()
    _count(session, report, job_id, product_id)
    session.commit()
    report.failed[product_id] = reason


def _raise_time_limit(exc: BaseException | None) -> None:
    """Raise the batch's soft time limit if ``exc`` is it or wraps it
    (:func:`backend.worker.processing.soft_time_limit_in`), as ``SoftTimeLimitExceeded`` whose
    ``__cause__`` is ``exc`` (its traceback says where it struck:
    :func:`backend.worker.processing.blocked_in`), for the task to settle
    (:func:`settle_after_time_limit`)."""
    if exc is None or not soft_time_limit_in(exc):
        return
    if isinstance(exc, SoftTimeLimitExceeded):
        raise exc
    raise SoftTimeLimitExceeded(str(exc)) from exc


def calibrate_products_batch(session: Session, product_ids: list[int], settings: Settings, *,
                             job_id: str | None = None, executor=None, holder: str | None = None,
                             device: str = "gpu") -> BatchReport:
    """Calibrate the planned products ``product_ids`` as one device batch.

    Parameters
    ----------
    session : Session
        Used on the calling thread only (the executor's threads read files and compute).
    product_ids : list of int
        Products planned by :func:`backend.worker.processing.plan_job`.
    settings : Settings
        Product store and ``ARRAY_BACKEND``.
    job_id : str, optional
        The job each finished product is counted towards.
    executor : BatchExecutor, optional
        Default: this process's executor for :func:`choose_backend`'s backend.
    holder : str, optional
        Who claims the products (:func:`backend.state.this_process`, with the task's id
        and retry number).
    device : {"gpu", "cpu"}
        ``gpu``: the GPU worker's batch (above). ``cpu``: the CPU worker's batch
        (``calibrate_products_cpu_batch``): NumPy, by the process's overlapped host executor
        (frame k+1 read and product k-1 written while frame k computes:
        :class:`~pipelines.calibration.l2.batch.BatchExecutor`), no device note.

    Returns
    -------
    BatchReport

    Raises
    ------
    sqlalchemy.exc.OperationalError
        A database fault (the task retries; products not yet counted are redone).
    """
    # Long: one device batch from claim to settlement (claims, resident masters, the executor's
    # callbacks that write and count each product, the storage-fault and soft-limit exits);
    # the callbacks close over the batch's session and claims
    from pipelines.calibration import BatchItem

    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be 'gpu' or 'cpu', got {device!r}")
    backend, note = ("numpy", None) if device == "cpu" else choose_backend(settings)
    if executor is None:
        executor = gpu_executor(backend)
    elif device == "cpu":
        backend = executor.backend
    else:
        backend = executor.backend
        if backend == "cupy":
            note = None
        elif note is None:
            note = "device gpu requested; calibrated with NumPy on the CPU (executor given by the caller)"
    if note:
        log.warning("%s", note)
    report = BatchReport(backend=backend, note=note)
    notes = (note,) if note else ()

    # claim each product (backend.state.claim_product): finished ones, and ones a live
    # claim holds, are left alone; one past the delivery limit fails and is counted
    claimed: dict[int, Claim] = {}
    for pid in product_ids:
        claim = claim_product(session, pid, lease_s=settings.lease_s, max_deliveries=settings.max_deliveries,
                              holder=holder)
        if claim.status == "claimed":
            claimed[pid] = claim
        elif claim.status in ("exhausted", "cancelled"):  # failed by the claim: counted now
            _count(session, report, job_id, pid)
            session.commit()
            report.failed[pid] = session.get(Product, pid).error
        else:
            report.skipped.append(pid)

    items = []
    infos: dict[int, dict] = {}  # what the writer threads need of each product, read here (the ORM stays on this thread)
    for pid in claimed:
        prod = session.get(Product, pid)
        try:
            cals = {f.kind.value: resident_master(f) for f in prod.calibration_files}
        except Exception as exc:  # noqa: BLE001 - a master changed on disk or unreadable: this product fails
            _raise_time_limit(exc)  # ... unless it was the batch's soft time limit: the task settles
            _fail(session, report, job_id, pid, failure_reason(exc))
            continue
        try:
            options = as_options((prod.parameters or {}).get("options"))
        except DataError as exc:  # options stored by hand or by an older version: this product fails
            _fail(session, report, job_id, pid, failure_reason(exc))
            continue
        items.append(BatchItem.from_path(pid, prod.frame.path, cals, options))
        infos[pid] = product_write_info(settings, prod)

    # GPU batches: each product's files are written by one of ``GPU_WRITERS`` writer threads
    # (several at once, while the next frames compute) under temporary names; this thread
    # confirms the claim, renames them and fills the row (write_product). An object store is
    # written from this thread, as before.
    threaded = device == "gpu" and not settings.product_store

    def on_write(outcome):
        return prepare_product_files(settings, infos[outcome.key], outcome.result, notes)

    def on_result(outcome) -> None:
        pid = outcome.key
        prepared = outcome.written
        if not outcome.ok:
            # the executor catches what breaks one frame, the batch's soft time limit too when it
            # struck the calling thread while it read or staged a frame: that is the task's to settle
            _raise_time_limit(outcome.exception)
            _fail(session, report, job_id, pid, failure_reason(outcome.exception) if outcome.exception else outcome.error)
            return
        stopper = cancelling_waiter(session, pid)
        if stopper is not None:  # the frame boundary: every job waiting on it was cancelled meanwhile
            if prepared is not None:
                prepared.discard()
            _fail(session, report, job_id, pid, cancel_reason(stopper))
            return
        prod = session.get(Product, pid)
        try:
            if outcome.write_error is not None:  # the writer thread's fault, handled as this thread's would be
                raise outcome.write_error
            if not write_product(session, settings, prod, outcome.result, notes=notes, attempt=claimed[pid].attempt,
                                 holder=claimed[pid].holder, prepared=prepared):
                session.rollback()
                report.skipped.append(pid)  # taken over by another delivery meanwhile
                return
            session.flush()
        except Exception as exc:  # noqa: BLE001 - e.g. product store full: this product fails
            session.rollback()
            if prepared is not None:  # what a writer thread left under temporary names
                prepared.discard()
            settle_placed(session, settings)  # what it placed, in either store (unless its row names it)
            _raise_time_limit(exc)  # the batch's limit (SQLAlchemy may have wrapped it): the task settles
            log.exception("product %s could not be written", pid)
            # a storage fault (disk full, read-only or unreachable store) pauses the lane and
            # gives the claim back instead (backend.worker.storage_faults); the reconciler
            # re-sends the product when the lane is tried again
            if give_back_on_storage_fault(session, settings, pid, claimed[pid], lane_of(prod.parameters), exc):
                report.skipped.append(pid)
                return
            _fail(session, report, job_id, pid, failure_reason(exc))
            return
        _count(session, report, job_id, pid)
        session.commit()
        session.info.pop(PLACED, None)  # its objects are the product now
        report.written.append(pid)

    if threaded:
        executor.run(items, on_result=on_result, keep_results=False, on_write=on_write, writers=settings.gpu_writers)
    else:
        executor.run(items, on_result=on_result, keep_results=False)
    return report


def fail_unfinished(session: Session, product_ids: list[int], job_id: str | None, reason: str, *,
                    holder: str | None = None) -> BatchReport:
    """Fail (with ``reason``) and count the products of a batch still ``planned``, or
    ``writing`` under this batch's claim (``holder``), after the batch task itself broke, so
    that their job ends instead of waiting for the reconciler. A product another delivery
    holds is left to it."""
    report = BatchReport(backend="none")
    for pid in product_ids:
        prod = session.get(Product, pid)
        if prod is None:
            continue
        session.refresh(prod)
        if prod.state == ProductState.writing and holder is not None and prod.claimed_by != holder:
            report.skipped.append(pid)
            continue
        if prod.state in (ProductState.planned, ProductState.writing):
            _fail(session, report, job_id, pid, reason)
    return report


def settle_after_time_limit(session: Session, settings: Settings, product_ids: list[int], job_id: str | None,
                            exc: BaseException, *, holder: str | None = None) -> tuple[BatchReport, list[int]]:
    """After a batch task's soft time limit (``exc``): the limit is the batch's, not by itself a
    frame's failure. The first product of ``product_ids`` still held by this batch (``writing``
    under ``holder``: outcomes are handed over in input order, so it is the one the batch was
    making) is given back with this start counted, or failed on its last delivery
    (:func:`backend.worker.processing.give_back_after_time_limit`: ``MAX_DELIVERIES``, the reason
    naming both settings; waiting on storage, the lane pauses); the others it holds never
    finished through no fault of theirs and are given back with their start not counted. Each
    batch limit counts one start, so a batch that passes its limit every time ends (bounded).
    Products still ``planned`` (given back, or never claimed) are returned, unfailed, with those
    given back, for the caller to send again in a new batch message (none when the lane
    paused: the reconciler re-sends them when it is tried again). A product another delivery
    holds is left to it; a failed one is counted towards ``job_id``."""
    report = BatchReport(backend="none")
    again: list[int] = []
    counted = paused = False
    for pid in product_ids:
        prod = session.get(Product, pid)
        if prod is None:
            continue
        session.refresh(prod)
        if prod.state == ProductState.writing:
            if holder is not None and prod.claimed_by != holder:
                report.skipped.append(pid)
                continue
            claim = Claim("claimed", prod.attempts or 0, prod.claimed_by)
            if not counted:  # the product under way
                counted = True
                lane = lane_of(prod.parameters)
                outcome = give_back_after_time_limit(session, settings, pid, claim, lane, exc)
                if outcome == "failed":
                    _count(session, report, job_id, pid)
                    session.commit()
                    report.failed[pid] = session.get(Product, pid).error
                elif outcome == "again":
                    again.append(pid)
                elif outcome == "paused":
                    paused = True
                    report.skipped.append(pid)
                continue
            if give_back_claim(session, pid, claim, counted=False, sent=not paused):  # claimed, never made
                again.append(pid)
            session.commit()
        elif prod.state == ProductState.planned:
            again.append(pid)
    if paused:
        report.skipped += again
        again = []
    return report, again
