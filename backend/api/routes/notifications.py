"""Notifications: server-sent events of a job's (and a movie's) progress, webhooks and their
delivery logs, saved searches and their notifications.

Server-sent events (``GET /jobs/{id}/events``, ``GET /movies/{id}/events``, ``text/event-stream``)
    Reads are anonymous, as ``GET /jobs/{id}`` is. The stream starts at once with a
    ``retry:`` line (the browser's reconnect delay [ms]); then an event ``progress`` each
    time the job changes (JSON: id, state, total, done, failed, skipped, cancelled,
    progress fraction, error), ``end`` when it reaches a final state
    (:data:`backend.state.JOB_FINAL`), after which the server closes the stream; a comment
    line (``: heartbeat``) every :data:`HEARTBEAT_S` when nothing changed, so proxies keep
    the connection. Each event's ``id`` is the job's state and counts: a client that
    reconnects with ``Last-Event-ID`` is sent nothing it has seen (the next change, or
    ``end``). The job is read every :data:`POLL_S` in a short database session of its own
    (no session, transaction or pooled connection is held across the stream), each read in
    a thread given up after :data:`POLL_TIMEOUT_S` (an ``error`` event, then the stream
    closes and the browser reconnects after ``retry``).

    ``backend.api.app.DeadlineMiddleware`` answers 503 only to a request that has not
    started its response by the deadline; a stream sends its first line before reading the
    database, so a stream is never cut at the deadline (``text/event-stream`` is also left
    uncompressed by the gzip middleware, which would hold events back).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Response, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from backend.api.deps import OptionalPrincipal, SessionDep, SubmitLimited
from backend.api.params import IdPath, PaginationDep
from backend.auth import Principal
from backend.models import Job, Movie, SavedSearch, Webhook
from backend.services import notify, visibility
from backend.services import saved_searches as searches
from backend.state import JOB_FINAL, MOVIE_FINAL

__all__ = ["router", "POLL_S", "HEARTBEAT_S", "RETRY_MS", "POLL_TIMEOUT_S", "sse_event", "progress_stream"]

log = logging.getLogger(__name__)

router = APIRouter(tags=["notifications"])

#: How often a stream reads its job [s].
POLL_S = 0.5
#: A comment line is sent when nothing was sent for this long [s].
HEARTBEAT_S = 15.0
#: The reconnect delay the stream asks of the browser (``retry:``) [ms].
RETRY_MS = 3000
#: One read of the job is given up after this long [s] (a frozen database).
POLL_TIMEOUT_S = 5.0

_AUTH_ERRORS = {401: {"description": "No API token, or an unknown, revoked or expired one"},
                403: {"description": "Not yours (or the token lacks the scope)"},
                404: {"description": "No such item"}}


# -- schemas ---------------------------------------------------------------------------------------


class SavedSearchCreate(BaseModel):
    """A saved search: ``query`` holds parameters of ``GET /api/v1/events`` (kind ``events``)
    or ``GET /api/v1/products`` (``products``), as an object or a query string."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=searches.MAX_NAME_CHARS)
    kind: Literal["events", "products"]
    query: dict[str, Any] | str = Field(default_factory=dict, examples=[{"type": "CE", "min_angular_width": 60}])
    webhook_url: str | None = Field(None, max_length=notify.MAX_URL_CHARS,
                                    description="https:// or http://, no credentials; deliveries are signed")


class SavedSearchUpdate(BaseModel):
    """A change to a saved search: a new name and/or a new query (its kind stays)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, max_length=searches.MAX_NAME_CHARS)
    query: dict[str, Any] | str | None = Field(None, examples=[{"type": "CE", "min_angular_width": 90}])


# -- server-sent events -------------------------------------------------------------------------


def sse_event(event: str, data: dict[str, Any], event_id: str | None = None) -> str:
    """One event in the ``text/event-stream`` format (``event:``, ``id:``, one ``data:`` line
    of JSON, a blank line)."""
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id else "")
    return head + "data: " + json.dumps(data, separators=(",", ":")) + "\n\n"


def _job_snapshot(bind, job_id: str) -> dict[str, Any] | None:
    """The job's progress, read in a short session of its own (None: no such job)."""
    with Session(bind=bind) as s:
        job = s.get(Job, job_id)
        if job is None:
            return None
        snap = notify.job_summary(job)
        snap.pop("url", None)
        return snap


