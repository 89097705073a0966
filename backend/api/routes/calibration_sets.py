"""``/calibration-sets``: the calibrations products are versioned by, their products, promotion.

A calibration set (:mod:`backend.services.calibration_sets`) is one channel's calibration
files (ids, versions, SHA-256), the options and the software version, under one id; a
product's ``version`` is its set's id. Reads are anonymous and see the public sets; a token's
user also sees their own; an admin sees all. A set (or its products) that the caller may not
see is a 404, as if it did not exist. Promotion (``POST /{id}/promote``) needs ``admin``.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from backend.api.deps import AdminPrincipal, OptionalPrincipal, SessionDep
from backend.api.params import ChannelQuery, IdPath, PaginationDep
from backend.api.schemas import Page, ProductPublic, ProductsPublic, UTCDateTime
from backend.models import CalibrationSet, ProductState
from backend.services import calibration_sets as sets_service
from backend.services import set_access
from backend.services.event_visibility import viewer_of

router = APIRouter(prefix="/calibration-sets", tags=["calibration sets"])
log = logging.getLogger(__name__)


class CalibrationFileRef(BaseModel):
    """One calibration file of a set."""

    id: int
    kind: str = Field(examples=["dark"])
    version: int
    sha256: str | None


class CalibrationSetPublic(BaseModel):
    """A calibration set: what a product of this version was made with.

    ``default``: the newest valid files with default options (public from the start);
    ``public``: feeds the public catalogue and light curves; ``owner``: the user whose job
    made it (None: the platform), private to them until an admin promotes it. ``epoch_start``
    / ``epoch_end``: the DATE-OBS span in which all its files are valid (None: open).
    """

    id: int
    channel: str
    calibration_files: list[CalibrationFileRef]
    options: dict[str, Any] = Field(description="Calibration options that differ from the defaults")
    pinned: dict[str, Any] = Field(description="{kind: version} pinned by the job that made it")
    params_hash: str
    software_version: str
    epoch_start: UTCDateTime | None
    epoch_end: UTCDateTime | None
    default: bool
    public: bool
    owner: str | None
    promoted_at: UTCDateTime | None
    promoted_by: str | None
    created_at: UTCDateTime | None


class CalibrationSetDetail(CalibrationSetPublic):
    """A set with what it covers: its products and the DATE-OBS span of their frames."""

    products: int = Field(description="Products of this set, any state")
    written_products: int
    frames: int = Field(description="Distinct frames with a product of this set")
    first_date_obs: UTCDateTime | None
    last_date_obs: UTCDateTime | None
    products_url: str


class DetectionQueued(BaseModel):
    detector: str
    channel: str
    start: UTCDateTime
    end: UTCDateTime


class PromotionPublic(BaseModel):
    """A promoted set and the public detections queued over the frames it has products for."""

    set: CalibrationSetDetail
    detections_queued: list[DetectionQueued]


CalibrationSetsPublic = Page[CalibrationSetPublic]


def _public(row: CalibrationSet) -> dict[str, Any]:
    d = sets_service.describe_set(row)
    for k in ("epoch_start", "epoch_end", "promoted_at", "created_at"):
        if d[k] is not None:
            d[k] = dt.datetime.fromisoformat(d[k].replace("Z", "+00:00"))
    return d


def _detail(session, row: CalibrationSet) -> CalibrationSetDetail:
    span = set_access.set_span(session, row.id)
    return CalibrationSetDetail(**_public(row), products=span.products, written_products=span.written,
                                frames=span.frames, first_date_obs=span.first_date_obs,
                                last_date_obs=span.last_date_obs,
                                products_url=f"/api/v1/calibration-sets/{row.id}/products")


def _set_or_404(session, set_id: int, principal) -> CalibrationSet:
    row = set_access.visible_set(session, set_id, principal)
    if row is None:
        raise HTTPException(404, detail=f"no calibration set with id {set_id}")
    return row


@router.get("", response_model=CalibrationSetsPublic, summary="List calibration sets")
def read_calibration_sets(
    session: SessionDep,
    page: PaginationDep,
    principal: OptionalPrincipal,
    channel: ChannelQuery = None,
    public: Annotated[bool | None, Query(description="true: public sets only; false: private ones only")] = None,
) -> CalibrationSetsPublic:
    """The sets the caller may see (anonymous: the public ones; a token's user: also theirs;
    an admin: all), newest first, of ``channel`` when given."""
    user, sees_all = viewer_of(principal)
    rows, total = sets_service.list_sets(session, channel=channel, user=user,
                                         admin=sees_all, public=public, limit=page.limit, offset=page.offset)
    return CalibrationSetsPublic(items=[CalibrationSetPublic(**_public(r)) for r in rows], total=total,
                                 limit=page.limit, offset=page.offset)


@router.get("/{set_id}", response_model=CalibrationSetDetail, summary="One calibration set and what it covers")
def read_calibration_set(set_id: IdPath, session: SessionDep, principal: OptionalPrincipal) -> CalibrationSetDetail:
    """The set's files, options and software version, with how many products and frames it
    has and the DATE-OBS span of those frames. 404 for a set the caller may not see."""
    return _detail(session, _set_or_404(session, set_id, principal))


@router.get("/{set_id}/products", response_model=ProductsPublic, summary="The products of one calibration set")
def read_calibration_set_products(
    set_id: IdPath,
    session: SessionDep,
    page: PaginationDep,
    principal: OptionalPrincipal,
    state: Annotated[ProductState | None, Query(description="planned, writing, written or failed")] = None,
) -> ProductsPublic:
    """The products made with this set, by DATE-OBS (one query: the page and its total).
    404 for a set the caller may not see."""
    _set_or_404(session, set_id, principal)
    rows, total = set_access.set_products_page(session, set_id, state=state, limit=page.limit, offset=page.offset)
    return ProductsPublic(items=[ProductPublic.model_validate(r) for r in rows], total=total,
                          limit=page.limit, offset=page.offset)


@router.post(
    "/{set_id}/promote",
    response_model=PromotionPublic,
    summary="Promote a calibration set to public (admin)",
    responses={401: {"description": "No API token, or an unknown, revoked or expired one"},
               403: {"description": "The token lacks scope admin"},
               404: {"description": "No such calibration set"},
               503: {"description": "Promoted, but the public detections could not be queued (broker down)"}},
)
def promote_calibration_set(set_id: IdPath, session: SessionDep, principal: AdminPrincipal) -> PromotionPublic:
    """Make the set public and the newest public set of its channel over its epoch (frames
    it has products for take them as their public products), then queue the public
    detections (as the platform) over the DATE-OBS span of its written products: its
    detections enter the public catalogue. Promoting a public set again makes it the newest
    public one again. Needs scope ``admin``."""
    from kombu.exceptions import OperationalError

    row = session.get(CalibrationSet, set_id)
    if row is None:
        raise HTTPException(404, detail=f"no calibration set with id {set_id}")
    sets_service.promote(session, set_id, by=principal.user)
    session.commit()
    try:
        queued = set_access.queue_public_detections(session, row)
    except OperationalError as exc:
        log.warning("set %d promoted; public detections not queued: %s", set_id, exc)
        raise HTTPException(503, detail=f"calibration set {set_id} was promoted, but its public detections could "
                                        "not be queued (the broker cannot be reached); run `lstdp detect` over its "
                                        "span or promote it again") from None
    return PromotionPublic(set=_detail(session, row), detections_queued=[DetectionQueued(**q) for q in queued])
