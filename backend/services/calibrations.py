"""Calibration files (master darks, flats, stray-light models, ...): read-side queries.

Writing and selecting calibration files for a frame belongs to the pipelines; this module
lists and shows what is registered.
"""

from __future__ import annotations

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from backend.models import CalibrationFile, CalibrationKind

__all__ = ["list_calibration_files", "get_calibration_file"]


def _filtered(stmt: Select, *, channel: str | None, kind: CalibrationKind | None) -> Select:
    if channel is not None:
        stmt = stmt.where(CalibrationFile.channel_code == channel)
    if kind is not None:
        stmt = stmt.where(CalibrationFile.kind == kind)
    return stmt


def list_calibration_files(
    session: Session,
    *,
    channel: str | None = None,
    kind: CalibrationKind | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[CalibrationFile], int]:
    """Calibration files of ``channel`` and ``kind``.

    Ordered by channel, kind, then newest version first (the order in which the
    selection rule considers them).

    Returns
    -------
    rows : list of CalibrationFile
    total : int
        Number of rows matching the filters (all pages).
    """
    total = session.scalar(_filtered(select(func.count()).select_from(CalibrationFile), channel=channel, kind=kind)) or 0
    stmt = _filtered(select(CalibrationFile), channel=channel, kind=kind).order_by(
        CalibrationFile.channel_code, CalibrationFile.kind, CalibrationFile.version.desc(), CalibrationFile.id
    )
    return list(session.scalars(stmt.limit(limit).offset(offset))), total


def get_calibration_file(session: Session, calibration_file_id: int) -> CalibrationFile | None:
    """The calibration file with id ``calibration_file_id`` or ``None``."""
    return session.get(CalibrationFile, calibration_file_id)
