"""The lean event search: :func:`backend.services.event_search.search_events` (light rows) and
:func:`backend.services.coverage.window_coverage` with far less CPU, on PostgreSQL (psycopg).

What it does differently (issue 29 item 4), for the same answer:

* **SQL built once per shape.** A search's shape (which filters are given, how many types and
  sources, the sort, cursor or offset, the viewer's kind) picks one SQL text with named
  psycopg parameters, made the first time the shape is seen and kept (:data:`_SQL`, a few
  hundred shapes at most); a request only fills the parameters and sends it on the
  connection's psycopg cursor (no SQLAlchemy expression, compilation or result machinery).
  The text is that of :func:`~backend.services.event_search.filter_conditions`, condition by
  condition (the parity test, ``tests/test_lean_events.py``, compares both on every filter);
  the viewer's condition is compiled from
  :func:`backend.services.event_visibility.owner_condition` itself, so the privacy rule has one
  source.
* **One statement for the page and the count**: ``count(*)`` of at most
  :data:`~backend.services.event_search.EXACT_COUNT_LIMIT` + 1 matches in a one-row subquery,
  the page a ``LEFT JOIN LATERAL`` subquery beside it (its plan is the page's own plan: a
  ``LIMIT`` subquery is not flattened), and with them the detections' coverage aggregate and
  the catalogue coverage's generation number. Above the limit the planner's estimate is asked
  as today (``EXPLAIN``). Sorts by a nullable key keep their two page statements
  (:func:`~backend.services.event_search._nullable_key_page`), the count then separate.
  A box over a time window reads its matches once for both (:func:`_one_scan_sql`).
* **Conditions the indexes answer**, beside the exact ones and keeping the same rows: a
  (time, Solar X) point in a box (:func:`_conditions`, the GiST ``ix_events_time_hpc_x``) and,
  in the count of an angle range, the angle's whole degree in the range's degrees
  (:func:`_pa_box`, the B-tree ``ix_events_pa_deg_start``); migrations 0022 and 0024.
* **Coverage**: the catalogue spans (:func:`backend.services.coverage.catalogue_spans`) are
  kept per process and database with the ``data_generations`` number they were read with; a
  statement-level trigger on ``catalogue_coverage`` gives that number a new value on every
  change (migration 0022), so a search re-reads the table exactly when it changed, whichever
  process changed it. The per-window part is computed for each request from the spans
  (:func:`~backend.services.coverage.window_coverage_from`): no answer is cached.

Filters that go through link tables (``associated_type``, ``calibration_set``,
``calibration_file``, ``systematics``) are answered by
:func:`~backend.services.event_search.search_events` itself (:func:`lean_search` returns
None for them and the caller uses it): their first step is a read whose result decides the
statement's form.

Times: parameters are aware UTC datetimes; rows come back as psycopg gives them (aware, in
the connection's time zone).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from backend.services import event_search as _es
from backend.services.event_search import (
    DEFAULT_SORT,
    LIGHT_COLUMNS,
    SORT_KEYS,
    WINDOW_FIRST_MAX,
    EventFilters,
    SearchError,
    decode_cursor,
    encode_cursor,
    parse_sort,
)

__all__ = ["LeanPage", "lean_search", "lean_coverage", "catalogue_spans_cached", "supported"]

#: Columns of a page row, in :data:`LIGHT_COLUMNS` order.
_COLS = ", ".join(f"events.{c}" for c in LIGHT_COLUMNS)
_ID = LIGHT_COLUMNS.index("id")
#: Index of each sort key in a row.
_KEY_INDEX = {k: LIGHT_COLUMNS.index(k) for k in SORT_KEYS}
#: SQL texts by shape (see the module docstring); the lock only guards the dict's growth.
_SQL: dict[tuple, Any] = {}
_SQL_LOCK = threading.Lock()


@dataclass
class LeanPage:
    """A page as :class:`~backend.services.event_search.EventPage` gives it to the JSON writer:
    ``items`` are tuples in :data:`LIGHT_COLUMNS` order."""

    items: list[tuple]
    total: int
    total_is_estimate: bool
    next_cursor: str | None
    sort: str
    limit: int
    offset: int
    #: (first, last) DATE-OBS of the detections' window when asked (``detected`` coverage).
    detected: tuple | None = None
    #: the catalogue coverage's generation number read with the page (None: not read).
    generation: int | None = None

    @property
    def truncated(self) -> bool:
        return self.next_cursor is not None


def supported(f: EventFilters) -> bool:
    """Whether :func:`lean_search` answers these filters itself (no link-table filter)."""
    return not (f.associated_type or f.calibration_set or f.calibration_file is not None or f.systematics)


def _viewer_sql(f: EventFilters) -> tuple[str | None, str | None]:
    """The viewer's condition as SQL (compiled once per kind from
    :func:`~backend.services.event_visibility.owner_condition`) and the name of its user
    parameter (None when it has none)."""
    kind = "all" if f.sees_all else ("user" if f.viewer else "anon")
    hit = _SQL.get(("viewer", kind))
    if hit is None:
        from sqlalchemy.dialects import postgresql

        from backend.models import Event
        from backend.services.event_visibility import owner_condition

        sentinel = "\x00viewer\x00"
        cond = owner_condition(sentinel if kind == "user" else None, kind == "all", Event.__table__.c.owner)
        if cond is None:
            hit = (None, None)
        else:
            c = cond.compile(dialect=postgresql.psycopg.dialect())
            names = [k for k, v in c.params.items() if v == sentinel]
            if len(names) != len(c.params) or (kind == "user") != (len(names) == 1):
                raise RuntimeError(f"unexpected viewer condition {c.string!r}")  # pragma: no cover
            sql = c.string
            if names:
                sql = sql.replace(f"%({names[0]})s", "%(viewer)s")
            hit = (sql, "viewer" if names else None)
        with _SQL_LOCK:
            _SQL[("viewer", kind)] = hit
    return hit


def _in(col: str, name: str, n: int) -> str:
    if n == 1:
        return f"{col} = %({name}0)s"
    return f"{col} IN ({', '.join(f'%({name}{i})s' for i in range(n))})"


#: The start time in seconds since 2000-01-01 UTC, as the GiST indexes of migration 0022 write it.
TIME_S = "date_part('epoch', events.start_time - '2000-01-01 00:00:00+00'::timestamptz)"
_EPOCH_2000 = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
#: Slack of the time side of the point-in-box conditions [s] (float rounding of the epoch).
_BOX_SLACK_S = 1.0


def _x_box(f: EventFilters, lower_bound: bool) -> bool:
    """Whether the (time, Solar X) box condition is added: both time bounds, both X bounds."""
    return bool(lower_bound and f.end is not None and f.start is not None and f.hpc_x_min is not None
                and f.hpc_x_max is not None)


#: The position angle's whole degree, clamped to [-1, 360] (NaN and +inf to 360, -inf to -1), as
#: the B-tree ``ix_events_pa_deg_start`` of migration 0024 keys it (the same text).
PA_DEG = "least(greatest(floor(events.position_angle), -1), 360)"


def _pa_degrees(f: EventFilters) -> list[float] | None:
    """The whole degrees (:data:`PA_DEG`) that the angle filter's rows can have (None: no angle
    filter): every row the exact condition keeps has its degree in the list, so the condition
    ``PA_DEG = ANY(list)`` beside it keeps the same rows. ``floor`` and the clamp are monotonic:
    ``lo <= pa <= hi`` gives a degree between those of ``lo`` and ``hi``; through 0 deg
    (``pa >= lo OR pa <= hi``, which also keeps NaN and +-inf) from that of ``lo`` up to 360 (NaN,
    +inf) and from -1 (-inf) up to that of ``hi``."""
    if f.pa_min is None and f.pa_max is None:
        return None
    lo = 0.0 if f.pa_min is None else f.pa_min
    hi = 360.0 if f.pa_max is None else f.pa_max

    if not (math.isfinite(lo) and math.isfinite(hi)):  # not from the parsers; every degree then
        return [float(d) for d in range(-1, 361)]

    def deg(x: float) -> int:
        return min(max(math.floor(x), -1), 360)

    if lo <= hi:
        return [float(d) for d in range(deg(lo), deg(hi) + 1)]
    return [float(d) for d in range(-1, deg(hi) + 1)] + [float(d) for d in range(deg(lo), 361)]


def _pa_box(f: EventFilters) -> str | None:
    """The whole-degree condition that the exact count of an angle range adds beside the exact
    conditions (:func:`_pa_degrees`: the same rows; None without an angle filter). It lets the
    planner read the B-tree ``ix_events_pa_deg_start`` of migration 0024 (degree, start time;
    INCLUDE what the search tests), one range of start times per degree, index-only: a year of
    CMEs in a 20-120 deg range reads the few thousand entries of those degrees instead of every
    CME of the year (8,000-26,000 entries of ``ix_events_type_start_id``). The page does not
    get it: its B-tree scan newest first stops at the page's end (measured cheaper)."""
    if f.pa_min is None and f.pa_max is None:
        return None
    return f"{PA_DEG} = ANY(%(pa_deg)s)"


