"""``/events/histogram``: the landing timeline of all matching events (counts per type and bin).

Included before the ``/events`` router (``/events/{event_id}`` would take the path otherwise).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from backend.api.deps import SessionDep
from backend.api.params import EventSearchDep
from backend.api.schemas import EventHistogramPublic
from backend.db import autocommit_reads
from backend.render.figures import events_timeline_figure
from backend.render.figures_density import events_density_figure
from backend.services import event_search as event_search_service
from backend.services.event_histogram import DEFAULT_BINS, MAX_BINS, event_histogram

router = APIRouter(prefix="/events", tags=["events"])

#: A window with this many matching events or fewer is drawn event by event (markers, a click
#: opens the event); above it, as counts per bin. 500 markers and bars stay quick to draw and
#: to hover in plotly.js; a page of the list is 50.
DRILL_MAX = 500

BinsQuery = Annotated[int, Query(ge=1, le=MAX_BINS, description=f"Most bins (1..{MAX_BINS}); the width follows "
                                                              "the window (1 min to years)")]


@router.get("/histogram", response_model=EventHistogramPublic, summary="Counts of all matching events per type and time bin")
def read_events_histogram(session: SessionDep, filters: EventSearchDep, bins: BinsQuery = DEFAULT_BINS) -> EventHistogramPublic:
    """The same filters as ``GET /events``; every matching event is counted once, in the bin of
    its start time (an event under way at ``start`` in the first bin), so the counts add up to
    the search's exact total. The bin width is the smallest of 1, 5, 15, 30 min, 1, 3, 6, 12 h,
    1, 2, 7, 14, 30, 91, 365 days that covers [start, end] in at most ``bins`` bins; without
    start/end the window is from the first to the last matching start time."""
    h = event_histogram(autocommit_reads(session), filters, bins=bins)
    return EventHistogramPublic(start=h.start, end=h.end, bin_s=h.bin_s, edges=h.edges, counts=h.counts, total=h.total)


@router.get(
    "/histogram/figure",
    summary="Landing timeline (Plotly JSON): counts per type and bin, or each event when few",
    responses={200: {"content": {"application/json": {}}, "description": "A Plotly figure: {data, layout}"}},
)
def read_events_histogram_figure(session: SessionDep, filters: EventSearchDep,
                                 bins: BinsQuery = DEFAULT_BINS) -> Response:
    """Stacked bars of ``GET /events/histogram`` (hover: the counts; a click on a bar zooms into
    its bin), or, when the window holds 500 (``DRILL_MAX``) matching events or fewer, every one of them
    (bars from start to end, a marker at the peak; a click opens the event). ``layout.meta``
    says which (``mode``: ``bins`` or ``events``) and the total."""
    session = autocommit_reads(session)
    h = event_histogram(session, filters, bins=bins)
    if h.total <= DRILL_MAX:
        page = event_search_service.search_events(session, filters, sort="-start_time", limit=DRILL_MAX,
                                                  light=True, with_total=False)
        fig = events_timeline_figure(page.items, total=h.total)
        fig.update_layout(meta={"mode": "events", "total": h.total, "bin_s": h.bin_s,
                                "start": h.start.isoformat() if h.start else None,
                                "end": h.end.isoformat() if h.end else None})
        if h.start is not None and h.end is not None and h.end > h.start:
            fig.update_xaxes(range=[h.start, h.end])
    else:
        fig = events_density_figure(h, drill_max=DRILL_MAX)
    return Response(fig.to_json(), media_type="application/json")
