"""Where LST frames and catalogue events meet: the UTC days with frames, and the events of each.

The landing page links to these windows (``frontend/templates/_demo_windows.html``), each to
the events list filtered to its day; the README's "What the demo shows" names the demo's.
They are computed from the database, never listed by hand: a day is a window when at least
one frame was observed in it and at least one event (of any source) overlaps it, with the
events list's own overlap rule (:func:`backend.services.event_search.filter_conditions`), so
the count shown beside a link is the number of events the link lists.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.models import Event, Frame
from backend.services.event_search import EventFilters, filter_conditions
from pipelines.utc import as_utc

__all__ = ["ObservingWindow", "observing_windows", "newest_frame_day", "MAX_WINDOWS"]

#: Most windows returned (newest first): the landing page is not an archive index; one
#: index probe per day with frames finds them (:func:`newest_frame_day`).
MAX_WINDOWS = 20
_DAY = dt.timedelta(days=1)


@dataclass
class ObservingWindow:
    """One UTC day with LST frames and catalogue or detected events.

    Attributes
    ----------
    day : datetime.date
    start, end : datetime.datetime
        The day's bounds (aware UTC, ``end`` = next midnight): the events-list filter.
    frames : dict of str to int
        Frames per channel code observed that day.
    first_frame, last_frame : datetime.datetime
        DATE-OBS of the day's first and last frame (aware UTC).
    events : dict of str to int
        Events overlapping the day per source (``goes_xrs``, ``cdaw``, ``detected``, ...).
    """

    day: dt.date
    start: dt.datetime
    end: dt.datetime
    frames: dict[str, int] = field(default_factory=dict)
    first_frame: dt.datetime | None = None
    last_frame: dt.datetime | None = None
    events: dict[str, int] = field(default_factory=dict)

    @property
    def n_events(self) -> int:
        """All events overlapping the day."""
        return sum(self.events.values())

    @property
    def query(self) -> dict[str, str]:
        """The events-list query of the day (``start``/``end`` as ISO 8601 UTC, minutes)."""
        return {"start": self.start.strftime("%Y-%m-%dT%H:%M"), "end": self.end.strftime("%Y-%m-%dT%H:%M")}


def _midnight(t: dt.datetime) -> dt.datetime:
    t = as_utc(t)
    return dt.datetime(t.year, t.month, t.day, tzinfo=dt.UTC)


def newest_frame_day(session: Session, before: dt.datetime | None = None) -> dt.datetime | None:
    """The UTC midnight of the newest day with a frame before ``before`` (None: of all frames).

    One indexed ``max(frames.date_obs)`` probe: walking back day by day costs one query per
    day with frames (a skip scan), never a scan of every frame.
    """
    q = select(func.max(Frame.date_obs))
    if before is not None:
        q = q.where(Frame.date_obs < before)
    t = session.scalar(q)
    return None if t is None else _midnight(t)


def observing_windows(session: Session, *, limit: int = MAX_WINDOWS,
                      include_quiet: bool = False) -> list[ObservingWindow]:
    """The days where LST frames and events meet, newest first (at most ``limit``).

    Parameters
    ----------
    session : sqlalchemy.orm.Session
    limit : int
        Most windows returned (default :data:`MAX_WINDOWS`).
    include_quiet : bool
        Also the days with frames and no event (``events`` empty); by default they are
        skipped and do not count.

    Returns
    -------
    list of ObservingWindow
        Each with its frames per channel and its events per source.
    """
    out: list[ObservingWindow] = []
    day = newest_frame_day(session)
    while day is not None and len(out) < limit:
        start, end = day, day + _DAY
        rows = session.execute(
            select(Frame.channel_code, func.count(), func.min(Frame.date_obs), func.max(Frame.date_obs))
            .where(Frame.date_obs >= start, Frame.date_obs < end).group_by(Frame.channel_code)).all()
        ev = dict(session.execute(
            select(Event.source, func.count()).where(*filter_conditions(session, EventFilters(start=start, end=end)))
            .group_by(Event.source)).all())
        if rows and (ev or include_quiet):
            out.append(ObservingWindow(
                day=start.date(), start=start, end=end, frames={c: int(n) for c, n, _, _ in sorted(rows)},
                first_frame=as_utc(min(r[2] for r in rows)), last_frame=as_utc(max(r[3] for r in rows)),
                events={src: int(n) for src, n in sorted(ev.items())}))
        day = newest_frame_day(session, start)
    return out
