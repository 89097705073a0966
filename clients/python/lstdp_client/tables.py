"""API rows (JSON objects) as :class:`astropy.table.QTable` with units.

Each known field has a kind: a UTC time (an :class:`astropy.time.Time` column, masked where
the API sent ``null``), a quantity in a fixed unit (missing values are NaN in that unit), a
whole number (a masked integer column) or text (masked where ``null``). The units are the
ones the API documents for its fields (``backend/api/schemas.py``: ``EventPublic``,
``ProductPublic``). A field the client does not know (a newer server) is kept as a plain
column of the values as sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import astropy.units as u
import numpy as np
from astropy.table import MaskedColumn, QTable
from astropy.time import Time

__all__ = ["EVENT_COLUMNS", "PRODUCT_COLUMNS", "rows_to_qtable", "time_column"]

_TIME, _INT, _STR, _BOOL = "time", "int", "str", "bool"

#: ``EventPublic`` fields (``GET /api/v1/events``): kind or unit. hpc_x/hpc_y are
#: helioprojective Solar X/Y seen from Earth; hgs_* Stonyhurst heliographic; position angle
#: counter-clockwise from solar north; goes_flux the GOES 0.1-0.8 nm peak flux of the class.
EVENT_COLUMNS: dict[str, Any] = {
    "id": _INT, "event_type": _STR, "source": _STR, "source_key": _STR,
    "start_time": _TIME, "peak_time": _TIME, "end_time": _TIME, "channels": _STR,
    "hpc_x": u.arcsec, "hpc_y": u.arcsec, "hgs_lat": u.deg, "hgs_lon": u.deg,
    "position_angle": u.deg, "angular_width": u.deg, "speed_km_s": u.km / u.s,
    "goes_class": _STR, "goes_flux": u.W / u.m**2, "peak_value": float, "peak_unit": _STR,
    "noaa_ar": _INT, "frm_name": _STR, "frm_version": _STR, "owner": _STR, "calibration_set_id": _INT,
}

#: ``ProductPublic`` fields (``GET /api/v1/products``); ``date_obs`` is the frame's DATE-OBS (UTC).
PRODUCT_COLUMNS: dict[str, Any] = {
    "id": _INT, "frame_id": _INT, "channel": _STR, "date_obs": _TIME, "level": _STR, "version": _INT,
    "calibration_set_id": _INT, "state": _STR, "software_version": _STR, "calibration_key": _STR,
    "params_hash": _STR, "sha256": _STR, "job_id": _STR, "created_at": _TIME, "updated_at": _TIME,
    "fits_url": _STR, "quicklook_url": _STR,
}


def time_column(values: Iterable[str | None]) -> Time:
    """UTC times of ISO 8601 strings (``...Z`` or ``+00:00``); masked where None.

    Returns
    -------
    astropy.time.Time
        Shape (n,), scale ``utc``, format ``isot``.
    """
    vals = list(values)
    missing = np.array([v is None for v in vals], dtype=bool)
    iso = [_iso_utc(v) if v is not None else "2000-01-01T00:00:00" for v in vals]
    t = Time(iso, format="isot", scale="utc") if iso else Time([], format="isot", scale="utc")
    if missing.any():
        t[missing] = np.ma.masked
    return t


def _iso_utc(value: str) -> str:
    """``value`` without its UTC designator (the API writes times in UTC: ``Z`` or ``+00:00``)."""
    v = value.strip()
    if v.endswith("Z"):
        return v[:-1]
    if v.endswith("+00:00"):
        return v[:-6]
    import datetime as dt

    return dt.datetime.fromisoformat(v).astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat()


def _column(kind: Any, values: list[Any]):
    if kind == _TIME:
        return time_column(values)
    if kind == _INT:
        mask = [v is None for v in values]
        return MaskedColumn([0 if v is None else int(v) for v in values], mask=mask, dtype=np.int64)
    if kind == _STR:
        mask = [v is None for v in values]
        return MaskedColumn(["" if v is None else str(v) for v in values], mask=mask, dtype=str)
    if kind == _BOOL:
        return np.array([bool(v) for v in values], dtype=bool)
    data = np.array([np.nan if v is None else float(v) for v in values], dtype=float)
    if kind is float:
        return data
    return data * kind


def rows_to_qtable(rows: Iterable[Mapping[str, Any]], columns: Mapping[str, Any],
                   meta: Mapping[str, Any] | None = None) -> QTable:
    """A QTable of ``rows`` (JSON objects), one column per field.

    Parameters
    ----------
    rows : iterable of dict
        API items.
    columns : dict
        Field name to kind (``"time"``, ``"int"``, ``"str"``, ``float``) or an astropy unit.
        Known fields come first in this order; other fields follow as sent.
    meta : dict, optional
        Stored as the table's ``meta``.

    Returns
    -------
    astropy.table.QTable
        ``len(rows)`` rows (zero rows keep the known columns).
    """
    rows = list(rows)
    names = list(columns)
    for r in rows:
        names += [k for k in r if k not in columns and k not in names]
    table = QTable(meta=dict(meta or {}))
    for name in names:
        values = [r.get(name) for r in rows]
        kind = columns.get(name)
        if kind is None:  # a field this client does not know: as sent
            col = np.empty(len(values), dtype=object)
            col[:] = values
            table[name] = col
        else:
            table[name] = _column(kind, values)
    return table
