"""NOAA/NGDC GOES XRS flare reports (one fixed-width text file per year).

Format (NGDC "X-ray solar flare report format", ``xray.fmt.REVISED``), 1-based columns::

     1- 2  data code (31)          3- 5  station (777 = GOES)     6-11  YYMMDD
    12-13  asterisks: unconfirmed change
    14-17  start HHMM   18 qualifier   19-22  end HHMM   23 qualifier   24-27  max HHMM
    28     qualifier
    29-34  location: N/S lat, E/W central meridian distance (e.g. N16E91)
    35-36  optical importance and brightness (before 2004) or 35-37 'SXI' (2004 on: the
           location comes from GOES SXI images)
    60     X-ray class letter (A, B, C, M, X)   61-63  intensity, F3.1 with implied decimal
           (' 49' = 4.9, '172' = 17.2)
    64-67  calcium plage region (old files)     68-71  station name ('GOES', 'G15')
    73-80  integrated flux from start to end [J m-2] (from 1997)
    81-85  NOAA/USAF sunspot region number      87-94  central meridian passage (YYMMDD.D)
    96-102 SXI total area [arcsec2]            104-110 SXI total intensity [DN/s]

Quirks met in the 1990-2014 files and how they are handled:

* line lengths vary (80 to 121 characters, 2003 mixes several): columns are read from a
  line padded with blanks, never split on white space;
* an end or maximum time earlier than the start means the flare crossed midnight: one day
  is added when that makes the flare last at most 12 h (else the row is kept as printed
  and flagged); the files before 1997 write times after midnight as hours 24-47 instead
  (``2347 2409 2359``);
* in February and July 1994 the end and maximum columns are swapped (104 of 106 and 139
  of 140 rows have the "maximum" after the "end"): a month where more than 80 % of at least
  10 rows are so is read as start/max/end and its rows are flagged
  ``end_max_columns_swapped``; a single row with its maximum after its end is kept and
  flagged ``peak_after_end``;
* a missing or malformed end/max time is stored as None and flagged; a row without a
  valid date or start time is refused;
* rows without an X-ray class (1993, 1996, 1999) are kept with ``goes_class=None``; a
  class the scale does not have (``M0.0``, ``C12.0``: multipliers run from 1.0 to 9.9
  below X) is kept with ``goes_class=None``, no flux and the flag
  ``xray_class_impossible:<as printed>``;
* data/station codes other than 31/777 (typos such as ``33777``, ``11777``) are kept and
  flagged;
* rows repeated verbatim (blocks of 2005 and 2006 are repeated) are refused as duplicates;
  two reports of one flare (same times and class; one with a location, 2000-03-09 and
  2000-06-14; or with another integrated flux, 2002-08-02) keep the row with the location,
  then the longer one; ``^Z`` end-of-file bytes are not rows;
* before 1997 the times may be those of the correlated optical flare (format note 1).

Helioprojective positions are computed with sunpy from the heliographic location at the
peak time (start time when the peak is missing), Earth observer (:mod:`.coords`).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

import numpy as np

from pipelines.catalogues.coords import as_time, heliographic_to_helioprojective, parse_heliographic_location
from pipelines.catalogues.records import (
    CatalogueError,
    EventRecord,
    ParseResult,
    full_noaa_number,
    goes_class_to_flux,
    refuse_duplicates,
)

__all__ = ["parse_goes_xrs", "goes_class_flux", "SOURCE"]

SOURCE = "goes_xrs"
FRM_NAME = "NOAA/NGDC GOES XRS event report"

#: Lower edge of each GOES class in the 0.1-0.8 nm band [W m-2].
_CLASS_FLUX = {"A": 1e-8, "B": 1e-7, "C": 1e-6, "M": 1e-5, "X": 1e-4}
_MAX_DURATION = dt.timedelta(hours=12)
_HHMM = re.compile(r"^\s*(\d{2})(\d{2})\s*$")


def goes_class_flux(goes_class: str) -> float:
    """Peak 0.1-0.8 nm flux [W m-2] of a GOES class string such as ``M5.2`` or ``X28``.

    Raises
    ------
    ValueError
        For a string that is not a GOES class.
    """
    return goes_class_to_flux(goes_class)


def _hhmm(text: str) -> tuple[int, int] | None:
    m = _HHMM.match(text)
    if not m:
        return None
    h, mi = int(m.group(1)), int(m.group(2))
    if h > 47 or mi > 59:  # hours 24-47: the next day (the pre-1997 files write 2447 for 00:47)
        return None
    return h, mi


def _at(day: dt.date, hm: tuple[int, int]) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC) + dt.timedelta(hours=hm[0], minutes=hm[1])


def _after_start(start: dt.datetime, t: dt.datetime, name: str, rec_flags: list[str]) -> dt.datetime:
    """``t`` moved to the next day if it is before ``start`` and the flare then stays < 12 h."""
    if t >= start:
        return t
    nxt = t + dt.timedelta(days=1)
    if nxt - start <= _MAX_DURATION:
        rec_flags.append(f"{name}_next_day")
        return nxt
    rec_flags.append(f"{name}_before_start")
    return t


def _months_with_swapped_columns(text: str) -> set[str]:
    """``YYMM`` of the months whose rows mostly have the "max" column after the "end" one."""
    counts: dict[str, list[int]] = {}
    for line in text.splitlines():
        s, e, m = line[13:17], line[18:22], line[23:27]
        if not (line[5:11].isdigit() and s.isdigit() and e.isdigit() and m.isdigit()):
            continue
        s_, e_, m_ = int(s), int(e), int(m)
        if e_ < s_ or m_ < s_ or e_ == m_:  # midnight crossings and ties say nothing
            continue
        c = counts.setdefault(line[5:9], [0, 0])
        c[0] += 1
        c[1] += m_ > e_
    return {ym for ym, (n, later) in counts.items() if n >= 10 and later > 0.8 * n}


def _float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _year_of(path: Path) -> int | None:
    m = re.search(r"(19|20)\d{2}", path.name)
    return int(m.group(0)) if m else None


def parse_goes_xrs(path: str | os.PathLike) -> ParseResult:
    """Parse one NOAA GOES XRS yearly report into flare events (HEK type ``FL``).

    Parameters
    ----------
    path : path-like
        A ``goes-xrs-report_YYYY.txt`` file.

    Returns
    -------
    ParseResult
        ``source='goes_xrs'``; each event has the GOES class, the peak 0.1-0.8 nm flux
        [W m-2] as ``peak_value``, heliographic and helioprojective location when the
        report gives one, the NOAA region, and the other columns in ``attributes``.
        ``source_key`` is ``YYYY-MM-DDTHHMM/end/max/class`` of the row; of two rows with
        one key (two reports of one flare) the one with a location is kept and the other
        refused, verbatim repeats are refused.

    Raises
    ------
    CatalogueError
        If the file cannot be read.
    """
    # Long: one pass over the report's fixed-width columns, with a refusal reason for each
    # malformed field; the checks read the same line's slices and belong together.
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise CatalogueError(f"cannot read {p}: {exc}") from None
    text = raw.decode("ascii", errors="replace")
    file_year = _year_of(p)
    result = ParseResult(source=SOURCE, path=str(p))
    row_ids: list[str] = []
    positions: list[tuple[int, float, float, dt.datetime]] = []  # (event index, lat, lon, time)

    swapped_months = _months_with_swapped_columns(text)
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.rstrip("\r\n").replace("\x1a", "")
        if not line.strip():
            continue
        result.rows_in += 1
        rid = f"{p.name}:{lineno}"
        ln = line.ljust(121)
        code, station, ymd = ln[0:2], ln[2:5], ln[5:11]
        if not ymd.isdigit():
            result.refused.append((rid, f"no YYMMDD date in columns 6-11: {line[:20]!r}"))
            continue
        yy, mm, dd = int(ymd[0:2]), int(ymd[2:4]), int(ymd[4:6])
        year = 1900 + yy if yy >= 50 else 2000 + yy
        try:
            day = dt.date(year, mm, dd)
        except ValueError:
            result.refused.append((rid, f"invalid date {ymd!r}"))
            continue
        start_hm = _hhmm(ln[13:17])
        if start_hm is None:
            result.refused.append((rid, f"no valid start time in columns 14-17: {ln[13:17]!r}"))
            continue
        flags: list[str] = []
        if file_year is not None and year != file_year:
            flags.append("year_differs_from_file")
        if (code, station) != ("31", "777"):
            flags.append(f"record_code_{code}{station}")
        start = _at(day, start_hm)
        end_text, peak_text = ln[18:22], ln[23:27]
        if ymd[:4] in swapped_months:
            end_text, peak_text = peak_text, end_text
            flags.append("end_max_columns_swapped")
        end_hm, peak_hm = _hhmm(end_text), _hhmm(peak_text)
        end = peak = None
        if end_hm is None:
            if end_text.strip():
                flags.append(f"end_time_unreadable:{end_text.strip()}")
            else:
                flags.append("no_end_time")
        else:
            end = _after_start(start, _at(day, end_hm), "end", flags)
        if peak_hm is None:
            if peak_text.strip():
                flags.append(f"peak_time_unreadable:{peak_text.strip()}")
            else:
                flags.append("no_peak_time")
        else:
            peak = _after_start(start, _at(day, peak_hm), "peak", flags)
        if peak is not None and end is not None and peak > end:
            flags.append("peak_after_end")
        if end is not None and end != start and end - start > _MAX_DURATION:
            flags.append("longer_than_12h")

        loc_text = ln[28:34].strip()
        loc = parse_heliographic_location(loc_text) if loc_text else None
        if loc_text and loc is None:
            flags.append(f"location_unreadable:{loc_text}")
        sxi = ln[34:37] == "SXI"
        optical = None if sxi else (ln[34:36].strip() or None)

        letter, inten = ln[59], ln[60:63]
        goes_class = peak_flux = None
        if letter in _CLASS_FLUX and inten.strip().isdigit():
            value = int(inten.strip()) / 10.0
            printed = f"{letter}{value:.1f}"
            try:
                peak_flux = goes_class_to_flux(printed)
                goes_class = printed
            except ValueError:
                # 'M0.0', 'C12.0': not a class the scale has; kept in the attributes, never as
                # a class or flux a GOES-class filter would read
                flags.append(f"xray_class_impossible:{printed}")
        elif letter.strip() or inten.strip():
            flags.append(f"xray_class_unreadable:{ln[59:63].strip()}")
        else:
            flags.append("no_xray_class")

        attrs: dict = {}
        if ln[11:13].strip():
            attrs["unconfirmed_change"] = ln[11:13].strip()
        quals = {k: v for k, v in (("start", ln[17]), ("end", ln[22]), ("peak", ln[27])) if v.strip()}
        if quals:
            attrs["time_qualifiers"] = quals
        if optical:
            attrs["optical_importance"] = optical
        if loc is not None:
            attrs["location"] = loc_text
            attrs["location_source"] = "SXI" if sxi else ("optical flare" if year < 2004 else "unspecified")
        plage = ln[63:67].strip()
        if plage.isdigit():
            attrs["plage_region"] = int(plage)
        attrs["station"] = ln[67:71].strip() or None
        integrated = _float(ln[72:80])
        if integrated is not None:
            attrs["integrated_flux_J_m2"] = integrated
        noaa_raw = ln[80:85].strip()
        noaa = full_noaa_number(int(noaa_raw), start) if noaa_raw.isdigit() else None
        cmp_ = ln[86:94].strip()
        if cmp_:
            attrs["central_meridian_passage"] = cmp_
        sxi_area, sxi_int = _float(ln[95:102]), _float(ln[103:110])
        if sxi_area is not None:
            attrs["sxi_area_arcsec2"] = sxi_area
        if sxi_int is not None:
            attrs["sxi_intensity_dn_s"] = sxi_int
        if year < 1997:
            attrs["times_note"] = "before 1997 the times may be those of the correlated optical flare"
        if flags:
            attrs["flags"] = flags
        attrs["line"] = line.rstrip()

        key = "/".join([
            start.strftime("%Y-%m-%dT%H%M"),
            end_text.strip() or "-",
            peak_text.strip() or "-",
            goes_class or "-",
        ])
        rec = EventRecord(
            event_type="FL", source=SOURCE, source_key=key, start_time=start, peak_time=peak, end_time=end,
            channels="XRS 0.1-0.8 nm", goes_class=goes_class, peak_value=peak_flux,
            peak_unit="W m-2" if peak_flux is not None else None, noaa_ar=noaa, frm_name=FRM_NAME,
            description=f"GOES X-ray flare {goes_class or '(no class)'}" + (f" at {loc_text}" if loc else ""),
            attributes=attrs,
        )
        if loc is not None:
            rec.hgs_lat, rec.hgs_lon = loc
            positions.append((len(result.events), loc[0], loc[1], peak or start))
        result.events.append(rec)
        row_ids.append(rid)

    _fill_positions(result.events, positions)
    # one event per key; of two reports of one event keep the one with a location, then the
    # longer (more complete) line
    refuse_duplicates(result, row_ids, [e.attributes["line"] for e in result.events],
                      score=lambda e: (e.hgs_lat is not None) * 1000 + len(e.attributes["line"].strip()))
    return result.check()


def _fill_positions(events: list[EventRecord], positions: list[tuple[int, float, float, dt.datetime]]) -> None:
    if not positions:
        return
    idx = [p[0] for p in positions]
    x, y, visible = heliographic_to_helioprojective(
        np.array([p[1] for p in positions]), np.array([p[2] for p in positions]), as_time([p[3] for p in positions])
    )
    for i, xi, yi, vi in zip(idx, x, y, visible, strict=True):
        events[i].hpc_x, events[i].hpc_y = float(xi), float(yi)
        if not vi:
            events[i].flag("behind_limb")
