"""The product pages: ``/products`` (the gallery of the latest quicklooks per channel),
``/products/{product_id}/view`` (the image viewer of one L2 product) and ``/products/search``
(L2 products by channel, DATE-OBS range, calibration set and level, paged, with the bulk
download of the same search; issue 25, point 6).

The search page reads through the products API's service (:func:`backend.services.products.list_products`,
the query of ``GET /api/v1/products``) with the API's visibility rule (a private set's
products to its owner and admins only), and links the archive and the curl/wget script of
``GET /api/v1/products/archive`` and ``/download.sh`` (:mod:`backend.api.routes.bulk`) with
the same filters. Bad filter values are shown on the page and not applied, never an error
status (as the events page does).
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from fastapi import HTTPException

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.pages.events import QUICKLOOKS_PER_CHANNEL
from backend.api.pages.templating import form_time, templates
from backend.api.params import IdPath
from backend.models import ProductState
from backend.services import bulk as bulk_service
from backend.services import products as products_service
from backend.services.calibration_sets import list_sets
from backend.services.channels import list_channels
from backend.services.event_filters import MAX_ID, canonical_channel, filter_time
from pipelines.calibration.l2.quality import SYSTEMATICS
from pipelines.channels import CHANNELS

__all__ = ["router", "PAGE_SIZE", "MAX_SETS", "PRODUCT_LEVELS", "SYSTEMATIC_CHOICES"]

router = APIRouter(include_in_schema=False)

#: Products per page.
PAGE_SIZE = 50
#: Calibration sets offered in the form's list (newest first; any other id may be typed in the URL).
MAX_SETS = 200
#: The data levels the platform writes (``Product.level``; only L2: calibrated, in physical
#: units, with uncertainty and data-quality mask; see README "Data levels and products").
PRODUCT_LEVELS = ("L2",)
#: The search's ``systematics`` choices: ``any`` flagged, or one frame-wide systematic (the
#: values of ``GET /api/v1/products?systematics=``).
SYSTEMATIC_CHOICES = ("any", *SYSTEMATICS)
_LEVEL = re.compile(r"^L[0-9][A-Za-z0-9.]{0,6}$")


@router.get("/products", response_class=HTMLResponse)
def products_page(request: Request, session: SessionDep):
    """Gallery of the latest quicklooks of each of LST's four channels."""
    return templates.TemplateResponse(request, "products.html", {
        "gallery": products_service.latest_quicklooks_by_channel(session, per_channel=QUICKLOOKS_PER_CHANNEL),
        "channels": {c.code: c for c in list_channels(session)},
        "archive_limit": bulk_service.MAX_ARCHIVE_FILES,
    })


@router.get("/products/{product_id}/view", response_class=HTMLResponse)
def viewer_page(request: Request, product_id: IdPath, session: SessionDep, principal: OptionalPrincipal,
                event: Annotated[int | None, Query(ge=1, le=2_147_483_647)] = None):
    """The image viewer of one L2 product (``frontend/static/viewer.js`` on the API of
    :mod:`backend.api.routes.viewer`): helioprojective axes, zoom and pan at full resolution,
    limb, Stonyhurst grid, scaling, DQ layer, cursor readout, the events of its time window;
    ``?event=<id>`` highlights one event and centres the view on it."""
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


