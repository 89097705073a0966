"""Event search: filters, sort, keyset (cursor) pagination and counts that scale.

:func:`search_events` answers the search API (``GET /api/v1/events``) and the browser.

Filters (all optional, combined with AND)
    HEK type (several: OR), time overlap with [start, end], source (several: OR), channel,
    helioprojective bounding box [arcsec], position-angle range [deg] (wrapping through 0
    when ``pa_min > pa_max``), minimum GOES flux [W m-2] (from ``min_goes_class``), minimum
    peak value, detector (``frm_name``, ``frm_version``), NOAA active region, "has an
    associated event of type X" (``event_associations``), calibration set or calibration
    file of the L2 products an event was detected from (``event_products`` -> ``products``), a
    frame-wide systematic flagged on them (``products.quality_flags``).
Sort
    ``start_time``, ``peak_time``, ``end_time``, ``goes_flux``, ``speed_km_s`` or ``id``,
    ascending or descending (``-`` prefix), the id breaking ties; events without a value of
    a nullable key come last in either direction. Default ``-start_time`` (newest first).
Pagination
    Keyset: the opaque cursor holds the sort key, the last row's value and id, and a
    fingerprint of the filters, so the next page is an index range scan whatever its depth
    (``OFFSET`` would read and drop every earlier row). A cursor used with other filters or
    another sort is refused (:class:`SearchError`).
Counts
    Exact up to :data:`EXACT_COUNT_LIMIT` matches (``count(*)`` over at most that many index
    entries); above it, on PostgreSQL, the planner's row estimate (at least the limit) with
    ``total_is_estimate=True``. Never a silent cap.

Time overlap: an event lasts from ``start_time`` to its end (peak when no end). The
condition ``start_time <= end AND last_time >= start`` alone has no lower bound on the
indexed ``start_time``; the longest ``duration_s`` of the types searched (one probe of
``ix_events_type_duration`` per type, or of ``ix_events_duration`` for all types, one
short query) gives one: ``start_time >= start - longest``, passed as a literal so that the
planner can estimate the range. Exact, not a heuristic: no stored event can overlap and
start earlier.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    and_,
    any_,
    bindparam,
    false,
    func,
    literal_column,
    or_,
    select,
    text,
    tuple_,
)
from sqlalchemy.orm import Session

from backend.models import Event, EventAssociation, EventProduct, Product, ProductCalibrationFile
from backend.services.event_visibility import owner_condition
from pipelines.errors import DataError
from pipelines.utc import as_utc

__all__ = [
    "SearchError",
    "EventFilters",
    "EventPage",
    "SORT_KEYS",
    "DEFAULT_SORT",
    "EXACT_COUNT_LIMIT",
    "search_events",
    "filter_conditions",
    "parse_sort",
    "encode_cursor",
    "decode_cursor",
]

#: The events table and its columns. Statements are built on the table (SQLAlchemy Core), not
#: on the mapped class: a Core statement goes from ``Session.execute`` straight to the
#: connection, without the ORM's compile-state and loading steps (fewer Python calls per
#: statement, see benchmarks/reports/events_api.md); the full-object query still selects the
#: mapped class.
_EVENTS = Event.__table__
_E = _EVENTS.c

#: Above this many matches the total is the planner's estimate (flagged), on PostgreSQL.
EXACT_COUNT_LIMIT = 10_000
#: Sort keys: column and whether it may be NULL.
SORT_KEYS: dict[str, tuple[Any, bool]] = {
    "start_time": (_E.start_time, False),
    "peak_time": (_E.peak_time, True),
    "end_time": (_E.end_time, True),
    "goes_flux": (_E.goes_flux, True),
    "speed_km_s": (_E.speed_km_s, True),
    "id": (_E.id, False),
}
DEFAULT_SORT = "-start_time"
#: Largest event id (PostgreSQL ``integer``): a cursor with a bigger id is damaged, not a query.
MAX_EVENT_ID = 2**31 - 1
#: Columns of a light search row (what a list, CSV, VOTable or timeline shows).
LIGHT_COLUMNS = ("id", "event_type", "source", "source_key", "start_time", "peak_time", "end_time", "channels",
                 "hpc_x", "hpc_y", "hgs_lat", "hgs_lon", "position_angle", "angular_width", "speed_km_s",
                 "goes_class", "goes_flux", "peak_value", "peak_unit", "noaa_ar", "frm_name", "frm_version",
                 "owner", "calibration_set_id")
#: Keys of ``Event.attributes`` that a light row also carries, after :data:`LIGHT_COLUMNS`, as
#: ``attr_<key>`` (one JSON value each, not the whole JSON): what CSV and VOTable show of the
#: source's observatory, instrument and channel (HEK and DONKI rows keep them there) and of a
#: GOES level the source gives (the STIX list). Read by
#: :func:`backend.services.event_formats.event_attributes`.
LIGHT_ATTRIBUTE_KEYS = ("obs_observatory", "obs_instrument", "obs_channelid", "instruments",
                        "goes_xrs_class_at_flare_time", "goes_xrs_flux_at_flare_time_w_m2")
_TIME_KEYS = {"start_time", "peak_time", "end_time"}
_LIGHT = tuple(_E[c] for c in LIGHT_COLUMNS) + tuple(_E.attributes[k].label(f"attr_{k}")
                                                     for k in LIGHT_ATTRIBUTE_KEYS)


class SearchError(DataError):
    """A search request that cannot be answered as asked (bad cursor, bad sort); a 4xx."""


@dataclass(frozen=True)
class EventFilters:
    """What to search for. Units: times aware UTC, hpc in arcsec, angles in degrees
    counter-clockwise from solar north, ``min_goes_flux`` in W m-2.

    Attributes
    ----------
    event_types : tuple of str
        HEK codes; an event matches any of them.
    start, end : datetime.datetime or None
        The event's [start_time, end (peak) time] overlaps [start, end].
    sources : tuple of str
        ``detected`` or catalogue names; any of them.
    channel : str or None
        One LST channel code contained in the event's ``channels``.
    hpc_x_min, hpc_x_max, hpc_y_min, hpc_y_max : float or None
        Helioprojective bounding box of the event's ``hpc_x``/``hpc_y`` [arcsec], inclusive.
    pa_min, pa_max : float or None
        Position-angle range [deg, 0..360]; ``pa_min > pa_max`` wraps through north (0).
    min_goes_flux : float or None
        Minimum GOES 0.1-0.8 nm peak flux [W m-2] (``goes_flux``).
    min_peak_value : float or None
        Minimum ``peak_value`` (in the event's own ``peak_unit``).
    frm_name, frm_version : str or None
        Detector (HEK FRM_NAME, FRM_VERSION), exact.
    noaa_ar : int or None
        NOAA active-region number. A number below 10000 also matches that number + 10000
        (SRS and HEK print regions after 2002-06-14 with four digits: 3664 is 13664; see
        :func:`pipelines.catalogues.records.full_noaa_number`).
    associated_type : str or None
        HEK code: the event has an association (``event_associations``, any kind) with an
        event of this type (``CE``: flares with a CME).
    calibration_set : str or None
        A calibration set id (digits, ``CalibrationSet.id``), or a ``Product.calibration_key``
        (``kind:id`` pairs, e.g. ``dark:3,flat:5``): the event is linked (``event_products``)
        to an L2 product made with exactly this calibration set.
    calibration_file : int or None
        A calibration file id: the event is linked to an L2 product that used it
        (``product_calibration_files``).
    viewer : str or None
        Who searches (:mod:`backend.services.event_visibility`): None is anonymous and sees
        the public catalogue only (``owner IS NULL``); a user sees it and their own events.
    sees_all : bool
        An admin: every event, whoever owns it.
    min_angular_width : float or None
        Smallest angular width [deg] (``angular_width``: a CME's width in position angle,
        CDAW/CACTus; 360 for a halo CME). Events without a width never match.
    systematics : str or None
        A frame-wide systematic (``centre_refused``, ..., or ``any``;
        :data:`pipelines.calibration.l2.quality.SYSTEMATICS`): the event is linked
        (``event_products``) to an L2 product on which the calibration flagged it
        (``Product.quality_flags``).
    """

    event_types: tuple[str, ...] = ()
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    sources: tuple[str, ...] = ()
    channel: str | None = None
    hpc_x_min: float | None = None
    hpc_x_max: float | None = None
    hpc_y_min: float | None = None
    hpc_y_max: float | None = None
    pa_min: float | None = None
    pa_max: float | None = None
    min_goes_flux: float | None = None
    min_peak_value: float | None = None
    frm_name: str | None = None
    frm_version: str | None = None
    noaa_ar: int | None = None
    associated_type: str | None = None
    calibration_set: str | None = None
    calibration_file: int | None = None
    viewer: str | None = None
    sees_all: bool = False
    min_angular_width: float | None = None
    systematics: str | None = None

    def fingerprint(self) -> str:
        """A short hash of the filters (a cursor is only valid with the filters it came from):
        the first 12 hex digits of the SHA-256 of ``json.dumps`` (keys sorted, ``default=str``)
        of every field's value, times as ISO text."""
        # the fields' values as they are (asdict would deep-copy them): the same JSON, the same hash;
        # the field names read once per class (dataclasses.fields walks them on every call)
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))
        d = {}
        for k in names:
            v = getattr(self, k)
            d[k] = v.isoformat() if isinstance(v, dt.datetime) else v
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


