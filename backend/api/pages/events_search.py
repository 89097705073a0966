"""What the events page adds for search (issue 11 items 4-6): the per-source coverage of the
window, the choices of the detector and calibration-set filters, and the landing timeline's
URL and zoom (``tl_start``/``tl_end`` in the page URL, read by ``frontend/static/timeline.js``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import Event, EventProduct, Product
from backend.services.coverage import window_coverage
from backend.services.event_filters import filter_time
from backend.services.event_search import EventFilters
from backend.services.event_visibility import owner_condition
from pipelines.catalogues import DETECTED_SOURCE
from pipelines.utc import as_utc

__all__ = ["search_form_extras", "MAX_CHOICES"]

#: Most detector names and calibration sets offered in the form's lists.
MAX_CHOICES = 200


def _iso(t) -> str:
    return as_utc(t).strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else ""


def search_form_extras(session: Session, filters: EventFilters, applied: dict[str, str],
                       tl_start: str | None, tl_end: str | None) -> dict[str, Any]:
    """Template values of the events page's search parts.

    Returns
    -------
    dict
        ``coverage`` (source -> :class:`~backend.services.coverage.WindowCoverage`),
        ``detectors`` (detected events' ``frm_name`` values), ``calibration_sets`` (the
        ``calibration_key`` of products linked to events), ``density_url`` (the timeline's
        figure URL without the time window), ``window_start``/``window_end`` (the filter's
        window, ISO UTC), ``tl_start``/``tl_end`` (the zoom as given, ISO UTC, or ""), and
        ``errors`` (notes for bad zoom values: the zoom is then dropped).
    """
    problems: list = []
    z0 = filter_time("tl_start", tl_start, problems)
    z1 = filter_time("tl_end", tl_end, problems)
    errors = [f"timeline zoom not applied: {p.message}" for p in problems]
    if z0 is not None and z1 is not None and z1 <= z0:
        errors.append("timeline zoom not applied: tl_end is not after tl_start")
        z0 = z1 = None
    detectors = list(session.scalars(
        select(Event.frm_name).where(Event.source == DETECTED_SOURCE, Event.frm_name.is_not(None))
        .distinct().order_by(Event.frm_name).limit(MAX_CHOICES)))
    seen = owner_condition(filters.viewer, filters.sees_all, Event.owner)  # of the events the viewer may see
    cal_q = (select(Product.calibration_key).join(EventProduct, EventProduct.product_id == Product.id)
             .join(Event, Event.id == EventProduct.event_id))
    cal_sets = list(session.scalars((cal_q if seen is None else cal_q.where(seen))
                                    .distinct().order_by(Product.calibration_key).limit(MAX_CHOICES)))
    no_window = {k: v for k, v in applied.items() if k not in ("start", "end")}
    return {
        "coverage": window_coverage(session, filters.sources, filters.start, filters.end),
        "detectors": detectors,
        "calibration_sets": cal_sets,
        "density_url": f"/api/v1/events/histogram/figure?{urlencode(no_window)}",
        "window_start": _iso(filters.start),
        "window_end": _iso(filters.end),
        "tl_start": _iso(z0),
        "tl_end": _iso(z1),
        "errors": errors,
    }
