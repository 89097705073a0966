"""Calibration files (master darks, flats, stray-light models, ...): read-side queries.

Writing and selecting calibration files for a frame belongs to the pipelines; this module
lists and shows what is registered, which products used a file (lineage) and which would
change if it were replaced (impact).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session, joinedload

from backend.models import CalibrationFile, CalibrationKind, Frame, Product, ProductCalibrationFile, ProductState
from backend.services import visibility

__all__ = ["list_calibration_files", "get_calibration_file", "products_using_calibration_file",
           "impact_of_calibration_file"]


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


def _lineage(calibration_file_id: int) -> Select:
    return (select(Product).join(Product.frame)
            .join(ProductCalibrationFile, ProductCalibrationFile.product_id == Product.id)
            .where(ProductCalibrationFile.calibration_file_id == calibration_file_id))


def _page(session: Session, stmt: Select, limit: int, offset: int, principal: Any = None) -> tuple[list[Product], int]:
    stmt = visibility.visible(stmt, Product, principal)  # only products the viewer may see
    total = session.scalar(select(func.count()).select_from(stmt.with_only_columns(Product.id).subquery())) or 0
    rows = session.scalars(stmt.options(joinedload(Product.frame))
                           .order_by(Frame.date_obs, Product.version, Product.id).limit(limit).offset(offset))
    return list(rows), total


def products_using_calibration_file(session: Session, calibration_file_id: int, *, limit: int = 50,
                                    offset: int = 0, principal: Any = None) -> tuple[list[Product], int]:
    """Products made with the calibration file (its lineage, ``product_calibration_files``)
    that ``principal`` (None: anonymous) may see (:func:`backend.services.visibility.product_rule`).

    Every product version and state is listed, ordered by the frame's DATE-OBS, then
    product version, then id.

    Returns
    -------
    rows : list of Product
        One page; ``Product.frame`` is loaded.
    total : int
        Number of such products (all pages).
    """
    return _page(session, _lineage(calibration_file_id), limit, offset, principal)


def impact_of_calibration_file(session: Session, cal: CalibrationFile, *, limit: int = 50,
                               offset: int = 0, principal: Any = None) -> tuple[list[Product], int]:
    """Products that would change if ``cal`` were replaced by a new version (of those
    ``principal``, None: anonymous, may see; :func:`backend.services.visibility.product_rule`).

    Rule: a replacement is a new version of the same channel and kind with the same
    validity interval. The registry's selection (newest version valid at DATE-OBS, unless
    a job pins a version; :func:`backend.services.registry.select_calibrations`) would then
    choose the replacement for every frame whose DATE-OBS lies in ``[valid_from,
    valid_to)`` (``valid_to`` open when NULL). So the products affected are those that

    1. used ``cal`` (lineage table ``product_calibration_files``), and
    2. whose frame's DATE-OBS lies in ``cal``'s validity interval, and
    3. were not made with a pinned version of this kind (``parameters.pinned[kind]``):
       a pinned product keeps its pin and is not recomputed by a replacement.

    A product that used ``cal`` outside its interval can only have come from a pin and is
    therefore excluded by (2) and (3) alike. Only ``written`` products count (a planned or
    failed one has no values to change); every written version is listed, since each
    would get a successor.

    Parameters
    ----------
    cal : CalibrationFile
    limit, offset : int
        Page.

    Returns
    -------
    rows : list of Product
        One page, ordered by DATE-OBS, version, id; ``Product.frame`` loaded.
    total : int
    """
    stmt = _lineage(cal.id).where(Product.state == ProductState.written, Frame.date_obs >= cal.valid_from)
    if cal.valid_to is not None:
        stmt = stmt.where(Frame.date_obs < cal.valid_to)
    pinned = Product.parameters["pinned"][cal.kind.value].as_string()
    stmt = stmt.where(pinned.is_(None))
    return _page(session, stmt, limit, offset, principal)