def _count_where(f: EventFilters, conds: list[str]) -> str:
    """The WHERE text of the exact count: ``conds`` and, with an angle filter, :func:`_pa_box`."""
    box = _pa_box(f)
    return " AND ".join(([box] if box else []) + conds)


def _conditions(f: EventFilters, lower_bound: bool) -> list[str]:
    """The SQL conditions of :func:`~backend.services.event_search.filter_conditions` for the
    filters given (names of the parameters: :func:`_params`), and, with both time bounds and both
    Solar X bounds, a point-in-box condition on (start time, Solar X) that the GiST index
    ``ix_events_time_hpc_x`` of migration 0022 answers: a superset of what the exact conditions
    beside it keep (the time side widened by :data:`_BOX_SLACK_S`), so the rows are the same.
    (The same for the position angle, ``point(time, position_angle)``, made the planner
    combine it with the type's time index into a bitmap heap scan slower than the covering
    index-only scan it replaced: a year of CMEs 12-30 ms instead of 3-12; not used.)"""
    conds: list[str] = []
    if _x_box(f, lower_bound):
        conds.append(f"point({TIME_S}, events.hpc_x) <@ box(point(%(box_t0)s, %(hpc_x_min)s), "
                     "point(%(box_t1)s, %(hpc_x_max)s))")
    viewer, _ = _viewer_sql(f)
    if viewer is not None:
        conds.append(f"({viewer})")
    if f.event_types:
        conds.append(_in("events.event_type", "type", len(f.event_types)))
    if f.end is not None:
        conds.append("events.start_time <= %(end)s")
    if f.start is not None:
        conds.append("coalesce(events.end_time, events.peak_time, events.start_time) >= %(start)s")
        if lower_bound:
            conds.append("events.start_time >= %(lower)s")
    if f.sources:
        conds.append(_in("events.source", "source", len(f.sources)))
    if f.channel:
        conds.append("(events.channels = %(ch)s OR events.channels LIKE %(ch_a)s OR events.channels LIKE %(ch_b)s "
                     "OR events.channels LIKE %(ch_c)s)")
    for name, op in (("hpc_x_min", ">="), ("hpc_x_max", "<="), ("hpc_y_min", ">="), ("hpc_y_max", "<=")):
        if getattr(f, name) is not None:
            conds.append(f"events.{name[:5]} {op} %({name})s")
    if f.pa_min is not None or f.pa_max is not None:
        lo = 0.0 if f.pa_min is None else f.pa_min
        hi = 360.0 if f.pa_max is None else f.pa_max
        conds.append("events.position_angle >= %(pa_lo)s " + ("AND" if lo <= hi else "OR")
                     + " events.position_angle <= %(pa_hi)s")
        conds[-1] = f"({conds[-1]})"
    if f.min_goes_flux is not None:
        conds.append("events.goes_flux >= %(flux)s")
    if f.min_peak_value is not None:
        conds.append("events.peak_value >= %(peak)s")
    if f.min_angular_width is not None:
        conds.append("events.angular_width >= %(width)s")
    if f.frm_name:
        conds.append("events.frm_name = %(frm_name)s")
    if f.frm_version:
        conds.append("events.frm_version = %(frm_version)s")
    if f.noaa_ar is not None:
        conds.append("events.noaa_ar IN (%(ar)s, %(ar_full)s)" if f.noaa_ar < 10_000 else "events.noaa_ar = %(ar)s")
    return conds


