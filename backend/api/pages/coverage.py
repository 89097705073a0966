"""The ``/coverage`` page: per event source and LST channel, the covered spans and the gaps."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import SessionDep, SettingsDep
from backend.api.pages.templating import form_time, templates
from backend.api.params import TimeRange
from backend.services.coverage import coverage_report
from backend.services.event_filters import filter_time

router = APIRouter(include_in_schema=False)

#: Most gaps listed per source on the page (the API lists all).
GAPS_SHOWN = 30


@router.get("/coverage", response_class=HTMLResponse)
def coverage_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    start: Annotated[str | None, Query(max_length=40)] = None,
    end: Annotated[str | None, Query(max_length=40)] = None,
):
    """Coverage of every source (``GET /api/v1/coverage``) as a table with a bar per source;
    bad times are reported on the page and not applied."""
    problems: list = []
    t0 = filter_time("start", start, problems)
    t1 = filter_time("end", end, problems)
    errors = [p.note for p in problems]
    if t0 is not None and t1 is not None and t1 < t0:
        errors.append("end is before start: the time range was not applied")
        t0 = t1 = None
    report = coverage_report(session, t0, t1, settings)
    # the bar's extent: the window, else every span of every source
    edges = [x for c in report for s in c.spans for x in (s.start, s.end)]
    lo = t0 or (min(edges) if edges else None)
    hi = t1 or (max(edges) if edges else None)

    def pct(t) -> float:
        if lo is None or hi is None or hi <= lo:
            return 0.0
        return max(0.0, min(100.0, 100.0 * (t - lo).total_seconds() / (hi - lo).total_seconds()))

    return templates.TemplateResponse(request, "coverage.html", {
        "report": report, "errors": errors, "form": {"start": form_time(t0), "end": form_time(t1)},
        "lo": lo, "hi": hi, "pct": pct, "gaps_shown": GAPS_SHOWN, "span": TimeRange(t0, t1),
    })
