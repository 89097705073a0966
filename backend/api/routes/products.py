"""``/products``: L2 products, their FITS files and quicklook images."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse
from starlette.responses import Response

from backend.api.conditional import file_response, object_response
from backend.api.deps import OptionalPrincipal, SessionDep, SettingsDep
from backend.api.params import (MAX_ID, CalibrationSetQuery, ChannelQuery, IdPath, JobIdQuery, LevelQuery, PaginationDep,
                                SystematicsQuery, TimeRangeDep)
from backend.api.schemas import ProductDetail, ProductPublic, ProductsPublic
from backend.models import Job, Product, ProductState
from backend.store import is_object_ref, product_name
from backend.services import products as products_service
from backend.services import visibility

router = APIRouter(prefix="/products", tags=["products"])


@router.get("", response_model=ProductsPublic, summary="List L2 products")
def read_products(
    session: SessionDep,
    page: PaginationDep,
    principal: OptionalPrincipal,
    span: TimeRangeDep,
    channel: ChannelQuery = None,
    state: Annotated[ProductState | None, Query(description="planned, writing, written or failed")] = None,
    frame_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="Only products of this frame")] = None,
    job_id: JobIdQuery = None,
    calibration_set: CalibrationSetQuery = None,
    level: LevelQuery = None,
    systematics: SystematicsQuery = None,
) -> ProductsPublic:
    """Products filtered by channel, DATE-OBS range of their frame, state, frame, job (the products of
    the job's frames, whichever job made them first), calibration set, level and a frame-wide
    systematic flagged on them (``quality_flags``); every version is listed.
    Products of a private calibration set are listed to its owner (and admins) only; a
    ``job_id`` of another user's private job is 404."""
    if job_id:
        visibility.get_visible(session, Job, job_id, principal)
    conds = products_service.product_conditions(principal, calibration_set=calibration_set, level=level,
                                                systematics=systematics)
    rows, total = products_service.list_products(
        session, channel=channel, start=span.start, end=span.end, state=state, frame_id=frame_id, job_id=job_id or None,
        limit=page.limit, offset=page.offset, conditions=conds,
    )
    return ProductsPublic(items=[ProductPublic.model_validate(r) for r in rows], total=total,
                          limit=page.limit, offset=page.offset)


def _product_or_404(session, product_id: int, principal=None) -> Product:
    return visibility.get_visible(session, Product, product_id, principal)  # a private set's: 404


@router.get("/{product_id}", response_model=ProductDetail, summary="One product with its calibration lineage")
def read_product(product_id: IdPath, session: SessionDep, principal: OptionalPrincipal) -> ProductDetail:
    """One product with its header, statistics and the calibration files it was made with
    (404 for a product of a private calibration set, but to its owner and admins)."""
    return ProductDetail.model_validate(_product_or_404(session, product_id, principal))


@router.get(
    "/{product_id}/fits",
    response_class=FileResponse,
    summary="Download the L2 FITS file",
    responses={200: {"content": {"application/fits": {}}, "description": "The L2 FITS file"},
               404: {"description": "No such product, or its file is not written"}},
)
def read_product_fits(request: Request, product_id: IdPath, session: SessionDep, settings: SettingsDep,
                      principal: OptionalPrincipal) -> Response:
    """The L2 FITS file (image + ``DQ`` extension) of a written product. ``ETag`` is the file's
    SHA-256; ``If-None-Match``/``If-Modified-Since`` are honoured (304, :mod:`backend.api.conditional`)."""
    row = _product_or_404(session, product_id, principal)
    if row.state != ProductState.written:
        raise HTTPException(404, detail=f"product {product_id} is {row.state.value}, its FITS file is not written")
    if is_object_ref(row.path):  # an object store: streamed from it, checked as it goes
        name = product_name(row.path)
        answer = object_response(request, row.path, media_type="application/fits", filename=name, sha256=row.sha256)
        if answer is None:
            raise HTTPException(404, detail=f"the FITS file of product {product_id} is missing from the product store")
        return answer
    path = products_service.served_store_path(row.path, settings.products)
    if path is None:
        raise HTTPException(404, detail=f"the FITS file of product {product_id} is missing from the product store")
    return file_response(request, path, media_type="application/fits", filename=path.name, sha256=row.sha256)


@router.get(
    "/{product_id}/quicklook.png",
    response_class=FileResponse,
    summary="Quicklook PNG",
    responses={200: {"content": {"image/png": {}}, "description": "The quicklook image"},
               404: {"description": "No such product, or it has no quicklook"}},
)
def read_product_quicklook(request: Request, product_id: IdPath, session: SessionDep, settings: SettingsDep,
                           principal: OptionalPrincipal) -> Response:
    """The quicklook image of a product (``Product.quicklook_path``); conditional requests
    are honoured (304, :mod:`backend.api.conditional`)."""
    row = _product_or_404(session, product_id, principal)
    if not row.quicklook_path:
        raise HTTPException(404, detail=f"product {product_id} has no quicklook image")
    if is_object_ref(row.quicklook_path):
        answer = object_response(request, row.quicklook_path, media_type="image/png")
        if answer is None:
            raise HTTPException(404, detail=f"the quicklook of product {product_id} is missing from the product store")
        return answer
    path = products_service.served_store_path(row.quicklook_path, settings.products)
    if path is None:
        raise HTTPException(404, detail=f"the quicklook of product {product_id} is missing from the product store")
    return file_response(request, path, media_type="image/png")
