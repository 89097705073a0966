"""NOAA/USAF Solar Region Summary (SRS), one text file per day.

Layout (SWPC product ``SRS.txt``)::

    :Product: 0101SRS.txt
    :Issued: 2015 Jan 01 0030 UTC
    ...
    I.  Regions with Sunspots.  Locations Valid at 31/2400Z
    Nmbr Location  Lo  Area  Z   LL   NN Mag Type
    2246 N19W56   108  0070 Hsx  01   01 Alpha
    IA. H-alpha Plages without Spots.  Locations Valid at 31/2400Z Dec
    Nmbr  Location  Lo
    2245  N09W76   128
    II. Regions Due to Return 01 Jan to 03 Jan
    Nmbr Lat    Lo
    2235 S08    286

One active region (HEK type ``AR``) per row of sections I and IA, at the time the
locations are valid (24:00 UT of the day before the issue, i.e. 00:00 of the issue date)
-> ``start_time``; ``end_time`` is one day later (until the next daily summary).
Location -> ``hgs_lat``/``hgs_lon`` and, with sunpy and an Earth observer,
``hpc_x``/``hpc_y``. ``Lo`` Carrington longitude [deg], ``Area`` [millionths of the
hemisphere, MSH], ``Z`` McIntosh class, ``LL`` longitudinal extent [deg], ``NN`` number of
spots and ``Mag Type`` (Mount Wilson/Hale class) go to ``attributes``.

Section II rows (regions expected to return around the east limb) are not observations
of a region: they are refused with that reason. ``NONE`` lines are not rows. Files in
upper case (1990s) are read as the others; McIntosh and Mount Wilson classes are stored
title-cased (``Bxo``, ``Beta-Gamma``) whatever the file's case. A first row glued to its
column titles (``NMBR LAT    LO7997 N05   242``) is read as a row. Region
numbers printed with four digits after 2002-06-14 are lifted to the 10000 series
(:func:`~pipelines.catalogues.records.full_noaa_number`).
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
    refuse_duplicates,
)

__all__ = ["parse_noaa_srs", "SOURCE"]

SOURCE = "noaa_srs"
FRM_NAME = "NOAA SWPC Solar Region Summary"

_ISSUED = re.compile(r"^:Issued:\s*(\d{4})\s+([A-Za-z]{3})\w*\s+(\d{1,2})\s+(\d{4})\s*UTC", re.I)
_VALID = re.compile(r"valid\s+at\s+(\d{1,2})/(\d{4})Z", re.I)
_SECTION = re.compile(r"^\s*(IA|III|II|I)\.\s")
_ROW_I = re.compile(
    r"^(\d{4})\s+([NS]\d{2}[EW]\d{2,3})\s+(\d{1,3})\s+(\d{4})\s+([A-Za-z]{3})\s+(\d{1,3})\s+(\d{1,3})\s+(\S+)\s*$"
)
_ROW_IA = re.compile(r"^(\d{4})\s+([NS]\d{2}[EW]\d{2,3})\s+(\d{1,3})(?:\s+(.*))?$")
_ROW_II = re.compile(r"^(\d{4})\s+([NS]\d{2})\s+(\d{1,3})\s*$")
#: A column-title line with the first row glued to it (``NMBR LAT    LO7997 N05   242`` in
#: the SRS of 1996-12-09, sunpy issue 7126).
_GLUED_HEADER = re.compile(r"^(nmbr\b.*?(?:lo|type))(\d{4}\s.*)$", re.I)


def parse_noaa_srs(path: str | os.PathLike) -> ParseResult:
    """Parse one SRS file into active-region events (HEK type ``AR``).

    Parameters
    ----------
    path : path-like
        A ``YYYYMMDDSRS.txt`` file.

    Returns
    -------
    ParseResult
        ``source='noaa_srs'``; ``source_key`` is ``YYYY-MM-DD/<full NOAA number>`` (the
        day the locations are valid for).

    Raises
    ------
    CatalogueError
        If the file cannot be read or has no ``:Issued:`` line.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise CatalogueError(f"cannot read {p}: {exc}") from None
    issued = None
    for line in text.splitlines():
        m = _ISSUED.match(line.strip())
        if m:
            y, mon, d, hm = m.groups()
            issued = dt.datetime.strptime(f"{y} {mon.title()} {d} {hm}", "%Y %b %d %H%M").replace(tzinfo=dt.UTC)
            break
    if issued is None:
        raise CatalogueError(f"{p.name}: no ':Issued: YYYY Mon DD HHMM UTC' line")
    valid = issued.replace(hour=0, minute=0, second=0, microsecond=0)
    result = ParseResult(source=SOURCE, path=str(p))
    row_ids: list[str] = []
    section: str | None = None
    srs_number = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        m = re.match(r"^SRS\s+Number\s+(\d+)", line, re.I)
        if m:
            srs_number = int(m.group(1))
        m = _SECTION.match(line)
        if m:
            section = m.group(1).upper()
            v = _VALID.search(line)
            if v and section in ("I", "IA"):
                day, hhmm = int(v.group(1)), v.group(2)
                expect = valid - dt.timedelta(days=1) if hhmm == "2400" else valid
                if expect.day != day:
                    raise CatalogueError(f"{p.name}:{lineno}: locations valid on day {day}, issued {issued:%Y-%m-%d}")
            continue
        if section not in ("I", "IA", "II"):
            continue
        glued = _GLUED_HEADER.match(line)
        if glued:
            line = glued.group(2)  # the row after the titles, read as a row
        elif not line or line.upper() == "NONE" or line.lower().startswith("nmbr"):
            continue
        if not re.match(r"^\d{4}\s", line):
            section = None  # free text after the tables (comments, notices)
            continue
        result.rows_in += 1
        rid = f"{p.name}:{lineno}"
        if section == "II":
            result.refused.append((rid, "section II: a region due to return, not observed on the disk"))
            continue
        m = (_ROW_I if section == "I" else _ROW_IA).match(line)
        if not m:
            result.refused.append((rid, f"section {section} row not in the expected columns: {line!r}"))
            continue
        number_raw, loc_s = m.group(1), m.group(2)
        loc = parse_heliographic_location(loc_s)
        if loc is None:
            result.refused.append((rid, f"unreadable location {loc_s!r}"))
            continue
        noaa = full_noaa_number(int(number_raw), valid)
        attrs: dict = {
            "section": section,
            "section_title": "regions with sunspots" if section == "I" else "H-alpha plages without spots",
            "location": loc_s,
            "carrington_longitude_deg": float(m.group(3)),
            "number_as_printed": number_raw,
            "issued": issued,
            "srs_number": srs_number,
        }
        desc = f"NOAA AR {noaa} at {loc_s}" + _section_columns(section, m, attrs)
        rec = EventRecord(
            event_type="AR", source=SOURCE, source_key=f"{valid:%Y-%m-%d}/{noaa}", start_time=valid,
            end_time=valid + dt.timedelta(days=1), hgs_lat=loc[0], hgs_lon=loc[1], noaa_ar=noaa,
            frm_name=FRM_NAME, description=desc, attributes=attrs,
        )
        result.events.append(rec)
        row_ids.append(rid)
    if result.events:
        x, y, visible = heliographic_to_helioprojective(
            np.array([e.hgs_lat for e in result.events]), np.array([e.hgs_lon for e in result.events]),
            as_time([e.start_time for e in result.events]),
        )
        for e, xi, yi, vi in zip(result.events, x, y, visible, strict=True):
            e.hpc_x, e.hpc_y = float(xi), float(yi)
            if not vi:
                e.flag("behind_limb")
    refuse_duplicates(result, row_ids)
    return result.check()


def _section_columns(section: str, m: re.Match, attrs: dict) -> str:
    """Put the section-specific columns of a row into ``attrs``; the description's tail."""
    if section == "I":
        # the upper-case files of the 1990s write 'BXO', 'BETA': one spelling for all years
        mcintosh, mag = m.group(5).title(), m.group(8).title()
        attrs.update({
            "area_msh": int(m.group(4)),
            "mcintosh_class": mcintosh,
            "longitudinal_extent_deg": int(m.group(6)),
            "number_of_spots": int(m.group(7)),
            "mag_type": mag,
        })
        return f" ({mcintosh}, {mag}, {int(m.group(4))} MSH)"
    if m.group(4):
        attrs["comment"] = m.group(4).strip()
    return " (plage without spots)"
