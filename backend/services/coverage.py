"""Coverage: which time spans each event source and each LST channel covers, and the gaps.

A window no catalogue covers and a quiet window must read differently ("CDAW: no coverage
after 2013-12-31" against "0 events"). Coverage comes from :data:`PROVIDERS`, one object
per source or channel with ``name``, ``kind``, ``title`` and
``coverage(session, start, end, settings) -> SourceCoverage``; one more source (e.g. the
GOES XRS time series) is one more line in :data:`PROVIDERS`.

Providers
    * :class:`CatalogueProvider` (one per catalogue of :data:`pipelines.catalogues.CATALOGUES`):
      what the imported files *say* they cover, recorded at import time in
      ``catalogue_coverage`` (:func:`record_catalogue_coverage`, called by
      :func:`backend.services.events.import_catalogue`). Gaps: "catalogue begins/ends",
      "no catalogue file covers this", "not imported".
    * :class:`ChannelProvider` (one per LST channel): where written public L2 products exist,
      from the frames and their products (a user's private products count nowhere, their
      errors are never shown). An observing *run* is frames whose spacing stays within
      :data:`GAP_CADENCES` times the run's own median spacing (:func:`observing_runs`; a
      6-min run is one run at 6 min whatever the channel's nominal cadence); a run is one
      covered span, a break of it, or frames without a written product, is a gap, with its
      reasons: no frames, failed products (with the commonest error), frames not calibrated,
      quarantined files (DATE-OBS read from the quarantined file).
    * :class:`DetectedProvider` (``detected``): the union of the channels' covered spans
      (the detectors run on written L2 products; no product, no detection).

Spans are half-open ``[start, end)`` in aware UTC.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from backend.models import CatalogueCoverage, Frame, Product, ProductState, utcnow
from pipelines.catalogues import CATALOGUES, DETECTED, DETECTED_SOURCE, source_label
from pipelines.catalogues.coverage import FileCoverage, file_coverage
from pipelines.catalogues.records import CatalogueError
from pipelines.channels import CHANNELS
from pipelines.utc import as_utc

__all__ = [
    "GAP_CADENCES",
    "MIN_RUN_FRAMES",
    "observing_runs",
    "Span",
    "Gap",
    "SourceCoverage",
    "WindowCoverage",
    "CoverageProvider",
    "CatalogueProvider",
    "ChannelProvider",
    "DetectedProvider",
    "PROVIDERS",
    "record_catalogue_coverage",
    "coverage_report",
    "window_coverage",
    "quarantined_frames",
]

#: A spacing of more than this many times its run's own median spacing (the run's cadence)
#: between two frames is a gap (:func:`observing_runs`): a frame or two dropped is not a gap
#: (at most 3 cadences), a pause of five cadences or more is. For SDI at its nominal 60 s this
#: is the bound the flare detector calls a series *sparse* at (``pipelines.detect.flares``:
#: ``sparse_cadence_s`` = 300 s): beyond it a flare's rise can fall between two frames.
GAP_CADENCES = 5.0
#: Fewest frames of a run: its median spacing must come from at least two spacings, so that
#: one spacing is never measured against itself (two frames an hour apart are two frames,
#: not an hourly run). Fewer frames are isolated frames, each covering its exposure.
MIN_RUN_FRAMES = 3
#: Frames this far outside a window are read too, so that a run crossing the window's edge is
#: measured with its own spacing (a run at a cadence slower than this is cut at the edge).
RUN_CONTEXT = dt.timedelta(hours=6)

@dataclass(frozen=True)
class Span:
    """A covered span ``[start, end)``; ``complete`` False: a selection or a cut answer."""

    start: dt.datetime
    end: dt.datetime
    complete: bool = True
    note: str = ""


@dataclass(frozen=True)
class Gap:
    """An uncovered span ``[start, end)`` with the reason(s) known."""

    start: dt.datetime
    end: dt.datetime
    reason: str


@dataclass
class SourceCoverage:
    """Coverage of one source or channel over a window.

    Attributes
    ----------
    name : str
        Source (``cdaw``...), ``detected`` or channel code (``SDI``...).
    kind : str
        ``catalogue``, ``detected`` or ``channel``.
    title : str
    start, end : datetime.datetime or None
        The window looked at (None: open; then the source's own extent).
    spans : list of Span
        Covered spans, clipped to the window, in time order, merged where they touch.
    gaps : list of Gap
        The rest of the window (between and around the spans), with reasons.
    basis : str
        Where the coverage comes from.
    """

    name: str
    kind: str
    title: str
    start: dt.datetime | None
    end: dt.datetime | None
    spans: list[Span] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    basis: str = ""


@dataclass(frozen=True)
class WindowCoverage:
    """Whether a source covers a search window, in one status and one sentence.

    ``status``: ``covered`` (the whole window, complete), ``partial`` (part of it),
    ``selection`` (covered by a list that is a selection, not complete), ``none`` (no part),
    ``unknown`` (nothing imported for the source). ``message`` e.g. "CDAW: no coverage
    after 2013-12-31".
    """

    source: str
    status: str
    message: str
    spans: tuple[Span, ...] = ()


class CoverageProvider(Protocol):
    """One source of coverage (see the module docstring)."""

    name: str
    kind: str
    title: str

    def coverage(self, session: Session, start: dt.datetime | None, end: dt.datetime | None,
                 settings=None) -> SourceCoverage: ...


def _day(t: dt.datetime) -> str:
    return as_utc(t).strftime("%Y-%m-%d")


def _last_day(end: dt.datetime) -> str:
    """The last UTC day of a half-open span ending at ``end``."""
    return _day(as_utc(end) - dt.timedelta(microseconds=1))


def _when(t: dt.datetime) -> str:
    t = as_utc(t)
    return _day(t) if (t.hour, t.minute, t.second, t.microsecond) == (0, 0, 0, 0) else t.strftime("%Y-%m-%d %H:%M:%S")


def _shift(t: dt.datetime, d: dt.timedelta) -> dt.datetime:
    """``t + d``, held at ``datetime``'s limits (a window from year 1 or to year 9999)."""
    try:
        return t + d
    except OverflowError:
        return dt.datetime.min.replace(tzinfo=dt.UTC) if d < dt.timedelta(0) else dt.datetime.max.replace(tzinfo=dt.UTC)


def _merge(spans: list[Span], slack: dt.timedelta = dt.timedelta(0)) -> list[Span]:
    """Spans sorted and merged where they overlap or touch (within ``slack``)."""
    out: list[Span] = []
    for s in sorted(spans, key=lambda s: (s.start, s.end)):
        if out and s.start <= out[-1].end + slack and s.complete == out[-1].complete:
            last = out[-1]
            out[-1] = Span(last.start, max(last.end, s.end), last.complete, last.note)
        else:
            out.append(s)
    return out


def observing_runs(times: list[dt.datetime], *, factor: float = GAP_CADENCES,
                   min_frames: int = MIN_RUN_FRAMES) -> list[tuple[int, int]]:
    """Split sorted frame times into observing runs by their own cadence.

    A run is consecutive frames whose every spacing is at most ``factor`` times the run's
    median spacing. Found top-down: a stretch of frames is cut at each spacing above
    ``factor`` times its median spacing and each piece is split again by its own median,
    until no piece is cut; consecutive pieces of fewer than ``min_frames`` frames (frames a
    faster cadence left alone, e.g. a 6-min run after a 1-min one) are joined and split again
    by *their* median spacing. Pieces that stay shorter than ``min_frames`` are isolated
    frames, not runs.

    Parameters
    ----------
    times : list of datetime.datetime
        Frame times, sorted ascending (equal times allowed).
    factor : float
        Break factor (default :data:`GAP_CADENCES`).
    min_frames : int
        Fewest frames of a run (default :data:`MIN_RUN_FRAMES`).

    Returns
    -------
    list of (int, int)
        ``(first, last)`` indices into ``times`` (inclusive) of each run, in time order;
        isolated frames belong to none.
    """
    import numpy as np

    n = len(times)
    if n < min_frames:
        return []
    t = np.array([(x - times[0]).total_seconds() for x in times])
    d = np.diff(t)
    runs: list[tuple[int, int]] = []
    todo = [(0, n - 1)]
    while todo:
        a, b = todo.pop()
        if b - a + 1 < min_frames:
            continue
        gaps = d[a:b]
        moving = gaps[gaps > 0]  # frames at one time (equal DATE-OBS) set no cadence
        cadence = float(np.median(moving)) if moving.size else 0.0
        cuts = np.flatnonzero(gaps > factor * cadence) + a  # frame i ends a piece when d[i] is a break
        if cuts.size == 0:
            runs.append((a, b))
            continue
        pieces = list(zip([a, *(cuts + 1).tolist()], [*cuts.tolist(), b], strict=True))
        small: list[tuple[int, int]] = []
        for lo, hi in [*pieces, (b + 1, b)]:  # a sentinel flushes the last small stretch
            if hi - lo + 1 < min_frames and lo <= b:
                small.append((lo, hi))
                continue
            if small:
                joined = (small[0][0], small[-1][1])
                if joined != (a, b) and joined[1] - joined[0] + 1 >= min_frames:
                    todo.append(joined)
                small = []
            if lo <= b:
                todo.append((lo, hi))
    return sorted(runs)


def _clip(spans: list[Span], start: dt.datetime | None, end: dt.datetime | None) -> list[Span]:
    out = []
    for s in spans:
        a = max(s.start, start) if start is not None else s.start
        b = min(s.end, end) if end is not None else s.end
        if b > a or (b == a and s.start == s.end and (start is None or a >= start) and (end is None or a <= end)):
            out.append(Span(a, b, s.complete, s.note))
    return out


def _holes(spans: list[Span], start: dt.datetime | None, end: dt.datetime | None) -> list[tuple[dt.datetime, dt.datetime]]:
    """The parts of [start, end] that no span covers (spans sorted, merged, clipped)."""
    holes = []
    cur = start
    for s in spans:
        if cur is not None and s.start > cur:
            holes.append((cur, s.start))
        cur = s.end if cur is None else max(cur, s.end)
    if end is not None and cur is not None and end > cur:
        holes.append((cur, end))
    if not spans and start is not None and end is not None and end > start:
        holes = [(start, end)]
    return holes


# -- catalogues -----------------------------------------------------------------------------------


def record_catalogue_coverage(session: Session, source: str, files: list[str | Path]) -> list[CatalogueCoverage]:
    """Record what each imported file of catalogue ``source`` says it covers (upsert by name).

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        Flushed, not committed (the import's transaction).
    source : str
        A catalogue of :data:`pipelines.catalogues.CATALOGUES`.
    files : list of path
        The files imported.

    Returns
    -------
    list of CatalogueCoverage
        The rows, one per file.

    Notes
    -----
    A file whose span cannot be read or that contradicts itself (rows of another year than
    its name, :func:`pipelines.catalogues.coverage.file_coverage`) gets a row without a span
    whose ``basis`` says why: its events are stored, but it covers nothing known.
    """
    rows = []
    now = utcnow()
    for f in files:
        try:
            fc = file_coverage(source, f)
        except CatalogueError as exc:  # the events are stored; the file's span is unknown, and why
            fc = FileCoverage(Path(f).name, None, None, False, f"no span: {exc}")
        row = session.scalar(select(CatalogueCoverage).where(CatalogueCoverage.source == source,
                                                             CatalogueCoverage.file == fc.file[:255]))
        if row is None:
            row = CatalogueCoverage(source=source, file=fc.file[:255])
            session.add(row)
        row.covers_start, row.covers_end = fc.start, fc.end
        row.complete, row.basis = fc.complete, fc.basis[:400]
        row.recorded_at = now
        rows.append(row)
    session.flush()
    return rows


def _spans_of(rows) -> tuple[list[Span], int]:
    """Merged spans and the number of files of one catalogue's rows (start, end, complete, basis)."""
    spans = [Span(as_utc(a), as_utc(b), bool(c), basis) for a, b, c, basis in rows if a is not None and b is not None]
    return _merge(spans), len(rows)


class CatalogueProvider:
    """Coverage of one catalogue: the spans its imported files say they cover."""

    kind = "catalogue"

    def __init__(self, source: str) -> None:
        self.name = source
        self.title = source_label(source)
        self.description = CATALOGUES[source].title if source in CATALOGUES else source

    def spans(self, session: Session, rows: list | None = None) -> tuple[list[Span], int]:
        """Every span recorded for the catalogue (merged) and the number of files recorded;
        ``rows`` (start, end, complete, basis) when already read."""
        if rows is None:
            rows = session.execute(select(CatalogueCoverage.covers_start, CatalogueCoverage.covers_end,
                                          CatalogueCoverage.complete, CatalogueCoverage.basis)
                                   .where(CatalogueCoverage.source == self.name)).all()
        return _spans_of(rows)

    def coverage(self, session, start=None, end=None, settings=None) -> SourceCoverage:
        spans, n_files = self.spans(session)
        cov = SourceCoverage(self.name, self.kind, self.title, start, end,
                             basis=f"{self.description}: the span each imported file states ({n_files} file{'' if n_files == 1 else 's'})")
        if not spans:
            if start is not None and end is not None:
                cov.gaps = [Gap(start, end, "not imported" if not n_files else "its files state no span")]
            return cov
        first, last = spans[0].start, spans[-1].end
        cov.spans = _clip(spans, start, end)
        for a, b in _holes(cov.spans, start, end):
            if b <= first:
                why = f"catalogue begins {_when(first)}"
            elif a >= last:
                why = f"catalogue ends {_last_day(last)}"
            else:
                why = "no catalogue file covers this"
            cov.gaps.append(Gap(a, b, why))
        return cov


# -- LST channels ---------------------------------------------------------------------------------


def quarantined_frames(settings) -> list[tuple[str, dt.datetime, str]]:
    """``(channel, DATE-OBS, reason)`` of each quarantined file whose header still says them.

    Files under ``settings.quarantine`` with a ``<name>.reason`` beside them (what
    :func:`backend.services.ingest.quarantine` keeps); a file whose primary header cannot be
    read, or names no LST channel or no DATE-OBS, has no time and is left out. Sorted by
    channel, time and reason (a gap's text quotes its first: the same whatever order the file
    system lists them in).
    """
    if settings is None:
        return []
    from backend.services.ingest import _primary_header
    from pipelines.channels import channel_from_header
    from pipelines.fitsio import parse_date_obs, utc_datetime

    root = Path(settings.quarantine)
    out = []
    if not root.is_dir():
        return out
    for reason_file in root.rglob("*.reason"):
        f = reason_file.with_name(reason_file.name[: -len(".reason")])
        if not f.is_file():
            continue
        header = _primary_header(f)
        if header is None:
            continue
        try:
            channel = channel_from_header(header)
            when = utc_datetime(parse_date_obs(str(header["DATE-OBS"])))
        except Exception:  # noqa: BLE001 - a rejected file may be damaged anywhere: then it has no time
            continue
        if channel:
            reason = reason_file.read_text(errors="replace").strip().splitlines()
            out.append((channel, when, reason[0] if reason else ""))
    return sorted(out)


def _public_products():
    """SQL condition on ``products``: the rows an anonymous viewer may see
    (:func:`backend.services.visibility.product_rule`). Coverage, its gap reasons and the
    detections' window are the same for every caller, so they read public products only."""
    from backend.services.visibility import condition

    return condition(Product, None)


class ChannelProvider:
    """Coverage of one LST channel by written L2 products (see the module docstring)."""

    kind = "channel"

    def __init__(self, code: str) -> None:
        self.name = code
        self.title = code
        self.cadence = dt.timedelta(seconds=CHANNELS[code].cadence_s)
        #: frames read beyond the window's ends (:data:`RUN_CONTEXT`)
        self.max_break = RUN_CONTEXT

    def frames(self, session: Session, start, end) -> list[tuple[dt.datetime, float, int, int, int, str | None]]:
        """``(date_obs, exposure_s, written, failed, products, an error)`` per frame, by DATE-OBS,
        counting public products only (:func:`_public_products`: coverage is everyone's, so a
        user's private product neither covers a frame nor shows its error)."""
        written = func.max(case((Product.state == ProductState.written, 1), else_=0))
        failed = func.max(case((Product.state == ProductState.failed, 1), else_=0))
        q = (select(Frame.date_obs, Frame.exposure_s, written, failed, func.count(Product.id), func.max(Product.error))
             .outerjoin(Product, (Product.frame_id == Frame.id) & _public_products())
             .where(Frame.channel_code == self.name)
             .group_by(Frame.id, Frame.date_obs, Frame.exposure_s).order_by(Frame.date_obs))
        if start is not None:
            q = q.where(Frame.date_obs >= _shift(start, -self.max_break))
        if end is not None:
            q = q.where(Frame.date_obs <= _shift(end, self.max_break))
        return [(as_utc(t), float(x or 0.0), int(w or 0), int(fl or 0), int(n or 0), err)
                for t, x, w, fl, n, err in session.execute(q)]

    def coverage(self, session, start=None, end=None, settings=None) -> SourceCoverage:
        rows = self.frames(session, start, end)
        cov = SourceCoverage(self.name, self.kind, self.title, start, end,
                             basis=f"written L2 products of {self.name}; an observing run is frames spaced "
                                   f"at most {GAP_CADENCES:g} times the run's own median spacing, a longer "
                                   "break is a gap")
        written = [(t, exp) for t, exp, w, _fl, _n, _err in rows if w]
        runs = observing_runs([t for t, _ in written])
        in_run = [False] * len(written)
        spans: list[Span] = []
        for a, b in runs:
            cadence = statistics.median((written[i + 1][0] - written[i][0]).total_seconds() for i in range(a, b))
            end_ = max(t + dt.timedelta(seconds=exp) for t, exp in written[a:b + 1])
            spans.append(Span(written[a][0], end_, True, f"run of {b - a + 1} frames every {cadence:g} s"))
            in_run[a:b + 1] = [True] * (b - a + 1)
        spans += [Span(t, t + dt.timedelta(seconds=exp), True, "isolated frame")
                  for (t, exp), inside in zip(written, in_run, strict=True) if not inside]
        cov.spans = _clip(_merge(spans), start, end)
        quarantined = [(t, why) for ch, t, why in quarantined_frames(settings) if ch == self.name]
        lo = start if start is not None else (rows[0][0] if rows else None)
        hi = end if end is not None else (rows[-1][0] if rows else None)
        for a, b in _holes(cov.spans, lo, hi):
            inside = [r for r in rows if a <= r[0] <= b and not r[2]]
            reasons = []
            failed = [r for r in inside if r[3]]
            if failed:
                top = Counter((r[5] or "").splitlines()[0][:120] for r in failed if r[5]).most_common(1)
                reasons.append(f"{len(failed)} failed product{'s' if len(failed) != 1 else ''}"
                               + (f" ({top[0][0]})" if top else ""))
            uncal = [r for r in inside if not r[3]]
            if uncal:
                reasons.append(f"{len(uncal)} frame{'s' if len(uncal) != 1 else ''} not calibrated")
            q = [why for t, why in quarantined if a <= t <= b]
            if q:
                reasons.append(f"{len(q)} quarantined file{'s' if len(q) != 1 else ''} ({q[0][:120]})")
            if not inside:
                reasons.insert(0, "no frames")
            cov.gaps.append(Gap(a, b, "; ".join(reasons)))
        return cov


class DetectedProvider:
    """Coverage of the platform's own detections: where any channel has written L2 products."""

    kind = "detected"
    name = DETECTED_SOURCE
    title = DETECTED.label

    def coverage(self, session, start=None, end=None, settings=None) -> SourceCoverage:
        spans = []
        for code in CHANNELS:
            spans += ChannelProvider(code).coverage(session, start, end, settings).spans
        merged = _merge(spans)
        cov = SourceCoverage(self.name, self.kind, self.title, start, end, spans=merged,
                             basis="the detectors run on written L2 products: the channels' covered spans together")
        lo = start if start is not None else (merged[0].start if merged else None)
        hi = end if end is not None else (merged[-1].end if merged else None)
        cov.gaps = [Gap(a, b, "no written L2 products of any channel") for a, b in _holes(merged, lo, hi)]
        return cov


class XRayProvider:
    """Coverage of the ingested GOES XRS time series (:func:`backend.services.xray.xray_coverage`):
    the spans of the stored files, all satellites together; the light-curve context of flare pages."""

    kind = "timeseries"
    name = "goes_xrs_timeseries"
    title = "GOES XRS light curves"

    def coverage(self, session, start=None, end=None, settings=None) -> SourceCoverage:
        from backend.services.xray import xray_coverage

        rows = xray_coverage(session)
        sats = sorted({sat for sat, _, _ in rows})
        merged = _merge([Span(as_utc(a), as_utc(b), True, sat) for sat, a, b in rows])
        cov = SourceCoverage(self.name, self.kind, self.title, start, end, spans=_clip(merged, start, end),
                             basis=f"the ingested XRS files ({len(rows)} span{'' if len(rows) == 1 else 's'}"
                                   f"{': ' + ', '.join(sats) if sats else ''})")
        lo = start if start is not None else (merged[0].start if merged else None)
        hi = end if end is not None else (merged[-1].end if merged else None)
        cov.gaps = [Gap(a, b, "no XRS series ingested for this time" if merged else "no XRS series ingested")
                    for a, b in _holes(cov.spans, lo, hi)]
        return cov


#: Every coverage provider: the detections, the catalogues, the channels, the X-ray light
#: curves. One line more per source.
PROVIDERS: list[CoverageProvider] = [
    DetectedProvider(),
    *(CatalogueProvider(source) for source in CATALOGUES),
    *(ChannelProvider(code) for code in CHANNELS),
    XRayProvider(),
]


def coverage_report(session: Session, start: dt.datetime | None = None, end: dt.datetime | None = None,
                    settings=None, names: list[str] | None = None) -> list[SourceCoverage]:
    """Coverage of every provider (or those named) over ``[start, end]`` (aware UTC; open ends:
    each source's own extent).

    Raises
    ------
    KeyError
        For a name no provider has.
    """
    # a catalogue registered after this module was imported (a plugin, a test) is covered too
    added = [CatalogueProvider(s) for s in CATALOGUES if s not in {p.name for p in PROVIDERS}]
    by_name = {p.name: p for p in (*PROVIDERS, *added)}
    for n in names or ():
        if n not in by_name:
            raise KeyError(f"no coverage of {n!r}; expected one of {', '.join(by_name)}")
    chosen = [by_name[n] for n in names] if names else [*PROVIDERS, *added]
    return [p.coverage(session, start, end, settings) for p in chosen]


def detected_window_query(start: bool, end: bool):
    """The statement of :func:`_detected_window` with bind parameters ``start`` and ``end``
    (aware UTC) for the bounds that are given (``start``, ``end`` True): the lean event search
    (:mod:`backend.services.event_search_lean`) compiles it once per shape."""
    from sqlalchemy import bindparam

    q = (select(func.min(Frame.date_obs), func.max(Frame.date_obs))
         .join(Product, Product.frame_id == Frame.id)
         .where(Product.state == ProductState.written, _public_products()))
    if start:
        q = q.where(Frame.date_obs >= bindparam("start", type_=Frame.date_obs.type))
    if end:
        q = q.where(Frame.date_obs <= bindparam("end", type_=Frame.date_obs.type))
    return q


def _detected_window(session: Session, start, end) -> WindowCoverage:
    """The detections' coverage of a window, cheaply: the first and last DATE-OBS of a frame
    with a written L2 product in it (one aggregate; the planner starts from whichever of the
    written products and the window's frames is smaller)."""
    q = (select(func.min(Frame.date_obs), func.max(Frame.date_obs))
         .join(Product, Product.frame_id == Frame.id)
         .where(Product.state == ProductState.written, _public_products()))
    if start is not None:
        q = q.where(Frame.date_obs >= start)
    if end is not None:
        q = q.where(Frame.date_obs <= end)
    first, last = session.execute(q).one()
    return detected_window_from(first, last, start, end)


def detected_window_from(first, last, start, end) -> WindowCoverage:
    """:func:`_detected_window` from the first and last DATE-OBS it read (None, None: none)."""
    title = DETECTED.label
    if first is None:
        where = "in this window" if start is not None or end is not None else "yet"
        return WindowCoverage(DETECTED_SOURCE, "none", f"{title}: no L2 products {where} (the detectors run on them)")
    a, b = as_utc(first), as_utc(last)
    # the first and last product only (one aggregate on the hot path of every event search):
    # an extent, not a covered span; the gaps between are the coverage API's (DetectedProvider)
    return WindowCoverage(DETECTED_SOURCE, "partial",
                          f"{title}: only where L2 products exist (first {_when(a)}, last {_when(b)} in this "
                          "window; gaps between: /coverage)",
                          (Span(a, b, False, "extent of the written L2 products, not a covered span"),))


def window_coverage(session: Session, sources: list[str] | tuple[str, ...] | None,
                    start: dt.datetime | None, end: dt.datetime | None) -> dict[str, WindowCoverage]:
    """Per event source, whether the search window ``[start, end]`` is covered.

    Parameters
    ----------
    sources : sequence of str, optional
        ``detected`` and catalogue names; all sources when empty.
    start, end : datetime.datetime or None
        Aware UTC; open ends mean "from the source's first / to its last covered instant".

    Returns
    -------
    dict of str to WindowCoverage
        In :data:`pipelines.catalogues.SOURCES` order (``detected``, then the registry's
        catalogues) for the sources asked.
    """
    rows = session.execute(select(CatalogueCoverage.source, CatalogueCoverage.covers_start,
                                  CatalogueCoverage.covers_end, CatalogueCoverage.complete,
                                  CatalogueCoverage.basis)).all()  # one small table, read once
    wants_detected = not sources or DETECTED_SOURCE in sources
    detected = _detected_window(session, start, end) if wants_detected else None
    return window_coverage_from(catalogue_spans(rows), sources, start, end, detected)


def catalogue_spans(rows) -> dict[str, tuple[list[Span], int]]:
    """``{source: (merged spans, files recorded)}`` of ``catalogue_coverage`` rows
    ``(source, covers_start, covers_end, complete, basis)`` (what :func:`window_coverage_from`
    reads; a function of the table alone, so the lean event search keeps it until an import
    changes the table)."""
    by_source: dict[str, list] = {}
    for src, *row in rows:
        by_source.setdefault(src, []).append(row)
    return {src: _spans_of(r) for src, r in by_source.items()}


def window_coverage_from(spans_by_source: dict[str, tuple[list[Span], int]], sources, start, end,
                         detected: WindowCoverage | None) -> dict[str, WindowCoverage]:
    """:func:`window_coverage` from the catalogue spans already read (:func:`catalogue_spans`)
    and the detections' window (:func:`detected_window_from`; None when ``detected`` is not asked)."""
    wanted = [s for s in (DETECTED_SOURCE, *CATALOGUES) if not sources or s in sources]  # the registry now
    out: dict[str, WindowCoverage] = {}
    for s in wanted:
        if s == DETECTED_SOURCE:
            out[s] = detected
            continue
        p = CatalogueProvider(s)
        spans, n_files = spans_by_source.get(s, ([], 0))
        t = p.title
        if not spans:
            out[s] = WindowCoverage(s, "unknown", f"{t}: not imported" if not n_files else f"{t}: its files state no span")
            continue
        first, last = spans[0].start, spans[-1].end
        inside = _clip(spans, start, end)
        if not inside:
            if start is not None and start >= last:
                msg = f"{t}: no coverage after {_last_day(last)}"
            elif end is not None and end < first:
                msg = f"{t}: no coverage before {_when(first)}"
            else:
                before = [x for x in spans if x.end <= (start or first)]
                after = [x for x in spans if x.start >= (end or last)]
                msg = (f"{t}: no coverage between {_last_day(before[-1].end)} and {_when(after[0].start)}"
                       if before and after else f"{t}: no coverage in this window")
            out[s] = WindowCoverage(s, "none", msg)
            continue
        holes = _holes(inside, start, end) if start is not None and end is not None else []
        selection = not all(x.complete for x in inside)
        what = ", ".join(f"{_when(x.start)} to {_last_day(x.end)}" for x in inside[:3]) + (" ..." if len(inside) > 3 else "")
        if selection:
            out[s] = WindowCoverage(s, "selection", f"{t}: a selection, not a complete list ({what})", tuple(inside))
        elif holes:
            tail = ""
            if end is not None and inside[-1].end < end and inside[-1].end == last:
                tail = f"; no coverage after {_last_day(last)}"
            elif start is not None and inside[0].start > start and inside[0].start == first:
                tail = f"; no coverage before {_when(first)}"
            out[s] = WindowCoverage(s, "partial", f"{t}: covered {what} only{tail}", tuple(inside))
        else:
            whole = start is not None and end is not None
            out[s] = WindowCoverage(s, "covered", f"{t}: covered" if whole else f"{t}: covers {what}", tuple(inside))
    return out
