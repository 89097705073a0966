"""The image viewer page ``/products/{id}/view`` and the event page's context images
(included by :mod:`backend.api.pages`; the data come from :mod:`backend.services.imaging`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import SessionDep
from backend.api.routes.params import MAX_ID, IdPath
from backend.models import ProductState
from backend.services import imaging
from backend.services import products as products_service
from backend.settings import get_settings

__all__ = ["router", "event_context_images"]

router = APIRouter(include_in_schema=False)


@router.get("/products/{product_id}/view", response_class=HTMLResponse)
def viewer_page(request: Request, product_id: IdPath, session: SessionDep,
                event: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None):
    """The viewer of one L2 product: the image on helioprojective axes with zoom and pan at full
    resolution, limb, Stonyhurst grid, scaling controls, DQ layer, cursor readout and the events
    of its time window; ``?event=<id>`` highlights one event and centres the view on it."""
    from backend.api.pages import templates

    row = products_service.get_product(session, product_id)
    if row is None:
        raise HTTPException(404, detail=f"no product with id {product_id}")
    if row.state != ProductState.written:
        raise HTTPException(404, detail=f"product {product_id} is {row.state.value}: nothing to view")
    return templates.TemplateResponse(request, "viewer.html", {
        "p": row,
        "event_id": event,
        "defaults": imaging.default_scaling(row.frame.channel_code),
        "stretches": imaging.STRETCHES,
    })


def event_context_images(session, event) -> list[imaging.ChannelContext]:
    """The context images of an event page (:func:`backend.services.imaging.event_context`)."""
    return imaging.event_context(session, event, get_settings().products)


def context_for_template(session, event) -> dict[str, Any]:
    """The ``context_images`` entry of the event page's template context."""
    return {"context_images": event_context_images(session, event), "context_size": imaging.CONTEXT_SIZE}