def _params(f: EventFilters, lower: dt.datetime | None) -> dict[str, Any]:
    """The parameters of :func:`_conditions`."""
    p: dict[str, Any] = {}
    if f.viewer and not f.sees_all:
        p["viewer"] = f.viewer
    for i, t in enumerate(f.event_types):
        p[f"type{i}"] = t
    if f.end is not None:
        p["end"] = f.end
    if f.start is not None:
        p["start"] = f.start
        if lower is not None:
            p["lower"] = lower
            if f.end is not None:
                p["box_t0"] = (lower - _EPOCH_2000).total_seconds() - _BOX_SLACK_S
                p["box_t1"] = (f.end - _EPOCH_2000).total_seconds() + _BOX_SLACK_S
    for i, s in enumerate(f.sources):
        p[f"source{i}"] = s
    if f.channel:
        c = f.channel
        p.update(ch=c, ch_a=f"{c},%", ch_b=f"%,{c}", ch_c=f"%,{c},%")
    for name in ("hpc_x_min", "hpc_x_max", "hpc_y_min", "hpc_y_max"):
        v = getattr(f, name)
        if v is not None:
            p[name] = v
    if f.pa_min is not None or f.pa_max is not None:
        p["pa_lo"] = 0.0 if f.pa_min is None else f.pa_min
        p["pa_hi"] = 360.0 if f.pa_max is None else f.pa_max
        p["pa_deg"] = _pa_degrees(f)
    if f.min_goes_flux is not None:
        p["flux"] = f.min_goes_flux * (1 - 1e-9)  # as filter_conditions: float rounding only
    if f.min_peak_value is not None:
        p["peak"] = f.min_peak_value
    if f.min_angular_width is not None:
        p["width"] = f.min_angular_width
    if f.frm_name:
        p["frm_name"] = f.frm_name
    if f.frm_version:
        p["frm_version"] = f.frm_version
    if f.noaa_ar is not None:
        p["ar"] = f.noaa_ar
        if f.noaa_ar < 10_000:
            p["ar_full"] = f.noaa_ar + 10_000
    return p


