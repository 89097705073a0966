"""Calibration sets: the calibration files, options and software version of a product, by id.

A set is one channel's calibration files (ids, versions, SHA-256) and the calibration options
(their identity: the values that differ from the defaults, ``CalibrationOptions.identity``),
found or made when a job plans a frame (:func:`set_for`). Products are versioned by set
(``Product.version == CalibrationSet.id``): the same set on two frames is the same calibration.

Which sets are public (feed the public catalogue and light curves):

* the **default** set of a channel and epoch (the newest valid files, default options, nothing
  pinned that changes the selection) is public from the start;
* a set a user made (pins or options of their own) is theirs until an admin promotes it
  (:func:`promote`).

Where several public sets hold a product of one frame, the frame's public product is the one of
the set promoted (or made) last (:func:`public_product_ids`): promoting a set makes it the
public calibration over its epoch without deleting the older products.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend import __version__
from backend.models import CalibrationSet, Frame, Product, ProductState, utcnow
from backend.services.registry import SelectedCalibrations, params_hash, select_calibrations
from pipelines.calibration import CalibrationOptions
from pipelines.errors import DataError
from pipelines.utc import assume_utc

__all__ = ["set_for", "promote", "visible_to", "public_product_ids", "set_products", "describe_set",
           "get_set", "list_sets", "SetError"]


class SetError(DataError):
    """A calibration set that cannot be promoted or read (unknown id, not written...)."""


def _epoch(sel: SelectedCalibrations) -> tuple[dt.datetime | None, dt.datetime | None]:
    starts = [assume_utc(f.valid_from) for f in sel.files.values() if f.valid_from is not None]
    ends = [assume_utc(f.valid_to) for f in sel.files.values() if f.valid_to is not None]
    return (max(starts) if starts else None), (min(ends) if ends else None)


def set_for(session: Session, frame: Frame, sel: SelectedCalibrations, opts: CalibrationOptions, *,
            pinned: dict[str, int] | None, owner: str | None) -> CalibrationSet:
    """The calibration set of ``frame`` calibrated with ``sel`` and ``opts``: found, or made
    (``owner``'s; public when it is the default set). Safe when two planners make the same set
    at once (the loser of the unique key reads the winner's row).

    Raises
    ------
    CalibrationMissingError
        Only through the default selection it is compared with (never for a set that exists).
    """
    identity = opts.identity()
    ph = params_hash(identity)
    q = select(CalibrationSet).where(CalibrationSet.channel_code == frame.channel_code,
                                     CalibrationSet.calibration_key == sel.key, CalibrationSet.params_hash == ph,
                                     CalibrationSet.software_version == __version__)  # a release: its own sets
    found = session.scalar(q)
    if found is not None:
        return found
    default = not identity
    if default and pinned:  # pins that choose exactly the default files still make the default set
        try:
            also = ("psf",) if opts.deconvolve_psf and frame.channel_code == "SDI" else ()
            default = select_calibrations(session, frame.channel_code, frame.date_obs, None, naxis=frame.naxis1,
                                          also_required=also).key == sel.key
        except DataError:
            default = False
    start, end = _epoch(sel)
    row = CalibrationSet(
        channel_code=frame.channel_code, calibration_key=sel.key, params_hash=ph, options=identity,
        pinned=dict(pinned or {}),
        files=[{"id": f.id, "kind": k, "version": f.version, "sha256": f.sha256} for k, f in sorted(sel.files.items())],
        software_version=__version__, epoch_start=start, epoch_end=end, is_default=default, public=default,
        owner=None if default else owner)
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        found = session.scalar(q)
        if found is None:
            raise
        return found
    return row


def get_set(session: Session, set_id: int) -> CalibrationSet | None:
    return session.get(CalibrationSet, set_id)


def visible_to(q, user: str | None, *, admin: bool = False):
    """``q`` (a select of :class:`CalibrationSet`) limited to the sets ``user`` may see:
    public ones and their own (an admin sees all): the rule of
    :func:`backend.services.visibility.set_rule`."""
    from backend.services.visibility import Viewer, visible

    return visible(q, CalibrationSet, Viewer(user, admin))


def list_sets(session: Session, *, channel: str | None = None, user: str | None = None, admin: bool = False,
              public: bool | None = None, limit: int = 50, offset: int = 0) -> tuple[list[CalibrationSet], int]:
    """Sets visible to ``user`` (newest first), of ``channel`` when given."""
    q = visible_to(select(CalibrationSet), user, admin=admin)
    if channel:
        q = q.where(CalibrationSet.channel_code == channel)
    if public is not None:
        q = q.where(CalibrationSet.public.is_(public))
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = list(session.scalars(q.order_by(CalibrationSet.id.desc()).limit(limit).offset(offset)))
    return rows, total


def promote(session: Session, set_id: int, *, by: str, now: dt.datetime | None = None) -> CalibrationSet:
    """Make set ``set_id`` public (an admin's act, ``by``), and the newest public set of its
    channel over its epoch: frames it has products for take it as their public product. The
    caller commits.

    Raises
    ------
    SetError
        No such set.
    """
    row = session.get(CalibrationSet, set_id)
    if row is None:
        raise SetError(f"no calibration set {set_id}")
    row.public = True
    row.promoted_at = now or utcnow()
    row.promoted_by = by
    session.flush()
    return row


def _rank():
    """Order of public sets for one frame: promoted (or made) last first, then higher id."""
    return (func.coalesce(CalibrationSet.promoted_at, CalibrationSet.created_at).desc(), CalibrationSet.id.desc())


def public_product_ids(session: Session, channel: str, start: dt.datetime | None = None,
                       end: dt.datetime | None = None):
    """A select of ``(product id, frame id)``: for each frame of ``channel`` with DATE-OBS in
    ``start``..``end``, its written product of the public set ranked first (:func:`_rank`).
    Frames with no product of a public set are not in it."""
    rank = func.row_number().over(partition_by=Product.frame_id, order_by=_rank()).label("rank")
    inner = (select(Product.id.label("product_id"), Product.frame_id.label("frame_id"), rank)
             .join(Frame, Frame.id == Product.frame_id)
             .join(CalibrationSet, CalibrationSet.id == Product.calibration_set_id)
             .where(Frame.channel_code == channel, Product.state == ProductState.written,
                    CalibrationSet.public.is_(True)))
    if start is not None:
        inner = inner.where(Frame.date_obs >= start)
    if end is not None:
        inner = inner.where(Frame.date_obs <= end)
    sub = inner.subquery()
    return select(sub.c.product_id, sub.c.frame_id).where(sub.c.rank == 1)


def set_products(session: Session, set_id: int, *, limit: int = 50, offset: int = 0) -> tuple[list[Product], int]:
    """The products of set ``set_id`` (by DATE-OBS), and how many there are: one query."""
    q = select(Product).join(Frame, Frame.id == Product.frame_id).where(Product.calibration_set_id == set_id)
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = list(session.scalars(q.order_by(Frame.date_obs, Product.id).limit(limit).offset(offset)))
    return rows, total


def describe_set(row: CalibrationSet) -> dict[str, Any]:
    """The set as JSON-ready data (manifests, the API)."""
    def iso(t):
        return assume_utc(t).isoformat().replace("+00:00", "Z") if t else None

    return {"id": row.id, "channel": row.channel_code, "calibration_files": list(row.files or []),
            "options": dict(row.options or {}), "pinned": dict(row.pinned or {}), "params_hash": row.params_hash,
            "software_version": row.software_version, "epoch_start": iso(row.epoch_start),
            "epoch_end": iso(row.epoch_end), "default": bool(row.is_default), "public": bool(row.public),
            "owner": row.owner, "promoted_at": iso(row.promoted_at), "promoted_by": row.promoted_by,
            "created_at": iso(row.created_at)}
