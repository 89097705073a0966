"""The lean events path: ``GET /api/v1/events`` (JSON) and ``GET /api/v1/events/{id}`` with far
less CPU per request, the same answers byte for byte (issue 29 item 4).

How: :func:`install` wraps the ASGI app of the two FastAPI routes (``APIRoute.app``). The
wrapper reads the query string itself with strict, cheap checks (:data:`SEARCH_PARAMS`) and,
when every parameter is one it reads and every value is plainly valid, answers without
FastAPI's per-request dependency machinery: the filters go through the same parser as the
route (:func:`backend.services.event_filters.parse_event_filters`, ``check_event_filters``,
``for_viewer``), the principal through the same dependencies
(:func:`backend.api.deps.current_principal` with the same bearer and cookie readers; an
anonymous request, which carries neither, is None without them), the session from the same
provider (``get_session``, or the app's override of it), and the search through
:mod:`backend.services.event_search_lean` (SQL built once per shape, page and count in one
statement, catalogue coverage kept until an import changes it), written with orjson.
Everything else (a value it does not read plainly, a parameter it does not know, a format
other than JSON, an error of the filters) goes to the route as before, which answers it
(422s included) as it always has. Routing, middleware (deadline, body limit, HEAD,
compression), exception handlers and the OpenAPI description are untouched: only the
route's handler changes.

Per request CPU (issue 29 item 4, ``benchmarks/events_api_load.py``'s ``server_cpu_ms``): an
anonymous read checks its pooled connection out without the pool's pre-ping and repeats the
read on a pinged connection if that one was lost (:class:`_Reads`,
:func:`backend.db.checkout_without_ping`); the blocking work runs on this module's own thread
pool (:func:`_in_thread`, about 0.03 ms less than ``anyio.to_thread``); plain UTC times
(``2024-05-14T16:00:00Z``) are read without the general time parser (:func:`_time`).

At most :func:`lean_threads` requests run against the database at once (``LEAN_EVENTS_THREADS``,
by default the machine's CPUs plus one): the others wait on :func:`_running` before they take
a connection (the p99 under load, not the CPU: :class:`backend.settings.Settings` says why).

``LEAN_EVENTS=0`` in the environment turns the lean path off (every request takes the route's
own handler).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import datetime as dt
import inspect
import math
import os
import re
import threading
import weakref
from itertools import repeat
from typing import Any
from urllib.parse import parse_qsl

import anyio
import orjson
from fastapi import HTTPException
from starlette.requests import Request

from backend.auth import SESSION_COOKIE
from backend.services.event_filters import MAX_HPC_ARCSEC, MAX_ID

__all__ = ["install", "SEARCH_PARAMS", "declared_query_params", "LeanStats", "STATS", "lean_threads"]

SEARCH_PATH = "/api/v1/events"
DETAIL_PATH = "/api/v1/events/{event_id}"

#: A plain decimal number (what the lean path parses itself; anything else, e.g. ``1e3``,
#: ``inf``, `` 5``, goes to the route, which parses it as it always has).
_NUMBER = re.compile(r"-?[0-9]{1,12}(\.[0-9]{1,12})?")
_INT = re.compile(r"[0-9]{1,10}")
_SORT = re.compile(r"[-+]?[a-z_]+")
_CURSOR = re.compile(r"[A-Za-z0-9_\-]*")


class _Refuse(Exception):
    """A value the lean path does not read itself: the route answers the request."""


def _float(lo: float | None, hi: float | None):
    def parse(v: str) -> float:
        if not _NUMBER.fullmatch(v):
            raise _Refuse
        x = float(v)
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            raise _Refuse
        return x
    return parse


def _int(lo: int, hi: int):
    def parse(v: str) -> int:
        if not _INT.fullmatch(v):
            raise _Refuse
        x = int(v)
        if not lo <= x <= hi:
            raise _Refuse
        return x
    return parse


def _text(max_length: int, pattern: re.Pattern | None = None, no_nul: bool = False):
    def parse(v: str) -> str:
        if len(v) > max_length or (pattern is not None and not pattern.fullmatch(v)) or (no_nul and "\x00" in v):
            raise _Refuse
        return v
    return parse


#: A time in whole seconds, UTC, as clients write it most (``2024-05-14T16:00:00Z``): read by
#: :func:`_time` without the general parser, to the same value.
_CANONICAL_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})Z")


def _time(v: str) -> dt.datetime:
    """The route's reading of a time (``time_input``, then ``as_utc``); a plain UTC time in
    whole seconds directly (the same value: ``tests/test_lean_events.py`` compares both on
    every form, leap-second days included), except in the minute before midnight, where a leap
    second may fall (the general parser then decides)."""
    m = _CANONICAL_TIME.fullmatch(v)
    if m is not None and m.group(4, 5) != ("23", "59"):
        try:
            return dt.datetime(int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                               int(m.group(6)), tzinfo=dt.UTC)
        except ValueError:
            pass  # not a date or time (month 13, hour 24, second 60...): the general parser says what
    return _time_general(v)


def _time_general(v: str) -> dt.datetime:
    # the route's validators in their order: time_input (BeforeValidator), then as_utc (AfterValidator)
    from backend.api.params import as_utc, time_input

    try:
        t = as_utc(time_input(v))
    except ValueError:
        raise _Refuse from None
    if not isinstance(t, dt.datetime):
        raise _Refuse
    return t


def _channel(v: str) -> str | None:
    from backend.api.params import canonical_channel

    try:
        return canonical_channel(v)
    except ValueError:
        raise _Refuse from None


def _choice(*allowed: str):
    def parse(v: str) -> str:
        if v not in allowed:
            raise _Refuse
        return v
    return parse


def _systematics(v: str) -> str:
    from typing import get_args

    from backend.api.params import Systematic

    if v not in get_args(Systematic):
        raise _Refuse
    return v


#: The query parameters of ``GET /events`` that the lean path reads, each with its strict
#: reader (a value it refuses goes to the route) and whether it repeats. The bounds are the
#: route's (``backend/api/params.py``, ``backend/api/routes/events.py``); a declared
#: parameter missing here sends every request that gives it to the route, and the test
#: ``tests/test_lean_events.py`` fails on such a parameter.
SEARCH_PARAMS: dict[str, tuple[Any, bool]] = {
    "limit": (_int(1, 500), False),
    "offset": (_int(0, MAX_ID), False),
    "start": (_time, False),
    "end": (_time, False),
    "type": (_text(10_000), True),
    "source": (_text(10_000), True),
    "channel": (_channel, False),
    "hpc_x_min": (_float(-MAX_HPC_ARCSEC, MAX_HPC_ARCSEC), False),
    "hpc_x_max": (_float(-MAX_HPC_ARCSEC, MAX_HPC_ARCSEC), False),
    "hpc_y_min": (_float(-MAX_HPC_ARCSEC, MAX_HPC_ARCSEC), False),
    "hpc_y_max": (_float(-MAX_HPC_ARCSEC, MAX_HPC_ARCSEC), False),
    "pa_min": (_float(0, 360), False),
    "pa_max": (_float(0, 360), False),
    "min_goes_class": (_text(12), False),
    "min_peak_value": (_float(None, None), False),
    "frm_name": (_text(100, no_nul=True), False),
    "frm_version": (_text(40, no_nul=True), False),
    "noaa_ar": (_int(1, 99_999), False),
    "associated_type": (_text(4), False),
    "calibration_set": (_text(400), False),
    "calibration_file": (_int(1, MAX_ID), False),
    "min_angular_width": (_float(0, 360), False),
    "systematics": (_systematics, False),
    "sort": (_text(20, _SORT), False),
    "cursor": (_text(400, _CURSOR), False),
    "format": (_choice("json"), False),
}


class LeanStats:
    """Counts of requests answered by the lean path and handed to the route (per route), for
    tests and benchmarks."""

    def __init__(self) -> None:
        self.lean = {SEARCH_PATH: 0, DETAIL_PATH: 0}
        self.route = {SEARCH_PATH: 0, DETAIL_PATH: 0}


STATS = LeanStats()


def declared_query_params(app, path: str = SEARCH_PATH) -> list[str]:
    """The query parameters that ``GET path`` of ``app`` declares (its own and its
    dependencies'), as its OpenAPI description lists them."""
    op = app.openapi()["paths"][path]["get"]
    return [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]


def _read_search_params(query_string: bytes) -> dict[str, Any]:
    """The parameters as the lean path reads them; :class:`_Refuse` for anything else. The
    query string is split as Starlette's ``QueryParams`` splits it (``parse_qsl`` of its
    Latin-1 text, blank values kept), without building the multidict."""
    given: dict[str, list[str]] = {}
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        values = given.get(name)
        if values is None:
            given[name] = [value]
        else:
            values.append(value)
    out: dict[str, Any] = {}
    for name, values in given.items():
        spec = SEARCH_PARAMS.get(name)
        if spec is None:
            raise _Refuse  # unknown (HEK names among them: the route answers 400)
        parse, repeats = spec
        if not repeats and len(values) != 1:
            raise _Refuse
        if any(v == "" for v in values):
            raise _Refuse
        out[name] = [parse(v) for v in values] if repeats else parse(values[0])
    return out


def _filters(p: dict[str, Any], principal):
    """The route's ``event_search`` dependency on the values read (the same parser)."""
    import dataclasses

    from backend.services.event_filters import (
        EventFilterError,
        check_event_filters,
        for_viewer,
        parse_event_filters,
    )

    start, end = p.get("start"), p.get("end")
    if start is not None and end is not None and end < start:
        raise _Refuse  # the route's time_range answers 422
    parsed = parse_event_filters(
        types=p.get("type"), sources=p.get("source"), start=start, end=end, channel=p.get("channel"),
        pa_min=p.get("pa_min"), pa_max=p.get("pa_max"), hpc_x_min=p.get("hpc_x_min"), hpc_x_max=p.get("hpc_x_max"),
        hpc_y_min=p.get("hpc_y_min"), hpc_y_max=p.get("hpc_y_max"), min_goes_class=p.get("min_goes_class"),
        min_peak_value=p.get("min_peak_value"), frm_name=p.get("frm_name"), frm_version=p.get("frm_version"),
        noaa_ar=p.get("noaa_ar"), associated_type=p.get("associated_type"), calibration_set=p.get("calibration_set"),
        calibration_file=p.get("calibration_file"), min_angular_width=p.get("min_angular_width"),
    )
    try:
        filters = check_event_filters(parsed)
    except EventFilterError:
        raise _Refuse from None
    if p.get("systematics") is not None:
        filters = dataclasses.replace(filters, systematics=p["systematics"])
    return for_viewer(filters, principal)


def _needs_principal(scope) -> bool:
    """Whether the request carries a token or a session cookie (else it is anonymous)."""
    for k, v in scope["headers"]:
        if k == b"authorization" and v.strip():
            return True
        if k == b"cookie" and SESSION_COOKIE.encode() in v:
            return True
    return False


async def _principal(scope, session):
    """The request's principal by the route's own dependency (:func:`backend.api.deps.current_principal`)."""
    from backend.api import deps

    request = Request(scope)
    bearer = await deps._bearer(request)
    cookie = await deps._cookie(request)
    return await deps.current_principal(request, session, bearer, cookie)


class _SessionScope:
    """The request's session from the provider the route would use (``get_session`` or the
    app's override of it), ended as FastAPI ends a generator dependency."""

    def __init__(self, app) -> None:
        from backend.api.deps import get_session

        provider = get_session
        overrides = getattr(app, "dependency_overrides", None)
        if overrides:
            provider = overrides.get(get_session, get_session)
        self.provider = provider
        self.gen = None

    async def __aenter__(self):
        p = self.provider
        if inspect.isasyncgenfunction(p):
            self.gen = p()
            return await self.gen.__anext__()
        if inspect.isgeneratorfunction(p):
            self.gen = p()
            return next(self.gen)
        return p()  # pragma: no cover - the providers are generators

    async def __aexit__(self, exc_type, exc, tb):
        g = self.gen
        if g is None:
            return False
        if inspect.isasyncgen(g):
            try:
                if exc is None:
                    await g.__anext__()
                else:
                    await g.athrow(exc)
            except StopAsyncIteration:
                pass
            except BaseException as raised:
                if raised is exc:
                    return False
                raise
            return False
        try:
            if exc is None:
                next(g)
            else:
                g.throw(exc)
        except StopIteration:
            pass
        except BaseException as raised:
            if raised is exc:
                return False
            raise
        return False


def _db_error(exc, sql: str | None):
    """A psycopg error as SQLAlchemy's exception of the same kind (the app's handlers answer it:
    503 for a lost connection or a slow query, 422 for a value the database refuses)."""
    import psycopg
    from sqlalchemy import exc as sa_exc

    return sa_exc.DBAPIError.instance(sql, None, exc, psycopg.Error)


_ZERO = dt.timedelta(0)


def _utc(t):
    from pipelines.utc import as_utc

    return t if t is None or t.utcoffset() == _ZERO else as_utc(t)


def _page_body(page, coverage: dict, utc: bool = False) -> bytes:
    """The JSON of ``routes.events.page_json`` (same keys, same order, same text) with orjson
    (which writes NaN and infinities as ``null``, as ``page_json`` asks pydantic-core to).
    ``utc``: the rows' times are known to be UTC (:func:`_is_utc`), none is converted."""
    from backend.services.event_search import LIGHT_COLUMNS

    cols = LIGHT_COLUMNS
    if utc:
        items = list(map(dict, map(zip, repeat(cols), page.items)))
    else:
        items = []
        for row in page.items:
            d = dict(zip(cols, row))
            for k in ("start_time", "peak_time", "end_time"):
                d[k] = _utc(d[k])
            items.append(d)
    return orjson.dumps({
        "items": items, "total": page.total, "limit": page.limit, "offset": page.offset,
        "total_is_estimate": page.total_is_estimate, "sort": page.sort, "next_cursor": page.next_cursor,
        "truncated": page.truncated, "coverage": coverage,
    }, option=orjson.OPT_UTC_Z)


def _coverage_json(cover) -> dict:
    return {s: {"status": c.status, "message": c.message,
                "spans": [{"start": _utc(x.start), "end": _utc(x.end), "complete": x.complete} for x in c.spans]}
            for s, c in cover.items()}


class _Reads:
    """The request's read connection (psycopg): the session's, in autocommit
    (:func:`backend.db.autocommit_reads`), or, with no session (an anonymous request on the
    API's own engine, :func:`_uses_pool`), one checked out of the API engine's pool, the same pool
    and pre-ping the session would use, in autocommit while it is held, without the session's
    bookkeeping (about 0.1 ms a request). Such a connection is checked out without the pool's
    pre-ping (:func:`backend.db.checkout_without_ping`) unless ``ping``: a caller that finds it
    lost (:meth:`lost_unpinged`) repeats its read with ``ping=True``."""

    def __init__(self, session, ping: bool = False) -> None:
        self.session, self._fairy, self.unpinged = session, None, False
        if session is not None:
            from backend.db import autocommit_reads

            autocommit_reads(session)
            self._conn = session.connection()
            self.dialect = self._conn.dialect.name
            self.dbapi = self._conn.connection.dbapi_connection
        else:
            from backend.db import checkout_without_ping, get_engine

            engine = get_engine("api")
            self._fairy = engine.raw_connection() if ping else checkout_without_ping(engine)
            self.unpinged = not ping
            self.dialect = "postgresql"
            self.dbapi = self._fairy.dbapi_connection
            self.dbapi.autocommit = True

    def invalidate(self) -> None:
        """After a psycopg OperationalError: a pooled connection that is lost (not one whose
        statement was cancelled) is dropped from the pool. A session's connection is left to
        the session (its rollback and the pool's pre-ping deal with it, as for the route)."""
        if self._fairy is not None and (self.dbapi.broken or self.dbapi.closed):
            self._fairy.invalidate()

    def lost_unpinged(self) -> bool:
        """Whether this is a connection checked out without the pre-ping that turned out lost
        (after an OperationalError): the read is then repeated on a pinged connection, as the
        pre-ping would have reconnected."""
        return self.unpinged and (self.dbapi.broken or self.dbapi.closed)

    def close(self) -> None:
        if self._fairy is None:
            return
        fairy, self._fairy = self._fairy, None
        try:
            if fairy.dbapi_connection is not None:
                fairy.dbapi_connection.autocommit = False  # as the pool lends it
        except Exception:  # noqa: BLE001 - a broken connection: not back into the pool
            fairy.invalidate()
        finally:
            fairy.close()


def _uses_pool(app) -> bool:
    """Whether an anonymous lean request reads on a connection of the API engine's pool directly
    (PostgreSQL, and the app's session is not overridden, as the tests do)."""
    from backend.api.deps import get_session
    from backend.db import get_engine

    if get_session in (getattr(app, "dependency_overrides", None) or {}):
        return False
    return get_engine("api").dialect.name == "postgresql"


def _search_work(session, params: dict, filters, deadline, ping: bool = False) -> bytes:
    """The blocking part of a lean search (a worker thread): SQL, coverage, JSON. Without a
    session, once more on a pinged connection when the unpinged one was lost."""
    import psycopg

    from backend.services import event_search_lean as lean
    from backend.services.event_search import DEFAULT_SORT
    from pipelines.catalogues import DETECTED_SOURCE

    sort = params.get("sort", DEFAULT_SORT)
    limit, offset, cursor = params.get("limit", 50), params.get("offset", 0), params.get("cursor")
    if session is None and not lean.supported(filters):  # the service needs a session
        from backend.db import get_sessionmaker

        with get_sessionmaker("api")() as own:
            return _search_work(own, params, filters, deadline)
    retry = False
    reads = _Reads(session, ping)
    try:
        if reads.dialect == "postgresql" and lean.supported(filters):
            detected = not filters.sources or DETECTED_SOURCE in filters.sources
            try:
                with reads.dbapi.cursor(binary=True) as cur:
                    page = lean.lean_search(cur, filters, sort=sort, limit=limit, cursor=cursor, offset=offset,
                                            detected=detected, deadline=deadline)
                    cover = lean.lean_coverage(cur, page, filters.sources, filters.start, filters.end, deadline)
                    utc = _is_utc(reads.dbapi)
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError):
                    retry = reads.lost_unpinged()
                    reads.invalidate()
                if not retry:
                    raise _db_error(exc, "SELECT ... FROM events") from exc  # the 503 names "SELECT on events"
            finally:
                if deadline is not None:
                    deadline.query = None
            if not retry:
                return _page_body(page, _coverage_json(cover), utc)
    finally:
        reads.close()
    if retry:  # the unpinged connection was lost: once more, as the pre-ping would have reconnected
        return _search_work(None, params, filters, deadline, ping=True)
    # link-table filters (or SQLite): the search service itself, as the route calls it
    from backend.services import event_search as event_search_service
    from backend.services.coverage import window_coverage

    result = event_search_service.search_events(session, filters, sort=sort, limit=limit, cursor=cursor,
                                                offset=offset, light=True)
    return _page_body(result, _coverage_json(window_coverage(session, filters.sources, filters.start, filters.end)))