def _shape(f: EventFilters) -> tuple:
    """What decides the SQL text of the conditions (not the values)."""
    pa = None
    if f.pa_min is not None or f.pa_max is not None:
        pa = (0.0 if f.pa_min is None else f.pa_min) <= (360.0 if f.pa_max is None else f.pa_max)
    return ("all" if f.sees_all else ("user" if f.viewer else "anon"), len(f.event_types), f.end is not None,
            f.start is not None, len(f.sources), bool(f.channel), f.hpc_x_min is not None, f.hpc_x_max is not None,
            f.hpc_y_min is not None, f.hpc_y_max is not None, pa, f.min_goes_flux is not None,
            f.min_peak_value is not None, f.min_angular_width is not None, bool(f.frm_name), bool(f.frm_version),
            None if f.noaa_ar is None else f.noaa_ar < 10_000)


def _longest_sql(n_types: int) -> str:
    """:func:`~backend.services.event_search._longest_duration` for ``n_types`` types (0: all)."""
    if not n_types:
        return "SELECT coalesce((SELECT max(events.duration_s) FROM events), 0.0)"
    subs = [f"coalesce((SELECT max(events.duration_s) FROM events WHERE events.event_type = %(type{i})s), 0.0)"
            for i in range(n_types)]
    return "SELECT " + (subs[0] if n_types == 1 else f"greatest({', '.join(subs)})")


def _deferred(key: str, where: str, inner_order: str, outer_order: str, limit: str) -> str:
    """A page as a deferred join: the ids (and sort key) of the page first, from the filter
    columns alone (an index-only scan where an index carries them: the search indexes INCLUDE
    them, ``SEARCH_INCLUDE``), then the page's rows by id, in the same order. The same rows as
    ``SELECT cols ... ORDER BY ... LIMIT`` (the order is total: the id breaks ties); a plain
    index scan tested the filters on every table row it visited (6,000 rows for 44 matches of a
    box over a month)."""
    keycol = "" if key == "id" else f", events.{key} AS {key}"
    inner = (f"SELECT events.id AS id{keycol} FROM events" + (f" WHERE {where}" if where else "")
             + f" ORDER BY {inner_order} {limit}")
    return f"SELECT {_COLS} FROM ({inner}) AS k JOIN events ON events.id = k.id ORDER BY {outer_order}"


def _order(key: str, desc: bool, by_window: bool, table: str = "events.") -> str:
    """:func:`~backend.services.event_search._order` as SQL (on ``table``'s columns: ``k.`` for
    the outer order of :func:`_deferred`)."""
    if table != "events.":
        d = " DESC" if desc else " ASC"
        nulls = f"({table}{key} IS NULL) ASC, " if SORT_KEYS[key][1] else ""
        return f"{table}id{d}" if key == "id" else f"{nulls}{table}{key}{d}, {table}id{d}"
    col = f"events.{key}"
    nullable = SORT_KEYS[key][1]
    if by_window:
        col = f"{col} + INTERVAL '0 seconds'" if key in ("start_time", "peak_time", "end_time") else f"{col} + 0"
        col = f"({col})" if key != "id" else col
    d = " DESC" if desc else " ASC"
    if key == "id":
        return col + d
    parts = []
    if nullable:
        parts.append(f"(events.{key} IS NULL) ASC")
    parts += [col + d, "events.id" + d]
    return ", ".join(parts)


