"""Event exchange formats: CSV, VOTable, HEK JSON and VOEvent 2.0.

Pure functions of ``Event`` rows (no HTTP, no session):

* :func:`events_csv`: one header row, then one row per event (:data:`CSV_COLUMNS`).
* :func:`events_votable`: an IVOA VOTable (``astropy.io.votable`` from an astropy Table),
  units and UCDs on the columns, search totals as ``INFO`` elements.
* :func:`hek_record` / :func:`events_hek`: the HEK API response layout ``{"result": [...],
  "overmax": bool}`` with HEK field names (Hurlburt et al. 2012, Sol. Phys. 275, 67;
  the HEK "VOEvent parameters" list: ``event_type``, ``event_starttime``,
  ``event_peaktime``, ``event_endtime``, ``event_coord1/2``, ``event_coordunit``,
  ``event_coordsys``, ``hpc_x``, ``hpc_y``, ``hgs_x``, ``hgs_y``, ``frm_name``,
  ``frm_version``, ``fl_goescls``, ``fl_peakflux``, ``cme_radiallinvel``,
  ``cme_angularwidth``, ``ar_noaanum``, ``obs_observatory``, ``obs_instrument``,
  ``obs_channelid``, ``kb_archivid``). The ``obs_*`` fields name the catalogue's own
  observatory and instrument (:func:`observation`): ASO-S/LST only for LST events.
* :func:`event_voevent`: one event as a VOEvent 2.0 document (IVOA Recommendation
  2011-07-11), valid against its schema, with Who, What, WhereWhen (UTC-ICRS-GEO: the
  schema has no solar coordinate system; the helioprojective position is in What), How,
  Why and Citations (the associated events).

Fields HEK has no name for are given with an ``lst_`` prefix (``lst_position_angle``,
``lst_source``, ``lst_id``).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import quote

import numpy as np

from backend import __version__
from backend.models import Event
from pipelines.catalogues import DETECTED_SOURCE, source_observation
from pipelines.utc import as_utc

__all__ = [
    "CSV_COLUMNS",
    "IVORN_BASE",
    "VOEVENT_NS",
    "VOEVENT_COORD_SYSTEM",
    "VOEVENT_POSITION_ERROR_DEG",
    "geocentric_icrs",
    "event_ivorn",
    "observation",
    "events_csv",
    "events_votable",
    "GOES_LEVEL_ATTRIBUTES",
    "goes_level",
    "event_attributes",
    "hek_record",
    "events_hek",
    "event_voevent",
]

#: IVORN of this archive's events: ``<base>#<source>/<source_key>`` (stable across databases).
IVORN_BASE = "ivo://aso-s.lst/lstdp/events"
VOEVENT_NS = "http://www.ivoa.net/xml/VOEvent/v2.0"
_XSI = "http://www.w3.org/2001/XMLSchema-instance"

#: CSV/VOTable columns: (name, unit, UCD, description).
CSV_COLUMNS: list[tuple[str, str | None, str | None, str]] = [
    ("id", None, "meta.id;meta.main", "Event id in this archive"),
    ("event_type", None, "meta.code.class", "HEK event code (FL, CE, PR, ...)"),
    ("source", None, "meta.ref", "detected, or the catalogue"),
    ("source_key", None, "meta.id", "Identifier within the source"),
    ("obs_observatory", None, "meta.id;instr.obsty", "Observatory of the source (HEK obs_observatory)"),
    ("obs_instrument", None, "meta.id;instr", "Instrument of the source (HEK obs_instrument)"),
    ("obs_channelid", None, "instr.bandpass", "Channel or passband of the source (HEK obs_channelid)"),
    ("start_time", None, "time.start", "Start (UTC, ISO 8601)"),
    ("peak_time", None, "time.epoch", "Peak (UTC, ISO 8601)"),
    ("end_time", None, "time.end", "End (UTC, ISO 8601)"),
    ("channels", None, "instr.bandpass", "LST channels (comma-separated)"),
    ("hpc_x", "arcsec", "pos.cartesian.x", "Helioprojective longitude (Solar X)"),
    ("hpc_y", "arcsec", "pos.cartesian.y", "Helioprojective latitude (Solar Y)"),
    ("hgs_lat", "deg", "pos.bodyrc.lat", "Stonyhurst heliographic latitude"),
    ("hgs_lon", "deg", "pos.bodyrc.lon", "Stonyhurst heliographic longitude"),
    ("position_angle", "deg", "pos.posAng", "Position angle, counter-clockwise from solar north"),
    ("angular_width", "deg", "phys.angSize", "CME angular width"),
    ("speed_km_s", "km/s", "phys.veloc", "Plane-of-sky speed"),
    ("goes_class", None, "meta.code.class", "GOES X-ray class"),
    ("goes_flux", "W/m2", "phys.flux;em.X-ray", "GOES 0.1-0.8 nm peak flux of the class"),
    ("goes_level", None, "meta.code.class", "GOES XRS 0.1-0.8 nm level at the event time as a class (a source's "
                                             "own value, e.g. the STIX list's; not a GOES flare class)"),
    ("goes_level_flux", "W/m2", "phys.flux;em.X-ray", "GOES XRS 0.1-0.8 nm level at the event time"),
    ("peak_value", None, "phys.flux", "Peak value, in peak_unit"),
    ("peak_unit", None, "meta.unit", "Unit of peak_value"),
    ("noaa_ar", None, "meta.id", "NOAA active region number"),
    ("frm_name", None, "meta.code", "Feature recognition method (detector) name"),
    ("frm_version", None, "meta.version", "Feature recognition method version"),
]
_TIME_FIELDS = ("start_time", "peak_time", "end_time")
_FLOAT_FIELDS = {name for name, unit, _, _ in CSV_COLUMNS if unit} | {"peak_value"}


def _iso(t: dt.datetime | None, *, z: bool = True) -> str | None:
    """ISO 8601 UTC: ``2024-05-14T16:00:00Z`` (``z=False``: no zone, as HEK writes times)."""
    t = as_utc(t)
    if t is None:
        return None
    s = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond:
        s += f".{t.microsecond:06d}".rstrip("0")
    return s + ("Z" if z else "")


def event_ivorn(e: Event) -> str:
    """``ivo://aso-s.lst/lstdp/events#<source>/<source_key>`` (URL-quoted key)."""
    return f"{IVORN_BASE}#{quote(e.source, safe='')}/{quote(e.source_key, safe='')}"


