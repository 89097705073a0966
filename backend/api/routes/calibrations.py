"""``/calibration-files``: versioned calibration inputs (darks, flats, stray light, ...)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from backend.api.deps import SessionDep
from backend.api.routes.params import ChannelQuery, IdPath, PaginationDep
from backend.api.schemas import CalibrationFilePublic, CalibrationFilesPublic
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
    row = calibrations_service.get_calibration_file(session, calibration_file_id)
    if row is None:
        raise HTTPException(404, detail=f"no calibration file with id {calibration_file_id}")
    return CalibrationFilePublic.model_validate(row)
