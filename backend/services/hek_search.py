"""HEK-compatible event search: HEK's query parameters read into a query of our events.

The Heliophysics Events Knowledgebase (HEK, Hurlburt et al. 2012, Sol. Phys. 275, 67)
answers ``https://www.lmsal.com/hek/her?cmd=search&...``; sunpy's
``sunpy.net.hek.HEKClient(url=...)`` builds that query string from ``sunpy.net.hek.attrs``
and appends it to its ``url``. :func:`parse_hek_query` reads the same parameters and
:func:`hek_search` answers them from our ``events`` table in HEK's JSON layout
(:func:`backend.services.event_formats.events_hek`).

Parameters read (HEK's names; any other name is a :class:`HEKQueryError` naming it)
    ``cmd``            ``search`` (required; HEK's other commands are not served here)
    ``type``           ``column`` (default; HEK's ``contains`` search is not served)
    ``cosec``          ``2`` (JSON, what sunpy sends; the default)
    ``event_type``     comma list of HEK event codes, any case (``fl,ce``), ``**`` all (default)
    ``event_starttime``, ``event_endtime``  required, ISO 8601 UTC (``2012-03-07T00:00:00``); an
                       event is returned when its [start, end] overlaps them
    ``event_coordsys`` ``helioprojective`` (the default, what sunpy sends)
    ``x1, x2, y1, y2`` helioprojective box [arcsec] on the event's ``hpc_x``/``hpc_y``, inclusive;
                       all four or none. An event without a helioprojective position (a GOES
                       report row without a location, a STIX flare hidden from Earth) is
                       returned only by a box holding HEK's whole default region
                       (|x|, |y| <= 5000 arcsec, :data:`FULL_REGION`, which sunpy sends when no
                       ``SpatialRegion`` is given): a smaller box asks for events in it.
    ``paramN, opN, valueN``  N = 0, 1, ...: attribute comparisons, ANDed (:data:`HEK_PARAMS`;
                       operators ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``like``). sunpy
                       writes ``a.hek.FL.GOESCls > "M"`` as ``param0=FL_GOESCls&op0=>&value0=M``.
    ``result_limit``   rows per page, 1..:data:`MAX_RESULT_LIMIT` (default :data:`DEFAULT_RESULT_LIMIT`)
    ``page``           1-based page number (default 1)
    ``return``         comma list of the fields each row keeps (default all)

``FL_GOESCls`` is compared by the class's peak flux (``Event.goes_flux``), not as text as HEK
does (so that ``X10`` > ``X2``). A bare letter (``M``) stands for the whole class and keeps
HEK's meaning of ``> "M"`` (every ``M...`` and ``X...`` class sorts after ``"M"``): ``>`` and
``>=`` a letter are that class and above (flux >= 1e-5 W m-2 for M), ``<`` and ``<=`` below
it, ``=`` within it, ``!=`` outside it. A class with a number (``M5.2``) compares the flux as
the operator says (1e-9 relative tolerance for the class table's float rounding, as
``min_goes_class``).

Rows are in ``event_starttime`` order (then id), ``overmax`` true when more rows match
after the page. Visibility as every event route: anonymous callers see the public catalogue
(``owner IS NULL``), a user also their own events, an admin all
(:mod:`backend.services.event_visibility`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, not_, or_, select
from sqlalchemy.orm import Session

from backend.models import Event
from backend.services import event_formats
from backend.services.event_search import EventFilters, filter_conditions
from pipelines.catalogues.records import GOES_CLASS_FLUX, goes_class_to_flux
from pipelines.errors import DataError

__all__ = [
    "HEKQueryError",
    "HEKQuery",
    "HEK_PARAMS",
    "HEK_QUERY_PARAMETERS",
    "FULL_REGION",
    "DEFAULT_RESULT_LIMIT",
    "MAX_RESULT_LIMIT",
    "hek_parameter_names",
    "parse_hek_query",
    "hek_search",
]

#: Rows per page when ``result_limit`` is not given, and the most one page may hold.
DEFAULT_RESULT_LIMIT = 100
MAX_RESULT_LIMIT = 500
#: HEK's default search region (sunpy's ``SpatialRegion()``: x1=y1=-5000, x2=y2=5000 arcsec).
FULL_REGION = 5000.0
#: Largest |x|, |y| of a box [arcsec] (beyond it a number is a mistake, not a region).
_MAX_BOX = 1.0e6
_OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "like")
#: The plain (not numbered) parameters read.
HEK_QUERY_PARAMETERS = ("cmd", "type", "cosec", "event_type", "event_starttime", "event_endtime",
                        "event_coordsys", "x1", "x2", "y1", "y2", "result_limit", "page", "return")
_NUMBERED = re.compile(r"^(param|op|value)(\d{1,3})$")
_GOES_LETTER = re.compile(r"^[ABCMX]$")
_ERA = (dt.datetime(1900, 1, 1, tzinfo=dt.UTC), dt.datetime(2200, 1, 1, tzinfo=dt.UTC))


class HEKQueryError(DataError):
    """A HEK query that cannot be answered as asked: an unknown parameter, a bad value (400)."""


@dataclass(frozen=True)
class _Param:
    """A HEK attribute of our events: the column and how its values read."""

    column: str
    kind: str  # number, text, time, goes
    unit: str = ""


#: HEK attributes (lower case, as HEK's JSON writes them; names are read in any case) that
#: our events have, with the ``events`` column each compares.
HEK_PARAMS: dict[str, _Param] = {
    "fl_goescls": _Param("goes_flux", "goes"),
    "fl_peakflux": _Param("goes_flux", "number", "W m-2"),
    "cme_radiallinvel": _Param("speed_km_s", "number", "km/s"),
    "cme_angularwidth": _Param("angular_width", "number", "deg"),
    "ar_noaanum": _Param("noaa_ar", "number"),
    "frm_name": _Param("frm_name", "text"),
    "frm_version": _Param("frm_version", "text"),
    "frm_identifier": _Param("source", "text"),
    "event_starttime": _Param("start_time", "time"),
    "event_peaktime": _Param("peak_time", "time"),
    "event_endtime": _Param("end_time", "time"),
    "hpc_x": _Param("hpc_x", "number", "arcsec"),
    "hpc_y": _Param("hpc_y", "number", "arcsec"),
    "hgs_x": _Param("hgs_lon", "number", "deg"),
    "hgs_y": _Param("hgs_lat", "number", "deg"),
    "lst_source": _Param("source", "text"),
    "lst_position_angle": _Param("position_angle", "number", "deg"),
}


@dataclass(frozen=True)
class HEKQuery:
    """A HEK query, read.

    Attributes
    ----------
    filters : EventFilters
        Types, time window, box (``hpc_*`` bounds [arcsec]) and the viewer.
    conditions : tuple of (str, str, Any)
        ``(hek attribute, operator, value)`` read into our units (flux W m-2, times aware UTC).
    box : tuple of float or None
        ``(x1, x2, y1, y2)`` [arcsec] as asked.
    limit : int
        ``result_limit``.
    page : int
        1-based.
    columns : list of str or None
        ``return`` fields, or None for all.
    """

    filters: EventFilters
    conditions: tuple[tuple[str, str, Any], ...] = ()
    box: tuple[float, float, float, float] | None = None
    limit: int = DEFAULT_RESULT_LIMIT
    page: int = 1
    columns: list[str] | None = None


def hek_parameter_names(names: Sequence[str]) -> list[str]:
    """The names among ``names`` that are HEK query parameters (:data:`HEK_QUERY_PARAMETERS`,
    ``paramN``/``opN``/``valueN``), any case, in their order, except ``type`` (also a filter
    of ``GET /events``, which refuses the others)."""
    return [n for n in names if n.lower() != "type"
            and (n.lower() in HEK_QUERY_PARAMETERS or _NUMBERED.match(n.lower()))]


def _record_fields() -> list[str]:
    """The fields of a HEK row of ours (what ``return`` may name)."""
    e = Event(event_type="FL", source="x", source_key="x", start_time=_ERA[0],
              attributes={"hpc_bbox": [0, 0, 1, 1]})
    return list(event_formats.hek_record(e, position_always=True))


def _time(name: str, text: str) -> dt.datetime:
    try:
        t = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("/", "-"))
    except ValueError:
        raise HEKQueryError(f"{name}={text[:60]!r} is not a time; expected ISO 8601 UTC, "
                            "e.g. 2012-03-07T00:00:00") from None
    t = t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)
    if not _ERA[0] <= t < _ERA[1]:
        raise HEKQueryError(f"{name}={text[:60]!r} is outside {_ERA[0].year}..{_ERA[1].year - 1}")
    return t


def _number(name: str, text: str, lo: float = -_MAX_BOX, hi: float = _MAX_BOX) -> float:
    try:
        x = float(text)
    except ValueError:
        raise HEKQueryError(f"{name}={text[:60]!r} is not a number") from None
    if not math.isfinite(x) or not lo <= x <= hi:
        raise HEKQueryError(f"{name}={text[:60]!r} must be a finite number in {lo:g}..{hi:g}")
    return x


def _integer(name: str, text: str, lo: int, hi: int) -> int:
    if not re.fullmatch(r"\s*\d{1,10}\s*", text) or not lo <= int(text) <= hi:
        raise HEKQueryError(f"{name}={text[:60]!r} must be a whole number in {lo}..{hi}")
    return int(text)


def _condition_value(attr: str, op: str, text: str) -> Any:
    """The value of one ``paramN``/``opN``/``valueN`` comparison in our units."""
    spec = HEK_PARAMS[attr]
    label = f"value for {attr}"
    if op == "like" and spec.kind != "text":
        raise HEKQueryError(f"op 'like' compares text; {attr} is a {spec.kind} ({'/'.join(_OPERATORS[:-1])})")
    if spec.kind == "text":
        if op not in ("=", "!=", "like"):
            raise HEKQueryError(f"{attr} is text: use =, != or like, not {op!r}")
        if len(text) > 200 or "\x00" in text:
            raise HEKQueryError(f"{label} must be text of at most 200 characters")
        return text
    if spec.kind == "time":
        return _time(label, text)
    if spec.kind == "goes":
        cls = text.strip().upper()
        if _GOES_LETTER.fullmatch(cls):
            return cls
        try:
            return goes_class_to_flux(cls)
        except ValueError as exc:
            raise HEKQueryError(f"{label}: {exc}") from None
    return _number(label, text, -1.0e30, 1.0e30)


def parse_hek_query(params: Mapping[str, str] | Sequence[tuple[str, str]],
                    base: EventFilters | None = None) -> HEKQuery:
    """Read HEK's query parameters.

    Parameters
    ----------
    params : mapping or sequence of (name, value)
        The query string's pairs (a name given twice is refused).
    base : EventFilters, optional
        Filters to start from (the viewer: ``viewer``, ``sees_all``).

    Returns
    -------
    HEKQuery

    Raises
    ------
    HEKQueryError
        For an unknown parameter (all named), a parameter given twice, a missing or bad
        value, an unsupported ``cmd``/``type``/``cosec``/``event_coordsys``, an attribute our
        events do not have, an incomplete ``paramN``/``opN``/``valueN`` triple.
    """
    from backend.render.figures import HEK_EVENT_TYPES

    pairs = list(params.items()) if isinstance(params, Mapping) else list(params)
    q: dict[str, str] = {}
    unknown, twice = [], []
    for name, value in pairs:
        key = name.lower()
        if key not in HEK_QUERY_PARAMETERS and not _NUMBERED.match(key):
            unknown.append(name)
        elif key in q:
            twice.append(name)
        q[key] = value
    if unknown:
        raise HEKQueryError(f"unknown HEK parameter(s) {', '.join(map(repr, unknown))}; this HEK-compatible "
                            f"search reads {', '.join(HEK_QUERY_PARAMETERS)} and paramN/opN/valueN")
    if twice:
        raise HEKQueryError(f"parameter(s) given more than once: {', '.join(map(repr, twice))}")

    cmd = q.get("cmd")
    if cmd is None:
        raise HEKQueryError("cmd is required: cmd=search")
    if cmd != "search":
        raise HEKQueryError(f"cmd={cmd[:40]!r} is not served here; only cmd=search")
    if q.get("type", "column") != "column":
        raise HEKQueryError(f"type={q['type'][:40]!r} is not served here; only type=column")
    if q.get("cosec", "2") != "2":
        raise HEKQueryError(f"cosec={q['cosec'][:40]!r} is not served here; only cosec=2 (JSON)")
    coordsys = q.get("event_coordsys", "helioprojective")
    if coordsys.lower() != "helioprojective":
        raise HEKQueryError(f"event_coordsys={coordsys[:40]!r} is not served here; only helioprojective "
                            "(x1/x2/y1/y2 in arcsec)")

    types: list[str] = []
    raw_types = q.get("event_type", "**").strip()
    if raw_types != "**":
        for part in raw_types.split(","):
            code = part.strip().upper()
            if code not in HEK_EVENT_TYPES:
                raise HEKQueryError(f"event_type: unknown HEK event code {part.strip()[:20]!r}; expected "
                                    f"{', '.join(sorted(HEK_EVENT_TYPES))} (comma-separated) or **")
            if code not in types:
                types.append(code)

    missing = [n for n in ("event_starttime", "event_endtime") if n not in q]
    if missing:
        raise HEKQueryError(f"{' and '.join(missing)} required (HEK's search window, ISO 8601 UTC)")
    t0, t1 = _time("event_starttime", q["event_starttime"]), _time("event_endtime", q["event_endtime"])
    if t1 < t0:
        raise HEKQueryError(f"event_endtime ({t1:%Y-%m-%dT%H:%M:%S}) is before event_starttime "
                            f"({t0:%Y-%m-%dT%H:%M:%S})")

    box = None
    given = [n for n in ("x1", "x2", "y1", "y2") if n in q]
    if given and len(given) < 4:
        raise HEKQueryError(f"x1, x2, y1, y2 go together; missing {', '.join(n for n in ('x1', 'x2', 'y1', 'y2') if n not in given)}")
    if given:
        x1, x2, y1, y2 = (_number(n, q[n]) for n in ("x1", "x2", "y1", "y2"))
        if x2 < x1 or y2 < y1:
            raise HEKQueryError(f"the box needs x1 <= x2 and y1 <= y2 (got x {x1:g}..{x2:g}, y {y1:g}..{y2:g})")
        box = (x1, x2, y1, y2)

    conditions = []
    indices = sorted({int(m.group(2)) for k in q if (m := _NUMBERED.match(k))})
    for i in indices:
        lacking = [f"{p}{i}" for p in ("param", "op", "value") if f"{p}{i}" not in q]
        if lacking:
            raise HEKQueryError(f"param{i}/op{i}/value{i} go together; missing {', '.join(lacking)}")
        attr, op = q[f"param{i}"].strip().lower(), q[f"op{i}"].strip().lower()
        if attr not in HEK_PARAMS:
            raise HEKQueryError(f"param{i}={q[f'param{i}'][:60]!r}: our events have no such HEK attribute; "
                                f"searchable: {', '.join(HEK_PARAMS)}")
        if op not in _OPERATORS:
            raise HEKQueryError(f"op{i}={q[f'op{i}'][:20]!r} is not an operator; expected {' '.join(_OPERATORS)}")
        conditions.append((attr, op, _condition_value(attr, op, q[f"value{i}"])))

    limit = _integer("result_limit", q["result_limit"], 1, MAX_RESULT_LIMIT) if "result_limit" in q \
        else DEFAULT_RESULT_LIMIT
    page = _integer("page", q["page"], 1, 10_000_000) if "page" in q else 1
    columns = None
    if "return" in q:
        known = _record_fields()
        columns = [c.strip().lower() for c in q["return"].split(",") if c.strip()]
        bad = [c for c in columns if c not in known]
        if bad or not columns:
            raise HEKQueryError(f"return: unknown field(s) {', '.join(map(repr, bad)) or '(none given)'}; "
                                f"our rows have {', '.join(known)}")

    base = base or EventFilters()
    filters = dataclasses.replace(base, event_types=tuple(types), start=t0, end=t1)
    return HEKQuery(filters=filters, conditions=tuple(conditions), box=box, limit=limit, page=page,
                    columns=columns)


def _compare(col, op: str, value: Any):
    if op == "=":
        return col == value
    if op == "!=":
        return col != value
    if op == "<":
        return col < value
    if op == "<=":
        return col <= value
    if op == ">":
        return col > value
    return col >= value


def _goes_condition(op: str, value: Any):
    col = Event.goes_flux
    if isinstance(value, str):  # a bare letter: the whole class [lo, hi)
        lo = GOES_CLASS_FLUX[value] * (1 - 1e-9)
        hi = None if value == "X" else GOES_CLASS_FLUX[value] * 10 * (1 - 1e-9)
        within = col >= lo if hi is None else and_(col >= lo, col < hi)
        return {">": col >= lo, ">=": col >= lo, "<": col < lo, "<=": col < lo,
                "=": within, "!=": and_(col.is_not(None), not_(within))}[op]
    tol = value * 1e-9
    return {"=": and_(col >= value - tol, col <= value + tol), "!=": or_(col < value - tol, col > value + tol),
            "<": col < value - tol, "<=": col <= value + tol, ">": col > value + tol, ">=": col >= value - tol}[op]


def _conditions(query: HEKQuery) -> list:
    conds = []
    if query.box is not None:
        x1, x2, y1, y2 = query.box
        inside = and_(Event.hpc_x >= x1, Event.hpc_x <= x2, Event.hpc_y >= y1, Event.hpc_y <= y2)
        everywhere = x1 <= -FULL_REGION and y1 <= -FULL_REGION and x2 >= FULL_REGION and y2 >= FULL_REGION
        conds.append(or_(inside, Event.hpc_x.is_(None), Event.hpc_y.is_(None)) if everywhere else inside)
    for attr, op, value in query.conditions:
        spec = HEK_PARAMS[attr]
        col = getattr(Event, spec.column)
        if spec.kind == "goes":
            conds.append(_goes_condition(op, value))
        elif op == "like":
            pattern = value.replace("*", "%").lower()
            conds.append(func.lower(col).like(pattern))
        else:
            conds.append(_compare(col, op, value))
    return conds


def hek_search(session: Session, query: HEKQuery) -> dict[str, Any]:
    """Answer a HEK query: ``{"result": [row, ...], "overmax": bool}`` (HEK's layout).

    Rows are :func:`backend.services.event_formats.hek_record` with ``position_always``
    (every row has ``event_coordsys`` and ``event_coord1/2``, as HEK answers), in start-time
    order, page ``query.page`` of ``query.limit`` rows; ``overmax`` says more rows match.
    """
    conds = filter_conditions(session, query.filters) + _conditions(query)
    offset = (query.page - 1) * query.limit
    stmt = (select(Event).where(*conds).order_by(Event.start_time.asc(), Event.id.asc())
            .limit(query.limit + 1).offset(offset))
    rows = list(session.scalars(stmt))
    overmax = len(rows) > query.limit
    return event_formats.events_hek(rows[:query.limit], overmax=overmax, position_always=True,
                                    columns=query.columns)
