"""Frames (raw L0/L1 observations): read-side queries.

Times are DATE-OBS in UTC; a range filter is inclusive at both ends.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from backend.models import EventFrame, Frame

__all__ = ["list_frames", "get_frame", "frame_ids_for_event", "date_obs_span"]


def _filtered(stmt: Select, *, channel: str | None, start: dt.datetime | None, end: dt.datetime | None) -> Select:
    if channel is not None:
        stmt = stmt.where(Frame.channel_code == channel)
    if start is not None:
        stmt = stmt.where(Frame.date_obs >= start)
    if end is not None:
        stmt = stmt.where(Frame.date_obs <= end)
    return stmt


def list_frames(
    session: Session,
    *,
    channel: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Frame], int]:
    """Frames of ``channel`` whose DATE-OBS lies in [``start``, ``end``], oldest first.

    Parameters
    ----------
    channel : str, optional
        Canonical channel code (``SDI``, ``WST``, ``SCI-UV``, ``SCI-WL``).
    start, end : datetime, optional
        Aware UTC bounds on DATE-OBS (inclusive).
    limit, offset : int
        Page size and first row.

    Returns
    -------
    rows : list of Frame
        One page, ordered by DATE-OBS then id.
    total : int
        Number of frames matching the filters (all pages).
    """
    total = session.scalar(_filtered(select(func.count()).select_from(Frame), channel=channel, start=start, end=end)) or 0
    stmt = _filtered(select(Frame), channel=channel, start=start, end=end)
    rows = list(session.scalars(stmt.order_by(Frame.date_obs, Frame.id).limit(limit).offset(offset)))
    return rows, total


def get_frame(session: Session, frame_id: int) -> Frame | None:
    """The frame with id ``frame_id`` or ``None``."""
    return session.get(Frame, frame_id)


def frame_ids_for_event(session: Session, event_id: int) -> list[int]:
    """Ids of the frames an event is linked to (``event_frames``), ascending."""
    return list(session.scalars(
        select(EventFrame.frame_id).where(EventFrame.event_id == event_id).order_by(EventFrame.frame_id)
    ))


def date_obs_span(session: Session, channel: str | None = None) -> tuple[dt.datetime | None, dt.datetime | None]:
    """Earliest and latest DATE-OBS of the ingested frames (``(None, None)`` when there are none)."""
    stmt = select(func.min(Frame.date_obs), func.max(Frame.date_obs))
    if channel is not None:
        stmt = stmt.where(Frame.channel_code == channel)
    lo, hi = session.execute(stmt).one()
    return lo, hi