#: Attributes that hold a source's GOES XRS level at the event time (not a GOES flare class):
#: the STIX flare list's ``GOES_class_time_of_flare``/``GOES_flux_time_of_flare``
#: (:mod:`pipelines.catalogues.stix`).
GOES_LEVEL_ATTRIBUTES = ("goes_xrs_class_at_flare_time", "goes_xrs_flux_at_flare_time_w_m2")


def goes_level(e: Event) -> tuple[str | None, float | None]:
    """``(class, flux [W m-2])`` of the GOES XRS 0.1-0.8 nm level at the event's time that its
    source gives (:data:`GOES_LEVEL_ATTRIBUTES`; the STIX list), or ``(None, None)``. Not the
    event's GOES flare class (``Event.goes_class``), which only a GOES flare has."""
    attrs = event_attributes(e)
    cls = _text(attrs.get(GOES_LEVEL_ATTRIBUTES[0]))
    flux = attrs.get(GOES_LEVEL_ATTRIBUTES[1])
    try:
        flux = float(flux) if flux is not None else None
    except (TypeError, ValueError):
        flux = None
    return cls, (flux if flux is not None and math.isfinite(flux) else None)


def _value(e: Event, name: str) -> Any:
    if name.startswith("obs_"):
        return dict(zip(("obs_observatory", "obs_instrument", "obs_channelid"), observation(e)))[name]
    if name in ("goes_level", "goes_level_flux"):
        return goes_level(e)[name == "goes_level_flux"]
    v = getattr(e, name)
    if name in _TIME_FIELDS:
        return _iso(v)
    return v


