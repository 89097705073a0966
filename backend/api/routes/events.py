"""``/events``: solar events (detected or from catalogues), their light curves and timeline figures."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

import pydantic_core
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from backend.api.deps import OptionalPrincipal, SessionDep, SettingsDep
from backend.api.params import (
    EventSearchDep,
    MAX_ID,
    IdPath,
    PaginationDep,
    canonical_channel,
)
from backend.api.presenters import event_detail, visible_set_or_404
from backend.api.schemas import (
    EventDetail,
    EventsPublic,
    LightCurvePublic,
)
from backend.db import autocommit_reads
from backend.render.figures import events_timeline_figure, lightcurve_figure
from backend.models import Event
from backend.services import event_formats
from backend.services import event_search as event_search_service
from backend.services import events as events_service
from backend.services import products as products_service
from backend.services.event_search import DEFAULT_SORT, LIGHT_COLUMNS
from pipelines.utc import as_utc

router = APIRouter(prefix="/events", tags=["events"])

def _lightcurve_channel(value: str) -> str:
    """The channel of a light curve: SDI when empty, else a canonical LST channel code."""
    return canonical_channel(value) or "SDI"


LightCurveChannel = Annotated[
    str,
    Query(description="Channel of the L2 products averaged (default SDI)"),
    AfterValidator(_lightcurve_channel),
]
MarginQuery = Annotated[
    float,
    Query(ge=0, le=1440, allow_inf_nan=False, description="Minutes added before the start and after the end of the event"),
]

#: Most events a timeline figure draws; the title says when more matched.
TIMELINE_MAX = 2000


def _event_or_404(session, event_id: int, principal=None) -> Event:
    """The event if the caller may see it (:mod:`backend.services.event_visibility`); else
    404, also for a private event of another user (its id is not revealed)."""
    row = events_service.get_event(session, event_id, principal)
    if row is None:
        raise HTTPException(404, detail=f"no event with id {event_id}")
    return row


FormatQuery = Annotated[
    Literal["json", "csv", "votable", "hek"],
    Query(description="json (default), csv (header row), votable (IVOA VOTable) or hek "
                      "(HEK API layout: {result, overmax})"),
]
SortQuery = Annotated[
    str,
    Query(max_length=20, pattern=r"^[-+]?[a-z_]+$",
          description="start_time, peak_time, end_time, goes_flux, speed_km_s or id; - prefix: descending"),
]
CursorQuery = Annotated[
    str | None,
    Query(max_length=400, pattern=r"^[A-Za-z0-9_\-]*$", description="next_cursor of the previous page"),
]


def _page_headers(page) -> dict[str, str]:
    h = {"X-Total-Count": str(page.total), "X-Total-Is-Estimate": str(page.total_is_estimate).lower(),
         "X-Truncated": str(page.truncated).lower()}
    if page.next_cursor:
        h["X-Next-Cursor"] = page.next_cursor
    return h


@router.get(
    "",
    response_model=EventsPublic,
    summary="Search events",
    responses={200: {"content": {"text/csv": {}, "application/x-votable+xml": {}},
                     "description": "JSON page (default), CSV, VOTable or HEK JSON (format=...)"}},
)
def read_events(
    request: Request,
    session: SessionDep,
    page: PaginationDep,
    filters: EventSearchDep,
    sort: SortQuery = DEFAULT_SORT,
    cursor: CursorQuery = None,
    format: FormatQuery = "json",  # noqa: A002 - the parameter's public name
):
    """Events matching every filter given: HEK type(s), time overlap with [start, end],
    source(s), channel, helioprojective bounding box [arcsec], position-angle range [deg]
    (wrapping through 0 when pa_min > pa_max), minimum GOES class, minimum peak value,
    detector (frm_name, frm_version), NOAA region (noaa_ar), an associated event's type
    (associated_type=CE: flares with a CME), calibration set or file of the L2 products the
    event was detected from.

    The JSON adds ``coverage``: per source asked (all when no source filter), whether
    [start, end] is covered (``status`` covered, partial, selection, none or unknown, and a
    ``message`` such as "CDAW: no coverage after 2013-12-31"): a window no catalogue covers
    reads differently from one without events.

    Sorted by ``sort`` (default newest first), ``limit`` per page. Page on with
    ``cursor=<next_cursor>`` (keyset: same cost at any depth; ``offset`` still works for
    numbered pages, not together with a cursor). ``total`` counts every match, exactly up to
    10,000 and as a flagged estimate above (``total_is_estimate``); ``truncated`` says that
    more events follow this page. CSV and VOTable carry the same information in
    ``X-Total-Count``, ``X-Total-Is-Estimate``, ``X-Truncated`` and ``X-Next-Cursor``
    headers (VOTable also as INFO elements); HEK JSON sets ``overmax`` when truncated.
    """
    refuse_hek_parameters(request)
    result = event_search_service.search_events(
        autocommit_reads(session), filters, sort=sort, limit=page.limit, cursor=cursor, offset=page.offset,
        light=format in ("json", "csv", "votable"),
    )
    if format == "csv":
        return Response(event_formats.events_csv(result.items), media_type="text/csv; charset=utf-8",
                        headers={**_page_headers(result), "Content-Disposition": 'inline; filename="events.csv"'})
    if format == "votable":
        info = {"total": result.total, "total_is_estimate": result.total_is_estimate,
                "truncated": result.truncated, "next_cursor": result.next_cursor, "sort": result.sort}
        return Response(event_formats.events_votable(result.items, info), media_type="application/x-votable+xml",
                        headers=_page_headers(result))
    if format == "hek":
        return JSONResponse(event_formats.events_hek(result.items, overmax=result.truncated),
                            headers=_page_headers(result))
    from backend.services.coverage import window_coverage

    cover = window_coverage(session, filters.sources, filters.start, filters.end)
    return Response(page_json(result, coverage=coverage_json(cover)), media_type="application/json")


def refuse_hek_parameters(request: Request) -> None:
    """400 naming HEK's own query parameters (``event_type``, ``event_starttime``, ``cosec``,
    ``param0``...) given to ``GET /events``, which does not read them (they were once dropped
    silently): HEK queries go to ``GET /api/v1/hek``."""
    from backend.services.hek_search import hek_parameter_names

    names = hek_parameter_names(list(dict.fromkeys(request.query_params.keys())))
    if names:
        raise HTTPException(400, detail=(
            f"{', '.join(names)}: HEK query parameter(s), not read by GET /api/v1/events (its filters are "
            "type, start, end, min_goes_class, hpc_x_min...); for HEK's parameters use the HEK-compatible "
            "search GET /api/v1/hek"))


def coverage_json(cover) -> dict:
    """``{source: {status, message, spans}}`` of :func:`backend.services.coverage.window_coverage`."""
    return {s: {"status": c.status, "message": c.message,
                "spans": [{"start": as_utc(x.start), "end": as_utc(x.end), "complete": x.complete} for x in c.spans]}
            for s, c in cover.items()}


def page_json(result, coverage: dict | None = None) -> bytes:
    """The :class:`EventsPublic` JSON of a light search page, without re-validating each row.

    The rows come from the database with the types of :class:`~backend.api.schemas.EventPublic` (whose fields are
    exactly :data:`LIGHT_COLUMNS`, a test checks it); pydantic-core serialises them as the model
    would (times with a zero UTC offset as ``...Z``). Only the three time columns are looked at:
    a time that is naive (SQLite) or has another offset is converted to UTC as
    :data:`~backend.api.schemas.UTCDateTime` does. A third of the cost of validating 100 models.
    A stored NaN or infinity (PostgreSQL floats hold them; JSON has no such number) is ``null``.
    """
    items = []
    for row in result.items:
        d = dict(zip(LIGHT_COLUMNS, row))
        for k in _TIME_COLUMNS:
            t = d[k]
            if t is not None and t.utcoffset() != _ZERO:
                d[k] = as_utc(t)
        items.append(d)
    return pydantic_core.to_json({
        "items": items, "total": result.total, "limit": result.limit, "offset": result.offset,
        "total_is_estimate": result.total_is_estimate, "sort": result.sort, "next_cursor": result.next_cursor,
        "truncated": result.truncated, "coverage": coverage,
    }, inf_nan_mode="null")


_TIME_COLUMNS = ("start_time", "peak_time", "end_time")
_ZERO = dt.timedelta(0)


@router.get(
    "/timeline/figure",
    summary="Timeline figure (Plotly JSON) of the events matching the filters",
    responses={200: {"content": {"application/json": {}}, "description": "A Plotly figure: {data, layout}"}},
)
def read_events_timeline_figure(
    session: SessionDep,
    filters: EventSearchDep,
    limit: Annotated[int, Query(ge=1, le=TIMELINE_MAX, description=f"Most events drawn (1..{TIMELINE_MAX})")] = 500,
) -> Response:
    """The same filters as ``GET /events``; at most ``limit`` events are drawn: the newest
    (latest start time first, as ``sort=-start_time``), and the figure title says so
    ("newest N of M events shown") when more matched."""
    result = event_search_service.search_events(session, filters, sort="-start_time", limit=limit, light=True)
    return Response(events_timeline_figure(result.items, total=result.total).to_json(), media_type="application/json")


@router.get("/{event_id}", response_model=EventDetail, summary="One event with its associations")
def read_event(event_id: IdPath, session: SessionDep, principal: OptionalPrincipal) -> Response:
    """One event: HEK type, times, location, CME kinematics or GOES class, associated events
    (both directions are stored, so the list is complete from either end), and the ids of
    the frames and products it is linked to. ``owner`` and ``calibration_set_id`` say whose
    it is: a private event (found by a user's job on a set of their own) is shown to its
    owner and admins only, 404 to anyone else."""
    autocommit_reads(session)
    detail = event_detail(session, _event_or_404(session, event_id, principal), principal)
    return Response(detail.model_dump_json(), media_type="application/json")


@router.get(
    "/{event_id}/voevent",
    summary="One event as a VOEvent 2.0 document",
    response_class=Response,
    responses={200: {"content": {"application/xml": {}}, "description": "VOEvent 2.0 XML"}},
)
def read_event_voevent(event_id: IdPath, session: SessionDep, principal: OptionalPrincipal) -> Response:
    """The event as VOEvent 2.0 XML: Who, What (HEK parameters), WhereWhen (UTC,
    helioprojective UTC-HPC-TOPO), How (detector or catalogue), Why (HEK concept) and
    Citations (the associated events' IVORNs)."""
    row = _event_or_404(session, event_id, principal)
    xml = event_formats.event_voevent(row, events_service.associated_events(session, row.id, principal))
    return Response(xml, media_type="application/xml",
                    headers={"Content-Disposition": f'inline; filename="event-{row.id}.voevent.xml"'})


RegionQuery = Annotated[
    Literal["auto", "disk", "roi"],
    Query(description="auto (default: a box about the event's position for SDI/WST, else disk), "
                      "disk (disk-integrated; SCI: coronal field) or roi"),
]


ContextQuery = Annotated[
    int, Query(ge=0, le=50, description="Frames of the channel shown at least before the start and after the end")
]
CalibrationSetQuery = Annotated[int | None, Query(ge=1, le=MAX_ID, description=(
    "Calibration set id of the products used (GET /calibration-sets); default: each frame's public set"))]


class LightCurveQuery:
    """The query parameters of the two light-curve routes, read once (a FastAPI dependency).

    Attributes
    ----------
    channel : str
        Canonical LST channel code of the L2 products averaged (``SDI`` when empty).
    margin_min : float
        Minutes added before the event's start and after its end (0..1440).
    region : str
        ``auto``, ``disk`` or ``roi`` (see :func:`backend.services.products.event_lightcurve`).
    context_frames : int
        Frames of the channel shown at least before the start and after the end (0..50).
    calibration_set : int or None
        A calibration set id: its products only (404 if the caller may not see it); None:
        the public set of each frame.

    Bad values are 422 with the parameter named, as for any query parameter.
    """

    def __init__(
        self,
        channel: LightCurveChannel = "SDI",
        margin_min: MarginQuery = 30.0,
        region: RegionQuery = "auto",
        context_frames: ContextQuery = 3,
        calibration_set: CalibrationSetQuery = None,
    ) -> None:
        self.channel = channel
        self.margin_min = margin_min
        self.region = region
        self.context_frames = context_frames
        self.calibration_set = calibration_set


LightCurveDep = Annotated[LightCurveQuery, Depends()]


def sets_used(session, set_ids: list[int]) -> list[dict]:
    """``[{id, public, owner}]`` of calibration sets ``set_ids`` (what a light curve read)."""
    from backend.models import CalibrationSet

    rows = {r.id: r for r in session.query(CalibrationSet).filter(CalibrationSet.id.in_(set_ids))} if set_ids else {}
    return [{"id": i, "public": bool(rows[i].public), "owner": rows[i].owner} for i in set_ids if i in rows]


def _lightcurve(session, settings, event_id: int, q: LightCurveQuery,
                principal=None) -> tuple[Event, LightCurvePublic]:
    """The event (404 if none, or not visible) and its light curve as asked by ``q`` (422 for a
    ValueError of the service; 404 for a calibration set the caller may not see)."""
    row = _event_or_404(session, event_id, principal)
    set_id = visible_set_or_404(session, q.calibration_set, principal)
    try:
        lc = products_service.event_lightcurve(
            session, row, channel=q.channel, margin=dt.timedelta(minutes=q.margin_min),
            product_root=settings.products, region=q.region, context_frames=q.context_frames,
            calibration_set=set_id,
        )
    except ValueError as exc:
        raise HTTPException(422, detail=str(exc)) from None
    return row, LightCurvePublic(
        event_id=row.id, channel=lc.channel, unit=lc.unit, window_start=lc.start, window_end=lc.end,
        region=lc.region, roi=lc.roi,
        times=lc.times, values=lc.values, uncertainties=lc.sigmas, product_ids=lc.product_ids, skipped=lc.skipped,
        calibration_sets=sets_used(session, lc.calibration_sets),
    )


@router.get("/{event_id}/lightcurve", response_model=LightCurvePublic, summary="Light curve around an event")
def read_event_lightcurve(
    event_id: IdPath,
    session: SessionDep,
    settings: SettingsDep,
    q: LightCurveDep,
    principal: OptionalPrincipal,
) -> LightCurvePublic:
    """Mean of the written L2 products of ``channel`` (DQ-masked pixels skipped) over a
    box about the event (``roi``), the disk or, for SCI, the coronal field, from the
    event's start - margin to its end + margin, widened to ``context_frames`` frames on each
    side but by at most 6 hours (``MAX_CONTEXT``) on each side, one point per frame (its
    public product: the product of its public calibration set, or of ``calibration_set`` when
    asked; ``calibration_sets`` names the sets read). A frame whose region is all masked or
    NaN is a ``null`` value (a gap in the figure)."""
    return _lightcurve(session, settings, event_id, q, principal)[1]


@router.get(
    "/{event_id}/lightcurve/figure",
    summary="Light-curve figure (Plotly JSON) around an event",
    responses={200: {"content": {"application/json": {}}, "description": "A Plotly figure: {data, layout}"}},
)
def read_event_lightcurve_figure(
    event_id: IdPath,
    session: SessionDep,
    settings: SettingsDep,
    q: LightCurveDep,
    principal: OptionalPrincipal,
) -> Response:
    """The light curve of ``GET /events/{id}/lightcurve`` with the event's start, peak and end marked."""
    row, lc = _lightcurve(session, settings, event_id, q, principal)
    fig = lightcurve_figure(lc.times, lc.values, lc.unit, row, channel=lc.channel, region=lc.region, roi=lc.roi)
    return Response(fig.to_json(), media_type="application/json")
