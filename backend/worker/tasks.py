"""Celery tasks: thin wrappers that load rows by id, call the services, record state.

Registered under the names of :class:`backend.broker.TaskName` (``pipelines.tasks.*``, the
first release's module path), so messages queued by an earlier version are still consumed.

Pass ids, not objects (Celery guide). Data errors are never retried; transient database or
broker faults (``OperationalError``) are retried with exponential backoff. State changes go
through :mod:`backend.state`. The detections that follow a calibration job come from the
detector registry (:data:`pipelines.detect.registry.DETECTORS`): one generic task,
:func:`detect_events`, runs any of them.
"""

from __future__ import annotations

import datetime as dt
import logging

from celery import chain
from celery.signals import worker_init, worker_process_init, worker_ready
from sqlalchemy.exc import OperationalError

from backend.broker import TaskName, app
from backend.db import forget_connections_after_fork, session_scope
from backend.models import Job, JobState
from backend.services.detection import run_detector
from backend.services.events import associate_events
from backend.services.ingest import ingest_path
from backend.settings import get_settings
from backend.state import JOB_FINAL, move_job
from backend.worker.gpu_batch import calibrate_products_batch, fail_unfinished
from backend.worker.processing import calibrate_product as _calibrate_product
from backend.worker.processing import count_item, plan_job, reap_stale_work
from pipelines.calibration.options import as_options
from pipelines.calibration.resample import available_cores, set_default_threads
from pipelines.detect.registry import follow_ups, get_detector
from pipelines.errors import failure_reason
from pipelines.fitsio import sweep_partial_files

log = logging.getLogger(__name__)


