"""Solar Orbiter/STIX science flare list with locations (Hayes et al.), version 1.

The list (``STIX_flarelist_w_locations_20210214_20230430_version1.csv``, BSD-3-Clause,
github:hayesla/stix_flarelist_science; ``sample-data/real/MANIFEST.md``) holds the flares of
the operational STIX flare list (stixdcpy) with pixel data and more than 1000 counts in the
4-10 keV band, located by STIX imaging: 6,429 flares, 2021-02-14 .. 2023-04-30. One CSV row
a flare, columns (the list's README)::

    start_UTC,end_UTC,peak_UTC            flare times, UTC at Solar Orbiter
    4-10 keV ... 50-84 keV                counts in each STIX energy band (quick-look peak)
    att_in                                attenuator inserted (True/False)
    bkg 4-10 keV ... bkg 50-84 keV        background counts (median of the last quiet period)
    bkg_baseline_4-10 keV                 median of the fitted baseline
    hpc_x_solo,hpc_y_solo                 helioprojective arcsec seen from Solar Orbiter
    hpc_x_earth,hpc_y_earth               helioprojective arcsec seen from Earth (empty when
                                          the flare is not visible from Earth)
    visible_from_earth                    True/False
    hgs_lon,hgs_lat,hgc_lon,hgc_lat       Stonyhurst / Carrington heliographic degrees
    solo_position_lat,_lon,_AU_distance   Solar Orbiter's heliographic position [deg, AU]
    light_travel_time                     [s] Earth's light time from the Sun minus Solar
                                          Orbiter's (244.7 s for the first row, Solar Orbiter
                                          at 0.497 AU, Earth at 0.987 AU: (0.987-0.497) AU/c
                                          = 244.6 s)
    file_request_id_used                  STIX pixel-data request imaged
    GOES_class_time_of_flare,             the GOES XRS 0.1-0.8 nm level at the time of the
    GOES_flux_time_of_flare               flare [W m-2]: "not derived from STIX data", and
                                          meaningless when the flare is not visible from Earth
                                          (the list's README)
    flare_id                              stixdcpy flare id (unique, YYMMDDHHMM of the peak)

How the rows become events (HEK ``FL``, source ``stix``):

* Times: ``start_time``/``peak_time``/``end_time`` are the list's times **plus
  light_travel_time**, i.e. when the flare's light reached Earth, the time base of the
  GOES, LST and HEK flares it is compared with; the times as observed at Solar Orbiter are
  kept in ``attributes`` (``start_utc_solo`` ...). ``source_key`` is the flare id.
* Location: ``hpc_x``/``hpc_y`` are the Earth-view columns. A flare not visible from
  Earth has no ``hpc_x``/``hpc_y`` and the flag ``not_visible_from_earth``; its
  heliographic position (``hgs_lat``/``hgs_lon``, observer-independent) is kept, and the
  Solar Orbiter view (``hpc_x_solo``/``hpc_y_solo``) is in ``attributes`` for every row.
* ``peak_value`` is the 4-10 keV count (unit ``counts 4-10 keV``), the band the list is
  selected on; the other bands, backgrounds and the attenuator state are attributes.
* GOES class: **not stored in** ``goes_class``. The list's class is the GOES XRS level at
  the flare time (background and any other flare on the Earth-facing disk included), not a
  GOES flare-list class and not measured for flares hidden from Earth, so it would make the
  ``min_goes_class`` filter (on ``Event.goes_flux``) return far-side STIX flares by the
  flux of other flares. It is kept as ``goes_xrs_class_at_flare_time`` and
  ``goes_xrs_flux_at_flare_time_w_m2`` with ``goes_class_note``; the measured class of a
  flare comes with its linked GOES flare (same-flare association).
* ``frm_name`` ``STIX flare list (Hayes et al.)``, ``frm_version`` ``1``; ``channels``
  ``4-10 keV``; observatory/instrument Solar Orbiter/STIX
  (:func:`backend.services.event_formats.observation`).

Refused rows (reason each): unreadable or missing times, end before start or a peak
outside [start, end], a count or coordinate that is not a number, a ``visible_from_earth``
that is not True/False, a flare said visible without Earth coordinates, a row without a
flare id, a repeated flare id.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import os
from pathlib import Path

from pipelines.catalogues.records import CatalogueError, EventRecord, ParseResult, refuse_duplicates

__all__ = ["parse_stix", "SOURCE", "FRM_NAME", "REFERENCE", "COVERAGE", "COVERAGE_SOURCE"]

SOURCE = "stix"
FRM_NAME = "STIX flare list (Hayes et al.)"
FRM_VERSION = "1"
REFERENCE = ("Hayes L. A. et al., Solar Orbiter/STIX science flare list with locations, version 1 "
             "(github:hayesla/stix_flarelist_science)")
#: Period the list covers, first and last day inclusive (UTC at Solar Orbiter), from its
#: file name ``..._20210214_20230430_version1.csv`` and its first/last rows (first start
#: 2021-02-14T01:41, last end 2023-04-30T15:07).
COVERAGE: tuple[dt.date, dt.date] = (dt.date(2021, 2, 14), dt.date(2023, 4, 30))
COVERAGE_SOURCE = "file name and first/last rows of STIX_flarelist_w_locations_20210214_20230430_version1.csv"

BANDS = ("4-10 keV", "10-15 keV", "15-25 keV", "25-50 keV", "50-84 keV")
REQUIRED = ("start_UTC", "end_UTC", "peak_UTC", *BANDS, "att_in", "hpc_x_solo", "hpc_y_solo",
            "hpc_x_earth", "hpc_y_earth", "visible_from_earth", "hgs_lon", "hgs_lat",
            "light_travel_time", "GOES_class_time_of_flare", "GOES_flux_time_of_flare", "flare_id")
PEAK_UNIT = "counts 4-10 keV"
GOES_CLASS_NOTE = ("GOES XRS 0.1-0.8 nm level at the flare time, not derived from STIX data and not a GOES "
                   "flare-list class (background and other flares included); meaningless when the flare "
                   "is not visible from Earth (STIX flare list README)")


class _RowError(ValueError):
    pass


def _time(row: dict, col: str) -> dt.datetime:
    text = (row.get(col) or "").strip()
    if not text:
        raise _RowError(f"no {col}")
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise _RowError(f"unreadable {col} {text!r}") from None
    if t.tzinfo is not None:
        raise _RowError(f"{col} {text!r} has a time zone; the list writes UTC without one")
    return t.replace(tzinfo=dt.UTC)


def _num(row: dict, col: str, *, optional: bool = False) -> float | None:
    text = (row.get(col) or "").strip()
    if not text:
        if optional:
            return None
        raise _RowError(f"no {col}")
    try:
        x = float(text)
    except ValueError:
        raise _RowError(f"{col} {text!r} is not a number") from None
    if not math.isfinite(x):
        if optional:
            return None
        raise _RowError(f"{col} {text!r} is not finite")
    return x


def _bool(row: dict, col: str) -> bool:
    text = (row.get(col) or "").strip()
    if text in ("True", "False"):
        return text == "True"
    raise _RowError(f"{col} {text!r} is not True/False")


def _record(row: dict) -> EventRecord:
    flare_id = (row.get("flare_id") or "").strip()
    if not flare_id:
        raise _RowError("no flare_id")
    t0, t1, tp = _time(row, "start_UTC"), _time(row, "end_UTC"), _time(row, "peak_UTC")
    if t1 < t0:
        raise _RowError(f"end_UTC {t1:%Y-%m-%dT%H:%M:%S} before start_UTC {t0:%Y-%m-%dT%H:%M:%S}")
    if not (t0 <= tp <= t1):
        raise _RowError(f"peak_UTC {tp:%Y-%m-%dT%H:%M:%S} outside start..end")
    ltt = _num(row, "light_travel_time")
    if not (-600.0 < ltt < 600.0):  # Solar Orbiter's orbit (0.28-1.02 AU) keeps it within ±370 s
        raise _RowError(f"light_travel_time {ltt} s out of range")
    shift = dt.timedelta(seconds=ltt)
    counts = {b: _num(row, b) for b in BANDS}
    bkg = {b: _num(row, f"bkg {b}", optional=True) for b in BANDS}
    visible = _bool(row, "visible_from_earth")
    x_e, y_e = _num(row, "hpc_x_earth", optional=True), _num(row, "hpc_y_earth", optional=True)
    if visible and (x_e is None or y_e is None):
        raise _RowError("visible_from_earth is True but hpc_x_earth/hpc_y_earth are empty")
    x_s, y_s = _num(row, "hpc_x_solo"), _num(row, "hpc_y_solo")
    lon, lat = _num(row, "hgs_lon"), _num(row, "hgs_lat")
    if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 360.0):
        raise _RowError(f"heliographic position lat {lat} lon {lon} out of range")
    goes_cls = (row.get("GOES_class_time_of_flare") or "").strip().upper() or None
    goes_flux = _num(row, "GOES_flux_time_of_flare", optional=True)
    attrs: dict = {
        "flare_id": flare_id,
        "start_utc_solo": t0, "peak_utc_solo": tp, "end_utc_solo": t1,
        "light_travel_time_s": ltt,
        "time_base": "Earth (list's Solar Orbiter UTC + light_travel_time)",
        "counts": counts, "background_counts": bkg,
        "bkg_baseline_4_10_kev": _num(row, "bkg_baseline_4-10 keV", optional=True),
        "attenuator_in": _bool(row, "att_in"),
        "visible_from_earth": visible,
        "hpc_x_solo": x_s, "hpc_y_solo": y_s,
        "hgc_lon": _num(row, "hgc_lon", optional=True), "hgc_lat": _num(row, "hgc_lat", optional=True),
        "solo_position_lat": _num(row, "solo_position_lat", optional=True),
        "solo_position_lon": _num(row, "solo_position_lon", optional=True),
        "solo_position_au": _num(row, "solo_position_AU_distance", optional=True),
        "file_request_id": (row.get("file_request_id_used") or "").strip() or None,
        "goes_xrs_class_at_flare_time": goes_cls,
        "goes_xrs_flux_at_flare_time_w_m2": goes_flux,
        "goes_class_note": GOES_CLASS_NOTE,
        "location_source": "STIX imaging (Hayes et al.)",
        "reference": REFERENCE,
    }
    where = "not visible from Earth" if not visible else f"({x_e:.0f}\", {y_e:.0f}\") from Earth"
    goes_txt = f"; GOES XRS at flare time {goes_cls} (not a GOES flare class)" if goes_cls and visible else ""
    rec = EventRecord(
        event_type="FL", source=SOURCE, source_key=flare_id, start_time=t0 + shift, peak_time=tp + shift,
        end_time=t1 + shift, channels="4-10 keV", hgs_lat=lat, hgs_lon=lon,
        peak_value=counts["4-10 keV"], peak_unit=PEAK_UNIT, frm_name=FRM_NAME, frm_version=FRM_VERSION,
        description=f"STIX X-ray flare, {counts['4-10 keV']:.0f} counts 4-10 keV, {where}{goes_txt}",
        attributes=attrs,
    )
    if visible:
        rec.hpc_x, rec.hpc_y = x_e, y_e
    else:
        rec.flag("not_visible_from_earth")
        if x_e is not None or y_e is not None:
            rec.flag("earth_position_given_but_not_visible")
    return rec


def parse_stix(path: str | os.PathLike) -> ParseResult:
    """Parse the STIX science flare list (CSV, version 1 columns) into flare events.

    Parameters
    ----------
    path : path-like
        ``STIX_flarelist_w_locations_*_version1.csv`` (UTF-8, header row).

    Returns
    -------
    ParseResult
        ``source='stix'``: one HEK ``FL`` event per row, times at Earth [aware UTC],
        ``hpc_x``/``hpc_y`` the Earth view [arcsec] (None when not visible from Earth),
        ``hgs_lat``/``hgs_lon`` [deg], ``peak_value`` the 4-10 keV counts, ``goes_class``
        None (see the module notes); row ids are ``file:line``.

    Raises
    ------
    CatalogueError
        If the file cannot be read or lacks one of the list's columns.
    """
    p = Path(path)
    try:
        with p.open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise CatalogueError(f"{p.name} is not a STIX flare list: no column(s) {', '.join(missing)}")
            rows = [(reader.line_num, r) for r in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CatalogueError(f"cannot read {p}: {exc}") from None
    result = ParseResult(source=SOURCE, path=str(p))
    row_ids: list[str] = []
    texts: list[str] = []
    for lineno, row in rows:
        if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
            continue  # blank line
        result.rows_in += 1
        rid = f"{p.name}:{lineno}"
        if None in row:
            result.refused.append((rid, f"row has more than the {len(header)} columns of the header"))
            continue
        if any(v is None for v in row.values()):
            result.refused.append((rid, f"row has fewer than the {len(header)} columns of the header"))
            continue
        try:
            rec = _record(row)
        except _RowError as exc:
            result.refused.append((rid, str(exc)))
            continue
        rec.attributes["csv_line"] = lineno
        result.events.append(rec)
        row_ids.append(rid)
        texts.append(",".join(row[c] for c in header))
    refuse_duplicates(result, row_ids, texts)
    return result.check()
