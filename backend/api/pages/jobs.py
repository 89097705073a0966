"""The job pages: ``/jobs/new`` (the recalibration job form), ``/jobs`` (recent jobs and the
queue's lanes) and ``/jobs/{job_id}`` (one job and its progress)."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.pages.templating import templates
from backend.api.presenters import with_queue
from backend.models import CalibrationKind
from backend.services import frames as frames_service
from backend.services import jobs as jobs_service
from backend.services import products as products_service
from backend.services.channels import list_channels
from pipelines.utc import as_utc

__all__ = ["router", "PAGE_SIZE"]

router = APIRouter(include_in_schema=False)

#: Jobs listed on ``/jobs``, products listed on a job's page.
PAGE_SIZE = 50


def _job_form_times(lo: dt.datetime | None, hi: dt.datetime | None) -> tuple[str, str]:
    """Default DATE-OBS range of the job form as whole-second UTC ISO 8601 text
    (``2024-05-14T15:50:00Z``): from the earliest frame (rounded down) to the latest (rounded
    up, so it is inside), or the last day when there is no frame. Text, not a
    ``datetime-local`` input: a value with microseconds left that input blank and the form
    invalid, and a browser-local picker is ambiguous about UTC."""
    if lo is None or hi is None:
        hi = dt.datetime.now(dt.UTC).replace(microsecond=0)
        lo = hi - dt.timedelta(days=1)
    lo, hi = as_utc(lo), as_utc(hi)
    if hi.microsecond:
        hi = hi.replace(microsecond=0) + dt.timedelta(seconds=1)
    return tuple(t.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ") for t in (lo, hi))


@router.get("/jobs/new", response_class=HTMLResponse)
def new_job_page(request: Request, session: SessionDep):
    """Form for a recalibration job (valid as first shown: it submits with its defaults): channels,
    DATE-OBS range in UTC text, the calibration options with their defaults, limits and units,
    pinned versions chosen from the registry, and the estimate of the frames it would touch
    (``GET /api/v1/jobs/estimate``, as the fields change); submitted with fetch, then followed."""
    from backend.services import job_form

    start, end = _job_form_times(*frames_service.date_obs_span(session))
    return templates.TemplateResponse(request, "job_new.html", {
        "channels": list_channels(session),
        "kinds": [k.value for k in CalibrationKind],
        "default_start": start,
        "default_end": end,
        "option_fields": job_form.option_fields(),
        "calibration_choices": job_form.calibration_choices(session),
    })


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep, principal: OptionalPrincipal):
    """The most recent jobs the viewer may see (public ones and their own), and the queue's
    lanes (cpu, gpu) with their measured throughput."""
    from backend.services.quotas import queue_snapshot

    rows, total = jobs_service.list_jobs(session, principal, limit=PAGE_SIZE, offset=0)
    return templates.TemplateResponse(request, "jobs.html", {"jobs": rows, "total": total,
                                                             "lanes": queue_snapshot(session, viewer=principal).as_dict()["lanes"]})


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, session: SessionDep, principal: OptionalPrincipal):
    """One job, its parameters and a progress bar that follows it."""
    job = jobs_service.get_job(session, job_id, principal)  # another user's private job: 404
    from backend.services import job_form
    from backend.services.set_access import product_condition

    seen = product_condition(principal)  # products of a private set: to its owner and admins only
    rows, n_products = products_service.list_products(session, job_id=job.id, limit=PAGE_SIZE,
                                                      conditions=() if seen is None else (seen,))
    # a public job's products in a set private to its owner (not promoted): say so, not "no product yet"
    n_hidden = 0 if seen is None else products_service.list_products(session, job_id=job.id, limit=0)[1] - n_products
    states = products_service.job_product_states(session, job.id, () if seen is None else (seen,))
    return templates.TemplateResponse(request, "job.html", {
        "job": with_queue(session, [job])[0], "products": rows, "products_total": n_products,
        "products_hidden": n_hidden, "product_states": states, "option_fields": job_form.option_fields()})
