"""Event density: counts of ALL matching events per HEK type in time bins, aggregated in SQL.

:func:`event_histogram` answers ``GET /api/v1/events/histogram`` and draws the events page's
landing timeline. It takes the search's own filters (:class:`~backend.services.event_search.
EventFilters`, the same SQL conditions: :func:`~backend.services.event_search.filter_conditions`),
so its counts add up to the search's exact count.

Binning
    Each event is counted once, in the bin of its ``start_time``; an event that started before
    the window's ``start`` and overlaps it (the search's overlap rule) is counted in the first
    bin (it is under way there). The bin width is the smallest of :data:`BIN_WIDTHS_S` that
    covers the window in at most ``bins`` bins (edges included; ``bins=1`` may give 2) (the zoom level chooses it: a year of events in
    days, an hour in minutes), with edges on multiples of the width from the Unix epoch (UTC
    midnights for widths of a day and less). Without ``start``/``end`` the window is from the
    first to the last matching start time.
SQL
    One ``GROUP BY (bin, event_type)`` over the matching rows: ``floor((epoch(start_time) -
    origin) / width)`` with ``date_part('epoch', ...)`` on PostgreSQL (an index-only scan of
    ``ix_events_start_id`` / ``ix_events_type_start_id``, whose INCLUDE columns hold what the
    filters test) and ``julianday`` on SQLite. One more query reads the window's extent when
    it is open.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

from sqlalchemy import Float, Integer, cast, func, literal, select
from sqlalchemy.orm import Session

from backend.models import Event
from backend.render.figures_density import width_label  # noqa: F401 - re-exported (__all__)
from backend.services.event_search import EventFilters, filter_conditions
from pipelines.utc import as_utc

__all__ = ["BIN_WIDTHS_S", "DEFAULT_BINS", "MAX_BINS", "Histogram", "choose_bin_width", "event_histogram",
           "width_label"]

_E = Event.__table__.c
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_DAY = 86_400

#: Bin widths [s]: 1, 5, 15, 30 min; 1, 3, 6, 12 h; 1, 2, 7, 14 days; 30, 91, 365 days (a
#: wider window takes a multiple of 365 days).
BIN_WIDTHS_S: tuple[int, ...] = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, _DAY, 2 * _DAY,
                                 7 * _DAY, 14 * _DAY, 30 * _DAY, 91 * _DAY, 365 * _DAY)
DEFAULT_BINS = 120
MAX_BINS = 1000


#: Where histogram bins may lie (see :func:`event_histogram`).
BIN_RANGE = (dt.datetime(1600, 1, 1, tzinfo=dt.UTC), dt.datetime(2200, 1, 1, tzinfo=dt.UTC))


def choose_bin_width(span_s: float, bins: int) -> int:
    """The smallest width of :data:`BIN_WIDTHS_S` [s] that covers ``span_s`` [s] in at most
    ``bins`` bins; above the widest, whole multiples of 365 days. ValueError for ``bins < 1``."""
    if bins < 1:
        raise ValueError(f"bins must be at least 1, not {bins}")
    for w in BIN_WIDTHS_S:
        if span_s / w < bins:
            return w
    return int(math.ceil(span_s / bins / (365 * _DAY) + 1e-12)) * 365 * _DAY


@dataclass
class Histogram:
    """Counts per HEK type in time bins.

    Attributes
    ----------
    start, end : datetime.datetime or None
        The window counted (aware UTC); None when no event matches an open window.
    bin_s : int
        Bin width [s].
    edges : list of datetime.datetime
        ``len(counts[t]) + 1`` bin edges (aware UTC); bin ``i`` is ``[edges[i], edges[i+1])``.
    counts : dict of str to list of int
        Per HEK type (sorted by code), one count per bin.
    total : int
        Sum of all counts: the number of events matching the filters (exact).
    """

    start: dt.datetime | None
    end: dt.datetime | None
    bin_s: int
    edges: list[dt.datetime] = field(default_factory=list)
    counts: dict[str, list[int]] = field(default_factory=dict)
    total: int = 0

    @property
    def by_type(self) -> dict[str, int]:
        """Events per HEK type."""
        return {t: sum(c) for t, c in self.counts.items()}


def _epoch_s(session: Session, col):
    """SQL: seconds since 1970-01-01 UTC of a timestamp column."""
    if session.get_bind().dialect.name == "postgresql":
        # date_part gives double precision; extract() gives numeric since PostgreSQL 14, whose
        # arithmetic is several times slower per row
        return func.date_part("epoch", col)
    return (func.julianday(col) - literal(2440587.5)) * literal(86400.0)


def _floor(session: Session, x):
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.floor(x), Integer)
    return cast(x, Integer)  # SQLite: x >= 0 here, where truncation is floor


def event_histogram(session: Session, filters: EventFilters | None = None, *, bins: int = DEFAULT_BINS) -> Histogram:
    """Counts of the events matching ``filters`` per HEK type and time bin.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
    filters : EventFilters, optional
        The search's filters; ``start``/``end`` are the window binned (open ends: the first /
        last matching start time).
    bins : int
        Most bins (1..:data:`MAX_BINS`); the width is chosen by :func:`choose_bin_width`.

    Returns
    -------
    Histogram
        ``total`` equals the search's exact count for the same filters.

    Raises
    ------
    ValueError
        For ``bins`` outside 1..MAX_BINS.
    """
    if not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be within 1..{MAX_BINS}, not {bins}")
    f = filters or EventFilters()
    conds = filter_conditions(session, f)
    lo, hi = f.start, f.end
    if lo is None or hi is None:
        q = select(func.min(_E.start_time), func.max(_E.start_time))
        first, last = session.execute(q.where(*conds) if conds else q).one()
        if first is None:
            return Histogram(lo, hi, BIN_WIDTHS_S[0])
        lo = lo if lo is not None else as_utc(first)
        hi = hi if hi is not None else as_utc(last)
    # bins are laid out within 1600..2200 UTC (no solar record predates the first telescopic
    # sunspot drawings, 1610): a window asked from year 1 to 9999 would push edges floored to a
    # multiple of the width out of datetime's range. Events outside fall in the end bins, so the
    # counts still add up to the search's total.
    lo, hi = min(max(as_utc(lo), BIN_RANGE[0]), BIN_RANGE[1]), max(min(as_utc(hi), BIN_RANGE[1]), BIN_RANGE[0])
    span = max((hi - lo).total_seconds(), 0.0)
    lo_s = (lo - _EPOCH).total_seconds()
    hi_s = (hi - _EPOCH).total_seconds()
    width = choose_bin_width(span, bins)
    while True:  # edges on multiples of the width can take one bin more: then the next width
        origin = math.floor(lo_s / width) * width
        n = max(1, int(math.floor((hi_s - origin) / width)) + 1)
        if n <= bins or bins == 1 and n <= 2:
            break
        wider = [w for w in BIN_WIDTHS_S if w > width]
        width = wider[0] if wider else width + 365 * _DAY
    t = _epoch_s(session, _E.start_time)
    if f.start is not None:  # events under way at the window's start count in its first bin
        low = literal(float(lo_s), Float)
        t = func.greatest(t, low) if session.get_bind().dialect.name == "postgresql" else func.max(t, low)
    idx = _floor(session, (t - literal(float(origin), Float)) / literal(float(width), Float)).label("bin")
    q = select(idx, _E.event_type, func.count().label("n")).group_by(idx, _E.event_type)
    if conds:
        q = q.where(*conds)
    counts: dict[str, list[int]] = {}
    total = 0
    for i, code, k in session.execute(q):
        i = min(max(int(i), 0), n - 1)  # float rounding at the window's own edges
        counts.setdefault(code, [0] * n)[i] += int(k)
        total += int(k)
    edges = [_EPOCH + dt.timedelta(seconds=origin + j * width) for j in range(n + 1)]
    return Histogram(lo, hi, width, edges, dict(sorted(counts.items())), total)