#: :func:`_is_utc` by the connection's ``TimeZone`` setting (what psycopg's time zone is made from).
_UTC_ZONES: dict[bytes | None, bool] = {}


def _is_utc(dbapi) -> bool:
    """Whether psycopg gives this connection's times in UTC (its ``TimeZone``): then no row's
    time needs converting."""
    setting = dbapi.pgconn.parameter_status(b"TimeZone")
    hit = _UTC_ZONES.get(setting)
    if hit is None:
        hit = _UTC_ZONES[setting] = _tz_is_utc(dbapi.info.timezone)
    return hit


def _tz_is_utc(tz) -> bool:
    return tz.utcoffset(dt.datetime(2000, 1, 1)) == _ZERO and tz.utcoffset(dt.datetime(2000, 7, 1)) == _ZERO \
        and getattr(tz, "key", "UTC") in ("UTC", "Etc/UTC", "Etc/UCT", "UCT", "Universal", "Etc/Universal", "Zulu",
                                          "GMT", "Etc/GMT", "Etc/Zulu")


_DETAIL_COLS = ("id", "event_type", "source", "source_key", "start_time", "peak_time", "end_time", "channels",
                "hpc_x", "hpc_y", "hgs_lat", "hgs_lon", "position_angle", "angular_width", "speed_km_s",
                "goes_class", "goes_flux", "peak_value", "peak_unit", "noaa_ar", "frm_name", "frm_version", "owner",
                "calibration_set_id")


