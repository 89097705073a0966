"""The event pages: ``/`` (the landing page) and ``/events`` (the events list with its filters,
the coverage of the window and the timeline), ``/events/{event_id}`` (one event).

Pages read through the same service functions as the API; figures are not drawn here: a
page holds a ``<div data-figure-url=...>`` that ``frontend/static/app.js`` fills with the
Plotly JSON from the API. Bad filter values on a page are shown as a message on the page
(the filter is then not applied), never as an error status; they are read by the API's parser,
:func:`backend.services.event_filters.parse_event_filters`.

The events list pages with the search API's keyset cursors (``after``: the events older
than a row, ``before``: the events newer than a row), never with an offset: every page
costs the same index range scan whatever its depth, and its total is exact up to
:data:`backend.services.event_search.EXACT_COUNT_LIMIT` and flagged as an estimate above.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.pages.events_search import search_form_extras
from backend.api.pages.templating import form_num, form_time, templates
from backend.api.params import IdPath
from backend.api.presenters import event_detail
from backend.models import Event
from backend.services import event_curves as event_curves_service
from backend.services import event_search
from backend.services import events as events_service
from backend.services import products as products_service
from backend.services.demo_progress import read_progress
from backend.services.event_filters import NUMERIC_FILTERS, filter_time, for_viewer, parse_event_filters
from backend.services.event_search import EventFilters, SearchError, encode_cursor, search_events
from backend.services.observing_windows import observing_windows
from backend.settings import get_settings
from pipelines.catalogues import SOURCES
from pipelines.channels import CHANNELS
from pipelines.utc import as_utc

__all__ = ["router", "EVENT_SOURCES", "PAGE_SIZE", "ListPage", "event_list_page"]

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 50
#: Order of the events list: newest first (the API's default too), the higher id first on a
#: tie; the "previous" link reads the same key ascending from the first row shown and turns
#: the rows round (exact: ``start_time`` is never NULL, so both orders hold the same rows).
LIST_SORT = "-start_time"
_LIST_KEY = "start_time"
_REVERSE_SORT = "start_time"
#: Quicklooks shown per channel on an event page, and the time added around the event.
QUICKLOOKS_PER_CHANNEL = 6
QUICKLOOK_MARGIN = dt.timedelta(hours=1)
#: Margin of the light curve around an event (the API default).
LIGHTCURVE_MARGIN = dt.timedelta(minutes=30)
#: Event sources known to the platform (``Event.source``), offered in the filter form.
EVENT_SOURCES = SOURCES



_NUM = Annotated[str | None, Query(max_length=24)]
#: A page link's cursor (the API's ``cursor`` allows as much).
_CURSOR = Annotated[str | None, Query(max_length=400)]


@dataclass
class ListPage:
    """One page of the events list.

    Attributes
    ----------
    rows : list
        Light event rows (:data:`backend.services.event_search.LIGHT_COLUMNS`), newest first.
    total : int
        Events matching the filters, all pages (an estimate when ``total_is_estimate``).
    total_is_estimate : bool
    first : bool
        The newest page (no cursor, or a ``before`` cursor that reached the newest events).
    after, before : str or None
        Cursors of the next (older) and previous (newer) page; None where there is none.
    """

    rows: list[Any]
    total: int
    total_is_estimate: bool
    first: bool
    after: str | None
    before: str | None


def event_list_page(session, filters: EventFilters, *, after: str | None = None,
                    before: str | None = None, size: int | None = None) -> ListPage:
    """The page of ``size`` events (default :data:`PAGE_SIZE`), newest first: those older than
    the ``after`` cursor, newer than the ``before`` cursor, or the newest when neither is given.

    ``before`` is a cursor of the reversed order (:data:`_REVERSE_SORT`) made from the first row
    of the page after it; when fewer than a page of newer events remain, the newest page is
    returned (full, ``first=True``). Each page is one keyset query plus the count of
    :func:`~backend.services.event_search.search_events`, at any depth.

    Raises
    ------
    SearchError
        A cursor made for other filters or another order, a damaged cursor, or both cursors.
    """
    if after and before:
        raise SearchError("a page link carries either after or before, not both")
    size = size or PAGE_SIZE
    fp = filters.fingerprint()

    def cursor(sort: str, row) -> str:
        return encode_cursor(sort, getattr(row, _LIST_KEY), row.id, fp)

    if before:
        res = search_events(session, filters, sort=_REVERSE_SORT, limit=size, cursor=before, light=True)
        if res.truncated:  # newer events remain above this page
            rows = res.items[::-1]
            return ListPage(rows, res.total, res.total_is_estimate, False,
                            after=cursor(LIST_SORT, rows[-1]), before=cursor(_REVERSE_SORT, rows[0]))
    elif after:
        res = search_events(session, filters, sort=LIST_SORT, limit=size, cursor=after, light=True)
        rows = res.items
        return ListPage(rows, res.total, res.total_is_estimate, False, after=res.next_cursor,
                        before=cursor(_REVERSE_SORT, rows[0]) if rows else None)
    res = search_events(session, filters, sort=LIST_SORT, limit=size, light=True)
    return ListPage(res.items, res.total, res.total_is_estimate, True, after=res.next_cursor, before=None)


@router.get("/", response_class=HTMLResponse)
@router.get("/events", response_class=HTMLResponse)
def events_page(
    request: Request,
    session: SessionDep,
    principal: OptionalPrincipal,
    type: Annotated[str | None, Query()] = None,  # noqa: A002 - the HEK name of the filter
    source: Annotated[str | None, Query(max_length=32)] = None,
    start: Annotated[str | None, Query(max_length=40)] = None,
    end: Annotated[str | None, Query(max_length=40)] = None,
    min_goes_class: Annotated[str | None, Query(max_length=12)] = None,
    pa_min: _NUM = None,
    pa_max: _NUM = None,
    hpc_x_min: _NUM = None,
    hpc_x_max: _NUM = None,
    hpc_y_min: _NUM = None,
    hpc_y_max: _NUM = None,
    after: _CURSOR = None,
    before: _CURSOR = None,
    noaa_ar: _NUM = None,
    associated_type: Annotated[str | None, Query(max_length=4)] = None,
    frm_name: Annotated[str | None, Query(max_length=100)] = None,
    calibration_set: Annotated[str | None, Query(max_length=400)] = None,
    tl_start: Annotated[str | None, Query(max_length=40)] = None,
    tl_end: Annotated[str | None, Query(max_length=40)] = None,
):
    """Events list with filters (HEK type, source, time range, minimum GOES class,
    position-angle range, helioprojective box, NOAA region, associated event type, detector,
    calibration set), newest first, paged by cursor (:func:`event_list_page`; the filters ride
    along in the page links), the coverage of the window per source and the landing timeline
    (all matching events, ``frontend/static/timeline.js``; its zoom is ``tl_start``/``tl_end``
    in the URL). A page link made for other filters is reported and the newest page shown.
    Served at ``/`` (the landing page) and ``/events`` (the event list), the links of each
    staying on its own path."""
    parsed = parse_event_filters(
        types=type, sources=source, start=start, end=end, min_goes_class=min_goes_class,
        pa_min=pa_min, pa_max=pa_max, hpc_x_min=hpc_x_min, hpc_x_max=hpc_x_max,
        hpc_y_min=hpc_y_min, hpc_y_max=hpc_y_max, noaa_ar=noaa_ar, associated_type=associated_type,
        frm_name=(frm_name or "").strip() or None, calibration_set=calibration_set, form=True,
    )
    errors = [p.note for p in parsed.problems]
    filters = for_viewer(parsed.filters, principal)  # the public catalogue, and the viewer's own events
    event_type = filters.event_types[0] if filters.event_types else None
    source = filters.sources[0] if filters.sources else None
    t0, t1, min_class = filters.start, filters.end, parsed.min_goes_class
    num = {name: getattr(filters, name) for name, *_ in NUMERIC_FILTERS}
    form = {"type": event_type or "", "source": source or "", "start": form_time(t0), "end": form_time(t1),
            "min_goes_class": min_class or "", **{k: form_num(v) for k, v in num.items()},
            "noaa_ar": str(filters.noaa_ar or ""), "associated_type": filters.associated_type or "",
            "frm_name": filters.frm_name or "", "calibration_set": filters.calibration_set or ""}
    form_q = {k: v for k, v in form.items() if v}
    # the list follows the timeline's zoom (tl_start/tl_end): the events of the search in view
    list_filters, zoom = _zoomed(filters, tl_start, tl_end)
    page_q = {**form_q, **({"tl_start": zoom[0], "tl_end": zoom[1]} if zoom else {})}
    try:
        page = event_list_page(session, list_filters, after=after, before=before)
    except SearchError as exc:
        errors.append(f"page link not followed ({exc}): the newest events are shown")
        page = event_list_page(session, list_filters)
    applied = {k: v for k, v in (
        ("type", event_type), ("source", source),
        ("start", t0.isoformat() if t0 else None), ("end", t1.isoformat() if t1 else None),
        ("min_goes_class", min_class), *((k, form_num(v)) for k, v in num.items()),
        ("noaa_ar", form["noaa_ar"]), ("associated_type", form["associated_type"]), ("frm_name", form["frm_name"]),
        ("calibration_set", form["calibration_set"]),
    ) if v}
    base = "/events" if request.url.path.rstrip("/") == "/events" else "/"
    shown = {"start": list_filters.start.isoformat(), "end": list_filters.end.isoformat()} if zoom else {}
    extras = search_form_extras(session, filters, applied, tl_start, tl_end)
    errors += extras.pop("errors")
    return templates.TemplateResponse(request, "events.html", {
        **extras,
        "events": page.rows,
        "total": page.total,
        "total_is_estimate": page.total_is_estimate,
        "exact_count_limit": event_search.EXACT_COUNT_LIMIT,
        "first_page": page.first,
        "base": base,
        "save_query": urlencode(applied),  # "Save this search": the API's parameters of these filters
        "zoom": zoom,
        "newest_url": f"{base}?{urlencode(page_q)}",
        "prev_url": f"{base}?{urlencode({**page_q, 'before': page.before})}" if page.before else None,
        "next_url": f"{base}?{urlencode({**page_q, 'after': page.after})}" if page.after else None,
        "form": form,
        "sources": EVENT_SOURCES,
        "errors": errors,
        "timeline_url": f"/api/v1/events/timeline/figure?{urlencode(applied)}",
        "export_urls": {fmt: f"/api/v1/events?{urlencode({**applied, **shown, 'format': fmt, 'limit': 500})}"
                        for fmt in ("csv", "votable", "hek")},
        "observing_windows": observing_windows(session, include_quiet=True),  # _demo_windows.html
        "demo_progress": read_progress(get_settings().root),  # _demo_progress.html
    })


def _zoomed(filters: EventFilters, tl_start: str | None, tl_end: str | None
            ) -> tuple[EventFilters, tuple[str, str] | None]:
    """The filters of the events list under the timeline's zoom: the search's time window cut
    to ``tl_start``..``tl_end`` (ISO UTC), and the zoom as the page links carry it. A zoom
    that cannot be read, is empty, or lies outside the search leaves the search as it is
    (as ``frontend/static/timeline.js`` draws it; bad values are reported by
    :func:`backend.api.pages.events_search.search_form_extras`)."""
    problems: list = []
    z0 = filter_time("tl_start", tl_start, problems)
    z1 = filter_time("tl_end", tl_end, problems)
    if problems or z0 is None or z1 is None or z1 <= z0:
        return filters, None
    a = max(filters.start, z0) if filters.start else z0
    b = min(filters.end, z1) if filters.end else z1
    if b <= a:
        return filters, None
    iso = "%Y-%m-%dT%H:%M:%S.%fZ"
    return dataclasses.replace(filters, start=a, end=b), (as_utc(z0).strftime(iso), as_utc(z1).strftime(iso))


def _quicklooks_around(session, event: Event) -> dict[str, list[Any]]:
    start = as_utc(event.start_time) - QUICKLOOK_MARGIN
    end = as_utc(event.end_time or event.peak_time or event.start_time) + QUICKLOOK_MARGIN
    by_channel: dict[str, list[Any]] = {}
    for p in products_service.latest_products_in_window(session, start, end, with_quicklook=True, limit=5000):
        by_channel.setdefault(p.frame.channel_code, []).append(p)
    return {code: products_service.sample_evenly(by_channel[code], QUICKLOOKS_PER_CHANNEL)
            for code in CHANNELS if code in by_channel}


def _event_context(session, event: Event, principal=None) -> dict[str, Any]:
    """The context images of an event page (``_event_context.html``)."""
    from backend.services import imaging
    from backend.settings import get_settings

    return {"context_images": imaging.event_context(session, event, get_settings().products, principal=principal),
            "context_size": imaging.CONTEXT_SIZE}


@router.get("/events/{event_id}", response_class=HTMLResponse)
def event_page(request: Request, event_id: IdPath, session: SessionDep, principal: OptionalPrincipal):
    """One event in the field's terms, its associations, quicklooks around it and its light curve.
    A private event (a user's detection on a set of their own) is shown to its owner and admins
    only, marked with its calibration set; 404 to anyone else."""
    row = events_service.get_event(session, event_id, principal)
    if row is None:
        raise HTTPException(404, detail=f"no event with id {event_id}")
    detail = event_detail(session, row, principal)
    lc_start, lc_end = products_service.event_window(row, LIGHTCURVE_MARGIN)
    has_sdi = bool(products_service.latest_products_in_window(session, lc_start, lc_end, channel="SDI", limit=1))
    duration = None
    if detail.end_time is not None:
        duration = detail.end_time - detail.start_time
    return templates.TemplateResponse(request, "event.html", {
        "e": detail,
        "duration": duration,
        "quicklooks": _quicklooks_around(session, row),
        "quicklook_margin_h": QUICKLOOK_MARGIN.total_seconds() / 3600,
        "has_sdi": has_sdi,
        "lightcurve_url": f"/api/v1/events/{event_id}/lightcurve/figure?channel=SDI",
        **_event_context(session, row, principal),
        "linked": event_curves_service.linked_data(session, row, QUICKLOOK_MARGIN),
        "systematics": products_service.event_systematics(session, row.id),  # flagged linked products
    })