#: The field names of each filters class, in their order (:meth:`EventFilters.fingerprint`).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass
class EventPage:
    """One page of a search.

    Attributes
    ----------
    items : list of Event
    total : int
        Matches, all pages (an estimate when ``total_is_estimate``).
    total_is_estimate : bool
        True when more than :data:`EXACT_COUNT_LIMIT` match and ``total`` is the planner's
        estimate (never below the limit).
    next_cursor : str or None
        Cursor of the next page; None on the last page.
    sort : str
    limit, offset : int
    """

    items: list[Event]
    total: int
    total_is_estimate: bool
    next_cursor: str | None
    sort: str
    limit: int
    offset: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        """True when more events match than this page holds (after it)."""
        return self.next_cursor is not None


def parse_sort(sort: str | None) -> tuple[str, bool]:
    """``'-start_time'`` -> ``('start_time', True)`` (descending); SearchError for unknown keys."""
    s = (sort or DEFAULT_SORT).strip()
    desc = s.startswith("-")
    key = s.lstrip("+-")
    if key not in SORT_KEYS:
        raise SearchError(f"unknown sort key {sort!r}; expected one of "
                          f"{', '.join(sorted(SORT_KEYS))}, optionally prefixed with - for descending")
    return key, desc


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def encode_cursor(sort: str, value: Any, row_id: int, fingerprint: str) -> str:
    """Opaque cursor: base64url JSON of the sort, the last row's sort value and id, the filters' hash."""
    if isinstance(value, dt.datetime):
        v = as_utc(value).isoformat()
    else:
        v = value
    return _b64(json.dumps({"s": sort, "v": v, "i": int(row_id), "f": fingerprint}, separators=(",", ":")).encode())