def _detail_work(session, event_id: int, principal, deadline, ping: bool = False) -> bytes | None:
    """The blocking part of a lean detail: the event, its links, frames and products in one
    statement; None when the caller may not see it (404). Without a session, once more on a
    pinged connection when the unpinged one was lost."""
    reads = _Reads(session, ping)
    try:
        if reads.dialect != "postgresql":
            return _detail_via_services(session, event_id, principal)
        try:
            return _detail_lean(reads, event_id, principal, deadline)
        except _Lost:
            pass
    finally:
        reads.close()
    return _detail_work(None, event_id, principal, deadline, ping=True)


class _Lost(Exception):
    """The unpinged connection of a lean read was lost: the read is repeated (:class:`_Reads`)."""


def _detail_lean(reads, event_id: int, principal, deadline) -> bytes | None:
    """:func:`_detail_work` on PostgreSQL."""
    import psycopg

    from backend.api.schemas import EventAssociationPublic, EventDetail, EventPublic
    from backend.services import event_search_lean as lean
    from backend.services.event_search import EventFilters
    from backend.services.event_visibility import viewer_of

    user, sees_all = viewer_of(principal)
    viewer, has_user = lean._viewer_sql(EventFilters(viewer=user, sees_all=sees_all))
    params: dict[str, Any] = {"id": event_id}
    if has_user:
        params["viewer"] = user
    cols = ", ".join(f"events.{c}" for c in _DETAIL_COLS)
    where = "events.id = %(id)s" + (f" AND ({viewer})" if viewer else "")
    # one statement: the event (with its frames and products) as a one-row subquery, its visible
    # linked events beside it (a row each, in their order; one row of NULLs when it has none)
    one = (f"SELECT {cols}, events.description, events.attributes, "
           "ARRAY(SELECT event_frames.frame_id FROM event_frames WHERE event_frames.event_id = events.id "
           "ORDER BY event_frames.frame_id), "
           "ARRAY(SELECT event_products.product_id FROM event_products WHERE event_products.event_id = events.id "
           "ORDER BY event_products.product_id) "
           f"FROM events WHERE {where}")
    links = (f"SELECT {cols}, event_associations.kind, event_associations.reason FROM events "
             "JOIN event_associations ON event_associations.other_event_id = events.id "
             "WHERE event_associations.event_id = %(id)s" + (f" AND ({viewer})" if viewer else ""))
    sql = f"SELECT m.*, l.* FROM ({one}) AS m LEFT JOIN ({links}) AS l ON true ORDER BY l.start_time, l.id"
    try:
        with reads.dbapi.cursor(binary=True) as cur:
            lean._note(deadline, sql)
            cur.execute(sql, params)
            got = cur.fetchall()
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.OperationalError):
            lost = reads.lost_unpinged()
            reads.invalidate()
            if lost:
                raise _Lost from exc
        raise _db_error(exc, "SELECT ... FROM events") from exc  # as the route's: "SELECT on events"
    finally:
        if deadline is not None:
            deadline.query = None
    if not got:
        return None
    n = len(_DETAIL_COLS)
    row = got[0]
    k = n + 4  # where a linked event's columns begin
    linked = [r[k:] for r in got] if got[0][k] is not None else []
    d = dict(zip(_DETAIL_COLS, row))
    d["description"], d["attributes"] = row[n], row[n + 1]
    detail = EventDetail.model_validate(d)
    detail.associated = [EventAssociationPublic(kind=str(r[n]), event=EventPublic.model_validate(dict(zip(_DETAIL_COLS, r))),
                                                reason=r[n + 1]) for r in linked]
    detail.frame_ids = list(row[n + 2])
    detail.product_ids = list(row[n + 3])
    return detail.model_dump_json().encode()