def _sql(shape: tuple, build):
    hit = _SQL.get(shape)
    if hit is None:
        hit = build()
        with _SQL_LOCK:
            if len(_SQL) > 4096:  # pragma: no cover - a bound, not expected (shapes are few)
                _SQL.clear()
            _SQL[shape] = hit
    return hit


_DETECTED_SQL: dict[tuple[bool, bool], tuple[str, dict]] = {}


def _detected_sql(start: bool, end: bool) -> tuple[str, dict]:
    """SQL and fixed parameters of :func:`backend.services.coverage.detected_window_query`
    (compiled once per shape with SQLAlchemy's psycopg dialect)."""
    hit = _DETECTED_SQL.get((start, end))
    if hit is None:
        import enum

        from sqlalchemy.dialects import postgresql

        from backend.services.coverage import detected_window_query

        c = detected_window_query(start, end).compile(dialect=postgresql.psycopg.dialect())
        fixed = {}
        for k, v in c.params.items():
            if k in ("start", "end"):
                continue
            fixed[k] = v.value if isinstance(v, enum.Enum) else v
        sql = c.string
        for k in list(fixed):
            sql = sql.replace(f"%({k})s", f"%(det_{k})s")
        sql = sql.replace("%(start)s", "%(det_start)s").replace("%(end)s", "%(det_end)s")
        hit = (sql, {f"det_{k}": v for k, v in fixed.items()})
        _DETECTED_SQL[(start, end)] = hit
    return hit


def _note(deadline, sql: str) -> None:
    """Tell the request's deadline which query runs (its 503 names it), as the engine hooks do."""
    if deadline is not None:
        import time

        deadline.query, deadline.query_started = "SELECT on events", time.monotonic()


#: ``(host, port, dbname)`` of each open connection (:func:`_database`).
_DATABASE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _database(conn) -> tuple:
    """``(host, port, dbname)`` of a psycopg connection (what the kept values are kept per),
    read from its ``info`` once per connection (each is a libpq call and a decode)."""
    hit = _DATABASE.get(conn)
    if hit is None:
        info = conn.info
        hit = _DATABASE[conn] = (info.host, info.port, info.dbname)
    return hit


#: The longest ``duration_s`` of the types searched that a search last read, per database and
#: types (:func:`lean_search`): a lower bound made from it is checked in the same statement.
_LONGEST: dict[tuple, float] = {}


def _lower_bound(cur, f: EventFilters, *, fresh: bool, deadline=None) -> tuple[dt.datetime | None, bool | None,
                                                                                tuple | None, float | None]:
    """The time-overlap lower bound of :func:`lean_search` (``event_search.filter_conditions``):
    ``(lower, check, longest_key, secs)``, ``secs`` the longest duration used [s]. From the longest duration of the types, read by a probe
    (``fresh``, or nothing kept), or, in the one-statement form, from the value the last search
    read, checked in the same statement (``check``): a kept value at least the current one gives
    the same rows (the bound only has to be below every overlapping event's start); a smaller one,
    the search again with the current value (an import stored a longer event). All None
    without a start time; ``lower`` None (``check`` False) when the bound overflows."""
    if f.start is None:
        return None, None, None, None
    longest_key = (*_database(cur.connection), f.event_types)
    secs = None if fresh else _LONGEST.get(longest_key)
    check = secs is not None
    if secs is None:
        secs_sql = _sql(("longest", len(f.event_types)), lambda: _longest_sql(len(f.event_types)))
        _note(deadline, secs_sql)
        cur.execute(secs_sql, {f"type{i}": t for i, t in enumerate(f.event_types)})
        secs = float(cur.fetchone()[0] or 0.0)
        _LONGEST[longest_key] = secs
    try:
        return f.start - dt.timedelta(seconds=secs + 1.0), check, longest_key, secs
    except OverflowError:
        return None, False, longest_key, secs