def decode_cursor(cursor: str, sort: str, fingerprint: str) -> tuple[Any, int]:
    """The (value, id) of a cursor made for this sort and these filters; SearchError otherwise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        d = json.loads(raw)
        s, v, i, f = d["s"], d["v"], int(d["i"]), d["f"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise SearchError("cursor: not a cursor of this API (use next_cursor of the previous page as it is)") from None
    if not 0 <= i <= MAX_EVENT_ID:
        raise SearchError("cursor: damaged id; start again without a cursor")
    if s != sort:
        raise SearchError(f"cursor: it was made for sort={s!r}, not {sort!r}; start again without a cursor")
    if f != fingerprint:
        raise SearchError("cursor: it was made with other filters; start again without a cursor")
    key = sort.lstrip("-")
    if v is not None:
        try:
            if key in _TIME_KEYS:
                v = as_utc(dt.datetime.fromisoformat(v))
            elif key == "id":
                v = int(v)
                if not 0 <= v <= MAX_EVENT_ID:
                    raise ValueError("id out of range")
            else:
                v = float(v)
                if not math.isfinite(v):
                    raise ValueError("not a finite number")
        except (TypeError, ValueError, OverflowError):
            raise SearchError("cursor: damaged value; start again without a cursor") from None
    elif not SORT_KEYS[key][1]:
        raise SearchError("cursor: damaged value; start again without a cursor")
    return v, i


def _channel_filter(channel: str):
    c = _E.channels
    return or_(c == channel, c.like(f"{channel},%"), c.like(f"%,{channel}"), c.like(f"%,{channel},%"))


def _longest_duration(event_types: tuple[str, ...]):
    """Scalar SQL expression: the longest stored ``duration_s`` [s] of these types (all
    types when empty), 0 when none. Each ``max`` is one probe of an index on
    ``(event_type, duration_s)`` or ``(duration_s)``, evaluated once per query."""
    if not event_types:
        return func.coalesce(select(func.max(_E.duration_s)).scalar_subquery(), 0.0)
    subs = [func.coalesce(select(func.max(_E.duration_s)).where(_E.event_type == t).scalar_subquery(), 0.0)
            for t in event_types]
    return subs[0] if len(subs) == 1 else func.greatest(*subs)


def filter_conditions(session: Session, f: EventFilters) -> list:
    """SQL conditions of the filters (see :class:`EventFilters`), the viewer's visibility first."""
    conds: list = []
    seen = owner_condition(f.viewer, f.sees_all, _E.owner)
    if seen is not None:
        conds.append(seen)
    if f.event_types:
        conds.append(_E.event_type.in_(f.event_types) if len(f.event_types) > 1
                     else _E.event_type == f.event_types[0])
    if f.end is not None:
        conds.append(_E.start_time <= f.end)
    if f.start is not None:
        conds.append(func.coalesce(_E.end_time, _E.peak_time, _E.start_time) >= f.start)
        # lower bound on the indexed start_time: no event starts earlier and still overlaps
        if session.get_bind().dialect.name == "postgresql":
            # index probes only; a literal bound (not a subquery) lets the planner estimate the
            # time range, so that it picks a backward index scan that stops at the page end
            secs = float(session.scalar(select(_longest_duration(f.event_types))) or 0.0)
        else:  # SQLite (the embedded mode): small tables
            q = select(func.max(_E.duration_s))
            if f.event_types:
                q = q.where(_E.event_type.in_(f.event_types))
            secs = float(session.scalar(q) or 0.0)
        try:
            conds.append(_E.start_time >= f.start - dt.timedelta(seconds=secs + 1.0))
        except OverflowError:  # a start near 0001-01-01: no lower bound on start_time is needed
            pass
    if f.sources:
        conds.append(_E.source.in_(f.sources) if len(f.sources) > 1 else _E.source == f.sources[0])
    if f.channel:
        conds.append(_channel_filter(f.channel))
    if f.hpc_x_min is not None:
        conds.append(_E.hpc_x >= f.hpc_x_min)
    if f.hpc_x_max is not None:
        conds.append(_E.hpc_x <= f.hpc_x_max)
    if f.hpc_y_min is not None:
        conds.append(_E.hpc_y >= f.hpc_y_min)
    if f.hpc_y_max is not None:
        conds.append(_E.hpc_y <= f.hpc_y_max)
    if f.pa_min is not None or f.pa_max is not None:
        lo = 0.0 if f.pa_min is None else f.pa_min
        hi = 360.0 if f.pa_max is None else f.pa_max
        pa = _E.position_angle
        conds.append(and_(pa >= lo, pa <= hi) if lo <= hi else or_(pa >= lo, pa <= hi))
    if f.min_goes_flux is not None:
        # the stored flux comes from the same class table: allow for float rounding only
        conds.append(_E.goes_flux >= f.min_goes_flux * (1 - 1e-9))
    if f.min_peak_value is not None:
        conds.append(_E.peak_value >= f.min_peak_value)
    if f.min_angular_width is not None:
        conds.append(_E.angular_width >= f.min_angular_width)
    if f.frm_name:
        conds.append(_E.frm_name == f.frm_name)
    if f.frm_version:
        conds.append(_E.frm_version == f.frm_version)
    if f.noaa_ar is not None:
        conds.append(_E.noaa_ar.in_((f.noaa_ar, f.noaa_ar + 10_000)) if f.noaa_ar < 10_000 else _E.noaa_ar == f.noaa_ar)
    # the linked sets (associations, detections): the ids themselves when few, else one
    # uncorrelated IN subquery (see _linked_ids; a correlated EXISTS made SQLite scan the
    # other type per row)
    if f.associated_type:
        # the link rows carry the other event's type and owner: one index range, no join
        other_seen = owner_condition(f.viewer, f.sees_all, EventAssociation.other_owner)  # a hidden one counts not
        conds.append(_linked_ids(session, select(EventAssociation.event_id)
                                 .where(EventAssociation.other_event_type == f.associated_type,
                                        *([] if other_seen is None else [other_seen]))))
    if f.calibration_set:
        by = (Product.calibration_set_id == int(f.calibration_set) if (f.calibration_set.isascii() and f.calibration_set.isdigit())
              else Product.calibration_key == f.calibration_set)
        conds.append(_linked_ids(session, select(EventProduct.event_id)
                                 .join(Product, Product.id == EventProduct.product_id).where(by)))
    if f.calibration_file is not None:
        conds.append(_linked_ids(session, select(EventProduct.event_id)
                                 .join(ProductCalibrationFile,
                                       ProductCalibrationFile.product_id == EventProduct.product_id)
                                 .where(ProductCalibrationFile.calibration_file_id == f.calibration_file)))
    if f.systematics:
        from backend.services.products import quality_condition

        conds.append(_linked_ids(session, select(EventProduct.event_id)
                                 .join(Product, Product.id == EventProduct.product_id)
                                 .where(quality_condition(Product.quality_flags, f.systematics))))
    return conds


