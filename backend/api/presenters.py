"""What the API's routes and the browser's pages share: the API schemas of an event with its
associations, of jobs with their queue positions, of a GOES XRS window and of a job just
submitted; and the lookups that answer 404 (or 409, 422) the same way on both: a calibration
set the caller may not see, a movie's window, the two product versions of a diff.

A route module never imports another route module (``tests/test_architecture.py``): what two
of them, or a route and a page, both need lives here (or, when it is not about HTTP, in
:mod:`backend.services`).
"""

from __future__ import annotations

import datetime as dt

from fastapi import HTTPException
from sqlalchemy.orm import Session

from backend.api.schemas import (
    EventAssociationPublic,
    EventDetail,
    EventPublic,
    JobCreatedPublic,
    JobPublic,
    JobQueuePublic,
    WebhookCreatedPublic,
    XRaySamplesPublic,
    XRaySeriesPublic,
    XRayWindowPublic,
)
from backend.models import Event, Job, JobState
from backend.services import events as events_service
from backend.services import frames as frames_service
from backend.services import movies as movies_service
from backend.services import notify, product_diff, quotas
from backend.services import products as products_service
from backend.services import xray as xray_service
from pipelines.channels import CHANNELS
from pipelines.errors import DataError

__all__ = ["event_detail", "visible_set_or_404", "with_queue", "job_created", "window_public", "movie_window",
           "product_pair"]


def _association(item: tuple) -> EventAssociationPublic:
    """One ``(event, kind[, reason])`` entry of ``associated_events_with_reasons``."""
    event, kind, *rest = item
    return EventAssociationPublic(kind=str(kind), event=EventPublic.model_validate(event),
                                  reason=rest[0] if rest else None)


def event_detail(session, row: Event, principal=None) -> EventDetail:
    """The full description of an event: associations (to the events ``principal`` may
    see) and linked frame/product ids."""
    detail = EventDetail.model_validate(row)
    detail.associated = [_association(a) for a in
                         events_service.associated_events_with_reasons(session, row.id, principal)]
    detail.frame_ids = frames_service.frame_ids_for_event(session, row.id)
    detail.product_ids = products_service.product_ids_for_event(session, row.id)
    return detail


def visible_set_or_404(session, set_id: int | None, principal) -> int | None:
    """``set_id`` when the caller may see that calibration set (None stays None); else 404."""
    if set_id is None:
        return None
    from backend.services.set_access import visible_set

    if visible_set(session, set_id, principal) is None:
        raise HTTPException(404, detail=f"no calibration set with id {set_id}")
    return set_id


def with_queue(session: Session, jobs: list[Job]) -> list[JobPublic]:
    """``jobs`` as :class:`JobPublic`, each queued or running one with its ``queue`` position
    and ETA (one snapshot of the queue for all: two queries, whatever the number of jobs)."""
    from backend.services.set_access import job_set_ids

    sets = job_set_ids(session, [j.id for j in jobs])
    out = [JobPublic.model_validate(j).model_copy(update={"calibration_sets": sets[j.id]}) for j in jobs]
    if any(j.state in (JobState.queued, JobState.running) for j in jobs):
        snap = quotas.queue_snapshot(session)
        for pub in out:
            q = snap.jobs.get(pub.id)
            if q is not None:
                pub.queue = JobQueuePublic.model_validate(q.as_dict())
    return out


def job_created(session: Session, job: Job, public: JobPublic | None = None) -> JobCreatedPublic:
    """The answer of ``POST /jobs``: the job (``public``, the ``JobPublic`` with its queue
    position and calibration sets, when given) and, when it has one, its webhook with the secret."""
    body = (JobCreatedPublic.model_validate(public.model_dump()) if public is not None
            else JobCreatedPublic.model_validate(job))
    hook = notify.webhook_of_job(session, job.id)
    if hook is not None:
        body.webhook = WebhookCreatedPublic(**notify.describe_webhook(hook, with_secret=True))
    return body


def window_public(win: xray_service.XRayWindow) -> XRayWindowPublic:
    """The API form of an :class:`~backend.services.xray.XRayWindow`."""
    return XRayWindowPublic(
        start=win.start, end=win.end, n_samples=win.n_samples,
        series=[XRaySamplesPublic(series=XRaySeriesPublic.model_validate(s.series), times=s.times_iso, xrsa=s.xrsa,
                                  xrsb=s.xrsb, xrsa_quality=s.xrsa_quality, xrsb_quality=s.xrsb_quality)
                for s in win.series],
    )


def movie_window(session: Session, channel: str | None, start: dt.datetime | None, end: dt.datetime | None,
                 event: int | None, principal=None) -> tuple[str, dt.datetime, dt.datetime, int | None]:
    """The channel and window asked for: explicit, or an event's (± the margin; its own
    channel when it names an LST channel that has frames there, else the first that has)."""
    if event is not None:
        row = events_service.get_event(session, event, principal)
        if row is None:
            raise HTTPException(404, detail=f"no event with id {event}")
        lo, hi = movies_service.event_movie_window(row)
        if channel is None:
            named = [c.strip() for c in (row.channels or "").split(",") if c.strip() in CHANNELS]
            have = [c for c in named + ["SDI", *CHANNELS]
                    if movies_service.movie_products(session, c, lo, hi, limit=1)]
            channel = have[0] if have else (named[0] if named else "SDI")
        return channel, lo, hi, event
    missing = [n for n, v in (("channel", channel), ("start", start), ("end", end)) if v is None]
    if missing:
        raise HTTPException(422, detail=f"give {', '.join(missing)} (or event=<id>)")
    return channel, start, end, None


def product_pair(session, frame_id: int, a: int, b: int, principal) -> product_diff.ProductPair:
    """Products ``a`` and ``b`` of frame ``frame_id`` to compare (:func:`backend.services.product_diff.load_pair`):
    404 when one is unknown or not visible, 422 when one is not of the frame, 409 when one cannot
    be read (not written, an unreadable file, other shapes)."""
    try:
        return product_diff.load_pair(session, frame_id, a, b, principal)
    except product_diff.DiffNotFound as exc:
        raise HTTPException(404, detail=str(exc)) from None
    except product_diff.DiffNotOfFrame as exc:
        raise HTTPException(422, detail=str(exc)) from None
    except DataError as exc:  # not written, unreadable file, shapes differ
        raise HTTPException(409, detail=str(exc)) from None
