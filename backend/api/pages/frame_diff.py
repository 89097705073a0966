"""The ``/frames/{frame_id}/diff`` page: two product versions of one frame compared
(:mod:`backend.services.product_diff`; the API of :mod:`backend.api.routes.reproducibility`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.pages.templating import templates
from backend.api.params import IdPath, VersionQuery
from backend.api.presenters import product_pair
from backend.services import product_diff

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/frames/{frame_id}/diff", response_class=HTMLResponse)
def frame_diff_page(request: Request, frame_id: IdPath, a: VersionQuery, b: VersionQuery, session: SessionDep,
                    principal: OptionalPrincipal):
    """The diff of two product versions of one frame: products, header diff table, image
    statistics, the difference and ratio images; links to the other versions."""
    report = product_diff.diff_report(product_pair(session, frame_id, a, b, principal))
    return templates.TemplateResponse(request, "frame_diff.html", {
        "report": report, "versions": product_diff.versions_of_frame(session, frame_id, principal)})
