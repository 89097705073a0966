"""``/products/{id}/...``: the image viewer's API (:mod:`backend.render.image`, :mod:`backend.services.imaging`).

* ``region.png``: any pixel region as a PNG of at most ``size`` pixels a side, scaled with
  astropy.visualization (stretch, percentile limits of the whole image); the headers
  ``X-Region`` (``x0,x1,y0,y1`` covered, 0-based, end exclusive), ``X-Decimation`` and
  ``X-Display-Limits`` say what it shows.
* ``dq.png``: the DQ mask of a region as a transparent coloured PNG (``bits`` selects).
* ``wcs``: the helioprojective axes, limb, Stonyhurst grid, DATE-OBS, observer, Rsun.
* ``pixel``: the value, DQ bits and world coordinates of one pixel.
* ``overlays``: the events of the frame's time window placed on the frame.

Bad parameters (unknown stretch, ``pmin >= pmax``, a region outside the image, a value that
is not a number) are 422 with a message; a product that is not written or whose file is
gone is 404.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from backend.api.deps import OptionalPrincipal, SessionDep, SettingsDep
from backend.api.params import MAX_ID, IdPath
from backend.models import ProductState
from backend.render import image as imaging
from backend.services import products as products_service
from backend.services.imaging import frame_overlays

router = APIRouter(prefix="/products", tags=["viewer"])

_PNG = {200: {"content": {"image/png": {}}, "description": "PNG image"}}
_PIXEL = Annotated[int | None, Query(ge=-(2**31), le=2**31, description="Pixel index, 0-based")]
_CACHE = {"Cache-Control": "public, max-age=3600"}


def _image(session, settings, product_id: int, principal=None) -> imaging.ProductImage:
    """The product's image; 404 when there is none, or it is of a private calibration set
    ``principal`` may not see (:func:`backend.services.set_access.may_see_product`)."""
    from backend.services.set_access import may_see_product

    row = products_service.get_product(session, product_id)
    if row is None or not may_see_product(session, principal, row):
        raise HTTPException(404, detail=f"no product with id {product_id}")
    if row.state != ProductState.written:
        raise HTTPException(404, detail=f"product {product_id} is {row.state.value}, its FITS file is not written")
    path = products_service.served_store_path(row.path, settings.products)
    if path is None:
        raise HTTPException(404, detail=f"the FITS file of product {product_id} is missing from the product store")
    return imaging.open_product(path, row.frame.channel_code)


@router.get("/{product_id}/region.png", response_class=Response, responses=_PNG,
            summary="A region of the image as PNG (dynamic pyramid)")
def read_region(
    product_id: IdPath, session: SessionDep, settings: SettingsDep, principal: OptionalPrincipal,
    x0: _PIXEL = None, x1: _PIXEL = None, y0: _PIXEL = None, y1: _PIXEL = None,
    size: Annotated[int, Query(description=f"Largest side of the PNG [pixel], 16-{imaging.MAX_REGION_SIZE}")]
    = imaging.DEFAULT_REGION_SIZE,
    stretch: Annotated[str | None, Query(max_length=16, description="linear, sqrt, log or asinh")] = None,
    pmin: Annotated[float | None, Query(description="Lower percentile [0-100] of the whole image")] = None,
    pmax: Annotated[float | None, Query(description="Upper percentile [0-100] of the whole image")] = None,
    cmap: Annotated[str | None, Query(max_length=40, description="matplotlib colour map")] = None,
) -> Response:
    """Pixels ``x0..x1``, ``y0..y1`` (0-based, end exclusive; default the whole image), block-averaged
    by the power of two that fits them in ``size`` pixels, north up, NaN transparent. Limits are the
    ``pmin``/``pmax`` percentiles of the whole image (the channel's defaults when not given)."""
    img = _image(session, settings, product_id, principal)
    r = imaging.render_region(img, x0=x0, x1=x1, y0=y0, y1=y1, size=size, stretch=stretch, pmin=pmin, pmax=pmax,
                              cmap=cmap)
    return Response(r.png, media_type="image/png", headers={**r.headers(), **_CACHE})


@router.get("/{product_id}/dq.png", response_class=Response, responses=_PNG,
            summary="The DQ mask of a region as a transparent PNG")
def read_dq_region(
    product_id: IdPath, session: SessionDep, settings: SettingsDep, principal: OptionalPrincipal,
    x0: _PIXEL = None, x1: _PIXEL = None, y0: _PIXEL = None, y1: _PIXEL = None,
    size: Annotated[int, Query(description=f"Largest side of the PNG [pixel], 16-{imaging.MAX_REGION_SIZE}")]
    = imaging.DEFAULT_REGION_SIZE,
    bits: Annotated[str | None, Query(max_length=120, description="DQ bits shown: names or values, comma "
                                                                  "separated (default all)")] = None,
) -> Response:
    """Flagged pixels in the colour of their lowest selected bit, the others transparent; a reduced
    level ORs the bits of each block."""
    img = _image(session, settings, product_id, principal)
    r = imaging.render_dq(img, x0=x0, x1=x1, y0=y0, y1=y1, size=size, bits=bits)
    return Response(r.png, media_type="image/png", headers={**r.headers(), **_CACHE})


@router.get("/{product_id}/wcs", summary="Helioprojective axes, limb and Stonyhurst grid of a product")
def read_wcs(product_id: IdPath, session: SessionDep, settings: SettingsDep,
             principal: OptionalPrincipal) -> dict[str, Any]:
    """See :func:`backend.render.image.wcs_description`: shape, DATE-OBS, observer, Rsun, the
    pixel -> arcsec map, the limb and the Stonyhurst grid (every 15 deg, visible hemisphere only)
    as polylines in arcsec, the default scaling and the DQ bits."""
    out = dict(imaging.wcs_description(_image(session, settings, product_id, principal)))
    out["product_id"] = product_id
    return out


@router.get("/{product_id}/pixel", summary="Value, DQ and world coordinates of one pixel")
def read_pixel(
    product_id: IdPath, session: SessionDep, settings: SettingsDep, principal: OptionalPrincipal,
    x: Annotated[float | None, Query(description="Pixel column, 0-based")] = None,
    y: Annotated[float | None, Query(description="Pixel row, 0-based (row 0 at the bottom)")] = None,
    tx: Annotated[float | None, Query(description="Helioprojective Tx [arcsec]")] = None,
    ty: Annotated[float | None, Query(description="Helioprojective Ty [arcsec]")] = None,
) -> dict[str, Any]:
    """The pixel at (``x``, ``y``) or at helioprojective (``tx``, ``ty``): value with BUNIT, DQ bits,
    Tx/Ty, and Stonyhurst latitude/longitude when on the disk."""
    return imaging.pixel_info(_image(session, settings, product_id, principal), x=x, y=y, tx=tx, ty=ty)


@router.get("/{product_id}/overlays", summary="The events of the frame's time window, placed on it")
def read_overlays(
    product_id: IdPath, session: SessionDep, settings: SettingsDep, principal: OptionalPrincipal,
    margin_h: Annotated[float, Query(ge=0, le=72, description="Window: DATE-OBS +- this many hours")] = 1.0,
    event: Annotated[int | None, Query(ge=1, le=MAX_ID, description="An event included whatever its time")] = None,
) -> dict[str, Any]:
    """Flares and other point events rotated to the frame's DATE-OBS (sunpy differential rotation),
    CMEs as position-angle wedges; each with its id, type, label and event page URL. An event
    behind the limb at the frame's time is flagged (``visible: false``), not dropped."""
    img = _image(session, settings, product_id, principal)
    out = frame_overlays(session, img, margin=dt.timedelta(hours=margin_h), event_id=event, principal=principal)
    out["product_id"] = product_id
    return out
