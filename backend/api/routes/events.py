"""``/events``: solar events (detected or from catalogues), their light curves and timeline figures."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import AfterValidator

from backend.api.deps import SessionDep, SettingsDep
from backend.api.routes.params import (
    ChannelQuery,
    EventTypeQuery,
    IdPath,
    SAFE_KEY_PATTERN,
    PaginationDep,
    TimeRangeDep,
    canonical_channel,
)
from backend.api.schemas import EventAssociationPublic, EventDetail, EventPublic, EventsPublic, LightCurvePublic
from backend.figures import events_timeline_figure, lightcurve_figure
from backend.models import Event
from backend.services import events as events_service
from backend.services import frames as frames_service
from backend.services import products as products_service

router = APIRouter(prefix="/events", tags=["events"])

SourceQuery = Annotated[
    str | None,
    Query(max_length=32, pattern=SAFE_KEY_PATTERN,
          description="detected, or a catalogue: goes_xrs, cdaw, hek, donki, lst_wst, noaa_srs"),
]


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
    Query(ge=0, le=1440, description="Minutes added before the start and after the end of the event"),
]

#: Most events a timeline figure draws; the title says when more matched.
TIMELINE_MAX = 2000


def _event_or_404(session, event_id: int) -> Event:
    row = events_service.get_event(session, event_id)
    if row is None:
        raise HTTPException(404, detail=f"no event with id {event_id}")
    return row


def _association(item: tuple[Event, str]) -> EventAssociationPublic:
    """One ``(event, kind)`` entry of ``associated_events``."""
    event, kind = item
    return EventAssociationPublic(kind=str(kind), event=EventPublic.model_validate(event))


def event_detail(session, row: Event) -> EventDetail:
    """The full description of an event: associations and linked frame/product ids."""
    detail = EventDetail.model_validate(row)
    detail.associated = [_association(a) for a in events_service.associated_events(session, row.id)]
    detail.frame_ids = frames_service.frame_ids_for_event(session, row.id)
    detail.product_ids = products_service.product_ids_for_event(session, row.id)
    return detail


@router.get("", response_model=EventsPublic, summary="List events")
def read_events(
    session: SessionDep,
    page: PaginationDep,
    span: TimeRangeDep,
    event_type: EventTypeQuery = None,
    source: SourceQuery = None,
    channel: ChannelQuery = None,
) -> EventsPublic:
    """Events of a HEK type and source whose [start, end] overlaps [start, end] of the query."""
    rows, total = events_service.list_events(
        session, event_type=event_type, start=span.start, end=span.end, source=source, channel=channel,
        limit=page.limit, offset=page.offset,
    )
    return EventsPublic(items=[EventPublic.model_validate(r) for r in rows], total=total,
                        limit=page.limit, offset=page.offset)


@router.get(
    "/timeline/figure",
    summary="Timeline figure (Plotly JSON) of the events matching the filters",
    responses={200: {"content": {"application/json": {}}, "description": "A Plotly figure: {data, layout}"}},
)
def read_events_timeline_figure(
    session: SessionDep,
    span: TimeRangeDep,
    event_type: EventTypeQuery = None,
    source: SourceQuery = None,
    channel: ChannelQuery = None,
    limit: Annotated[int, Query(ge=1, le=TIMELINE_MAX, description=f"Most events drawn (1..{TIMELINE_MAX})")] = 500,
) -> Response:
    """The same filters as ``GET /events``; at most ``limit`` events are drawn (the earliest),
    and the figure title says so when more matched."""
    rows, total = events_service.list_events(
        session, event_type=event_type, start=span.start, end=span.end, source=source, channel=channel,
        limit=limit, offset=0,
    )
    return Response(events_timeline_figure(rows, total=total).to_json(), media_type="application/json")


@router.get("/{event_id}", response_model=EventDetail, summary="One event with its associations")
def read_event(event_id: IdPath, session: SessionDep) -> EventDetail:
    """One event: HEK type, times, location, CME kinematics or GOES class, associated events,
    and the ids of the frames and products it is linked to."""
    return event_detail(session, _event_or_404(session, event_id))


def _lightcurve(session, settings, event_id: int, channel: str, margin_min: float) -> tuple[Event, LightCurvePublic]:
    row = _event_or_404(session, event_id)
    lc = products_service.event_lightcurve(
        session, row, channel=channel, margin=dt.timedelta(minutes=margin_min), product_root=settings.products
    )
    return row, LightCurvePublic(
        event_id=row.id, channel=lc.channel, unit=lc.unit, window_start=lc.start, window_end=lc.end,
        times=lc.times, values=lc.values, product_ids=lc.product_ids, skipped=lc.skipped,
    )


@router.get("/{event_id}/lightcurve", response_model=LightCurvePublic, summary="Light curve around an event")
def read_event_lightcurve(
    event_id: IdPath,
    session: SessionDep,
    settings: SettingsDep,
    channel: LightCurveChannel = "SDI",
    margin_min: MarginQuery = 30.0,
) -> LightCurvePublic:
    """Disk-integrated mean of the written L2 products of ``channel`` (DQ-masked pixels
    skipped; SCI: mean over the coronal field) from the event's start - margin to its
    end + margin, one point per frame (its newest product version)."""
    return _lightcurve(session, settings, event_id, channel, margin_min)[1]


@router.get(
    "/{event_id}/lightcurve/figure",
    summary="Light-curve figure (Plotly JSON) around an event",
    responses={200: {"content": {"application/json": {}}, "description": "A Plotly figure: {data, layout}"}},
)
def read_event_lightcurve_figure(
    event_id: IdPath,
    session: SessionDep,
    settings: SettingsDep,
    channel: LightCurveChannel = "SDI",
    margin_min: MarginQuery = 30.0,
) -> Response:
    """The light curve of ``GET /events/{id}/lightcurve`` with the event's start, peak and end marked."""
    row, lc = _lightcurve(session, settings, event_id, channel, margin_min)
    fig = lightcurve_figure(lc.times, lc.values, lc.unit, row, channel=lc.channel)
    return Response(fig.to_json(), media_type="application/json")