def _detail_via_services(session, event_id: int, principal) -> bytes | None:
    from backend.api.presenters import event_detail
    from backend.services import events as events_service

    row = events_service.get_event(session, event_id, principal)
    if row is None:
        return None
    return event_detail(session, row, principal).model_dump_json().encode()


async def _send_json(send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _deadline(scope):
    return scope.get("state", {}).get("deadline")


def _answered(scope) -> bool:
    """Whether the request's deadline has already answered it 503 (nothing it does is seen)."""
    deadline = _deadline(scope)
    return deadline is not None and deadline.answered


#: Threads of the lean path's blocking work: as many as the API's pooled connections
#: (:data:`backend.db.API_POOL`), since each holds one; how many lean requests run at once is
#: :func:`lean_threads` (:func:`_running`).
_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def lean_threads() -> int:
    """How many lean-path requests of one API process run at once: ``LEAN_EVENTS_THREADS``, by
    default the host's CPU count plus one (``os.cpu_count()``: the machine's CPUs, not this
    process's affinity or a container's quota, since it stands for the database's cores,
    which are the machine's when the database runs beside the API, as in the default
    deployment), never more than the API's pooled connections (:data:`backend.db.API_POOL`).
    Why (measured): :class:`backend.settings.Settings`."""
    from backend.db import API_POOL
    from backend.settings import get_settings

    n = get_settings().lean_events_threads
    if n is None:
        n = (os.cpu_count() or 1) + 1
    return max(1, min(int(n), sum(API_POOL)))


#: One :func:`lean_threads` semaphore per event loop (an asyncio semaphore belongs to the loop
#: that first waits on it; the tests' clients each run their own loop).
_RUNNING: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = weakref.WeakKeyDictionary()


def _running() -> asyncio.Semaphore:
    """The semaphore a lean request holds from before it takes a database connection (the
    signed-in caller's session, or the pooled connection of an anonymous read) until its
    answer is read: the others wait for it first come, first served, holding no connection
    (so waiting requests can never hold every connection while the running ones wait for
    one), until their deadline answers them 503."""
    loop = asyncio.get_running_loop()
    sem = _RUNNING.get(loop)
    if sem is None:
        sem = _RUNNING[loop] = asyncio.Semaphore(lean_threads())
    return sem


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        from backend.db import API_POOL

        with _EXECUTOR_LOCK:
            if _EXECUTOR is None:
                _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=sum(API_POOL),
                                                                  thread_name_prefix="lean-events")
    return _EXECUTOR


