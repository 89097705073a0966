"""NASA CCMC DONKI CME records (``/DONKI/CME`` web-service JSON).

Each record: ``activityID`` (unique, e.g. ``2010-04-03T09:54:00-CME-001``) ->
``source_key``; ``startTime`` (first appearance in a coronagraph, ``...Z``) ->
``start_time``; ``sourceLocation`` (e.g. ``S20E05``, the source region on the disk) ->
``hgs_lat``/``hgs_lon`` and, with sunpy and an Earth observer at the start time,
``hpc_x``/``hpc_y``; ``activeRegionNum`` -> ``noaa_ar``; ``instruments`` -> ``channels``;
``cmeAnalyses``: cone-model fits (StereoCAT/SWPC_CAT) with the CME direction
(``latitude``/``longitude``, Stonyhurst deg), ``halfAngle`` [deg], ``speed`` [km/s],
``type`` (S, C, O, R, ER: speed classes), ``isMostAccurate``, ``levelOfData``.

Which analysis: the one flagged ``isMostAccurate`` (DONKI's own choice). When several are
flagged (20 CMEs) the one with the highest ``levelOfData`` then the latest listed is used;
when none is flagged but analyses exist (40 CMEs), the same rule picks among all and the
event is flagged ``no_analysis_marked_most_accurate``. 69 CMEs have no analysis: they are
kept without position angle, width or speed.

From the chosen analysis:

* ``speed_km_s`` = ``speed`` (the cone-model radial speed);
* ``angular_width`` = 2 x ``halfAngle`` (the full cone angle, deg; not a plane-of-sky width);
* ``position_angle`` = the plane-of-sky position angle of the cone axis seen from Earth
  (:func:`~pipelines.catalogues.coords.direction_position_angle`: sunpy Heliocentric frame,
  deg counter-clockwise from solar north). Within 20 deg of the Sun-Earth line the axis
  projects onto the disk centre and the angle means little: flagged
  ``direction_near_sun_earth_line``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.catalogues.coords import (
    as_time,
    direction_position_angle,
    heliographic_to_helioprojective,
    parse_heliographic_location,
)
from pipelines.catalogues.records import (
    CatalogueError,
    EventRecord,
    ParseResult,
    full_noaa_number,
    refuse_duplicates,
)
from pipelines.utc import as_utc

__all__ = ["parse_donki", "choose_analysis", "SOURCE"]

SOURCE = "donki"
FRM_NAME = "DONKI (NASA CCMC)"
#: Cone axes closer than this to the Sun-Earth line [deg] have an ill-defined position angle.
NEAR_SUN_EARTH_LINE_DEG = 20.0


def _time(value: Any) -> dt.datetime | None:
    if value in (None, ""):
        return None
    return as_utc(dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")))


def choose_analysis(analyses: list[dict] | None) -> tuple[dict | None, str]:
    """The analysis to take PA/width/speed from, and how it was chosen.

    Returns
    -------
    analysis : dict or None
    how : str
        ``most_accurate``, ``most_accurate_of_several``, ``none_marked_most_accurate`` or
        ``no_analysis``.
    """
    items = [a for a in (analyses or []) if isinstance(a, dict)]
    if not items:
        return None, "no_analysis"
    flagged = [a for a in items if a.get("isMostAccurate") is True]
    pool = flagged or items

    def rank(ia: tuple[int, dict]) -> tuple[int, int]:
        i, a = ia
        level = a.get("levelOfData")
        return (int(level) if isinstance(level, (int, float)) else -1, i)

    _, best = max(enumerate(pool), key=rank)
    if len(flagged) == 1:
        return best, "most_accurate"
    if flagged:
        return best, "most_accurate_of_several"
    return best, "none_marked_most_accurate"


def _instrument_code(name: str) -> str:
    """``'LASCO-C2'`` for ``'SOHO: LASCO/C2'``, ``'COR2-A'`` for ``'STEREO A: SECCHI/COR2'``."""
    m = re.match(r"^\s*STEREO\s+([AB])\s*:\s*SECCHI/(\S+)", name, re.I)
    if m:
        return f"{m.group(2).upper()}-{m.group(1).upper()}"
    m = re.match(r"^\s*SOHO\s*:\s*LASCO/(\S+)", name, re.I)
    if m:
        return f"LASCO-{m.group(1).upper()}"
    return name.split(":")[-1].strip().replace("/", "-")


def parse_donki(path: str | os.PathLike) -> ParseResult:
    """Parse a DONKI CME JSON list into CME events (HEK type ``CE``).

    Parameters
    ----------
    path : path-like
        A JSON list of DONKI CME records.

    Returns
    -------
    ParseResult
        ``source='donki'``; see the module notes for the fields.

    Raises
    ------
    CatalogueError
        If the file is not a JSON list.
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CatalogueError(f"cannot read {p} as JSON: {exc}") from None
    if not isinstance(doc, list):
        raise CatalogueError(f"{p.name}: a DONKI CME file is a JSON list")
    result = ParseResult(source=SOURCE, path=str(p))
    row_ids: list[str] = []
    directions: list[tuple[EventRecord, float, float, dt.datetime]] = []
    sources: list[tuple[EventRecord, float, float, dt.datetime]] = []
    for i, e in enumerate(doc):
        result.rows_in += 1
        if not isinstance(e, dict):
            result.refused.append((f"[{i}]", "not a JSON object"))
            continue
        aid = str(e.get("activityID") or "").strip()
        rid = f"[{i}] {aid}".strip()
        if not aid:
            result.refused.append((rid, "no activityID"))
            continue
        try:
            start = _time(e.get("startTime"))
        except ValueError:
            result.refused.append((rid, f"unreadable startTime {e.get('startTime')!r}"))
            continue
        if start is None:
            result.refused.append((rid, "no startTime"))
            continue
        analysis, how = choose_analysis(e.get("cmeAnalyses"))
        instruments = [str(x.get("displayName")) for x in (e.get("instruments") or []) if isinstance(x, dict)]
        codes = ",".join(_instrument_code(n) for n in instruments)
        attrs: dict[str, Any] = {
            "catalog": e.get("catalog"),
            "link": e.get("link"),
            "note": e.get("note") or None,
            "instruments": instruments,
            "linked_events": [x.get("activityID") for x in (e.get("linkedEvents") or []) if isinstance(x, dict)],
            "source_location": e.get("sourceLocation") or None,
            "n_analyses": len(e.get("cmeAnalyses") or []),
            "analysis_choice": how,
        }
        rec = EventRecord(
            event_type="CE", source=SOURCE, source_key=aid, start_time=start, channels=codes or None,
            noaa_ar=full_noaa_number(e["activeRegionNum"], start) if isinstance(e.get("activeRegionNum"), int) else None,
            frm_name=FRM_NAME, description=(e.get("note") or "").strip() or None, attributes=attrs,
        )
        if how == "none_marked_most_accurate":
            rec.flag("no_analysis_marked_most_accurate")
        if analysis is not None:
            a = {k: v for k, v in analysis.items() if k != "enlilList"}
            a["n_enlil_runs"] = len(analysis.get("enlilList") or [])
            attrs["analysis"] = a
            rec.speed_km_s = analysis.get("speed")
            half = analysis.get("halfAngle")
            rec.angular_width = 2.0 * float(half) if isinstance(half, (int, float)) else None
            lat, lon = analysis.get("latitude"), analysis.get("longitude")
            if isinstance(lat, (int, float)) and isinstance(lon, (int, float)):
                directions.append((rec, float(lat), float(lon), start))
        loc = parse_heliographic_location(e.get("sourceLocation") or "")
        if loc is not None:
            rec.hgs_lat, rec.hgs_lon = loc
            sources.append((rec, loc[0], loc[1], start))
        elif e.get("sourceLocation"):
            rec.flag(f"source_location_unreadable:{e.get('sourceLocation')}")
        result.events.append(rec)
        row_ids.append(rid)

    if directions:
        pa, sep = direction_position_angle(
            np.array([d[1] for d in directions]), np.array([d[2] for d in directions]),
            as_time([d[3] for d in directions]),
        )
        for (rec, *_), pa_i, sep_i in zip(directions, pa, sep, strict=True):
            rec.position_angle = float(pa_i)
            rec.attributes["axis_angle_from_sun_earth_line_deg"] = float(sep_i)
            if sep_i < NEAR_SUN_EARTH_LINE_DEG or sep_i > 180 - NEAR_SUN_EARTH_LINE_DEG:
                rec.flag("direction_near_sun_earth_line")
    if sources:
        x, y, visible = heliographic_to_helioprojective(
            np.array([s[1] for s in sources]), np.array([s[2] for s in sources]), as_time([s[3] for s in sources])
        )
        for (rec, *_), xi, yi, vi in zip(sources, x, y, visible, strict=True):
            rec.hpc_x, rec.hpc_y = float(xi), float(yi)
            if not vi:
                rec.flag("behind_limb")
    refuse_duplicates(result, row_ids)
    return result.check()
