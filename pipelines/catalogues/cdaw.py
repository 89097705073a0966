"""The CDAW SOHO/LASCO CME catalogue (text version ``univ_all.txt``).

Columns (Yashiro et al. 2004, JGR 109, A07105; https://cdaw.gsfc.nasa.gov/CME_list/)::

    Date  Time  Central_PA  Width  Linear_speed  2nd-order speed (initial, final, at 20 Rsun)
    Accel  Mass  Kinetic_energy  MPA  Remarks

* ``Date Time``: first appearance in the LASCO C2 field of view (UT) -> ``start_time``;
  the catalogue gives no peak or end.
* ``Central PA`` [deg, counter-clockwise from solar north] -> ``position_angle``; ``Halo``
  for full halo CMEs -> position angle None, ``angular_width`` 360 (the catalogue's
  convention) and ``attributes['halo']``.
* ``Width`` [deg], ``Linear speed`` [km/s] (linear fit to the height-time points) ->
  ``angular_width``, ``speed_km_s``.
* ``----`` (dashes of any length) means not measured -> None.
* a trailing ``*`` on the acceleration, mass or kinetic energy marks the value as
  uncertain (poor height-time measurement or few points) -> the value is kept and
  ``attributes['<name>_uncertain'] = True``.
* ``MPA`` [deg]: the position angle at which the height-time measurement was made.
* Remarks (``;``-separated): ``Only C2``/``Only C3`` restrict the channels; ``Partial Halo``,
  ``Poor Event``... are kept in ``attributes['remarks']`` and ``description``.

Several CMEs share a first-appearance time (575 times in 1996-2013), so ``source_key`` is
``YYYY-MM-DDThh:mm:ss/MPA<mpa>``, unique over the catalogue (the CDAW height-time files are
named by date, time and MPA too).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

from pipelines.catalogues.records import CatalogueError, EventRecord, ParseResult, refuse_duplicates

__all__ = ["parse_cdaw", "SOURCE"]

SOURCE = "cdaw"
FRM_NAME = "CDAW SOHO/LASCO CME catalog"
_DASHES = re.compile(r"^-{2,}$")
_NUM = re.compile(r"^(-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)(\*?)$")


def _value(text: str) -> tuple[float | None, bool]:
    """(value, uncertain) of a catalogue cell; (None, False) for dashes."""
    if _DASHES.match(text):
        return None, False
    m = _NUM.match(text)
    if not m:
        raise ValueError(f"not a number: {text!r}")
    return float(m.group(1)), bool(m.group(2))


def parse_cdaw(path: str | os.PathLike) -> ParseResult:
    """Parse the CDAW LASCO CME list into CME events (HEK type ``CE``).

    Parameters
    ----------
    path : path-like
        The catalogue text file (header line, then one CME per line).

    Returns
    -------
    ParseResult
        ``source='cdaw'``; ``position_angle`` (None for halo CMEs) and ``angular_width``
        [deg], ``speed_km_s`` (linear speed) [km/s]; second-order speeds [km/s],
        acceleration [m s-2], mass [g], kinetic energy [erg], MPA [deg] and remarks in
        ``attributes``.

    Raises
    ------
    CatalogueError
        If the file cannot be read or has no CDAW header line.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise CatalogueError(f"cannot read {p}: {exc}") from None
    result = ParseResult(source=SOURCE, path=str(p))
    row_ids: list[str] = []
    header_seen = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if not result.rows_in and not line.lstrip()[0].isdigit():
            # the header line(s) before the first row ("Date Time Central Width ...")
            header_seen = header_seen or ("Date" in line and "Width" in line)
            continue
        result.rows_in += 1
        rid = f"{p.name}:{lineno}"
        cells = line.split(None, 12)
        if len(cells) < 12:
            result.refused.append((rid, f"{len(cells)} columns, expected at least 12"))
            continue
        date_s, time_s, cpa_s, width_s, v_s, v2i_s, v2f_s, v20_s, acc_s, mass_s, ke_s, mpa_s = cells[:12]
        remarks_s = cells[12].strip() if len(cells) > 12 else ""
        try:
            start = dt.datetime.strptime(f"{date_s} {time_s}", "%Y/%m/%d %H:%M:%S").replace(tzinfo=dt.UTC)
        except ValueError:
            result.refused.append((rid, f"unreadable date/time {date_s!r} {time_s!r}"))
            continue
        try:
            halo = cpa_s.lower() == "halo"
            cpa = None if halo else _value(cpa_s)[0]
            width = _value(width_s)[0]
            speed = _value(v_s)[0]
            v2i, v2f, v20 = (_value(s)[0] for s in (v2i_s, v2f_s, v20_s))
            acc, acc_unc = _value(acc_s)
            mass, mass_unc = _value(mass_s)
            ke, ke_unc = _value(ke_s)
            mpa = _value(mpa_s)[0]
        except ValueError as exc:
            result.refused.append((rid, f"unreadable cell: {exc}"))
            continue
        remarks = [r.strip() for r in remarks_s.split(";") if r.strip()]
        low = [r.lower() for r in remarks]
        attrs: dict = {
            "mpa_deg": mpa,
            "speed_2nd_order_initial_km_s": v2i,
            "speed_2nd_order_final_km_s": v2f,
            "speed_2nd_order_20rsun_km_s": v20,
            "acceleration_m_s2": acc,
            "mass_g": mass,
            "kinetic_energy_erg": ke,
            "remarks": remarks,
        }
        if acc_unc:
            attrs["acceleration_uncertain"] = True
        if mass_unc:
            attrs["mass_uncertain"] = True
        if ke_unc:
            attrs["kinetic_energy_uncertain"] = True
        flags: list[str] = []
        if halo:
            attrs["halo"] = True
            if width != 360:
                flags.append(f"halo_width_listed_as_{width_s}")
            width = 360.0
        if "partial halo" in low:
            attrs["partial_halo"] = True
        if any("poor event" in r for r in low):
            attrs["quality"] = "very poor" if "very poor event" in low else "poor"
        if speed is None:
            flags.append("speed_not_measured")
        if flags:
            attrs["flags"] = flags
        if "only c2" in low:
            channels = "LASCO-C2"
        elif "only c3" in low:
            channels = "LASCO-C3"
        else:
            channels = "LASCO-C2,LASCO-C3"
        desc = ("Halo CME" if halo else f"CME at PA {cpa:.0f} deg") + (f"; {'; '.join(remarks)}" if remarks else "")
        key = f"{start:%Y-%m-%dT%H:%M:%S}/MPA{mpa_s}"
        result.events.append(EventRecord(
            event_type="CE", source=SOURCE, source_key=key, start_time=start, channels=channels,
            position_angle=cpa, angular_width=width, speed_km_s=speed, frm_name=FRM_NAME,
            description=desc, attributes=attrs,
        ))
        row_ids.append(rid)
    if not header_seen:
        raise CatalogueError(f"{p.name}: no CDAW header line (Date Time Central Width ...)")
    refuse_duplicates(result, row_ids)
    return result.check()