def _movie_snapshot(bind, movie_id: str) -> dict[str, Any] | None:
    with Session(bind=bind) as s:
        m = s.get(Movie, movie_id)
        if m is None:
            return None
        total = m.frames_total or 0
        return {"id": m.id, "state": m.state.value, "total": total, "done": m.frames_done or 0,
                "progress": min(1.0, (m.frames_done or 0) / total) if total else (1.0 if m.state in MOVIE_FINAL
                                                                                 else 0.0),
                "error": m.error}


def _fingerprint(snap: dict[str, Any]) -> str:
    """The event id of a snapshot: its state and counts (changes exactly when they do)."""
    keys = ("state", "total", "done", "failed", "skipped", "cancelled")
    return "-".join(str(snap.get(k, 0)) for k in keys)


async def progress_stream(snapshot: Callable[[], dict[str, Any] | None], final: Callable[[dict[str, Any]], bool],
                          *, last_event_id: str | None = None, poll_s: float = POLL_S,
                          heartbeat_s: float = HEARTBEAT_S, what: str = "job") -> AsyncIterator[str]:
    """The event stream of one job (or movie): see the module docstring. ``snapshot`` is
    run in a thread per poll; ``final`` says whether a snapshot ends the stream."""
    yield f"retry: {RETRY_MS}\n: following {what} progress\n\n"  # the response starts now
    last = last_event_id
    quiet_since = time.monotonic()
    while True:
        try:
            snap = await asyncio.wait_for(asyncio.to_thread(snapshot), POLL_TIMEOUT_S)
        except (TimeoutError, SQLAlchemyError) as exc:
            reason = f"no answer within {POLL_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError) else "unavailable"
            log.warning("%s progress stream: database %s", what, reason)
            yield sse_event("error", {"detail": f"the database is {reason}; reconnecting"})
            return
        if snap is None:
            yield sse_event("error", {"detail": f"the {what} no longer exists"})
            return
        eid = _fingerprint(snap)
        if eid != last:
            yield sse_event("progress", snap, eid)
            last, quiet_since = eid, time.monotonic()
        if final(snap):
            yield sse_event("end", snap, eid)
            return
        if time.monotonic() - quiet_since >= heartbeat_s:
            yield ": heartbeat\n\n"
            quiet_since = time.monotonic()
        await asyncio.sleep(poll_s)


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
_SSE_RESPONSES = {200: {"content": {"text/event-stream": {}}, "description": "progress and end events"},
                  404: {"description": "No such job"}}


def _released(session: Session):
    """The session's bind, after ending its read transaction (its pooled connection goes
    back before the stream starts: each poll uses a session of its own)."""
    bind = session.get_bind()
    session.commit()
    return bind


@router.get("/jobs/{job_id}/events", response_class=StreamingResponse, responses=_SSE_RESPONSES,
            summary="Follow a job's progress (server-sent events)")
def job_events(job_id: str, session: SessionDep, principal: OptionalPrincipal,
               last_event_id: Annotated[str | None, Header(max_length=200)] = None) -> StreamingResponse:
    """``text/event-stream``: ``progress`` events (id, state, total, done, failed, skipped,
    cancelled, progress fraction, error) each time the job changes, ``end`` once it has
    ended, then the stream closes; a ``: heartbeat`` comment every 15 s. ``Last-Event-ID``
    is honoured (nothing seen is sent again); ``retry: 3000``. The job page uses it (with
    ``EventSource``) instead of polling ``GET /jobs/{id}``."""
    visibility.get_visible(session, Job, job_id, principal)  # another user's private job: 404
    bind = _released(session)
    stream = progress_stream(lambda: _job_snapshot(bind, job_id), lambda s: s["state"] in {j.value for j in JOB_FINAL},
                             last_event_id=last_event_id, what="job")
    return StreamingResponse(stream, media_type="text/event-stream", headers=_SSE_HEADERS)


@router.get("/movies/{movie_id}/events", response_class=StreamingResponse, responses=_SSE_RESPONSES,
            summary="Follow a movie's rendering (server-sent events)")
def movie_events(movie_id: str, session: SessionDep, principal: OptionalPrincipal,
                 last_event_id: Annotated[str | None, Header(max_length=200)] = None) -> StreamingResponse:
    """As ``GET /jobs/{id}/events`` for a movie: ``done`` and ``total`` count frames rendered."""
    visibility.get_visible(session, Movie, movie_id, principal)  # another user's movie: 404
    bind = _released(session)
    stream = progress_stream(lambda: _movie_snapshot(bind, movie_id),
                             lambda s: s["state"] in {m.value for m in MOVIE_FINAL}, last_event_id=last_event_id,
                             what="movie")
    return StreamingResponse(stream, media_type="text/event-stream", headers=_SSE_HEADERS)


