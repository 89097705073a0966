"""What time span each catalogue file says it covers (pure: a file in, a span out).

A catalogue's coverage is what its files *say* they cover, never the span from its first
to its last event: a quiet month inside a catalogue's period is covered (0 events is an
answer), a month after its end is not (no answer). One reader per catalogue, named by its
registry entry (``Catalogue.coverage`` in :data:`pipelines.catalogues.CATALOGUES`, e.g.
``"pipelines.catalogues.coverage:cdaw_coverage"``):

========== ======================================================================================
source     what the file says
========== ======================================================================================
goes_xrs   NOAA/NGDC GOES XRS event reports come one file per year (``goes-xrs-report_1990.txt``;
           each row's date ``31777YYMMDD``): Jan 1 to Dec 31 of that year. The year is read from
           the rows (all rows of a report carry its year) and must agree with a year in the name.
cdaw       The CDAW SOHO/LASCO list's own period is in its name (``..._univ_1996-2013.txt``: the
           univ_all list exported for 1996 to 2013): Jan 1 of the first year to Dec 31 of the last.
hek        A HEK API response answers one query window; its name holds the window's UTC day(s)
           (``hek-events_2024-05-10.json``, ``hek-events_2024-05-09_2024-05-10.json``).
           ``overmax: true`` (HEK cut the answer) makes the span incomplete.
donki      DONKI exports name their query months (``donki_cme_2010-04_2021-11.json``): the first
           day of the first month to the last day of the last.
noaa_srs   One Solar Region Summary per day: its ``:Issued:`` line; the locations are valid at
           00:00 UT of the issue date and hold until the next day's summary (one UTC day).
lst_wst    Table 2 of Jing et al. (2024) is "the 39 WLFs analyzed in detail": a selection, not a
           complete list. Its span (first to last flare) is given as *incomplete*: a window
           inside it without a row is not "no white-light flare".
========== ======================================================================================

Spans are half-open ``[start, end)`` in aware UTC: Dec 31 is covered to its last instant
and ``end`` is the next Jan 1 00:00.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.catalogues.records import CatalogueError

__all__ = [
    "FileCoverage",
    "file_coverage",
    "goes_xrs_coverage",
    "cdaw_coverage",
    "hek_coverage",
    "donki_coverage",
    "noaa_srs_coverage",
    "lst_wst_coverage",
    "stix_coverage",
]

UTC = dt.UTC


@dataclass(frozen=True)
class FileCoverage:
    """The span one catalogue file says it covers.

    Attributes
    ----------
    file : str
        The file's name (not its folder: the same file imported from elsewhere is one file).
    start, end : datetime.datetime or None
        Half-open ``[start, end)``, aware UTC; both None when the file states no span.
    complete : bool
        True when every event of the catalogue in the span is in the file (False: a selection,
        or an answer the server cut short).
    basis : str
        How the span was read (shown next to it, e.g. "file name: one report per year").
    """

    file: str
    start: dt.datetime | None
    end: dt.datetime | None
    complete: bool
    basis: str


def _year_span(y0: int, y1: int) -> tuple[dt.datetime, dt.datetime]:
    return dt.datetime(y0, 1, 1, tzinfo=UTC), dt.datetime(y1 + 1, 1, 1, tzinfo=UTC)


def goes_xrs_coverage(path: Path) -> FileCoverage:
    years: set[int] = set()
    with open(path, encoding="latin-1") as f:
        for line in f:
            m = re.match(r"^31777(\d{2})(\d{2})(\d{2})", line)
            if m:
                yy = int(m.group(1))
                years.add(1900 + yy if yy >= 70 else 2000 + yy)  # reports start in 1975
    named = {int(y) for y in re.findall(r"(?<!\d)(19\d{2}|20\d{2})(?!\d)", path.name)}
    if len(years) != 1:
        if len(named) == 1 and not years:
            (y,) = named
            return FileCoverage(path.name, *_year_span(y, y), True, "file name: one GOES XRS report per year (no rows)")
        return FileCoverage(path.name, None, None, False,
                            f"rows of {len(years)} years ({', '.join(map(str, sorted(years)))}): not one yearly report")
    (y,) = years
    if named and y not in named:
        raise CatalogueError(f"{path.name}: rows are of {y} but the name says {', '.join(map(str, sorted(named)))}")
    return FileCoverage(path.name, *_year_span(y, y), True, "one GOES XRS report per year (rows' year, file name)")


def cdaw_coverage(path: Path) -> FileCoverage:
    m = re.search(r"(?<!\d)((?:19|20)\d{2})-((?:19|20)\d{2})(?!\d)", path.name)
    if not m:
        return FileCoverage(path.name, None, None, False, "the file's name states no period (YYYY-YYYY)")
    y0, y1 = int(m.group(1)), int(m.group(2))
    if y1 < y0:
        raise CatalogueError(f"{path.name}: period {y0}-{y1} ends before it starts")
    return FileCoverage(path.name, *_year_span(y0, y1), True, f"the list's period in its name ({y0}-{y1})")


_DAY = r"(\d{4})-?(\d{2})-?(\d{2})"


def hek_coverage(path: Path) -> FileCoverage:
    days = re.findall(r"(?<!\d)" + _DAY + r"(?!\d)", path.name)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise CatalogueError(f"{path.name}: not a HEK JSON response ({exc})") from None
    overmax = isinstance(doc, dict) and str(doc.get("overmax")).strip().lower() in ("true", "1")
    if not days:
        return FileCoverage(path.name, None, None, not overmax, "the file's name states no query window")
    ts = [dt.datetime(int(y), int(m), int(d), tzinfo=UTC) for y, m, d in days]
    start, end = min(ts), max(ts) + dt.timedelta(days=1)
    basis = "HEK query window (UTC days in the file name)"
    if overmax:
        basis += "; HEK answered overmax=true: only part of the events"
    return FileCoverage(path.name, start, end, not overmax, basis)


def donki_coverage(path: Path) -> FileCoverage:
    m = re.search(r"(?<!\d)(\d{4})-(\d{2})_(\d{4})-(\d{2})(?!\d)", path.name)
    if not m:
        return FileCoverage(path.name, None, None, False, "the file's name states no query months (YYYY-MM_YYYY-MM)")
    y0, m0, y1, m1 = map(int, m.groups())
    start = dt.datetime(y0, m0, 1, tzinfo=UTC)
    end = dt.datetime(y1 + (m1 == 12), m1 % 12 + 1, 1, tzinfo=UTC)
    if end <= start:
        raise CatalogueError(f"{path.name}: query months end before they start")
    return FileCoverage(path.name, start, end, True, "DONKI query months in the file name")


_ISSUED = re.compile(r"^:Issued:\s*(\d{4})\s+([A-Za-z]{3})\w*\s+(\d{1,2})\s+(\d{4})\s*UTC", re.I | re.M)


def noaa_srs_coverage(path: Path) -> FileCoverage:
    text = Path(path).read_text(encoding="latin-1")
    m = _ISSUED.search(text)
    if not m:
        raise CatalogueError(f"{path.name}: no ':Issued: YYYY Mon DD HHMM UTC' line")
    y, mon, d, _ = m.groups()
    day = dt.datetime.strptime(f"{y} {mon.title()} {d}", "%Y %b %d").replace(tzinfo=UTC)
    return FileCoverage(path.name, day, day + dt.timedelta(days=1), True,
                        "one Solar Region Summary per day (its :Issued: line; valid 00:00 UT for a day)")


def lst_wst_coverage(path: Path) -> FileCoverage:
    from pipelines.catalogues.lst_wst import parse_lst_wst

    events = parse_lst_wst(path).events
    if not events:
        return FileCoverage(path.name, None, None, False, "a selection of flares with no rows")
    start = min(e.start_time for e in events)
    last = max((e.end_time or e.peak_time or e.start_time) for e in events)
    day0 = start.replace(hour=0, minute=0, second=0, microsecond=0)
    day1 = last.replace(hour=0, minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
    return FileCoverage(path.name, day0, day1, False,
                        f"a selection ({len(events)} flares analysed in detail, Jing et al. 2024), not a complete list")


_STIX_SPAN = re.compile(r"_(\d{8})_(\d{8})_version")


def stix_coverage(path: Path) -> FileCoverage:
    """The STIX flare list names its period (``..._20210214_20230430_version1.csv``; the last
    day included): :data:`pipelines.catalogues.stix.COVERAGE`."""
    m = _STIX_SPAN.search(path.name)
    if not m:
        return FileCoverage(path.name, None, None, False, "no period in the file name")
    try:
        a, b = (dt.datetime.strptime(x, "%Y%m%d").replace(tzinfo=UTC) for x in m.groups())
    except ValueError:
        raise CatalogueError(f"{path.name}: the period {m.group(1)}-{m.group(2)} in its name is not two dates") from None
    if b < a:
        raise CatalogueError(f"{path.name}: the period in its name ends ({m.group(2)}) before it starts ({m.group(1)})")
    return FileCoverage(path.name, a, b + dt.timedelta(days=1), True,
                        "file name: the list's period, first to last day (Hayes et al. STIX science flare list)")


def file_coverage(source: str, path: str | os.PathLike) -> FileCoverage:
    """The span catalogue file ``path`` of ``source`` says it covers.

    Parameters
    ----------
    source : str
        A key of :data:`pipelines.catalogues.CATALOGUES`: its entry's ``coverage`` reader
        (without one, a span-less FileCoverage saying so).
    path : path-like
        One catalogue file.

    Returns
    -------
    FileCoverage
        ``start``/``end`` None when the file states no span (then it covers nothing known).

    Raises
    ------
    KeyError
        For a source that is no catalogue.
    CatalogueError
        If the file contradicts itself (rows of another year than its name) or cannot be read.
    """
    from pipelines.catalogues import CATALOGUES

    if source not in CATALOGUES:
        raise KeyError(f"no coverage reader for catalogue {source!r}; expected one of {', '.join(CATALOGUES)}")
    reader = CATALOGUES[source].coverage
    p = Path(path)
    if reader is None:  # a catalogue added without a coverage reader
        return FileCoverage(p.name, None, None, False,
                            f"no coverage reader for catalogue {source!r}: the period its files cover is unknown")
    try:
        return reader(p)
    except OSError as exc:
        raise CatalogueError(f"{p.name}: cannot be read ({exc.strerror or exc})") from None