def lean_search(cur, f: EventFilters, *, sort: str | None, limit: int, cursor: str | None, offset: int,
                detected: bool, deadline=None, _probe: bool = False) -> LeanPage | None:
    """One page of light rows, the total, the next cursor, and (when ``detected``) the first
    and last DATE-OBS of the detections' window, as
    :func:`~backend.services.event_search.search_events` (``light=True``) and
    :func:`~backend.services.coverage.window_coverage` would give them.

    Parameters
    ----------
    cur : psycopg.Cursor
        A cursor of the request's connection (autocommit, or inside the test's transaction).
    f : EventFilters
    sort, limit, cursor, offset
        As :func:`~backend.services.event_search.search_events`.
    detected : bool
        Also read the detections' window (the ``detected`` source's coverage is asked).
    deadline : backend.api.app.RequestDeadline, optional
        Told the query that runs.

    Returns
    -------
    LeanPage or None
        None when the filters need :func:`~backend.services.event_search.search_events`
        (:func:`supported`).

    Raises
    ------
    SearchError
        As :func:`~backend.services.event_search.search_events` (bad sort, bad cursor, cursor
        with offset).
    """
    if not supported(f):
        return None
    key, desc = parse_sort(sort or DEFAULT_SORT)
    sort_s = ("-" if desc else "") + key
    fp = None
    value = row_id = None
    if cursor:
        if offset:
            raise SearchError("cursor and offset cannot be combined: a cursor already says where the page starts")
        fp = f.fingerprint()
        value, row_id = decode_cursor(cursor, sort_s, fp)
    nullable = SORT_KEYS[key][1]
    lower, check, longest_key, secs = _lower_bound(cur, f, fresh=_probe or (nullable and not offset),
                                                   deadline=deadline)
    params = _params(f, lower)
    shape = _shape(f) + (lower is not None,)
    by_window = key != "start_time" and f.start is not None and f.end is not None and f.end - f.start <= WINDOW_FIRST_MAX
    det_sql = None
    if detected:
        det_sql, det_fixed = _detected_sql(f.start is not None, f.end is not None)
        params.update(det_fixed)
        params["det_start"], params["det_end"] = f.start, f.end
    if nullable and not offset:
        rows = _nullable_pages(cur, f, shape, params, key, desc, limit, cursor is not None, value, row_id, by_window,
                               deadline)
        total, estimate, det, gen = _count_and_meta(cur, f, shape, params, det_sql, deadline)
    else:
        page_params = dict(params, lim=limit + 1, off=offset)
        keyset = ""
        if cursor:
            page_params["kv"], page_params["kid"] = value, row_id
            keyset = ("events.id < %(kid)s" if desc else "events.id > %(kid)s") if key == "id" else \
                (f"(events.{key}, events.id) {'<' if desc else '>'} (%(kv)s, %(kid)s)")

        # a box over a time window: the count's matches are read once, the page sorted from them
        one_scan = not cursor and _x_box(f, lower is not None)

        def build(one: bool):
            conds = _conditions(f, lower is not None)
            longest = _longest_sql(len(f.event_types))[len("SELECT "):] if check else None
            if one:
                return _one_scan_sql(key, desc, " AND ".join(conds), det_sql, longest)
            page_where = " AND ".join(conds + ([keyset] if keyset else []))
            meta = _meta_sql(_count_where(f, conds), det_sql, longest)
            page = _deferred(key, page_where, _order(key, desc, by_window), _order(key, desc, False, "k."),
                             "LIMIT %(lim)s OFFSET %(off)s")
            return f"SELECT meta.*, p.* FROM ({meta}) AS meta LEFT JOIN LATERAL ({page}) AS p ON true"

        def run(one: bool) -> list:
            sql = _sql(("page", shape, key, desc, by_window, bool(cursor), det_sql is not None, _es.EXACT_COUNT_LIMIT,
                        check, one), lambda: build(one))
            _note(deadline, sql)
            cur.execute(sql, page_params)
            return cur.fetchall()

        got = run(one_scan)
        if one_scan and got[0][0] > _es.EXACT_COUNT_LIMIT:  # more matches than read: the page from the index
            got = run(False)
        n, gen = got[0][0], got[0][1]
        skip = 2
        if check:
            now = float(got[0][2] or 0.0)
            skip = 3
            if now > secs:  # a longer event than the bound allowed for: again, with a probe
                return lean_search(cur, f, sort=sort, limit=limit, cursor=cursor, offset=offset, detected=detected,
                                   deadline=deadline, _probe=True)
            if now < secs:  # the same rows; the estimate (EXPLAIN) is asked with the current bound
                _LONGEST[longest_key] = now
                params = dict(params, **{k: v for k, v in _params(f, f.start - dt.timedelta(seconds=now + 1.0)).items()
                                         if k in ("lower", "box_t0")})
        det = (got[0][skip], got[0][skip + 1]) if det_sql is not None else None
        skip += 2 if det_sql is not None else 0
        rows = [r[skip:] for r in got] if got[0][skip + _ID] is not None else []
        total, estimate = _total(cur, f, shape, params, n, deadline)
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more and rows:
        last = rows[-1]
        next_cursor = encode_cursor(sort_s, last[_KEY_INDEX[key]], last[_ID], fp or f.fingerprint())
    return LeanPage(items=rows, total=total, total_is_estimate=estimate, next_cursor=next_cursor, sort=sort_s,
                    limit=limit, offset=offset, detected=det, generation=gen)