#: Most link rows (:func:`_linked_ids`) read to pass a linked set as its ids.
LINKED_IDS_LIMIT = 5_000


def _linked_ids(session: Session, ids_query):
    """Condition "``events.id`` in the ids of ``ids_query``" (a one-column select of event ids
    through a link table, indexed from the linked side: migration 0015).

    Up to :data:`LINKED_IDS_LIMIT` link rows it is the ids themselves (one indexed read of at
    most that many rows first): the page and the count then visit those events only, whatever
    the planner guesses. Guessing was what failed: PostgreSQL expected a type's links to be
    as common as the type (50,000 CH events, so thousands of links) and walked all 1,000,000
    events newest first probing each one's links, for a type that has none (1.2-1.6 s, a 503
    at the API deadline). Above the limit the set is dense and stays a subquery, which the
    planners join once (hash) or probe along the page's index order, stopping at the page's end.
    """
    ids = session.execute(ids_query.limit(LINKED_IDS_LIMIT + 1)).scalars().all()
    if len(ids) > LINKED_IDS_LIMIT:
        return _E.id.in_(ids_query)
    if not ids:  # nothing linked: a constant the planners fold (an empty array still walked the index)
        return false()
    ids = sorted(set(ids))
    # one parameter, not one per id (binding 5,000 parameters cost 0.1-0.3 s of Python per
    # statement): an array on PostgreSQL, a JSON list read by json_each on SQLite
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import ARRAY

        return _E.id == any_(bindparam("linked_ids", value=ids, type_=ARRAY(Integer), unique=True))
    listed = func.json_each(bindparam("linked_ids", value=json.dumps(ids), type_=String, unique=True))
    return _E.id.in_(select(literal_column("value")).select_from(listed))


