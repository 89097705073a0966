"""Celery tasks: thin wrappers that load rows by id, call the services, record state.

Pass ids, not objects (Celery guide). Data errors are never retried; transient database or
broker faults (``OperationalError``) are retried with exponential backoff.
"""

from __future__ import annotations

import logging

from celery import chain
from celery.signals import worker_init, worker_ready
from sqlalchemy.exc import OperationalError

from backend.db import session_scope
from backend.settings import get_settings
from pipelines.celery_app import app

log = logging.getLogger(__name__)

@worker_init.connect
def _share_cores(sender=None, **_kwargs) -> None:
    """Give each of the worker's ``c`` processes ``cores // c`` threads for the threaded steps.

    Sent in the main process before the pool forks (``sender`` is the ``WorkController``;
    its ``concurrency`` is the process count), so the children inherit the setting.
    """
    from pipelines.calibration.resample import available_cores, set_default_threads

    try:
        processes = int(getattr(sender, "concurrency", 0) or 0)
    except (TypeError, ValueError):  # "auto": resolved later; keep one thread per core
        return
    if processes > 0:
        set_default_threads(max(1, available_cores() // processes))
        log.info("threaded calibration steps: %d thread(s) in each of %d worker processes",
                 max(1, available_cores() // processes), processes)


@worker_ready.connect
def _reap_on_start(**_kwargs) -> None:
    """A starting worker fails the products that dead workers left behind."""
    from backend.services.processing import reap_stale_work

    try:
        with session_scope() as s:
            n = reap_stale_work(s)
        if n:
            log.warning("reaped %d products lost by earlier workers", n)
    except Exception:  # noqa: BLE001 - never keep a worker from starting
        log.exception("could not reap stale work")


RETRY = dict(autoretry_for=(OperationalError,), retry_backoff=2, retry_backoff_max=60, max_retries=5)


@app.task(name="pipelines.tasks.ingest_file", bind=True, **RETRY)
def ingest_file(self, path: str, move: bool = True) -> dict:
    """Ingest one file; returns the outcome (status, reason, ids). Never fails on bad data."""
    from backend.services.ingest import ingest_path

    with session_scope() as s:
        out = ingest_path(s, path, get_settings(), move=move)
    log.info("ingest %s", out.line())
    return out.__dict__


@app.task(name="pipelines.tasks.run_job", bind=True, **RETRY)
def run_job(self, job_id: str) -> dict:
    """Plan a job and fan out its work.

    CPU jobs: one chain per product, calibrate -> record progress (queue ``cpu``). GPU jobs
    (option ``device: gpu``): batches of ``GPU_BATCH_SIZE`` products, one
    :func:`calibrate_products_gpu_batch` task each (queue ``gpu``), which count every
    product as it finishes.
    """
    from backend.models import Job, JobState
    from backend.services.processing import plan_job, reap_stale_work

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
            if job is not None:
                from backend.models import utcnow

                job.state = JobState.failed
                job.error = f"{type(exc).__name__}: {exc}"[:4000]
                job.finished_at = utcnow()
        raise
    with session_scope() as s:
        options = (s.get(Job, job_id).parameters or {}).get("options") or {}
    if options.get("device") == "gpu":
        # GPU workers take batches: masters stay on the device, copies overlap compute
        size = get_settings().gpu_batch_size
        batches = [todo[i:i + size] for i in range(0, len(todo), size)]
        for batch in batches:
            calibrate_products_gpu_batch.apply_async(args=[job_id, batch], queue="gpu")
        return {"job_id": job_id, "planned": len(todo), "gpu_batches": len(batches)}
    for pid in todo:
        chain(calibrate_product.si(pid).set(queue="cpu"), record_progress.si(job_id, pid).set(queue="cpu")).apply_async()
    return {"job_id": job_id, "planned": len(todo)}


@app.task(name="pipelines.tasks.calibrate_product", bind=True, **RETRY)
def calibrate_product(self, product_id: int) -> dict:
    """Calibrate one product (state planned -> writing -> written | failed)."""
    from backend.services.processing import calibrate_product as _calibrate

    with session_scope() as s:
        try:
            prod = _calibrate(s, product_id, get_settings())
            return {"product_id": product_id, "state": prod.state.value, "error": prod.error}
        except OperationalError:
            raise
        except Exception as exc:  # recorded as failed on the row; the chain goes on to count it
            log.exception("product %s failed", product_id)
            return {"product_id": product_id, "state": "failed", "error": str(exc)}


@app.task(name="pipelines.tasks.calibrate_product_gpu", bind=True, **RETRY)
def calibrate_product_gpu(self, product_id: int) -> dict:
    """The same as :func:`calibrate_product`, routed to the ``gpu`` queue.

    No longer sent by :func:`run_job` (GPU jobs go in batches, :func:`calibrate_products_gpu_batch`);
    kept so that messages queued by an earlier version are still consumed.
    """
    return calibrate_product.run(product_id)


@app.task(name="pipelines.tasks.calibrate_products_gpu_batch", bind=True, **RETRY)
def calibrate_products_gpu_batch(self, job_id: str | None, product_ids: list[int]) -> dict:
    """Calibrate a batch of products on this worker's GPU (queue ``gpu``) and count each
    towards its job as it is written or fails (:func:`backend.services.gpu_batch.calibrate_products_batch`).

    Without a usable GPU the batch runs on NumPy and the products say so (see that module).
    If the batch breaks as a whole (not a database fault, which is retried), its products
    not yet finished fail with the reason, so the job ends. When the job ends, its
    follow-up detections are queued.
    """
    from backend.services.gpu_batch import calibrate_products_batch, fail_unfinished

    try:
        with session_scope() as s:
            report = calibrate_products_batch(s, list(product_ids), get_settings(), job_id=job_id)
    except OperationalError:
        raise
    except Exception as exc:  # noqa: BLE001 - the job must end, never wait for the reaper
        log.exception("GPU batch of job %s failed", job_id)
        with session_scope() as s:
            report = fail_unfinished(s, list(product_ids), job_id,
                                     f"GPU batch failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:2000])
    if report.job_finished:
        _queue_follow_ups(report.job_parameters)
    return {"job_id": job_id, **report.as_dict()}


def _queue_follow_ups(params: dict) -> None:
    """Queue the detections that run once a calibration job over ``params`` has ended."""
    span = {"start": params.get("start"), "end": params.get("end")}
    channels = params.get("channels", [])
    if "SDI" in channels:
        detect_flares.apply_async(kwargs=span, queue="cpu")
        detect_prominences.apply_async(kwargs={**span, "channel": "SDI"}, queue="cpu")
    for ch in ("SCI-UV", "SCI-WL"):
        if ch in channels:
            detect_cmes.apply_async(kwargs={**span, "channel": ch}, queue="cpu")
    if "SCI-UV" in channels:
        detect_prominences.apply_async(kwargs={**span, "channel": "SCI-UV"}, queue="cpu")
    if "WST" in channels:
        detect_white_light_flares.apply_async(kwargs=span, queue="cpu")


@app.task(name="pipelines.tasks.record_progress", bind=True, **RETRY)
def record_progress(self, job_id: str, product_id: int) -> dict:
    """Count one product towards its job; when the job ends, queue flare detection."""
    from backend.models import JobState
    from backend.services.processing import record_item

    with session_scope() as s:
        job = record_item(s, job_id, product_id)
        state = job.state.value if job else None
        finished = job is not None and job.state in (JobState.succeeded, JobState.failed)
        params = dict(job.parameters) if job else {}
    if finished:
        _queue_follow_ups(params)
    return {"job_id": job_id, "state": state}


@app.task(name="pipelines.tasks.detect_flares", bind=True, **RETRY)
def detect_flares(self, start: str | None = None, end: str | None = None) -> dict:
    """Run the SDI flare detector on written L2 products in a DATE-OBS range, then link the
    new events to those of other sources (:func:`backend.services.events.associate_events`)."""
    from backend.services.detection import detect_sdi_flares

    with session_scope() as s:
        events = detect_sdi_flares(s, start=_time(start), end=_time(end))
        linked = associate_events(s, start=_time(start), end=_time(end))
        return {"events": [e.id for e in events], "associations": linked}


def _time(value: str | None):
    import datetime as dt

    return dt.datetime.fromisoformat(value) if value else None


def associate_events(session, *, start=None, end=None) -> int:
    """Link events across sources and types between ``start`` and ``end`` (aware UTC or None);
    returns the number of new links (:func:`backend.services.events.associate_events`)."""
    from backend.services.events import associate_events as _associate

    return _associate(session, start=start, end=end)


@app.task(name="pipelines.tasks.detect_cmes", bind=True, **RETRY)
def detect_cmes(self, channel: str = "SCI-UV", start: str | None = None, end: str | None = None) -> dict:
    """Run the CME detector on the written L2 products of an SCI channel in a DATE-OBS range,
    then link the new events (flare/prominence -> CME)."""
    from backend.services.detection import detect_sci_cmes

    with session_scope() as s:
        events = detect_sci_cmes(s, channel=channel, start=_time(start), end=_time(end))
        linked = associate_events(s, start=_time(start), end=_time(end))
        return {"channel": channel, "events": [e.id for e in events], "associations": linked}


@app.task(name="pipelines.tasks.detect_prominences", bind=True, **RETRY)
def detect_prominences(self, channel: str = "SDI", start: str | None = None, end: str | None = None) -> dict:
    """Run the prominence-eruption detector on SDI or SCI-UV L2 products in a DATE-OBS range."""
    from backend.services.detection import detect_prominence_eruptions

    with session_scope() as s:
        events = detect_prominence_eruptions(s, channel=channel, start=_time(start), end=_time(end))
        linked = associate_events(s, start=_time(start), end=_time(end))
        return {"channel": channel, "events": [e.id for e in events], "associations": linked}


@app.task(name="pipelines.tasks.detect_white_light_flares", bind=True, **RETRY)
def detect_white_light_flares(self, start: str | None = None, end: str | None = None) -> dict:
    """Run the WST white-light flare detector (8 % over the pre-flare level) in a DATE-OBS range."""
    from backend.services.detection import detect_wst_white_light_flares

    with session_scope() as s:
        events = detect_wst_white_light_flares(s, start=_time(start), end=_time(end))
        linked = associate_events(s, start=_time(start), end=_time(end))
        return {"events": [e.id for e in events], "associations": linked}