_GENERATION = "(SELECT data_generations.value FROM data_generations WHERE data_generations.name = 'catalogue_coverage')"


def _meta_sql(where: str | None, detected: str | None, longest: str | None = None, count: str | None = None) -> str:
    """One row: the capped count (of ``where``, or the statement ``count``), the catalogue
    coverage's generation, with ``longest`` (the expression of :func:`_longest_sql`) the longest
    duration now, and with ``detected`` (the SQL of :func:`_detected_sql`) the detections'
    window (first, last)."""
    if count is None:
        count = (f"SELECT count(*) FROM (SELECT 1 FROM events" + (f" WHERE {where}" if where else "")
                 + f" LIMIT {_es.EXACT_COUNT_LIMIT + 1}) AS anon_1")
    sql = f"SELECT ({count}) AS n, {_GENERATION} AS gen" + (f", {longest} AS longest" if longest else "")
    if detected:
        return f"SELECT m.*, d.* FROM ({sql}) AS m CROSS JOIN ({detected}) AS d"
    return sql


def _one_scan_sql(key: str, desc: bool, where: str, det_sql: str | None, longest: str | None) -> str:
    """The page and the count from one read of the matches (a box over a time window): the
    matches' ids and sort keys, at most :data:`~backend.services.event_search.EXACT_COUNT_LIMIT`
    + 1 of them, as a materialized CTE; the count is theirs, the page the first of them in the
    sort order (the order is total: the id breaks ties), its rows by id. The same page as
    :func:`_deferred` while they are all the matches (count <= the limit); above it the caller
    reads the page again from the index (:func:`lean_search`). The box's GiST
    (``ix_events_time_hpc_x``, index-only since migration 0024) gives the matches in no order:
    the two-statement form read it twice, once for the count and once for the page's sort."""
    keycol = "" if key == "id" else f", events.{key} AS {key}"
    cte = (f"WITH matches AS MATERIALIZED (SELECT events.id AS id{keycol} FROM events WHERE {where} "
           f"LIMIT {_es.EXACT_COUNT_LIMIT + 1}) ")
    meta = _meta_sql(None, det_sql, longest, count="SELECT count(*) FROM matches")
    page = (f"SELECT {_COLS} FROM (SELECT matches.* FROM matches ORDER BY {_order(key, desc, False, 'matches.')} "
            f"LIMIT %(lim)s OFFSET %(off)s) AS k JOIN events ON events.id = k.id "
            f"ORDER BY {_order(key, desc, False, 'k.')}")
    return cte + f"SELECT meta.*, p.* FROM ({meta}) AS meta LEFT JOIN LATERAL ({page}) AS p ON true"


def _count_and_meta(cur, f, shape, params, det_sql, deadline):
    """The count and the coverage inputs in one statement (nullable sorts' pages are separate)."""
    def build():
        conds = _conditions(f, "lower" in params)
        return _meta_sql(_count_where(f, conds), det_sql)

    sql = _sql(("meta", shape, det_sql is not None, _es.EXACT_COUNT_LIMIT), build)
    _note(deadline, sql)
    cur.execute(sql, params)
    row = cur.fetchone()
    total, estimate = _total(cur, f, shape, params, row[0], deadline)
    return total, estimate, ((row[2], row[3]) if det_sql is not None else None), row[1]


