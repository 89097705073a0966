"""Bulk download of L2 products: ``/products/archive``, ``/products/download.sh`` and
``/events/{id}/products/archive`` (:mod:`backend.services.bulk`).

The archive is a tar (or ``tar.gz``, or ``zip``) streamed as it is read from the product store, with
``MANIFEST.json`` (every product: sent with its SHA-256 and size, or missing with the
reason) and ``SHA256SUMS`` as its last members. A selection of more than
:data:`~backend.services.bulk.MAX_ARCHIVE_FILES` products is a 422 that says the count and
the limit. This router is included before ``/products/{product_id}`` (``archive`` is not an id).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from backend.api.deps import OptionalPrincipal, SessionDep, SettingsDep
from backend.api.params import (MAX_ID, CalibrationSetQuery, ChannelQuery, IdPath, JobIdQuery, LevelQuery,
                                SystematicsQuery, TimeRangeDep)
from backend.models import ProductState
from backend.services import bulk
from backend.services import events as events_service

__all__ = ["router", "ProductSearch", "ProductSearchDep"]

router = APIRouter(tags=["bulk download"])

StateQuery = Annotated[
    Literal["written", "planned", "writing", "failed", "any"],
    Query(description="Product state (default written: those with a file); any: every state, those without a "
                      "file listed as missing"),
]
LimitQuery = Annotated[int | None, Query(ge=1, le=bulk.MAX_ARCHIVE_FILES,
                                         description=f"At most this many products (1..{bulk.MAX_ARCHIVE_FILES}); "
                                                     "without it a larger search is refused (422)")]
OffsetQuery = Annotated[int, Query(ge=0, le=MAX_ID, description="Products skipped first (with limit: parts)")]
FormatQuery = Annotated[Literal["tar", "tar.gz", "zip"], Query(description="tar (default), tar.gz or zip")]

_ARCHIVE_RESPONSES = {
    200: {"content": {"application/x-tar": {}, "application/gzip": {}, "application/zip": {}},
          "description": "The tar archive: the FITS files under <channel>/, then MANIFEST.json and SHA256SUMS"},
    422: {"description": "Bad filters, or more products than an archive holds (the count and the limit)"},
}


@dataclass(frozen=True)
class ProductSearch:
    """The product filters of a bulk download (those of ``GET /products``) and its part."""

    channel: str | None
    start: dt.datetime | None
    end: dt.datetime | None
    state: ProductState | None
    frame_id: int | None
    job_id: str | None
    limit: int | None
    offset: int
    principal: object = None  #: who asks: products of private sets only to their owner (and admins)
    calibration_set: int | None = None  #: only the products of this calibration set (its id)
    level: str | None = None  #: only products of this level (``L2``)
    systematics: str | None = None  #: only products flagged with this frame-wide systematic (or ``any``)

    def select(self, session) -> bulk.ProductSelection:
        """The selection (only products the principal may see); a ``job_id`` of a job the
        principal may not see raises :class:`backend.services.visibility.NotVisible` (404)."""
        from backend.models import Job
        from backend.services import visibility
        from backend.services.products import product_conditions

        if self.job_id is not None:
            visibility.get_visible(session, Job, self.job_id, self.principal)  # another's private job: 404
        conds = product_conditions(self.principal, calibration_set=self.calibration_set, level=self.level,
                                   systematics=self.systematics)
        return bulk.search_products(session, channel=self.channel, start=self.start, end=self.end, state=self.state,
                                    frame_id=self.frame_id, job_id=self.job_id, limit=self.limit,
                                    offset=self.offset, conditions=tuple(conds))


async def product_search(
    span: TimeRangeDep,
    principal: OptionalPrincipal,
    channel: ChannelQuery = None,
    state: StateQuery = "written",
    frame_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="Only products of this frame")] = None,
    job_id: JobIdQuery = None,
    limit: LimitQuery = None,
    offset: OffsetQuery = 0,
    calibration_set: CalibrationSetQuery = None,
    level: LevelQuery = None,
    systematics: SystematicsQuery = None,
) -> ProductSearch:
    return ProductSearch(channel, span.start, span.end, None if state == "any" else ProductState(state), frame_id,
                         job_id or None, limit, offset, principal, calibration_set, level, systematics)


ProductSearchDep = Annotated[ProductSearch, Depends(product_search)]


def _archive_response(selection: bulk.ProductSelection, settings, fmt: str, stem: str) -> StreamingResponse:
    entries = bulk.archive_entries(selection.products, settings.products)  # before the session closes
    created = dt.datetime.now(dt.UTC)
    compression, media_type = {"tar": ("none", "application/x-tar"), "tar.gz": ("gzip", "application/gzip"),
                               "zip": ("zip", "application/zip")}[fmt]
    name = f"{stem}_{created:%Y%m%dT%H%M%SZ}.{fmt}"
    body = bulk.stream_tar(entries, selection.query, total=selection.total, compression=compression, created=created)
    return StreamingResponse(body, media_type=media_type, headers={
        "Content-Disposition": f'attachment; filename="{name}"',
        "X-Archive-Files": str(sum(e.path is not None for e in entries)),
        "X-Archive-Missing": str(sum(e.path is None for e in entries)),
        "Cache-Control": "no-store",
    })


@router.get("/products/archive", response_class=StreamingResponse, responses=_ARCHIVE_RESPONSES,
            summary="Download the FITS files of a product search as one tar archive")
def read_products_archive(session: SessionDep, settings: SettingsDep, search: ProductSearchDep,
                          format: FormatQuery = "tar") -> StreamingResponse:  # noqa: A002 - the query's name
    """A streamed tar of the FITS files of the products matching the filters of ``GET /products``
    (every version; written ones by default), with ``MANIFEST.json`` (file name, product id,
    channel, DATE-OBS, SHA-256 and size of the bytes sent, whether it matches the stored
    checksum, product version, calibration ids and versions; missing products with the
    reason) and ``SHA256SUMS`` last. At most
    :data:`~backend.services.bulk.MAX_ARCHIVE_FILES` products: a larger search is 422.
    """
    return _archive_response(search.select(session), settings, format, "lst_products")


@router.get("/products/download.sh", response_class=PlainTextResponse,
            responses={200: {"content": {"text/x-shellscript": {}}, "description": "A POSIX shell script"},
                       422: {"description": "Bad filters, or more products than a script holds"}},
            summary="A shell script that downloads the FITS files of a product search with curl or wget")
def read_products_script(request: Request, session: SessionDep, settings: SettingsDep,
                         search: ProductSearchDep) -> PlainTextResponse:
    """One ``fetch`` line per file (curl, wget where curl is absent) from
    ``/api/v1/products/{id}/fits``, a comment per missing product, then ``sha256sum -c`` with
    the stored checksums. The same filters and limit as ``/products/archive``."""
    selection = search.select(session)
    entries = bulk.archive_entries(selection.products, settings.products)
    text = bulk.download_script(entries, str(request.base_url), query=selection.query, total=selection.total)
    return PlainTextResponse(text, media_type="text/x-shellscript", headers={
        "Content-Disposition": 'attachment; filename="download.sh"', "Cache-Control": "no-store"})


@router.get("/events/{event_id}/products/archive", response_class=StreamingResponse, responses=_ARCHIVE_RESPONSES,
            summary="Download the FITS files of an event's products as one tar archive")
def read_event_products_archive(
    event_id: IdPath,
    session: SessionDep,
    principal: OptionalPrincipal,
    settings: SettingsDep,
    margin_min: Annotated[float, Query(ge=0, le=1440, description="Minutes added before the start and after the "
                                                                  "end of the event [min]")] = 30,
    linked_only: Annotated[bool, Query(description="Only the products linked to the event")] = False,
    format: FormatQuery = "tar",  # noqa: A002
) -> StreamingResponse:
    """The products linked to the event and the newest written product of every frame with
    DATE-OBS in [start - margin, end + margin] (end: end, peak or start time), as
    ``/products/archive`` sends them."""
    event = events_service.get_event(session, event_id, principal)
    if event is None:
        raise HTTPException(404, detail=f"no event with id {event_id}")
    selection = bulk.event_products(session, event, margin=dt.timedelta(minutes=margin_min), linked_only=linked_only)
    return _archive_response(selection, settings, format, f"lst_event_{event_id}_products")


@router.get("/events/{event_id}/products/download.sh", response_class=PlainTextResponse,
            summary="A shell script that downloads the FITS files of an event's products")
def read_event_products_script(
    request: Request,
    event_id: IdPath,
    session: SessionDep,
    principal: OptionalPrincipal,
    settings: SettingsDep,
    margin_min: Annotated[float, Query(ge=0, le=1440, description="Minutes around the event [min]")] = 30,
    linked_only: Annotated[bool, Query(description="Only the products linked to the event")] = False,
) -> PlainTextResponse:
    """The products of ``/events/{id}/products/archive`` as a curl/wget script with ``sha256sum -c``."""
    event = events_service.get_event(session, event_id, principal)
    if event is None:
        raise HTTPException(404, detail=f"no event with id {event_id}")
    selection = bulk.event_products(session, event, margin=dt.timedelta(minutes=margin_min), linked_only=linked_only)
    entries = bulk.archive_entries(selection.products, settings.products)
    text = bulk.download_script(entries, str(request.base_url), query=selection.query, total=selection.total)
    return PlainTextResponse(text, media_type="text/x-shellscript", headers={
        "Content-Disposition": f'attachment; filename="event_{event_id}_download.sh"', "Cache-Control": "no-store"})