def events_csv(rows: list[Event]) -> str:
    """CSV text: a header row of :data:`CSV_COLUMNS` names, one row per event (empty = none)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c[0] for c in CSV_COLUMNS])
    for e in rows:
        w.writerow(["" if (v := _value(e, c[0])) is None else v for c in CSV_COLUMNS])
    return buf.getvalue()


def events_votable(rows: list[Event], info: dict[str, Any] | None = None) -> bytes:
    """A VOTable 1.4 document (XML bytes) of the events, built from an astropy Table.

    Parameters
    ----------
    rows : list of Event
    info : dict, optional
        Written as ``INFO`` elements of the resource (e.g. total, next_cursor).

    Notes
    -----
    Missing values are masked (VOTable nulls); floats carry units and UCDs, times are
    ISO 8601 UTC strings (``datatype="char"``, ``arraysize="*"``, ``xtype="timestamp"``, the
    DALI 1.1 timestamp) referring to a VOTable 1.4 ``TIMESYS`` (``timescale="UTC"``).
    Observatory, instrument and channel of each event's source (:func:`observation`) and
    the GOES level a source gives (:func:`goes_level`) are columns, as in the CSV.
    """
    from astropy.io.votable import from_table
    from astropy.io.votable.tree import Info, TimeSys
    from astropy.table import MaskedColumn, Table

    t = Table()
    for name, unit, ucd, desc in CSV_COLUMNS:
        vals = [_value(e, name) for e in rows]
        mask = [v is None for v in vals]
        if name in _FLOAT_FIELDS:
            data = np.array([np.nan if v is None else float(v) for v in vals], dtype=float)
        elif name in ("id", "noaa_ar"):
            data = np.array([0 if v is None else int(v) for v in vals], dtype=np.int64)
        elif name in _TIME_FIELDS:  # ISO 8601, ASCII: VOTable char (DALI timestamp)
            data = np.array([b"" if v is None else str(v).encode("ascii") for v in vals], dtype=bytes)
            if data.dtype.itemsize == 0 or len(data) == 0:
                data = np.array(data, dtype="S1")
        else:
            data = np.array(["" if v is None else str(v) for v in vals], dtype=str)
            if data.dtype.itemsize == 0 or len(data) == 0:
                data = np.array(data, dtype="U1")
        t[name] = MaskedColumn(data, mask=mask, unit=unit, description=desc)
    vot = from_table(t)
    vot.set_all_tables_format("tabledata")
    table = vot.get_first_table()
    table.name = "events"
    timesys = TimeSys(ID="utc", timescale="UTC", refposition="TOPOCENTER",
                      config={"version": "1.4", "version_1_4_or_later": True})
    vot.resources[0].time_systems.append(timesys)
    for f in table.fields:
        ucd = next((c[2] for c in CSV_COLUMNS if c[0] == f.name), None)
        if ucd:
            f.ucd = ucd
        if f.name in _TIME_FIELDS:
            f.datatype, f.arraysize, f.xtype, f.ref = "char", "*", "timestamp", timesys.ID
    resource = vot.resources[0]
    for k, v in (info or {}).items():
        resource.infos.append(Info(name=str(k), value="" if v is None else str(v)))
    buf = io.BytesIO()
    vot.to_xml(buf)
    return buf.getvalue()


def event_attributes(e: Any) -> dict[str, Any]:
    """The source attributes of an ``Event``, or those a light search row carries
    (``attr_<key>`` columns, :data:`backend.services.event_search.LIGHT_ATTRIBUTE_KEYS`)."""
    attrs = getattr(e, "attributes", None)
    if attrs is not None:
        return attrs
    mapping = getattr(e, "_mapping", None)
    if mapping is None:
        return {}
    return {k[5:]: v for k, v in mapping.items() if isinstance(k, str) and k.startswith("attr_") and v is not None}


def _text(v: Any) -> str | None:
    s = str(v).strip() if v is not None else ""
    return s or None


def _joined(values: list[str]) -> str | None:
    out: list[str] = []
    for v in values:
        if v and v not in out:
            out.append(v)
    return ",".join(out) or None


def observation(e: Event) -> tuple[str | None, str | None, str | None]:
    """``(obs_observatory, obs_instrument, obs_channelid)`` of the catalogue the event came from.

    ASO-S/LST (with the LST channel) only for events detected on LST products or from the
    LST/WST flare list; SOHO/LASCO for CDAW; GOES/XRS for the GOES reports; NOAA SWPC/SRS
    for the region summaries; what HEK says (``obs_observatory``, ``obs_instrument``,
    ``obs_channelid`` of the HEK row, kept in the attributes); DONKI's instruments
    (``SOHO: LASCO/C2`` -> SOHO, LASCO, C2). Unknown parts are None.
    """
    attrs = event_attributes(e)
    if e.source == "hek":
        return (_text(attrs.get("obs_observatory")), _text(attrs.get("obs_instrument")),
                _text(attrs.get("obs_channelid")) or _text(e.channels))
    if e.source == "donki":
        names = [str(n) for n in (attrs.get("instruments") or []) if n]
        obs, inst, chan = [], [], []
        for n in names:
            where, _, what = n.partition(":")
            if not what:
                where, what = "", where
            i, _, c = what.strip().partition("/")
            obs.append(where.strip())
            inst.append(i.strip())
            chan.append(c.strip())
        return _joined(obs), _joined(inst), _joined(chan) or _text(e.channels)
    observatory, instrument = source_observation(e.source)  # the source's registry entry
    return observatory, instrument, _text(e.channels)


def _event_coord(e: Event, position_always: bool) -> tuple[str | None, str | None, Any, Any, bool]:
    """``(event_coordsys, event_coordunit, event_coord1, event_coord2, noposition)``.

    Helioprojective (``UTC-HPC-TOPO``, arcsec) when the event has ``hpc_x``/``hpc_y``. Else,
    with ``position_always`` (what HEK itself answers, and what HEK clients such as sunpy's
    ``HEKTable`` need in every row), Stonyhurst heliographic (``UTC-HGS-TOPO``, degrees):
    the event's ``hgs_lon``/``hgs_lat`` (a STIX flare hidden from Earth), or HEK's
    convention for a flare without a location (SWPC rows of the HEK sample,
    ``sample-data/real/events/hek``): (0, 0) with ``noposition`` true. Without
    ``position_always`` the coordinate fields are None when there is no helioprojective
    position.
    """
    if e.hpc_x is not None and e.hpc_y is not None:
        return "UTC-HPC-TOPO", "arcsec", e.hpc_x, e.hpc_y, False
    if not position_always:
        return None, None, None, None, True
    if e.hgs_lon is not None and e.hgs_lat is not None:
        return "UTC-HGS-TOPO", "degrees", e.hgs_lon, e.hgs_lat, False
    return "UTC-HGS-TOPO", "degrees", 0.0, 0.0, True


def hek_record(e: Event, *, position_always: bool = False) -> dict[str, Any]:
    """One event as a HEK API result row (HEK field names; ``lst_`` extensions).

    ``position_always``: every row has an ``event_coordsys`` and ``event_coord1/2`` as HEK
    answers them (:func:`_event_coord`), and ``event_coord3`` (None) and ``noposition``
    (``"true"``/``"false"``, HEK's strings) are added; the HEK-compatible search
    (``GET /api/v1/hek``) answers so.
    """
    coordsys, coordunit, c1, c2, noposition = _event_coord(e, position_always)
    observatory, instrument, channel = observation(e)
    rec: dict[str, Any] = {
        "kb_archivid": event_ivorn(e),
        "event_type": e.event_type,
        "event_starttime": _iso(e.start_time, z=False),
        "event_peaktime": _iso(e.peak_time, z=False),
        "event_endtime": _iso(e.end_time, z=False),
        "event_coordsys": coordsys,
        "event_coordunit": coordunit,
        "event_coord1": c1,
        "event_coord2": c2,
        "hpc_x": e.hpc_x,
        "hpc_y": e.hpc_y,
        "hpc_bbox": None,
        "hgs_x": e.hgs_lon,
        "hgs_y": e.hgs_lat,
        "frm_name": e.frm_name,
        "frm_version": e.frm_version,
        "frm_identifier": e.source,
        "obs_observatory": observatory,
        "obs_instrument": instrument,
        "obs_channelid": channel,
        "ar_noaanum": e.noaa_ar,
        "fl_goescls": e.goes_class,
        "fl_peakflux": e.goes_flux,
        "fl_peakfluxunit": "W/m^2" if e.goes_flux is not None else None,
        "cme_radiallinvel": e.speed_km_s,
        "cme_radiallinvelunit": "km/s" if e.speed_km_s is not None else None,
        "cme_angularwidth": e.angular_width,
        "cme_angularwidthunit": "deg" if e.angular_width is not None else None,
        "event_description": e.description,
        "lst_id": e.id,
        "lst_source": e.source,
        "lst_position_angle": e.position_angle,
    }
    if position_always:
        rec["event_coord3"] = None
        rec["noposition"] = "true" if noposition else "false"
    bbox = (e.attributes or {}).get("hpc_bbox")
    if isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox):
        x0, y0, x1, y1 = bbox
        rec["hpc_bbox"] = f"POLYGON(({x0} {y0},{x1} {y0},{x1} {y1},{x0} {y1},{x0} {y0}))"
    return rec


def _finite_or_none(value: Any) -> Any:
    """A float that JSON can carry: NaN and infinities (a stored float may be one) as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def events_hek(rows: list[Event], *, overmax: bool, position_always: bool = False,
               columns: list[str] | None = None) -> dict[str, Any]:
    """``{"result": [hek_record, ...], "overmax": overmax}`` (HEK: more rows than returned);
    a NaN or infinite number is ``null`` (JSON has none).

    ``position_always`` is passed to :func:`hek_record`; ``columns`` (HEK's ``return``
    parameter) keeps only these fields of each row, in this order (names as
    :func:`hek_record` writes them; an unknown name is the caller's to refuse).
    """
    result = []
    for e in rows:
        rec = hek_record(e, position_always=position_always)
        if columns is not None:
            rec = {k: rec.get(k) for k in columns}
        result.append({k: _finite_or_none(v) for k, v in rec.items()})
    return {"result": result, "overmax": bool(overmax)}


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrib: str) -> ET.Element:
    el = ET.SubElement(parent, tag, {k: v for k, v in attrib.items() if v is not None})
    if text is not None:
        el.text = text
    return el