def _skip_if_answered(fn, deadline, *args):
    """``fn(*args)``, unless the request was already answered 503 at its deadline while this
    waited for a thread (its answer would be dropped): then nothing is read."""
    if deadline is not None and deadline.answered:
        return _ANSWERED
    return fn(*args)


#: What :func:`_skip_if_answered` returns for a request already answered.
_ANSWERED = object()


async def _in_thread(fn, *args):
    """``fn(*args)`` in a thread of :func:`_executor`, in a copy of the request's context (as
    ``anyio.to_thread.run_sync``, which costs about 0.03 ms more CPU per call: its capacity
    limiter, cancel scope and checkpoints). The last of ``args`` is the request's deadline."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(_executor(), ctx.run, _skip_if_answered, fn, args[-1], *args)


_DETAIL = re.compile(r"/api/v1/events/([^/]*)")


def _handler_for(app, exc: BaseException):
    """The app's handler of ``exc`` as Starlette's ``ExceptionMiddleware`` picks it (by class,
    the most specific first); None for what it leaves to ``ServerErrorMiddleware``."""
    handlers = getattr(app, "exception_handlers", {}) or {}
    for cls in type(exc).__mro__:
        if cls is Exception or cls is BaseException:
            return None
        if cls in handlers:
            return handlers[cls]
    return None


class LeanEventsMiddleware:
    """The innermost middleware of the app (inside compression, HEAD, idempotency, body limit
    and deadline): ``GET /api/v1/events`` and ``GET /api/v1/events/<id>`` answered by the lean
    path, everything else (and what the lean path does not read plainly) passed on to the
    routes unchanged. An exception of the lean path is answered by the app's own handler of it,
    as Starlette's ``ExceptionMiddleware`` would for the route."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == SEARCH_PATH:
            run = self._search
        else:
            m = _DETAIL.fullmatch(path)
            if m is None:
                await self.app(scope, receive, send)
                return
            run = self._detail
        try:
            answered = await run(scope, send, m.group(1) if run == self._detail else None)
        except Exception as exc:
            handler = _handler_for(scope.get("app"), exc)
            if handler is None:
                raise
            request = Request(scope, receive)
            response = await handler(request, exc) if inspect.iscoroutinefunction(handler) else \
                await anyio.to_thread.run_sync(handler, request, exc)
            await response(scope, receive, send)
            return
        if not answered:
            await self.app(scope, receive, send)

    async def _search(self, scope, send, _raw) -> bool:
        try:
            params = _read_search_params(scope["query_string"])
        except _Refuse:
            STATS.route[SEARCH_PATH] += 1
            return False
        if not _needs_principal(scope) and _uses_pool(scope.get("app")):
            try:
                filters = _filters(params, None)
            except _Refuse:
                STATS.route[SEARCH_PATH] += 1
                return False
            async with _running():
                if _answered(scope):  # the deadline's 503 went out while this waited
                    return True
                body = await _in_thread(_search_work, None, params, filters, _deadline(scope))
            if body is _ANSWERED:  # the deadline's 503 went out meanwhile
                return True
            STATS.lean[SEARCH_PATH] += 1
            await _send_json(send, body)
            return True
        async with _running():
            if _answered(scope):  # before the session's connection and the token's lookup
                return True
            async with _SessionScope(scope.get("app")) as session:
                principal = await _principal(scope, session) if _needs_principal(scope) else None
                try:
                    filters = _filters(params, principal)
                except _Refuse:
                    STATS.route[SEARCH_PATH] += 1
                    return False
                body = await _in_thread(_search_work, session, params, filters, _deadline(scope))
                if body is _ANSWERED:  # the deadline's 503 went out meanwhile
                    return True
        STATS.lean[SEARCH_PATH] += 1
        await _send_json(send, body)
        return True

    async def _detail(self, scope, send, raw: str) -> bool:
        if not (_INT.fullmatch(raw) and raw[0] != "0" and int(raw) <= MAX_ID):
            STATS.route[DETAIL_PATH] += 1
            return False
        event_id = int(raw)
        if not _needs_principal(scope) and _uses_pool(scope.get("app")):
            async with _running():
                if _answered(scope):  # the deadline's 503 went out while this waited
                    return True
                body = await _in_thread(_detail_work, None, event_id, None, _deadline(scope))
            if body is _ANSWERED:  # the deadline's 503 went out meanwhile
                return True
            STATS.lean[DETAIL_PATH] += 1
            if body is None:
                raise HTTPException(404, detail=f"no event with id {event_id}")
            await _send_json(send, body)
            return True
        async with _running():
            if _answered(scope):  # before the session's connection and the token's lookup
                return True
            async with _SessionScope(scope.get("app")) as session:
                principal = await _principal(scope, session) if _needs_principal(scope) else None
                body = await _in_thread(_detail_work, session, event_id, principal, _deadline(scope))
                if body is _ANSWERED:  # the deadline's 503 went out meanwhile
                    return True
                STATS.lean[DETAIL_PATH] += 1
                if body is None:  # as the route's _event_or_404: a private event of another user too
                    raise HTTPException(404, detail=f"no event with id {event_id}")
        await _send_json(send, body)
        return True


def install(app) -> bool:
    """Add :class:`LeanEventsMiddleware` to ``app`` (call it before the app's other middleware,
    so that it is the innermost), unless ``LEAN_EVENTS=0``; True when added."""
    if os.environ.get("LEAN_EVENTS", "1") == "0":
        return False
    app.add_middleware(LeanEventsMiddleware)
    return True
