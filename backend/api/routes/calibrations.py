"""``/calibration-files``: versioned calibration inputs (darks, flats, stray light, ...)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from backend.api.deps import OptionalPrincipal, SessionDep
from backend.api.params import ChannelQuery, IdPath, PaginationDep
from backend.api.schemas import (
    CalibrationFilePublic,
    CalibrationFilesPublic,
    CalibrationImpactPublic,
    ProductPublic,
    ProductsPublic,
)
from backend.models import CalibrationKind
from backend.services import calibrations as calibrations_service

router = APIRouter(prefix="/calibration-files", tags=["calibration files"])


@router.get("", response_model=CalibrationFilesPublic, summary="List calibration files")
def read_calibration_files(
    session: SessionDep,
    page: PaginationDep,
    channel: ChannelQuery = None,
    kind: Annotated[CalibrationKind | None, Query(description="dark, flat, stray_light, radiometric, mask_geometry, psf")] = None,
) -> CalibrationFilesPublic:
    """Calibration files of a channel and kind, newest version first."""
    rows, total = calibrations_service.list_calibration_files(
        session, channel=channel, kind=kind, limit=page.limit, offset=page.offset
    )
    return CalibrationFilesPublic(items=[CalibrationFilePublic.model_validate(r) for r in rows], total=total,
                                  limit=page.limit, offset=page.offset)


@router.get("/{calibration_file_id}", response_model=CalibrationFilePublic, summary="One calibration file")
def read_calibration_file(calibration_file_id: IdPath, session: SessionDep) -> CalibrationFilePublic:
    """One calibration file by id."""
    return CalibrationFilePublic.model_validate(_file_or_404(session, calibration_file_id))


def _file_or_404(session, calibration_file_id: int):
    row = calibrations_service.get_calibration_file(session, calibration_file_id)
    if row is None:
        raise HTTPException(404, detail=f"no calibration file with id {calibration_file_id}")
    return row


@router.get("/{calibration_file_id}/products", response_model=ProductsPublic,
            summary="Products made with this calibration file")
def read_calibration_file_products(calibration_file_id: IdPath, session: SessionDep,
                                   page: PaginationDep, principal: OptionalPrincipal) -> ProductsPublic:
    """Every product (all versions and states) whose calibration set included this file, by
    DATE-OBS; only those the caller may see (a private set's: its owner and admins)."""
    _file_or_404(session, calibration_file_id)
    rows, total = calibrations_service.products_using_calibration_file(
        session, calibration_file_id, limit=page.limit, offset=page.offset, principal=principal)
    return ProductsPublic(items=[ProductPublic.model_validate(r) for r in rows], total=total,
                          limit=page.limit, offset=page.offset)


IMPACT_RULE = ("written products that used this file, whose frame's DATE-OBS lies in its validity interval "
               "[valid_from, valid_to), and that were not made with a pinned version of this kind: a new "
               "version with the same interval would be selected for exactly these frames")


@router.get("/{calibration_file_id}/impact", response_model=CalibrationImpactPublic,
            summary="Products that would change if this calibration file were replaced")
def read_calibration_file_impact(calibration_file_id: IdPath, session: SessionDep,
                                 page: PaginationDep, principal: OptionalPrincipal) -> CalibrationImpactPublic:
    """Products a replacement of this file would recompute.

    The rule (see :func:`backend.services.calibrations.impact_of_calibration_file`): the
    written products that used this file, whose frame's DATE-OBS lies in the file's
    validity interval, and that did not pin a version of this kind. The registry picks
    the newest version valid at DATE-OBS, so a new version with the same interval would
    be chosen for exactly those frames; a recalibration job then makes new product
    versions and keeps these. Only products the caller may see are listed.
    """
    cal = _file_or_404(session, calibration_file_id)
    rows, total = calibrations_service.impact_of_calibration_file(session, cal, limit=page.limit, offset=page.offset,
                                                                 principal=principal)
    return CalibrationImpactPublic(items=[ProductPublic.model_validate(r) for r in rows], total=total,
                                   limit=page.limit, offset=page.offset,
                                   calibration_file=CalibrationFilePublic.model_validate(cal), rule=IMPACT_RULE)