def _param(group: ET.Element, name: str, value: Any, *, unit: str | None = None, ucd: str | None = None) -> None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return
    _sub(group, "Param", name=name, value=str(value), unit=unit, ucd=ucd)


#: ``AstroCoordSystem`` of the VOEvent's WhereWhen: UTC times, ICRS axes, geocentric origin.
#: The VOEvent 2.0 schema allows only the STC systems of its ``idValues`` enumeration
#: (TT/UTC/GPS/TDB with ICRS/FK5, TOPO/GEO/BARY): no solar (helioprojective) system, so
#: HEK's ``UTC-HPC-TOPO`` makes a document the schema refuses. The helioprojective
#: and heliographic positions are kept as ``What`` parameters (``hpc_x``/``hpc_y``,
#: ``hgs_x``/``hgs_y``, the HEK names).
VOEVENT_COORD_SYSTEM = "UTC-ICRS-GEO"

#: ``Error2Radius`` of the WhereWhen position [deg]: one arcminute. The catalogues give no
#: position error; their positions are arcsecond-level (detections, CDAW, HEK) or whole
#: heliographic degrees (NOAA SWPC locations such as ``N12E34``: 1 degree is about 17
#: arcsec at disk centre), so one arcminute bounds them; a stated choice, not a measurement.
VOEVENT_POSITION_ERROR_DEG = 1.0 / 60.0