# -- webhooks and their delivery logs -----------------------------------------------------------


def _signed_in(principal: Principal | None, what: str) -> Principal:
    if principal is None:
        raise HTTPException(401, detail=f"reading {what} needs an API token (Authorization: Bearer <token>): "
                                        "they are their owner's", headers={"WWW-Authenticate": "Bearer"})
    return principal


def _deliveries_page(session: Session, webhook_ids: list[int], page) -> dict[str, Any]:
    rows, total = notify.deliveries_of(session, webhook_ids=webhook_ids, limit=page.limit, offset=page.offset)
    return {"items": [notify.describe_delivery(r) for r in rows], "total": total, "limit": page.limit,
            "offset": page.offset}


@router.get("/webhooks", summary="Your webhooks", responses=_AUTH_ERRORS)
def read_webhooks(session: SessionDep, principal: OptionalPrincipal) -> dict[str, Any]:
    """The webhooks of the token's user (all, for an admin), newest first; never their secrets."""
    p = _signed_in(principal, "webhooks")
    q = visibility.visible(select(Webhook).order_by(Webhook.id.desc()), Webhook, p)
    rows = list(session.scalars(q.limit(500)))
    return {"items": [notify.describe_webhook(h) for h in rows], "total": len(rows)}


def _owned(session: Session, model: type, row_id: int, p: Principal, what: str) -> Any:
    """Row ``row_id`` of ``model`` (a webhook, a saved search) if ``p`` may see it (its owner,
    or an admin): 404 otherwise, also for another user's (never 403: its id is not confirmed)."""
    return visibility.get_visible(session, model, row_id, p)


def _own_webhook(session: Session, webhook_id: int, p: Principal) -> Webhook:
    return _owned(session, Webhook, webhook_id, p, "webhook")


@router.get("/webhooks/{webhook_id}/deliveries", summary="A webhook's delivery log", responses=_AUTH_ERRORS)
def read_webhook_deliveries(webhook_id: IdPath, session: SessionDep, principal: OptionalPrincipal,
                            page: PaginationDep) -> dict[str, Any]:
    """Its deliveries, newest first: state (pending, delivering, delivered, failed), attempts
    and, per attempt, the HTTP status, the error, the duration [ms] and the backoff before the
    next; the payload sent. Never the secret or the signature."""
    hook = _own_webhook(session, webhook_id, _signed_in(principal, "a delivery log"))
    return _deliveries_page(session, [hook.id], page)


@router.get("/jobs/{job_id}/deliveries", summary="A job's webhook delivery log", responses=_AUTH_ERRORS)
def read_job_deliveries(job_id: str, session: SessionDep, principal: OptionalPrincipal,
                        page: PaginationDep) -> dict[str, Any]:
    """The deliveries of the job's webhook(s) (``webhook_url`` of its request), as
    ``GET /webhooks/{id}/deliveries``; only the job's owner (or an admin) may read them."""
    p = _signed_in(principal, "a delivery log")
    job = visibility.get_visible(session, Job, job_id, p)  # another user's private job: 404
    if not p.may_act_on(job.owner):  # a public job: its deliveries are still its owner's
        raise HTTPException(404, detail=f"no delivery log of job {job_id[:40]!r} for user {p.user!r}")
    ids = list(session.scalars(visibility.visible(select(Webhook.id).where(Webhook.job_id == job.id), Webhook, p)))
    return _deliveries_page(session, ids, page)


# -- saved searches ----------------------------------------------------------------------------


def _search_or_error(session: Session, search_id: int, p: Principal) -> SavedSearch:
    return _owned(session, SavedSearch, search_id, p, "saved search")


def _hook_of(session: Session, search_id: int) -> Webhook | None:
    return session.scalar(select(Webhook).where(Webhook.saved_search_id == search_id).order_by(Webhook.id))


@router.post("/saved-searches", status_code=status.HTTP_201_CREATED, summary="Save an event or product search",
             responses={**_AUTH_ERRORS, 422: {"description": "A bad name, kind, query parameter or webhook URL "
                                                             "(the field named)"}})
