"""ASO-S/LST/WST white-light flares: Table 2 of Jing et al. 2024 (Sol. Phys.).

Jing Z. et al. 2024, "Solar white-light flares observed by the WST of ASO-S/LST",
Solar Physics (arXiv:2401.07275), Table 2: the 39 white-light flares (WLFs) of 2022-11 to
2023-05 analysed in detail, found at 360 nm with an 8 % relative enhancement threshold.

The file is the table as ``pdftotext -layout`` writes it (``sample-data/real/MANIFEST.md``)::

    Observation  Flare    GOES GOES HXR WL    WL     WL      WL        WL   WL    WL              WL
       Date     Location  Class Peak Peak  Start Peak  End  Delta-tau  rp   rm    S               F
                                [UT] [UT]  [UT]  [UT]  [UT]  [minute]  [%]  [%]   [arcsec2]       [erg]
     07.11.2022   N12E56   M5.2   00:11   00:05   00:07   00:07   00:13    6.0  16.9   9.94   404±20   (5.33±0.09)×1026

* Location: from the GOES flare catalogue (the table's note 1) -> ``hgs_lat``/``hgs_lon``
  and, with sunpy at the WL peak time and an Earth observer, ``hpc_x``/``hpc_y``.
* ``-`` in the HXR peak column: no HXI data (note 2) -> None.
* ``<2.0`` durations: brightening in one WST frame only (note 3) -> 2.0 with
  ``duration_is_upper_limit``.
* superscripts were flattened by pdftotext: ``×1026`` is ×10^26, ``×103`` is ×10^3.
* ``rp``/``rm``: peak and mean relative enhancement of the WL kernel [%] ->
  ``peak_value`` = rp, ``peak_unit`` = ``%``.
* The row of 2022-12-16 S21W64 has its WL end (01:48) before its WL peak (01:54), as
  published (its duration, 8 min, matches start to end): it is kept as printed and
  flagged ``end_before_peak``.

Event times are the WL start, peak and end (the WST observation of the flare); the GOES
and HXR peak times are in ``attributes``. All times are UT on the observation date; a time
more than 12 h before the WL start belongs to the next day.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

import numpy as np

from pipelines.catalogues.coords import as_time, heliographic_to_helioprojective, parse_heliographic_location
from pipelines.catalogues.records import CatalogueError, EventRecord, ParseResult, refuse_duplicates

__all__ = ["parse_lst_wst", "SOURCE", "REFERENCE"]

SOURCE = "lst_wst"
FRM_NAME = "Jing et al. 2024 WST white-light flares"
REFERENCE = "Jing Z. et al. 2024, Solar Physics (arXiv:2401.07275), Table 2"
#: Relative enhancement threshold of the WST white-light flare search (Jing et al. 2024).
ENHANCEMENT_THRESHOLD_PERCENT = 8.0

_DATE = re.compile(r"^\s*(\d{2})\.(\d{2})\.(\d{4})\b")
_T = r"(\d{2}:\d{2}|-)"
_VAL = r"(\(?\s*[\d.]+\s*±\s*[\d.]+\s*\)?(?:\s*×\s*10\d+)?)"
_ROW = re.compile(
    r"^\s*(\d{2}\.\d{2}\.\d{4})\s+([NS]\d{1,2}[EW]\d{1,3})\s+([ABCMX]\d+(?:\.\d+)?)\s+"
    + r"\s+".join([_T] * 5)
    + r"\s+(<?[\d.]+)\s+([\d.]+)\s+([\d.]+)\s+" + _VAL + r"\s+" + _VAL + r"\s*$"
)
_VALPARTS = re.compile(r"^\(?\s*([\d.]+)\s*±\s*([\d.]+)\s*\)?(?:\s*×\s*10(\d+))?$")


def _value_error(text: str) -> tuple[float, float]:
    """(value, uncertainty) of ``404±20`` or ``(5.33±0.09)×1026`` (= 5.33e26 ± 0.09e26)."""
    m = _VALPARTS.match(text.strip())
    if not m:
        raise ValueError(f"unreadable value {text!r}")
    scale = 10.0 ** int(m.group(3)) if m.group(3) else 1.0
    return float(m.group(1)) * scale, float(m.group(2)) * scale


def _time_on(day: dt.date, hhmm: str, start: dt.datetime | None) -> dt.datetime | None:
    if hhmm == "-":
        return None
    h, m = (int(x) for x in hhmm.split(":"))
    t = dt.datetime(day.year, day.month, day.day, h, m, tzinfo=dt.UTC)
    if start is not None and t - start < dt.timedelta(hours=-12):
        t += dt.timedelta(days=1)
    return t


def parse_lst_wst(path: str | os.PathLike) -> ParseResult:
    """Parse the WST white-light flare table of Jing et al. (2024) into flare events.

    Parameters
    ----------
    path : path-like
        ``jing2024_wst_whitelight_flares_table2.txt`` (UTF-8, pdftotext layout).

    Returns
    -------
    ParseResult
        ``source='lst_wst'``, 39 events of HEK type ``FL`` with ``channels='WST'``,
        WL start/peak/end times, GOES class, heliographic and helioprojective location,
        ``peak_value`` = peak relative enhancement rp [%]; GOES and HXR peak times,
        duration [min], mean enhancement rm [%], area S [arcsec2] and energy F [erg]
        (with their uncertainties) in ``attributes``. ``source_key`` is
        ``YYYY-MM-DDTHH:MM/<location>`` (WL start).

    Raises
    ------
    CatalogueError
        If the file cannot be read.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogueError(f"cannot read {p}: {exc}") from None
    result = ParseResult(source=SOURCE, path=str(p))
    row_ids: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not _DATE.match(line):
            continue  # title, column headings, footnotes
        result.rows_in += 1
        rid = f"{p.name}:{lineno}"
        m = _ROW.match(line)
        if not m:
            result.refused.append((rid, "row does not have the 14 columns of Table 2"))
            continue
        (date_s, loc_s, cls, goes_pk, hxr_pk, wl_start, wl_peak, wl_end, dur_s, rp, rm, area_s, energy_s) = m.groups()
        try:
            day = dt.datetime.strptime(date_s, "%d.%m.%Y").date()
            area, area_err = _value_error(area_s)
            energy, energy_err = _value_error(energy_s)
        except ValueError as exc:
            result.refused.append((rid, str(exc)))
            continue
        if wl_start == "-":
            result.refused.append((rid, "no WL start time"))
            continue
        start = _time_on(day, wl_start, None)
        peak = _time_on(day, wl_peak, start)
        end = _time_on(day, wl_end, start)
        loc = parse_heliographic_location(loc_s)
        flags: list[str] = []
        if peak is not None and end is not None and end < peak:
            flags.append("end_before_peak")
        if end is not None and end < start:
            flags.append("end_before_start")
        if peak is not None and peak < start:
            flags.append("peak_before_start")
        attrs: dict = {
            "observation_date": day.isoformat(),
            "location": loc_s,
            "location_source": "GOES flare catalogue (Table 2 note 1)",
            "goes_peak_time": _time_on(day, goes_pk, start),
            "hxr_peak_time": _time_on(day, hxr_pk, start),
            "hxr_peak_note": "HXI 20-50 keV peak" if hxr_pk != "-" else "no HXI data",
            "duration_min": float(dur_s.lstrip("<")),
            "rp_percent": float(rp),
            "rm_percent": float(rm),
            "area_arcsec2": area,
            "area_err_arcsec2": area_err,
            "energy_erg": energy,
            "energy_err_erg": energy_err,
            "enhancement_threshold_percent": ENHANCEMENT_THRESHOLD_PERCENT,
            "reference": REFERENCE,
            "table_row": len(row_ids) + len(result.refused) + 1,
        }
        if dur_s.startswith("<"):
            attrs["duration_is_upper_limit"] = True
        if flags:
            attrs["flags"] = flags
        rec = EventRecord(
            event_type="FL", source=SOURCE, source_key=f"{start:%Y-%m-%dT%H:%M}/{loc_s}", start_time=start,
            peak_time=peak, end_time=end, channels="WST", goes_class=cls, peak_value=float(rp), peak_unit="%",
            frm_name=FRM_NAME, description=f"White-light flare at 360 nm (WST), GOES {cls}, {loc_s}",
            attributes=attrs,
        )
        if loc is not None:
            rec.hgs_lat, rec.hgs_lon = loc
        result.events.append(rec)
        row_ids.append(rid)

    located = [i for i, e in enumerate(result.events) if e.hgs_lat is not None]
    if located:
        ev = [result.events[i] for i in located]
        x, y, visible = heliographic_to_helioprojective(
            np.array([e.hgs_lat for e in ev]), np.array([e.hgs_lon for e in ev]),
            as_time([e.peak_time or e.start_time for e in ev]),
        )
        for e, xi, yi, vi in zip(ev, x, y, visible, strict=True):
            e.hpc_x, e.hpc_y = float(xi), float(yi)
            if not vi:
                e.flag("behind_limb")
    refuse_duplicates(result, row_ids)
    return result.check()