def geocentric_icrs(e: Event) -> tuple[float, float] | None:
    """The event's direction from the Earth's centre in ICRS axes, ``(ra, dec)`` [deg].

    From its helioprojective position (``hpc_x``/``hpc_y`` [arcsec], observer at the
    Earth's centre at the peak time, or the start time without a peak), else from its
    Stonyhurst heliographic position (``hgs_lon``/``hgs_lat`` [deg], on the photosphere,
    ``RSUN_REF`` 695 700 km, IAU 2015 nominal). The geometric direction: the point's ICRS
    (barycentric) position minus the Earth's (``astropy.coordinates.get_body_barycentric``),
    no aberration nor light time. ``None`` when the event has no finite position.

    Uses ``sunpy.coordinates`` (Helioprojective, HeliographicStonyhurst). A helioprojective
    point is placed at the Sun's distance along its line of sight: the direction does not
    depend on that distance.
    """
    import astropy.units as u
    from astropy.coordinates import SkyCoord, UnitSphericalRepresentation, get_body_barycentric
    from astropy.time import Time
    from sunpy.coordinates import HeliographicStonyhurst, Helioprojective, get_earth

    when = as_utc(e.peak_time or e.start_time)
    if when is None:
        return None
    t = Time(when, scale="utc")

    def finite(*v: Any) -> bool:
        return all(x is not None and math.isfinite(float(x)) for x in v)

    if finite(e.hpc_x, e.hpc_y):
        earth = get_earth(t)
        c = SkyCoord(e.hpc_x * u.arcsec, e.hpc_y * u.arcsec, earth.radius,
                     frame=Helioprojective(obstime=t, observer=earth))
    elif finite(e.hgs_lon, e.hgs_lat):
        from sunpy.sun.constants import radius as rsun

        c = SkyCoord(e.hgs_lon * u.deg, e.hgs_lat * u.deg, rsun, frame=HeliographicStonyhurst(obstime=t))
    else:
        return None
    xyz = c.icrs.cartesian - get_body_barycentric("earth", t)
    sph = xyz.represent_as(UnitSphericalRepresentation)
    return float(sph.lon.to_value(u.deg)) % 360.0, float(sph.lat.to_value(u.deg))