def create_saved_search(body: SavedSearchCreate, session: SessionDep, principal: SubmitLimited,
                        response: Response) -> dict[str, Any]:
    """Save a query of ``GET /api/v1/events`` or ``GET /api/v1/products`` (checked with the
    same parsers: a value those routes refuse is a 422 naming ``query.<parameter>``). Its
    owner is told of matches that arrive from now on (``GET /saved-searches/{id}/notifications``;
    and the webhook, if one is given, whose secret is in this answer only). Needs
    ``jobs:submit``. Examples: ``{"kind": "products", "query": {"channel": "SDI", "start":
    "2024-05-10T00:00Z", "end": "2024-05-11T00:00Z"}}``; ``{"kind": "events", "query":
    {"type": "CE", "min_angular_width": 60}}`` (a new CME wider than 60 deg)."""
    from fastapi.exceptions import RequestValidationError

    try:
        row, hook = searches.create_saved_search(session, principal.user, body.name, body.kind, body.query,
                                                 webhook_url=body.webhook_url)
    except searches.SavedSearchError as exc:
        raise RequestValidationError([{"type": "value_error", "loc": ("body", *exc.param.split(".")),
                                       "msg": exc.message,
                                       "input": None if exc.value is None else str(exc.value)[:200]}]) from None
    session.commit()
    response.headers["Location"] = f"/api/v1/saved-searches/{row.id}"
    return searches.describe_saved_search(row, hook, with_secret=True)


@router.get("/saved-searches", summary="Your saved searches", responses=_AUTH_ERRORS)
def read_saved_searches(session: SessionDep, principal: OptionalPrincipal) -> dict[str, Any]:
    """The token user's saved searches, oldest first, with their match counts."""
    p = _signed_in(principal, "saved searches")
    rows = searches.list_saved_searches(session, p.user)
    return {"items": [searches.describe_saved_search(r, _hook_of(session, r.id)) for r in rows], "total": len(rows)}


@router.get("/saved-searches/{search_id}", summary="One saved search", responses=_AUTH_ERRORS)
def read_saved_search(search_id: IdPath, session: SessionDep, principal: OptionalPrincipal) -> dict[str, Any]:
    row = _search_or_error(session, search_id, _signed_in(principal, "saved searches"))
    return searches.describe_saved_search(row, _hook_of(session, row.id))


@router.patch("/saved-searches/{search_id}", summary="Rename a saved search or change its query",
              responses={**_AUTH_ERRORS, 422: {"description": "A bad name or query parameter (the field named)"}})
def update_saved_search(search_id: IdPath, body: SavedSearchUpdate, session: SessionDep,
                        principal: SubmitLimited) -> dict[str, Any]:
    """Change one's own saved search: ``name``, and/or ``query`` (checked as on creation; a
    new query is told of matches from now on, the notifications recorded so far stay). Needs
    ``jobs:submit``. Another user's search is 404."""
    from fastapi.exceptions import RequestValidationError

    row = _search_or_error(session, search_id, principal)
    if body.name is None and body.query is None:
        raise RequestValidationError([{"type": "value_error", "loc": ("body",), "msg": "give name, query or both",
                                       "input": None}])
    try:
        searches.update_saved_search(session, row, name=body.name, query=body.query)
    except searches.SavedSearchError as exc:
        raise RequestValidationError([{"type": "value_error", "loc": ("body", *exc.param.split(".")),
                                       "msg": exc.message,
                                       "input": None if exc.value is None else str(exc.value)[:200]}]) from None
    session.commit()
    return searches.describe_saved_search(row, _hook_of(session, row.id))


@router.delete("/saved-searches/{search_id}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a saved search",
               responses=_AUTH_ERRORS)
def delete_saved_search(search_id: IdPath, session: SessionDep, principal: SubmitLimited) -> Response:
    """Delete one's own saved search, its notifications, webhook and delivery log. Needs ``jobs:submit``."""
    row = _search_or_error(session, search_id, principal)
    session.delete(row)
    session.commit()
    return Response(status_code=204)


@router.get("/saved-searches/{search_id}/notifications", summary="New matches of a saved search",
            responses=_AUTH_ERRORS)
def read_notifications(search_id: IdPath, session: SessionDep, principal: OptionalPrincipal,
                       page: PaginationDep) -> dict[str, Any]:
    """The matches found since the search was saved, newest first: the item's kind
    (``event``/``product``), id and summary (an event's type, times, position angle, width,
    speed; a product's channel, DATE-OBS, version)."""
    row = _search_or_error(session, search_id, _signed_in(principal, "saved searches"))
    items, total = searches.notifications_of(session, row.id, limit=page.limit, offset=page.offset)
    return {"items": [searches.describe_notification(n) for n in items], "total": total, "limit": page.limit,
            "offset": page.offset}

