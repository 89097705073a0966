"""The event browser: server-rendered pages (Jinja2 templates in ``frontend/templates``).

Pages read through the same service functions as the API; figures are not drawn here: a
page holds a ``<div data-figure-url=...>`` that ``frontend/static/app.js`` fills with the
Plotly JSON from the API. Bad filter values on a page are shown as a message on the page
(the filter is then not applied), never as an error status; they are read by the API's parser,
:func:`backend.api.routes.params.parse_event_filters`.

The events list pages with the search API's keyset cursors (``after``: the events older
than a row, ``before``: the events newer than a row), never with an offset: every page
costs the same index range scan whatever its depth, and its total is exact up to
:data:`backend.services.event_search.EXACT_COUNT_LIMIT` and flagged as an estimate above.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from backend import __version__
from backend.api.deps import SessionDep
from backend.api.routes.params import NUMERIC_FILTERS, IdPath, for_viewer, is_safe_key, parse_event_filters
from backend.auth import OptionalPrincipal
from backend.render.figures import EVENT_COLOURS, HEK_EVENT_TYPES, hek_label
from backend.models import CalibrationKind, Event
from backend.services import event_curves as event_curves_service
from backend.services import events as events_service
from backend.services import frames as frames_service
from backend.services import jobs as jobs_service
from backend.services import products as products_service
from backend.services import event_search
from backend.services.observing_windows import observing_windows
from backend.services.demo_progress import read_progress
from backend.settings import get_settings
from backend.services import bulk as bulk_service
from backend.services.channels import list_channels
from backend.services.event_search import EventFilters, SearchError, encode_cursor, search_events
from frontend import STATIC_DIR, TEMPLATE_DIR
from pipelines.catalogues import SOURCES
from pipelines.channels import CHANNELS
from pipelines.utc import as_utc

__all__ = ["router", "templates", "static_url", "PLOTLY_JS_VERSION", "EVENT_SOURCES", "ListPage", "event_list_page"]

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


def _plotly_js_version() -> str:
    try:
        with open(STATIC_DIR / "vendor" / "plotly.min.js", encoding="utf-8") as f:
            head = f.read(200)
    except OSError:
        return "missing"
    m = re.search(r"plotly\.js v(\d+\.\d+\.\d+)", head)
    return m.group(1) if m else "unknown"


@functools.lru_cache(maxsize=256)
def static_url(path: str) -> str:
    """The URL of a file under ``frontend/static``, versioned by its content.

    ``/static/<path>?v=<first 12 hex digits of its SHA-256>``: a changed file gets a new URL,
    so browsers may cache every version for ever. Raises ``FileNotFoundError`` for a path
    that is not a static file (a template naming a missing script fails when rendered,
    not silently in the browser).
    """
    f = (STATIC_DIR / path).resolve()
    if STATIC_DIR.resolve() not in f.parents or not f.is_file():
        raise FileNotFoundError(f"no static file {path!r} under {STATIC_DIR}")
    digest = hashlib.sha256(f.read_bytes()).hexdigest()[:12]
    return f"/static/{path}?v={digest}"


def _templates() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(TEMPLATE_DIR))
    t.env.globals.update(
        static_url=static_url,
        version=__version__,
        plotly_version=PLOTLY_JS_VERSION,
        hek_label=hek_label,
        hek_types=HEK_EVENT_TYPES,
        event_colours=EVENT_COLOURS,
        goes_level=_goes_level,
    )
    t.env.filters["utc"] = _fmt_utc
    t.env.filters["ink"] = badge_ink
    t.env.filters["num"] = _fmt_num
    return t


def _goes_level(e) -> str | None:
    """The GOES XRS level a source gives for the event's time as a class (the STIX list's),
    for an event or a light list row; None when it gives none
    (:func:`backend.services.event_formats.goes_level`)."""
    from backend.services.event_formats import goes_level

    return goes_level(e)[0]


def _fmt_utc(t: dt.datetime | None, seconds: bool = True) -> str:
    t = as_utc(t)
    if t is None:
        return "—"
    return t.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def _luminance(hex_colour: str) -> float:
    """Relative luminance of an sRGB ``#rrggbb`` colour, 0 (black) to 1 (white) (WCAG 2.2,
    "relative luminance")."""
    h = hex_colour.lstrip("#")
    rgb = [int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def badge_ink(background: str) -> str:
    """The text colour (``#000000`` or ``#ffffff``) of higher WCAG contrast on ``background``
    (``#rrggbb``): an event badge's code stays readable on every colour of
    :data:`backend.figures.EVENT_COLOURS` (white on the Okabe-Ito vermillion is 3.9:1, under
    the 4.5:1 that WCAG 2.2 SC 1.4.3 asks of small text; black is 5.4:1)."""
    lum = _luminance(background)
    return "#000000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#ffffff"


def _fmt_num(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


PLOTLY_JS_VERSION = _plotly_js_version()
templates = _templates()
router = APIRouter(include_in_schema=False)


def _form_time(t: dt.datetime | None) -> str:
    """A time for the form and the page links, to the minute unless it has seconds (exact:
    a page link must give back the same filters, or its cursor is refused)."""
    t = as_utc(t)
    if t is None:
        return ""
    if t.microsecond:
        return t.replace(tzinfo=None).isoformat()
    return t.strftime("%Y-%m-%dT%H:%M:%S" if t.second else "%Y-%m-%dT%H:%M")


def _form_num(v: float | None) -> str:
    """A number for the form and the page links: short (``-500``) when that is exact, else ``repr``."""
    if v is None:
        return ""
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


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
    from backend.api.events_search_page import search_form_extras

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
    form = {"type": event_type or "", "source": source or "", "start": _form_time(t0), "end": _form_time(t1),
            "min_goes_class": min_class or "", **{k: _form_num(v) for k, v in num.items()},
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
        ("min_goes_class", min_class), *((k, _form_num(v)) for k, v in num.items()),
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
    :func:`backend.api.events_search_page.search_form_extras`)."""
    import dataclasses

    from backend.api.routes.params import _filter_time

    problems: list = []
    z0 = _filter_time("tl_start", tl_start, problems)
    z1 = _filter_time("tl_end", tl_end, problems)
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
    from backend.api.routes.events import event_detail

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


@router.get("/products", response_class=HTMLResponse)
def products_page(request: Request, session: SessionDep):
    """Gallery of the latest quicklooks of each of LST's four channels."""
    return templates.TemplateResponse(request, "products.html", {
        "gallery": products_service.latest_quicklooks_by_channel(session, per_channel=QUICKLOOKS_PER_CHANNEL),
        "channels": {c.code: c for c in list_channels(session)},
        "archive_limit": bulk_service.MAX_ARCHIVE_FILES,
    })


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
    from backend.api.routes.jobs import with_queue
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


@router.get("/products/{product_id}/view", response_class=HTMLResponse)
def viewer_page(request: Request, product_id: IdPath, session: SessionDep, principal: OptionalPrincipal,
                event: Annotated[int | None, Query(ge=1, le=2_147_483_647)] = None):
    """The image viewer of one L2 product (``frontend/static/viewer.js`` on the API of
    :mod:`backend.api.routes.viewer`): helioprojective axes, zoom and pan at full resolution,
    limb, Stonyhurst grid, scaling, DQ layer, cursor readout, the events of its time window;
    ``?event=<id>`` highlights one event and centres the view on it."""
    from backend.models import ProductState
    from backend.render import image as imaging
    from backend.services import product_diff

    from backend.services.set_access import may_see_product
    from pipelines.calibration.l2.quality import quality_reasons

    row = products_service.get_product(session, product_id)
    if row is None or not may_see_product(session, principal, row):  # a private set's: its owner's
        raise HTTPException(404, detail=f"no product with id {product_id}")
    if row.state != ProductState.written:
        raise HTTPException(404, detail=f"product {product_id} is {row.state.value}: nothing to view")
    return templates.TemplateResponse(request, "viewer.html", {
        "p": row, "event_id": event, "defaults": imaging.default_scaling(row.frame.channel_code),
        "stretches": imaging.STRETCHES,
        "versions": product_diff.versions_of_frame(session, row.frame_id, principal),  # "compare versions" links
        "systematics": quality_reasons({**(row.header or {}), "QUALITY": row.quality_flags}),  # {bit: reason}
    })