def event_voevent(e: Event, associated: list[tuple[Event, str]] | None = None,
                  *, author: str = "LST data platform") -> bytes:
    """One event as a VOEvent 2.0 XML document (UTF-8 bytes).

    Parameters
    ----------
    e : Event
    associated : list of (Event, str), optional
        Linked events and the kind of link; written as ``Citations/EventIVORN`` with
        ``cite="followup"`` and the kind in the Citations description.
    author : str
        ``Who/Author/contactName``.

    Returns
    -------
    bytes
        ``<voe:VOEvent ivorn=... role="observation" version="2.0">`` with Who, What
        (HEK parameters as ``Param``, the helioprojective ``hpc_x``/``hpc_y`` among them),
        WhereWhen (time, and the direction from the Earth's centre as RA/Dec in
        :data:`VOEVENT_COORD_SYSTEM`, :func:`geocentric_icrs`), How, Why and, if any,
        Citations. Valid against the IVOA VOEvent 2.0 schema
        (``tests/schemas/VOEvent-v2.0.xsd``).

    References
    ----------
    IVOA VOEvent 2.0 Recommendation (Seaman et al. 2011); HEK VOEvent usage
    (Hurlburt et al. 2012, Sol. Phys. 275, 67).
    """
    ET.register_namespace("voe", VOEVENT_NS)
    ET.register_namespace("xsi", _XSI)
    root = ET.Element(f"{{{VOEVENT_NS}}}VOEvent", {
        "ivorn": event_ivorn(e),
        "role": "observation",
        "version": "2.0",
        f"{{{_XSI}}}schemaLocation": f"{VOEVENT_NS} http://www.ivoa.net/xml/VOEvent/VOEvent-v2.0.xsd",
    })
    who = _sub(root, "Who")
    _sub(who, "AuthorIVORN", IVORN_BASE)
    _sub(who, "Date", _iso(dt.datetime.now(dt.UTC)))
    auth = _sub(who, "Author")
    _sub(auth, "title", "ASO-S Lyman-alpha Solar Telescope (LST) event archive")
    _sub(auth, "contactName", author)

    what = _sub(root, "What")
    rec = hek_record(e)
    for name in ("event_type", "frm_name", "frm_version", "frm_identifier", "obs_observatory", "obs_instrument",
                 "obs_channelid", "fl_goescls", "ar_noaanum", "kb_archivid"):
        _param(what, name, rec.get(name))
    _param(what, "event_starttime", rec["event_starttime"], ucd="time.start")
    _param(what, "event_peaktime", rec["event_peaktime"], ucd="time.epoch")
    _param(what, "event_endtime", rec["event_endtime"], ucd="time.end")
    _param(what, "fl_peakflux", e.goes_flux, unit="W/m^2", ucd="phys.flux;em.X-ray")
    _param(what, "cme_radiallinvel", e.speed_km_s, unit="km/s", ucd="phys.veloc")
    _param(what, "cme_angularwidth", e.angular_width, unit="deg", ucd="phys.angSize")
    _param(what, "lst_position_angle", e.position_angle, unit="deg", ucd="pos.posAng")
    _param(what, "hpc_x", e.hpc_x, unit="arcsec", ucd="pos.cartesian.x")
    _param(what, "hpc_y", e.hpc_y, unit="arcsec", ucd="pos.cartesian.y")
    _param(what, "hgs_x", e.hgs_lon, unit="deg", ucd="pos.bodyrc.lon")
    _param(what, "hgs_y", e.hgs_lat, unit="deg", ucd="pos.bodyrc.lat")
    if e.peak_value is not None:
        _param(what, "lst_peak_value", e.peak_value, unit=e.peak_unit)

    ww = _sub(root, "WhereWhen")
    odl = _sub(ww, "ObsDataLocation")
    _sub(odl, "ObservatoryLocation", id="GEOLUN")
    ol = _sub(odl, "ObservationLocation")
    _sub(ol, "AstroCoordSystem", id=VOEVENT_COORD_SYSTEM)
    ac = _sub(ol, "AstroCoords", coord_system_id=VOEVENT_COORD_SYSTEM)
    tm = _sub(_sub(_sub(ac, "Time"), "TimeInstant"), "ISOTime")
    when = e.peak_time or e.start_time
    tm.text = _iso(when, z=False)
    radec = geocentric_icrs(e)
    if radec is not None:
        pos = _sub(ac, "Position2D", unit="deg")
        _sub(pos, "Name1", "RA")
        _sub(pos, "Name2", "Dec")
        v2 = _sub(pos, "Value2")
        _sub(v2, "C1", f"{radec[0]:.6f}")
        _sub(v2, "C2", f"{radec[1]:.6f}")
        _sub(pos, "Error2Radius", f"{VOEVENT_POSITION_ERROR_DEG:.6f}")

    how = _sub(root, "How")
    if e.source == DETECTED_SOURCE:
        _sub(how, "Description", f"Detected on LST L2 products by {e.frm_name} {e.frm_version or ''}".strip()
             + f" (lstdp {__version__})")
    else:
        _sub(how, "Description", f"Imported from the {e.source} catalogue"
             + (f" (method {e.frm_name})" if e.frm_name else ""))
    observed = " ".join(x for x in (rec["obs_observatory"], rec["obs_instrument"]) if x)
    if observed:
        _sub(how, "Description", f"Observed with {observed}"
             + (f" ({rec['obs_channelid']})" if rec["obs_channelid"] else ""))

    why = _sub(root, "Why")
    inf = _sub(why, "Inference", probability="1.0")
    from backend.render.figures import HEK_EVENT_TYPES

    _sub(inf, "Name", e.event_type)
    _sub(inf, "Concept", HEK_EVENT_TYPES.get(e.event_type, e.event_type))

    if associated:
        cit = _sub(root, "Citations")
        for other, _kind in associated:
            _sub(cit, "EventIVORN", event_ivorn(other), cite="followup")
        _sub(cit, "Description", "; ".join(f"{k}: {event_ivorn(o)}" for o, k in associated))
    if e.description:
        _sub(root, "Description", e.description)
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8")
