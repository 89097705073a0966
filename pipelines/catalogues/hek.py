"""Heliophysics Event Knowledgebase (HEK) API responses.

A HEK search (``https://www.lmsal.com/hek/her?cosec=2&cmd=search...``) answers
``{"result": [...], "association": [...], "overmax": bool}``. Each result is a VOEvent-like
dict (Hurlburt et al. 2012, Sol. Phys. 275, 67) of any event type; the fields used here:

* ``event_type`` (HEK code: FL, CE, CH, AR, ...), ``event_starttime``/``peaktime``/
  ``endtime`` (UTC, ISO without zone);
* ``kb_archivid``: the event's IVORN, unique in HEK -> ``source_key``;
* ``hpc_x``/``hpc_y`` [arcsec], ``hgs_y``/``hgs_x`` (Stonyhurst latitude/longitude, deg),
  unless ``noposition`` is true (SWPC flares are then placed at disk centre with a 90-deg
  error: the position is dropped);
* ``hrc_a`` (position angle, deg counter-clockwise from north), ``cme_angularwidth``,
  ``cme_radiallinvel`` for CMEs;
* ``fl_goescls``, ``fl_peakflux``/``fl_peakfluxunit``, ``ar_noaanum``;
* ``frm_name``, ``frm_versionnumber``; ``search_instrument`` + ``search_channelid`` (HEK's
  normalised names, e.g. ``AIA 131``, ``LASCO C2,C3``) -> ``channels``.

Read truthfully: a response that is not valid UTF-8 (real answers carry lone Latin-1 bytes
such as 0xC5 in free text) is decoded with the bad bytes read as Latin-1, a
``CatalogueWarning`` and a line in ``ParseResult.repairs``; ``overmax: true`` (HEK cut the
answer at its limit) is noted in ``ParseResult.truncated``; ``fl_goescls`` is upper-cased
and a class the GOES scale does not have (``M0.0``) is flagged ``goes_class_impossible`` and
dropped; an ``fl_peakflux`` of zero or below (the -9999 fill) is flagged ``peak_flux_fill``
and not stored as a peak; ``T24:00:00`` is midnight at the end of that day.

Every other non-empty field goes to ``attributes``. The ``association`` list links two
events by IVORN (``first_ivorn`` -> ``second_ivorn``, ``edge_type`` e.g.
``is_followed_by``): returned as :class:`AssociationRecord` for the import service, and
also noted in the attributes of the events involved (``hek_associations``), since the other
end is often not in the same response.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

from pipelines.catalogues.records import (
    AssociationRecord,
    CatalogueError,
    EventRecord,
    ParseResult,
    full_noaa_number,
    goes_class_to_flux,
    normalise_goes_class,
    refuse_duplicates,
)
from pipelines.errors import CatalogueWarning
from pipelines.utc import as_utc

__all__ = ["parse_hek", "SOURCE"]

SOURCE = "hek"

_USED = {
    "event_type", "event_starttime", "event_peaktime", "event_endtime", "kb_archivid", "hpc_x", "hpc_y",
    "hgs_x", "hgs_y", "fl_goescls", "fl_peakflux", "fl_peakfluxunit", "ar_noaanum", "frm_name",
    "frm_versionnumber", "cme_angularwidth", "cme_radiallinvel",
}
#: Bulky encodings of geometry already present in readable form (hpc_bbox, hpc_boundcc).
_DROPPED = {"hpc_geom", "hpc_bbox_geom", "hgs_geom"}


_MIDNIGHT_24 = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ]24:00(?::00(?:\.0*)?)?(Z|[+-]00:?00)?$")


def _time(value: Any) -> dt.datetime | None:
    """An ISO time as aware UTC; ``YYYY-MM-DDT24:00:00`` (ISO 8601's end-of-day midnight)
    is 00:00 of the next day."""
    if value in (None, ""):
        return None
    text = str(value).strip()
    m = _MIDNIGHT_24.match(text)
    if m:
        day = dt.date.fromisoformat(m.group(1)) + dt.timedelta(days=1)
        return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
    return as_utc(dt.datetime.fromisoformat(text.replace("Z", "+00:00")))


def _decode(raw: bytes, name: str) -> tuple[str, str | None]:
    """The text of a HEK response; bytes that are not UTF-8 (HEK answers carry lone Latin-1
    bytes such as 0xC5 in free-text fields) are decoded as Latin-1, with a note why."""
    try:
        return raw.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        bad = raw[exc.start:exc.start + 1]
        n_bad = len(raw.decode("utf-8", errors="replace").split("\ufffd")) - 1
        note = (f"{name}: not valid UTF-8 (byte 0x{bad.hex().upper()} at offset {exc.start}, "
                f"{n_bad} undecodable byte(s)); decoded the bytes as Latin-1")
        out, i = [], 0
        while i < len(raw):  # keep the valid UTF-8, read only the bad bytes as Latin-1
            try:
                out.append(raw[i:].decode("utf-8"))
                break
            except UnicodeDecodeError as e:
                out.append(raw[i:i + e.start].decode("utf-8"))
                out.append(raw[i + e.start:i + e.end].decode("latin-1"))
                i += e.end
        return "".join(out).removeprefix("\ufeff"), note


def _num(value: Any) -> float | None:
    if value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "t", "1", "yes")


def _version(value: Any) -> str | None:
    v = _num(value)
    if v is None:
        return None if value in (None, "") else str(value)
    return f"{v:.6g}"


def parse_hek(path: str | os.PathLike) -> ParseResult:
    """Parse a saved HEK search response into events of their own HEK types.

    Parameters
    ----------
    path : path-like
        JSON file with the ``result`` list (and optionally ``association``).

    Returns
    -------
    ParseResult
        ``source='hek'``, ``source_key`` = ``kb_archivid`` (IVORN); ``associations`` from
        the ``association`` list (``source='hek'``, keys are IVORNs).

    Raises
    ------
    CatalogueError
        If the file is not JSON or has no ``result`` list.
    """
    p = Path(path)
    try:
        text, repair = _decode(p.read_bytes(), p.name)
        doc = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise CatalogueError(f"cannot read {p} as JSON: {exc}") from None
    if isinstance(doc, list):
        doc = {"result": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("result"), list):
        raise CatalogueError(f"{p.name}: not a HEK response (no 'result' list)")
    result = ParseResult(source=SOURCE, path=str(p))
    if repair:
        warnings.warn(repair, CatalogueWarning, stacklevel=2)
        result.repairs.append(repair)
    if _true(doc.get("overmax")):
        result.truncated.append(
            f"{p.name}: HEK answered overmax=true: the response holds only the first "
            f"{len(doc['result'])} events of a search that matched more (narrow the search or page it)")
    row_ids: list[str] = []
    assoc_by_ivorn: dict[str, list[dict]] = {}
    for a in doc.get("association") or []:
        first, second, kind = a.get("first_ivorn"), a.get("second_ivorn"), a.get("edge_type") or "associated"
        if not first or not second:
            continue
        extra = {k: a.get(k) for k in ("first_id", "second_id", "first_event_type", "second_event_type",
                                       "reported_by", "strength") if a.get(k) is not None}
        result.associations.append(AssociationRecord(SOURCE, first, second, kind, extra))
        edge = {"first_ivorn": first, "edge_type": kind, "second_ivorn": second}
        assoc_by_ivorn.setdefault(first, []).append(edge)
        assoc_by_ivorn.setdefault(second, []).append(edge)

    for i, e in enumerate(doc["result"]):
        result.rows_in += 1
        if not isinstance(e, dict):
            result.refused.append((f"result[{i}]", "not a JSON object"))
            continue
        ivorn = e.get("kb_archivid") or ""
        rid = f"result[{i}] {ivorn}".strip()
        etype = str(e.get("event_type") or "").strip().upper()
        if not etype or len(etype) > 4:
            result.refused.append((rid, f"no usable event_type ({e.get('event_type')!r})"))
            continue
        if not ivorn:
            result.refused.append((rid, "no kb_archivid (IVORN) to identify the event"))
            continue
        try:
            start = _time(e.get("event_starttime"))
            peak = _time(e.get("event_peaktime"))
            end = _time(e.get("event_endtime"))
        except ValueError as exc:
            result.refused.append((rid, f"unreadable time: {exc}"))
            continue
        if start is None:
            result.refused.append((rid, "no event_starttime"))
            continue
        attrs = {k: v for k, v in e.items() if k not in _USED and k not in _DROPPED and v not in (None, "", [], {})}
        noposition = _true(e.get("noposition"))
        flags: list[str] = []
        goes_class = normalise_goes_class(e.get("fl_goescls"))
        if goes_class is not None:
            try:
                goes_class_to_flux(goes_class)
            except ValueError:
                flags.append(f"goes_class_impossible:{goes_class}")
                attrs["fl_goescls_as_reported"] = e.get("fl_goescls")
                goes_class = None
        peak_flux = _num(e.get("fl_peakflux"))
        if peak_flux is not None and peak_flux <= 0:
            # 0 and the -9999 fill: no measurement, not a flux
            flags.append(f"peak_flux_fill:{e.get('fl_peakflux')}")
            attrs["fl_peakflux_as_reported"] = e.get("fl_peakflux")
            peak_flux = None
        rec = EventRecord(
            event_type=etype, source=SOURCE, source_key=ivorn, start_time=start, peak_time=peak, end_time=end,
            channels=_channels(e), goes_class=goes_class,
            peak_value=peak_flux, peak_unit=(e.get("fl_peakfluxunit") or None) if peak_flux is not None else None,
            noaa_ar=full_noaa_number(int(_num(e["ar_noaanum"])), start) if _num(e.get("ar_noaanum")) else None,
            frm_name=e.get("frm_name") or None, frm_version=_version(e.get("frm_versionnumber")),
            description=f"{e.get('concept') or etype} ({e.get('frm_name') or 'HEK'})", attributes=attrs,
        )
        for f in flags:
            rec.flag(f)
        if not noposition:
            rec.hpc_x, rec.hpc_y = _num(e.get("hpc_x")), _num(e.get("hpc_y"))
            rec.hgs_lat, rec.hgs_lon = _num(e.get("hgs_y")), _num(e.get("hgs_x"))
        else:
            rec.flag("noposition")
        if etype == "CE":
            rec.position_angle = _num(e.get("hrc_a"))
            rec.angular_width = _num(e.get("cme_angularwidth"))
            rec.speed_km_s = _num(e.get("cme_radiallinvel"))
        if ivorn in assoc_by_ivorn:
            rec.attributes["hek_associations"] = assoc_by_ivorn[ivorn]
        if _num(e.get("ar_noaanum")) and rec.noaa_ar != int(_num(e["ar_noaanum"])):
            rec.attributes["ar_noaanum_as_reported"] = int(_num(e["ar_noaanum"]))
        result.events.append(rec)
        row_ids.append(rid)
    refuse_duplicates(result, row_ids)
    return result.check()


def _channels(e: dict) -> str | None:
    """``'AIA 131'``, ``'LASCO C2,C3'``: HEK's normalised search_instrument + search_channelid
    (obs_instrument + obs_channelid when those are missing)."""
    inst = str(e.get("search_instrument") or e.get("obs_instrument") or "").strip()
    chan = str(e.get("search_channelid") or e.get("obs_channelid") or "").strip()
    if chan and inst and chan.lower().startswith(inst.lower()):
        return chan
    return " ".join(x for x in (inst, chan) if x) or None