@router.get("/products/search", response_class=HTMLResponse)
def product_search_page(
    request: Request,
    session: SessionDep,
    principal: OptionalPrincipal,
    channel: Annotated[str | None, Query(max_length=16)] = None,
    start: Annotated[str | None, Query(max_length=40)] = None,
    end: Annotated[str | None, Query(max_length=40)] = None,
    calibration_set: Annotated[str | None, Query(max_length=12)] = None,
    level: Annotated[str | None, Query(max_length=8)] = None,
    systematics: Annotated[str | None, Query(max_length=24)] = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
):
    """Written products matching the filters (``systematics``: ``any`` or a frame-wide systematic
    of :data:`pipelines.calibration.l2.quality.SYSTEMATICS` flagged on the product), ordered by
    DATE-OBS (every version), 50 a page (``page``: 1, 2, ...), and the bulk download of the whole search (the archive holds at
    most :data:`backend.services.bulk.MAX_ARCHIVE_FILES`)."""
    errors: list[str] = []
    problems: list = []
    try:
        code = canonical_channel(channel or None)
    except ValueError as exc:
        errors.append(f"channel: {exc}")
        code = None
    t0 = filter_time("start", start, problems)
    t1 = filter_time("end", end, problems)
    errors += [p.note for p in problems]
    if t0 is not None and t1 is not None and t1 < t0:
        errors.append("end is before start: the time range was not applied")
        t0 = t1 = None
    set_id = None
    if calibration_set:
        if (calibration_set.strip().isascii() and calibration_set.strip().isdigit()) and 1 <= int(calibration_set) <= MAX_ID:
            set_id = int(calibration_set)
        else:
            errors.append(f"calibration set: {calibration_set[:12]!r} is not a set id (a whole number, see the list)")
    lvl = None
    if level:
        if _LEVEL.match(level.strip()):
            lvl = level.strip()
        else:
            errors.append(f"level: {level[:8]!r} is not a product level such as L2")
    flagged = None
    if systematics:
        if systematics.strip() in SYSTEMATIC_CHOICES:
            flagged = systematics.strip()
        else:
            errors.append(f"systematics: {systematics[:24]!r} is not one of {', '.join(SYSTEMATIC_CHOICES)}")
    conds = products_service.product_conditions(principal, calibration_set=set_id, level=lvl, systematics=flagged)
    rows, total = products_service.list_products(
        session, channel=code, start=t0, end=t1, state=ProductState.written, limit=PAGE_SIZE,
        offset=(page - 1) * PAGE_SIZE, conditions=conds)
    pages = max(1, -(-total // PAGE_SIZE))
    form = {"channel": code or "", "start": form_time(t0), "end": form_time(t1),
            "calibration_set": str(set_id or ""), "level": lvl or "", "systematics": flagged or ""}
    applied = {k: v for k, v in form.items() if v}
    api_q = {**applied, **({"start": t0.isoformat()} if t0 else {}), **({"end": t1.isoformat()} if t1 else {})}
    sets, _n = list_sets(session, user=getattr(principal, "user", None),
                         admin=bool(principal and principal.is_admin), limit=MAX_SETS)
    levels = list(PRODUCT_LEVELS)  # a constant: a DISTINCT over products would scan them all on every view

    def page_url(n: int) -> str:
        return f"/products/search?{urlencode({**applied, 'page': n})}"

    return templates.TemplateResponse(request, "product_search.html", {
        "nav": "product_search",
        "rows": rows, "total": total, "page": page, "pages": pages, "page_size": PAGE_SIZE,
        "first_index": (page - 1) * PAGE_SIZE + 1 if rows else 0,
        "prev_url": page_url(page - 1) if page > 1 else None,
        "next_url": page_url(page + 1) if page < pages else None,
        "form": form, "errors": errors, "channels": list(CHANNELS), "sets": sets, "levels": levels,
        "systematic_choices": SYSTEMATIC_CHOICES,
        "viewer": getattr(principal, "user", None),
        "archive_limit": bulk_service.MAX_ARCHIVE_FILES,
        "archive_url": f"/api/v1/products/archive?{urlencode(api_q)}",
        "archive_zip_url": f"/api/v1/products/archive?{urlencode({**api_q, 'format': 'zip'})}",
        "script_url": f"/api/v1/products/download.sh?{urlencode(api_q)}",
        "api_url": f"/api/v1/products?{urlencode({**api_q, 'state': 'written'})}",
        "save_url": f"/saved-searches?{urlencode({'kind': 'products', 'query': urlencode(api_q)})}",
    })