def _keyset(key: str, desc: bool, value: Any, row_id: int):
    """Rows after (value, id) in the order ``key`` (desc or not), NULLs of the key last."""
    col, nullable = SORT_KEYS[key]
    if key == "id":
        return _E.id < row_id if desc else _E.id > row_id
    if value is None:  # already among the NULLs (they come last)
        return and_(col.is_(None), _E.id < row_id if desc else _E.id > row_id)
    after = tuple_(col, _E.id) < tuple_(value, row_id) if desc else tuple_(col, _E.id) > tuple_(value, row_id)
    return or_(after, col.is_(None)) if nullable else after


#: Longest time window [start, end] whose matches are sorted rather than read in the sort
#: key's index order (:func:`_window_first`): a year, about 100,000 events at 1,000,000 over ten
#: years.
WINDOW_FIRST_MAX = dt.timedelta(days=366)


def _window_first(session: Session, f: EventFilters, key: str) -> bool:
    """Whether the page of a time window sorted by another key than ``start_time`` should read
    the window's events (``ix_events_start_id``) and sort them, on PostgreSQL: its planner
    otherwise walks the sort key's index (``id``, ``peak_time``...) from one end, expecting the
    window's events spread evenly along it, while they sit together at one place of it (ids and
    times grow together): a day of 2025 sorted by ``id`` read 1,000,000 events (1.2 s, a 503).
    Windows up to :data:`WINDOW_FIRST_MAX`; SQLite (no such statistics) already reads the window."""
    return (key != "start_time" and f.start is not None and f.end is not None and f.end - f.start <= WINDOW_FIRST_MAX
            and session.get_bind().dialect.name == "postgresql")


