"""Celery tasks: thin wrappers that load rows by id, call the services, record state.

Pass ids, not objects (Celery guide). Data errors are never retried; transient database or
broker faults (``OperationalError``) are retried with exponential backoff.
"""

from __future__ import annotations

import logging

from celery import chain
from sqlalchemy.exc import OperationalError

from backend.db import session_scope
from backend.settings import get_settings
from pipelines.celery_app import app

log = logging.getLogger(__name__)

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
    """Plan a job and fan out one chain per product: calibrate -> record progress."""
    from backend.models import Job, JobState
    from backend.services.processing import plan_job

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
    queue = "gpu" if options.get("device") == "gpu" else "cpu"
    for pid in todo:
        chain(calibrate_product.si(pid).set(queue=queue), record_progress.si(job_id, pid).set(queue="cpu")).apply_async()
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
    """The same as :func:`calibrate_product`, routed to the ``gpu`` queue."""
    return calibrate_product.run(product_id)


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
    if finished and "SDI" in params.get("channels", []):
        detect_flares.apply_async(kwargs={"start": params.get("start"), "end": params.get("end")}, queue="cpu")
    return {"job_id": job_id, "state": state}


@app.task(name="pipelines.tasks.detect_flares", bind=True, **RETRY)
def detect_flares(self, start: str | None = None, end: str | None = None) -> dict:
    """Run the SDI flare detector on written L2 products in a DATE-OBS range."""
    import datetime as dt

    from backend.services.detection import detect_sdi_flares

    with session_scope() as s:
        events = detect_sdi_flares(s, start=dt.datetime.fromisoformat(start) if start else None,
                                   end=dt.datetime.fromisoformat(end) if end else None)
        return {"events": [e.id for e in events]}