def _total(cur, f, shape, params, n: int, deadline) -> tuple[int, bool]:
    """The exact count, or above the limit the planner's estimate (as ``event_search._count``)."""
    if n <= _es.EXACT_COUNT_LIMIT:
        return n, False
    import psycopg

    where = " AND ".join(_conditions(f, "lower" in params))
    base = "SELECT 1 FROM events" + (f" WHERE {where}" if where else "")
    # the values inlined as literals (psycopg's own quoting), as the original compiles with literal binds
    literal = psycopg.ClientCursor(cur.connection).mogrify(base, {k: v for k, v in params.items() if f"%({k})s" in base})
    _note(deadline, literal)
    cur.execute(f"EXPLAIN (FORMAT JSON) {literal}")
    plan = cur.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return max(int(plan[0]["Plan"]["Plan Rows"]), _es.EXACT_COUNT_LIMIT + 1), True


def _nullable_pages(cur, f, shape, params, key, desc, limit, after_cursor, value, row_id, by_window, deadline) -> list:
    """:func:`~backend.services.event_search._nullable_key_page` as SQL."""
    col = f"events.{key}"
    rows: list = []
    by = col
    if by_window:
        by = f"({col} + INTERVAL '0 seconds')" if key in ("peak_time", "end_time") else f"({col} + 0)"
    d = " DESC" if desc else " ASC"
    if not (after_cursor and value is None):
        def build1():
            conds = _conditions(f, "lower" in params) + [f"{col} IS NOT NULL"]
            if after_cursor:
                conds.append(f"({col}, events.id) {'<' if desc else '>'} (%(kv)s, %(kid)s)")
            return _deferred(key, " AND ".join(conds), f"{by}{d}, events.id{d}", f"k.{key}{d}, k.id{d}", "LIMIT %(lim)s")

        sql = _sql(("nn1", shape, key, desc, by_window, after_cursor), build1)
        p = dict(params, lim=limit + 1)
        if after_cursor:
            p["kv"], p["kid"] = value, row_id
        _note(deadline, sql)
        cur.execute(sql, p)
        rows = cur.fetchall()
    if len(rows) <= limit:
        with_id = after_cursor and value is None

        def build2():
            conds = _conditions(f, "lower" in params) + [f"{col} IS NULL"]
            if with_id:
                conds.append("events.id < %(kid)s" if desc else "events.id > %(kid)s")
            by_id = "events.id + 0" if by_window else "events.id"
            return _deferred("id", " AND ".join(conds), f"{by_id}{d}", f"k.id{d}", "LIMIT %(lim)s")

        sql = _sql(("nn2", shape, key, desc, by_window, with_id), build2)
        p = dict(params, lim=limit + 1 - len(rows))
        if with_id:
            p["kid"] = row_id
        _note(deadline, sql)
        cur.execute(sql, p)
        rows += cur.fetchall()
    return rows


# -- coverage ------------------------------------------------------------------------------------

_SPANS: dict[tuple, tuple[int, dict]] = {}
_SPANS_LOCK = threading.Lock()


def catalogue_spans_cached(cur, generation: int | None, deadline=None) -> dict:
    """:func:`backend.services.coverage.catalogue_spans` of this database, read again only when
    ``generation`` (the ``data_generations`` number read with the search, in the same snapshot)
    differs from the one the kept copy was read with."""
    from backend.services.coverage import catalogue_spans

    where = _database(cur.connection)
    hit = _SPANS.get(where)
    if hit is not None and generation is not None and hit[0] == generation:
        return hit[1]
    _note(deadline, "catalogue_coverage")
    # the number and the rows in one statement (one snapshot): a change after it gets a new number
    cur.execute("SELECT g.value, c.source, c.covers_start, c.covers_end, c.complete, c.basis "
                f"FROM (SELECT {_GENERATION} AS value) AS g LEFT JOIN catalogue_coverage AS c ON true")
    got = cur.fetchall()
    gen = got[0][0]
    spans = catalogue_spans([r[1:] for r in got if r[1] is not None])
    if gen is not None:
        with _SPANS_LOCK:
            _SPANS[where] = (gen, spans)
    return spans


def lean_coverage(cur, page: LeanPage, sources, start, end, deadline=None) -> dict:
    """The coverage of :func:`backend.services.coverage.window_coverage` for a lean page."""
    from backend.services.coverage import detected_window_from, window_coverage_from

    spans = catalogue_spans_cached(cur, page.generation, deadline)
    det = detected_window_from(page.detected[0], page.detected[1], start, end) if page.detected is not None else None
    return window_coverage_from(spans, sources, start, end, det)