def _unindexed(col, by_window: bool):
    """``col`` or, with ``by_window``, the same value as an expression no index gives in order
    (``col + 0``), so that the planner filters by the window first and sorts."""
    if not by_window:
        return col
    if col.key in _TIME_KEYS:
        return col + literal_column("INTERVAL '0 seconds'")
    return col + 0


def _order(key: str, desc: bool, by_window: bool = False) -> list:
    col, nullable = SORT_KEYS[key]
    col = _unindexed(col, by_window)
    if key == "id":
        return [col.desc() if desc else col.asc()]
    order = []
    if nullable:
        order.append(col.is_(None).asc())  # NULLs last in both directions
    order += [col.desc(), _E.id.desc()] if desc else [col.asc(), _E.id.asc()]
    return order


def _nullable_key_page(run, q, conds: list, key: str, desc: bool, limit: int, after_cursor: bool,
                       value: Any, row_id: int | None, by_window: bool = False) -> list:
    """Up to ``limit + 1`` rows in the order of a nullable sort key, NULLs of the key last, as
    two statements that an index on the key (``ix_events_<key>_id``) answers in its order: the
    rows with a value (``ORDER BY key, id``), then, when the page is not full, those without
    (``ORDER BY id``). One statement ordered by ``key IS NULL, key, id`` has no index order:
    it sorted every match (all 79,000 events of the demo for ``sort=-speed_km_s``, about a
    second on SQLite; issue 25)."""
    col = SORT_KEYS[key][0]
    rows: list = []
    if not (after_cursor and value is None):  # a cursor among the NULLs has passed every value
        where = [*conds, col.is_not(None)]
        if after_cursor:
            where.append(tuple_(col, _E.id) < tuple_(value, row_id) if desc else tuple_(col, _E.id) > tuple_(value, row_id))
        by = _unindexed(col, by_window)
        order = [by.desc(), _E.id.desc()] if desc else [by.asc(), _E.id.asc()]
        rows = run(q.where(*where).order_by(*order).limit(limit + 1))
    if len(rows) <= limit:
        where = [*conds, col.is_(None)]
        if after_cursor and value is None:
            where.append(_E.id < row_id if desc else _E.id > row_id)
        by_id = _unindexed(_E.id, by_window)
        rows += run(q.where(*where).order_by(by_id.desc() if desc else by_id.asc()).limit(limit + 1 - len(rows)))
    return rows