@worker_init.connect
def _share_cores(sender=None, **_kwargs) -> None:
    """Give each of the worker's ``c`` processes ``cores // c`` threads for the threaded steps.

    Sent in the main process before the pool forks (``sender`` is the ``WorkController``;
    its ``concurrency`` is the process count), so the children inherit the setting.
    """
    try:
        processes = int(getattr(sender, "concurrency", 0) or 0)
    except (TypeError, ValueError):  # "auto": resolved later; keep one thread per core
        return
    if processes > 0:
        set_default_threads(max(1, available_cores() // processes))
        log.info("threaded calibration steps: %d thread(s) in each of %d worker processes",
                 max(1, available_cores() // processes), processes)


@worker_process_init.connect
def _own_connections(**_kwargs) -> None:
    """A pool child (also one that replaces a killed child) never uses its parent's database
    connections (the start-up reaper opened some in the parent)."""
    forget_connections_after_fork()


@worker_ready.connect
def _reap_on_start(**_kwargs) -> None:
    """A starting worker fails the products that dead workers left behind, and removes the
    temporary files of their killed writes (older than an hour) from the product store."""
    try:
        with session_scope() as s:
            n = reap_stale_work(s)
        if n:
            log.warning("reaped %d products lost by earlier workers", n)
    except Exception:  # noqa: BLE001 - never keep a worker from starting
        log.exception("could not reap stale work")
    try:
        swept = sweep_partial_files(get_settings().products)
        if swept:
            log.warning("removed %d partial files of killed writes, e.g. %s", len(swept), swept[0].name)
    except OSError:
        log.exception("could not sweep partial files")


RETRY = dict(autoretry_for=(OperationalError,), retry_backoff=2, retry_backoff_max=60, max_retries=5)


@app.task(name=TaskName.ingest_file, bind=True, **RETRY)
def ingest_file(self, path: str, move: bool = True) -> dict:
    """Ingest one file; returns the outcome (status, reason, ids). Never fails on bad data."""
    with session_scope() as s:
        out = ingest_path(s, path, get_settings(), move=move)
    log.info("ingest %s", out.line())
    return out.__dict__


@app.task(name=TaskName.run_job, bind=True, **RETRY)
def run_job(self, job_id: str) -> dict:
    """Plan a job and fan out its work.

    CPU jobs: one chain per product, calibrate -> record progress (queue ``cpu``). GPU jobs
    (option ``device: gpu``): batches of ``GPU_BATCH_SIZE`` products, one
    :func:`calibrate_products_gpu_batch` task each (queue ``gpu``), which count every
    product as it finishes.
    """
    with session_scope() as s:
        reaped = reap_stale_work(s)
    if reaped:
        log.warning("reaped %d products lost by earlier jobs", reaped)
    try:
        with session_scope() as s:
            todo = plan_job(s, job_id)
    except OperationalError:
        raise
    except Exception as exc:  # the job must end failed with the reason, never stay queued
        with session_scope() as s:
            job = s.get(Job, job_id)
            if job is not None and job.state not in JOB_FINAL:
                move_job(job, JobState.failed, failure_reason(exc))
        raise
    with session_scope() as s:
        options = as_options((s.get(Job, job_id).parameters or {}).get("options"))
    if options.device == "gpu":
        # GPU workers take batches: masters stay on the device, copies overlap compute
        size = get_settings().gpu_batch_size
        batches = [todo[i:i + size] for i in range(0, len(todo), size)]
        for batch in batches:
            calibrate_products_gpu_batch.apply_async(args=[job_id, batch], queue="gpu")
        return {"job_id": job_id, "planned": len(todo), "gpu_batches": len(batches)}
    for pid in todo:
        chain(calibrate_product.si(pid).set(queue="cpu"), record_progress.si(job_id, pid).set(queue="cpu")).apply_async()
    return {"job_id": job_id, "planned": len(todo)}


@app.task(name=TaskName.calibrate_product, bind=True, **RETRY)
def calibrate_product(self, product_id: int) -> dict:
    """Calibrate one product (state planned -> writing -> written | failed)."""
    with session_scope() as s:
        try:
            prod = _calibrate_product(s, product_id, get_settings())
            return {"product_id": product_id, "state": prod.state.value, "error": prod.error}
        except OperationalError:
            raise
        except Exception as exc:  # recorded as failed on the row; the chain goes on to count it
            log.exception("product %s failed", product_id)
            return {"product_id": product_id, "state": "failed", "error": str(exc)}


@app.task(name=TaskName.calibrate_product_gpu, bind=True, **RETRY)
def calibrate_product_gpu(self, product_id: int) -> dict:
    """The same as :func:`calibrate_product`, routed to the ``gpu`` queue.

    No longer sent by :func:`run_job` (GPU jobs go in batches, :func:`calibrate_products_gpu_batch`);
    kept so that messages queued by an earlier version are still consumed.
    """
    return calibrate_product.run(product_id)


@app.task(name=TaskName.calibrate_products_gpu_batch, bind=True, **RETRY)
def calibrate_products_gpu_batch(self, job_id: str | None, product_ids: list[int]) -> dict:
    """Calibrate a batch of products on this worker's GPU (queue ``gpu``) and count each
    towards its job as it is written or fails (:func:`backend.worker.gpu_batch.calibrate_products_batch`).

    Without a usable GPU the batch runs on NumPy and the products say so (see that module).
    If the batch breaks as a whole (not a database fault, which is retried), its products
    not yet finished fail with the reason, so the job ends. When the job ends, its
    follow-up detections are queued.
    """
    try:
        with session_scope() as s:
            report = calibrate_products_batch(s, list(product_ids), get_settings(), job_id=job_id)
    except OperationalError:
        raise
    except Exception as exc:  # noqa: BLE001 - the job must end, never wait for the reaper
        log.exception("GPU batch of job %s failed", job_id)
        with session_scope() as s:
            report = fail_unfinished(s, list(product_ids), job_id, f"GPU batch failed: {failure_reason(exc)}")
    if report.job_finished:
        _queue_follow_ups(report.job_parameters)
    return {"job_id": job_id, **report.as_dict()}


def _queue_follow_ups(params: dict) -> None:
    """Queue the detections that run once a calibration job over ``params`` has ended:
    one :func:`detect_events` per (detector, channel) of the registry's
    :func:`~pipelines.detect.registry.follow_ups` for the job's channels."""
    span = {"start": params.get("start"), "end": params.get("end")}
    for name, channel in follow_ups(params.get("channels", [])):
        detect_events.apply_async(kwargs={"detector": name, "channel": channel, **span}, queue="cpu")


@app.task(name=TaskName.record_progress, bind=True, **RETRY)
def record_progress(self, job_id: str, product_id: int) -> dict:
    """Count one product towards its job; when the job ends, queue its follow-up detections."""
    with session_scope() as s:
        job, closed = count_item(s, job_id, product_id)
        state = job.state.value if job else None
        params = dict(job.parameters) if job else {}
    if closed:  # once per job: a late or redelivered message of an ended job queues nothing
        _queue_follow_ups(params)
    return {"job_id": job_id, "state": state}


def _time(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


@app.task(name=TaskName.detect_events, bind=True, **RETRY)
def detect_events(self, detector: str, channel: str | None = None, start: str | None = None,
                  end: str | None = None) -> dict:
    """Run registry detector ``detector`` (``flares``, ``cmes``, ``prominences``,
    ``white-light``) on the written L2 products of ``channel`` (default: the detector's) with
    DATE-OBS in ``start``..``end`` (ISO 8601), then link the new events to those of other
    sources and types (:func:`backend.services.events.associate_events`)."""
    t0, t1 = _time(start), _time(end)
    with session_scope() as s:
        channel = get_detector(detector).channel(channel)
        events = run_detector(s, detector, channel=channel, start=t0, end=t1)
        linked = associate_events(s, start=t0, end=t1)
        return {"detector": detector, "channel": channel, "events": [e.id for e in events], "associations": linked}


# The first release's per-detector tasks: kept so that messages already queued are consumed.
def _legacy(detector: str, channel: str | None, start: str | None, end: str | None, *,
            says_channel: bool) -> dict:
    """:func:`detect_events`, answered as the first release's task did (no detector name; the
    channel only where the task takes one)."""
    out = detect_events.run(detector, channel, start, end)
    out.pop("detector")
    if not says_channel:
        out.pop("channel")
    return out


@app.task(name=TaskName.detect_flares, bind=True, **RETRY)
def detect_flares(self, start: str | None = None, end: str | None = None) -> dict:
    """SDI flares (:func:`detect_events` with ``flares``); the first release's task."""
    return _legacy("flares", None, start, end, says_channel=False)


@app.task(name=TaskName.detect_cmes, bind=True, **RETRY)
def detect_cmes(self, channel: str = "SCI-UV", start: str | None = None, end: str | None = None) -> dict:
    """CMEs on SCI-UV or SCI-WL (:func:`detect_events` with ``cmes``); the first release's task."""
    return _legacy("cmes", channel, start, end, says_channel=True)


@app.task(name=TaskName.detect_prominences, bind=True, **RETRY)
def detect_prominences(self, channel: str = "SDI", start: str | None = None, end: str | None = None) -> dict:
    """Prominence eruptions on SDI or SCI-UV (:func:`detect_events` with ``prominences``)."""
    return _legacy("prominences", channel, start, end, says_channel=True)


@app.task(name=TaskName.detect_white_light_flares, bind=True, **RETRY)
def detect_white_light_flares(self, start: str | None = None, end: str | None = None) -> dict:
    """WST white-light flares (:func:`detect_events` with ``white-light``); the first release's task."""
    return _legacy("white-light", None, start, end, says_channel=False)