def _count(session: Session, conds: list) -> tuple[int, bool]:
    base = select(literal_column("1")).select_from(_EVENTS)
    if conds:
        base = base.where(*conds)
    n = int(session.scalar(select(func.count()).select_from(base.limit(EXACT_COUNT_LIMIT + 1).subquery())) or 0)
    if n <= EXACT_COUNT_LIMIT:
        return n, False
    if session.get_bind().dialect.name != "postgresql":
        full = select(func.count()).select_from(_EVENTS)
        return int(session.scalar(full.where(*conds) if conds else full) or 0), False
    compiled = base.compile(dialect=session.get_bind().dialect, compile_kwargs={"literal_binds": True})
    plan = session.execute(text(f"EXPLAIN (FORMAT JSON) {compiled}")).scalar()
    plan = json.loads(plan) if isinstance(plan, str) else plan
    estimate = int(plan[0]["Plan"]["Plan Rows"])
    return max(estimate, EXACT_COUNT_LIMIT + 1), True


def search_events(
    session: Session,
    filters: EventFilters | None = None,
    *,
    sort: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    offset: int = 0,
    with_total: bool = True,
    light: bool = False,
) -> EventPage:
    """Search the events.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
    filters : EventFilters, optional
    sort : str, optional
        A key of :data:`SORT_KEYS`, ``-`` prefix for descending; default ``-start_time``.
    limit : int
        Page size (>= 1).
    cursor : str, optional
        ``next_cursor`` of the previous page (same filters and sort).
    offset : int
        Rows to skip (kept for the browser's numbered pages; 0 with a cursor).
    with_total : bool
        Count the matches (False: ``total`` is -1).
    light : bool
        Return read-only rows (``sqlalchemy.Row``, attribute access like an ``Event``) of
        :data:`LIGHT_COLUMNS` instead of ORM objects, then the few attributes of
        :data:`LIGHT_ATTRIBUTE_KEYS` (``attr_<key>``): not the whole ``attributes`` JSON,
        no ``description``; a third of the cost of a page of 100 (a list does not show them).

    Returns
    -------
    EventPage

    Raises
    ------
    SearchError
        For an unknown sort key, a cursor of another search, or a cursor with an offset.
    """
    f = filters or EventFilters()
    key, desc = parse_sort(sort)
    sort_s = ("-" if desc else "") + key
    fp = f.fingerprint()
    conds = filter_conditions(session, f)
    page_conds = list(conds)
    value = row_id = None
    if cursor:
        if offset:
            raise SearchError("cursor and offset cannot be combined: a cursor already says where the page starts")
        value, row_id = decode_cursor(cursor, sort_s, fp)
    # light: plain rows of the listed columns (read-only; no ORM identity map, no JSON column)
    q = select(*_LIGHT) if light else select(Event)

    def run(stmt) -> list:
        return list(session.execute(stmt).all() if light else session.scalars(stmt).all())

    by_window = _window_first(session, f, key)
    if SORT_KEYS[key][1] and not offset:
        rows = _nullable_key_page(run, q, conds, key, desc, limit, cursor is not None, value, row_id, by_window)
    else:
        if cursor:
            page_conds.append(_keyset(key, desc, value, row_id))
        if page_conds:
            q = q.where(*page_conds)
        rows = run(q.order_by(*_order(key, desc, by_window)).limit(limit + 1).offset(offset))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more and rows:
        last = rows[-1]
        next_cursor = encode_cursor(sort_s, getattr(last, key), last.id, fp)
    total, estimate = _count(session, conds) if with_total else (-1, False)
    return EventPage(items=rows, total=total, total_is_estimate=estimate, next_cursor=next_cursor,
                     sort=sort_s, limit=limit, offset=offset)
