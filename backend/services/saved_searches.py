"""Saved searches: a user's event or product query, evaluated for new matches.

A saved search holds the query parameters of ``GET /api/v1/events`` (``kind`` ``events``)
or of ``GET /api/v1/products`` (``products``), checked with the same parsers as those
routes (:func:`backend.services.event_filters.parse_event_filters`; the product filters'
channel and time parsers of the same module), so a query saved is a query the API answers. Paging, sorting
and format parameters (``limit``, ``offset``, ``cursor``, ``sort``, ``format``) are not
filters and are refused.

New matches (:func:`evaluate`, run by the reconciler every ``RECONCILE_INTERVAL_S`` and
callable after imports and detections) are the items with an id above the search's
``cursor`` that match:

* events: of the public catalogue (``owner IS NULL``) or the search owner's own
  detections; the cursor moves to the largest event id looked at;
* products: ``written`` products (a product's id is given when it is planned and it is
  written later, so the cursor stops below the first matching product still ``planned``
  or ``writing``; one written meanwhile is told once all the same: a notification is
  unique per search and item).

Each new match is a :class:`~backend.models.SavedSearchNotification` row; a search with a
webhook also gets one ``saved_search.matches`` delivery per evaluation that found some
(:mod:`backend.services.notify`), in the same transaction.

Examples: new SDI products over a DATE-OBS range, ``{"channel": "SDI", "start":
"2024-05-10T00:00:00Z", "end": "2024-05-11T00:00:00Z"}``; a new CME wider than 60 deg,
``{"type": "CE", "min_angular_width": 60}``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
from typing import Any
from urllib.parse import parse_qsl

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.models import (CalibrationSet, Event, Frame, Job, Product, ProductState, SavedSearch, SavedSearchNotification, Webhook,
                            utcnow)
from backend.services import notify, visibility
from backend.services.event_filters import (MAX_ID, EventFilterError, canonical_channel, check_event_filters,
                                            filter_time, is_safe_key, parse_event_filters, time_order_problem)
from pipelines.errors import DataError

__all__ = ["SavedSearchError", "KINDS", "EVENT_PARAMS", "PRODUCT_PARAMS", "MAX_NAME_CHARS", "MAX_PER_PASS",
           "normalise_query", "create_saved_search", "update_saved_search", "evaluate", "evaluate_all", "describe_saved_search",
           "describe_notification", "list_saved_searches", "notifications_of"]

log = logging.getLogger(__name__)

KINDS = ("events", "products")
#: The filters of ``GET /api/v1/events`` (:func:`backend.api.params.event_search`).
EVENT_PARAMS = ("type", "source", "start", "end", "channel", "hpc_x_min", "hpc_x_max", "hpc_y_min", "hpc_y_max",
                "pa_min", "pa_max", "min_goes_class", "min_peak_value", "frm_name", "frm_version", "noaa_ar",
                "associated_type", "calibration_set", "calibration_file", "min_angular_width", "systematics")
#: The filters of ``GET /api/v1/products`` (``state``: only ``written``, what is notified).
PRODUCT_PARAMS = ("channel", "start", "end", "state", "frame_id", "job_id", "calibration_set", "level", "systematics")
_NOT_FILTERS = ("limit", "offset", "cursor", "sort", "format")
MAX_NAME_CHARS = 100
#: Most new matches one evaluation records per search (the next pass takes the rest).
MAX_PER_PASS = 1000
#: Most items listed in one webhook delivery (the count says how many there were).
MAX_ITEMS_PER_DELIVERY = 100
#: Most saved searches per user.
MAX_PER_USER = 100


class SavedSearchError(DataError):
    """A saved search that cannot be stored: ``param`` names the field (``name``, ``kind``,
    ``query.<parameter>``), ``message`` says why."""

    def __init__(self, param: str, message: str, value: Any = None) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message, self.value = param, message, value


def _as_dict(query: dict[str, Any] | str | None) -> dict[str, Any]:
    """The query as a dict: a JSON object, or a URL query string (``type=CE&min_angular_width=60``;
    a repeated parameter becomes a list)."""
    if query is None:
        return {}
    if isinstance(query, str):
        out: dict[str, Any] = {}
        for k, v in parse_qsl(query.lstrip("?"), keep_blank_values=False):
            out[k] = [*out[k], v] if isinstance(out.get(k), list) else ([out[k], v] if k in out else v)
        return out
    if not isinstance(query, dict):
        raise SavedSearchError("query", "must be an object of query parameters or a query string")
    return dict(query)


def _scalar(name: str, value: Any) -> Any:
    if isinstance(value, (dict, list)) and name not in ("type", "source"):
        raise SavedSearchError(f"query.{name}", "must be one value, not a list or an object", value)
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise SavedSearchError(f"query.{name}", "must be text or a list of text", value)
    return value


def _systematic(q: dict[str, Any]) -> str | None:
    """The ``systematics`` filter of a query, checked (``any`` or a name of
    :data:`pipelines.calibration.l2.quality.SYSTEMATICS`, as the routes take it); None if absent."""
    from pipelines.calibration.l2.quality import SYSTEMATICS

    value = q.get("systematics")
    if value in (None, ""):
        return None
    if not isinstance(value, str) or (value != "any" and value not in SYSTEMATICS):
        raise SavedSearchError("query.systematics", f"expected any or one of {', '.join(SYSTEMATICS)}", value)
    return value


def _normalise_events(q: dict[str, Any]) -> dict[str, Any]:
    _systematic(q)  # not a parse_event_filters filter: the route adds it (backend.api.params.event_search)
    kw = {("types" if k == "type" else "sources" if k == "source" else k): _scalar(k, v) for k, v in q.items()
          if k != "systematics"}
    if kw.get("min_peak_value") is not None:
        try:
            kw["min_peak_value"] = float(kw["min_peak_value"])
        except (TypeError, ValueError):
            raise SavedSearchError("query.min_peak_value", "is not a number", q["min_peak_value"]) from None
    for k in ("frm_name", "frm_version", "min_goes_class", "associated_type", "calibration_set", "channel"):
        if kw.get(k) is not None and not isinstance(kw[k], str):
            raise SavedSearchError(f"query.{k}", "must be text", kw[k])
    try:
        check_event_filters(parse_event_filters(**kw))
    except EventFilterError as exc:
        raise SavedSearchError(f"query.{exc.param}", exc.message, exc.value) from None
    return q


def _normalise_products(q: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in q.items():
        _scalar(k, v)
    if q.get("channel") not in (None, ""):
        try:
            out["channel"] = canonical_channel(str(q["channel"]))
        except ValueError as exc:
            raise SavedSearchError("query.channel", str(exc), q["channel"]) from None
    problems: list = []
    t0 = filter_time("start", q.get("start"), problems)
    t1 = filter_time("end", q.get("end"), problems)
    if problems:
        raise SavedSearchError(f"query.{problems[0].param}", problems[0].message, problems[0].value)
    if t0 is not None and t1 is not None and t1 < t0:
        p = time_order_problem(t0, t1)
        raise SavedSearchError("query.end", p.message, p.value)
    if t0 is not None:
        out["start"] = t0.isoformat()
    if t1 is not None:
        out["end"] = t1.isoformat()
    if q.get("state") not in (None, "", ProductState.written.value):
        raise SavedSearchError("query.state", "a saved product search is told of written products: leave state "
                                              "out or give 'written'", q["state"])
    if q.get("frame_id") not in (None, ""):
        try:
            fid = int(q["frame_id"])
        except (TypeError, ValueError):
            raise SavedSearchError("query.frame_id", "is not a whole number", q["frame_id"]) from None
        if not 1 <= fid <= MAX_ID:
            raise SavedSearchError("query.frame_id", f"must be between 1 and {MAX_ID}", q["frame_id"])
        out["frame_id"] = fid
    if q.get("job_id") not in (None, ""):
        if not isinstance(q["job_id"], str) or not is_safe_key(q["job_id"], 36):
            raise SavedSearchError("query.job_id", "is not a job id (letters, digits, _ . -; at most 36)", q["job_id"])
        out["job_id"] = q["job_id"]
    if q.get("calibration_set") not in (None, ""):
        cid = str(q["calibration_set"]).strip()
        if not (cid.isascii() and cid.isdigit()) or not 1 <= int(cid) <= MAX_ID:
            raise SavedSearchError("query.calibration_set", f"is not a calibration set id (1..{MAX_ID})",
                                   q["calibration_set"])
        out["calibration_set"] = cid  # text, as check_query_ids reads it
    if q.get("level") not in (None, ""):
        if not isinstance(q["level"], str) or not re.fullmatch(r"L[0-9][A-Za-z0-9.]{0,6}", q["level"]):
            raise SavedSearchError("query.level", "is not a product level such as L2", q["level"])
        out["level"] = q["level"]
    if _systematic(q) is not None:
        out["systematics"] = q["systematics"]
    return out


def normalise_query(kind: str, query: dict[str, Any] | str | None) -> dict[str, Any]:
    """Check ``query`` with the parsers of ``GET /api/v1/<kind>`` and return what is stored.

    Raises
    ------
    SavedSearchError
        An unknown kind, a parameter the route does not take (or a paging/sort/format one),
        or a value the route would answer 422 (``param`` names it: ``query.min_angular_width``).
    """
    if kind not in KINDS:
        raise SavedSearchError("kind", f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}", kind)
    q = {k: v for k, v in _as_dict(query).items() if v is not None and v != ""}
    allowed = EVENT_PARAMS if kind == "events" else PRODUCT_PARAMS
    for k in q:
        if k in _NOT_FILTERS:
            raise SavedSearchError(f"query.{k}", f"{k!r} pages or formats an answer; a saved search takes filters "
                                                 f"only: {', '.join(allowed)}", q[k])
        if k not in allowed:
            raise SavedSearchError(f"query.{k}", f"not a parameter of GET /api/v1/{kind}; expected "
                                                 f"{', '.join(allowed)}", q[k])
    return _normalise_events(q) if kind == "events" else _normalise_products(q)


def _event_filters(query: dict[str, Any]):
    kw = {("types" if k == "type" else "sources" if k == "source" else k): v for k, v in query.items()
          if k != "systematics"}
    if kw.get("min_peak_value") is not None:
        kw["min_peak_value"] = float(kw["min_peak_value"])
    return dataclasses.replace(parse_event_filters(**kw).filters, systematics=query.get("systematics") or None)


def _viewer(owner: str | None) -> visibility.Viewer:
    """A search sees as its owner does (never as an admin: a search outlives its token)."""
    return visibility.Viewer(owner, False)


def _product_query(query: dict[str, Any], owner: str | None = None):
    """The products a product search matches, among those ``owner`` may see
    (:func:`backend.services.visibility.product_rule`: never another user's private set,
    which a webhook would carry away), and of a job they may see when it names one
    (:func:`~backend.services.visibility.job_rule`: another user's private job matches nothing)."""
    from backend.services.products import _filtered, product_conditions

    start = dt.datetime.fromisoformat(query["start"]) if query.get("start") else None
    end = dt.datetime.fromisoformat(query["end"]) if query.get("end") else None
    q = _filtered(select(Product).join(Product.frame), channel=query.get("channel"), start=start, end=end,
                  state=None, frame_id=query.get("frame_id"), job_id=query.get("job_id"))
    q = q.where(*product_conditions(
        _viewer(owner), calibration_set=int(query["calibration_set"]) if query.get("calibration_set") else None,
        level=query.get("level") or None, systematics=query.get("systematics") or None))
    if query.get("job_id"):
        q = q.where(visibility.visible(select(Job.id).where(Job.id == query["job_id"]), Job, _viewer(owner)).exists())
    return q


def _top_id(session: Session, kind: type, owner: str | None) -> int:
    """The largest id of ``kind`` (Event or Product) that ``owner`` may see (0: none): a
    cursor shown to its owner never holds another user's private id."""
    return int(session.scalar(visibility.visible(select(func.max(kind.id)), kind, _viewer(owner))) or 0)


def _product_horizon(session: Session, query: dict[str, Any], after: int, owner: str | None = None) -> int:
    """The cursor of a product search: below the first matching product above ``after``
    still ``planned``/``writing``; else the largest product id ``owner`` may see."""
    first_open = session.scalar(_product_query(query, owner).with_only_columns(func.min(Product.id))
                                .where(Product.id > after,
                                       Product.state.in_([ProductState.planned, ProductState.writing])))
    if first_open is not None:
        return int(first_open) - 1
    return max(after, _top_id(session, Product, owner))


def check_query_ids(session: Session, owner: str | None, query: dict[str, Any]) -> None:
    """Raise :class:`~backend.services.visibility.NotVisible` (404) when a stored query names
    a job or calibration set ``owner`` may not see (as ``GET /api/v1/jobs/{id}`` would)."""
    if query.get("job_id"):
        visibility.get_visible(session, Job, query["job_id"], _viewer(owner))
    cal_set = str(query.get("calibration_set") or "").strip()
    if (cal_set.isascii() and cal_set.isdigit()):  # a set id (the other form, kind:version pairs, names public files)
        visibility.get_visible(session, CalibrationSet, int(cal_set), _viewer(owner))


def create_saved_search(session: Session, owner: str, name: str, kind: str, query: dict[str, Any] | str | None, *,
                        webhook_url: str | None = None) -> tuple[SavedSearch, Webhook | None]:
    """Store a saved search of ``owner`` (and its webhook, whose secret is shown once);
    only matches that arrive from now on are told (the cursor starts at the newest id).
    Flushed; the caller commits.

    Raises
    ------
    SavedSearchError
        A bad name, kind or query (the field named), too many searches.
    backend.services.visibility.NotVisible
        The query names a job or calibration set the owner may not see (404).
    notify.WebhookError
        A webhook URL that cannot be used.
    """
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME_CHARS or "\x00" in name:
        raise SavedSearchError("name", f"a name is 1-{MAX_NAME_CHARS} characters", name)
    stored = normalise_query(kind, query)
    check_query_ids(session, owner, stored)
    if webhook_url is not None:
        try:
            notify.check_webhook_url(webhook_url)
        except ValueError as exc:
            raise SavedSearchError("webhook_url", str(exc), None) from None
    have = session.scalar(select(func.count()).select_from(SavedSearch).where(SavedSearch.owner == owner)) or 0
    if have >= MAX_PER_USER:
        raise SavedSearchError("name", f"{owner} has {have} saved searches, the most allowed; delete one first")
    if kind == "events":
        cursor = _top_id(session, Event, owner)
    else:
        cursor = _product_horizon(session, stored, 0, owner)
    row = SavedSearch(owner=owner, name=name, kind=kind, query=stored, cursor=cursor)
    session.add(row)
    session.flush()
    hook = notify.register_webhook(session, owner, webhook_url, saved_search_id=row.id) if webhook_url else None
    return row, hook


def update_saved_search(session: Session, row: SavedSearch, *, name: str | None = None,
                        query: dict[str, Any] | str | None = None) -> SavedSearch:
    """Rename a saved search and/or replace its query (checked as :func:`create_saved_search`
    checks one). A new query is told of matches that arrive from now on (its cursor starts
    again at the newest id its owner may see); the notifications already recorded stay.
    Flushed; the caller commits.

    Raises
    ------
    SavedSearchError
        A bad name or query (the field named).
    backend.services.visibility.NotVisible
        The query names a job or calibration set the owner may not see (404).
    """
    if name is not None:
        name = name.strip()
        if not name or len(name) > MAX_NAME_CHARS or "\x00" in name:
            raise SavedSearchError("name", f"a name is 1-{MAX_NAME_CHARS} characters", name)
        row.name = name
    if query is not None:
        stored = normalise_query(row.kind, query)
        check_query_ids(session, row.owner, stored)
        if stored != row.query:
            row.query = stored
            row.cursor = (_top_id(session, Event, row.owner) if row.kind == "events"
                          else _product_horizon(session, stored, 0, row.owner))
    session.flush()
    return row


def _iso(t: dt.datetime | None) -> str | None:
    return notify._iso(t)


def _event_summary(e: Event) -> dict[str, Any]:
    return {"id": e.id, "event_type": e.event_type, "source": e.source, "start_time": _iso(e.start_time),
            "peak_time": _iso(e.peak_time), "end_time": _iso(e.end_time), "channels": e.channels,
            "position_angle": e.position_angle, "angular_width": e.angular_width, "speed_km_s": e.speed_km_s,
            "goes_class": e.goes_class, "owner": e.owner, "url": f"/api/v1/events/{e.id}"}


def _product_summary(p: Product, f: Frame) -> dict[str, Any]:
    return {"id": p.id, "channel": f.channel_code, "date_obs": _iso(f.date_obs), "frame_id": f.id,
            "version": p.version, "calibration_set_id": p.calibration_set_id, "url": f"/api/v1/products/{p.id}"}


def _new_event_matches(session: Session, search: SavedSearch) -> tuple[list[tuple[int, dict]], int]:
    from backend.services.event_search import filter_conditions

    top = _top_id(session, Event, search.owner)
    if top <= search.cursor:
        return [], search.cursor
    # the search's owner is the viewer: the public catalogue and their own detections
    conds = filter_conditions(session, dataclasses.replace(_event_filters(search.query), viewer=search.owner))
    rows = list(session.scalars(
        select(Event).where(Event.id > search.cursor, Event.id <= top, *conds)
        .order_by(Event.id).limit(MAX_PER_PASS)))
    cursor = rows[-1].id if len(rows) == MAX_PER_PASS else top
    return [(e.id, _event_summary(e)) for e in rows], cursor


def _new_product_matches(session: Session, search: SavedSearch) -> tuple[list[tuple[int, dict]], int]:
    told = select(SavedSearchNotification.item_id).where(SavedSearchNotification.saved_search_id == search.id)
    q = (_product_query(search.query, search.owner).add_columns(Frame)
         .where(Product.id > search.cursor, Product.state == ProductState.written, Product.id.not_in(told))
         .order_by(Product.id).limit(MAX_PER_PASS))
    rows = session.execute(q).all()
    cursor = _product_horizon(session, search.query, search.cursor, search.owner)
    if len(rows) == MAX_PER_PASS:
        cursor = min(cursor, rows[-1][0].id)
    return [(p.id, _product_summary(p, f)) for p, f in rows], cursor


def evaluate(session: Session, search: SavedSearch, *, now: dt.datetime | None = None) -> int:
    """Record the new matches of ``search`` (notifications, and a webhook delivery when it
    has a webhook), move its cursor; flushed, the caller commits. Returns how many."""
    now = now or utcnow()
    if search.kind == "events":
        found, cursor = _new_event_matches(session, search)
    else:
        found, cursor = _new_product_matches(session, search)
    item_kind = "event" if search.kind == "events" else "product"
    if found:
        known = set(session.scalars(select(SavedSearchNotification.item_id).where(
            SavedSearchNotification.saved_search_id == search.id,
            SavedSearchNotification.item_id.in_([i for i, _ in found]))))
        found = [(i, s) for i, s in found if i not in known]
    for item_id, summary in found:
        session.add(SavedSearchNotification(saved_search_id=search.id, item_kind=item_kind, item_id=item_id,
                                            summary=summary, created_at=now))
    search.cursor = max(search.cursor, cursor) if search.kind == "events" else cursor
    search.evaluated_at = now
    if found:
        search.matches = (search.matches or 0) + len(found)
        for hook in session.scalars(select(Webhook).where(Webhook.saved_search_id == search.id)):
            notify.queue_delivery(session, hook, "saved_search.matches", {
                "event": "saved_search.matches",
                "saved_search": {"id": search.id, "name": search.name, "kind": search.kind, "query": search.query},
                "count": len(found), "items": [s for _, s in found[:MAX_ITEMS_PER_DELIVERY]],
                "notifications_url": f"/api/v1/saved-searches/{search.id}/notifications"})
    session.flush()
    return len(found)


def evaluate_all(session: Session, *, now: dt.datetime | None = None) -> dict[int, int]:
    """Evaluate every saved search, one transaction each (committed); returns the new
    matches per search id that had some. A search that fails (logged) does not stop the others."""
    out: dict[int, int] = {}
    for sid in list(session.scalars(select(SavedSearch.id).order_by(SavedSearch.id))):
        try:
            search = session.scalar(select(SavedSearch).where(SavedSearch.id == sid).with_for_update(skip_locked=True))
            if search is None:
                session.rollback()
                continue
            n = evaluate(session, search, now=now)
            session.commit()
        except DataError:
            session.rollback()
            log.exception("saved search %d could not be evaluated", sid)
            continue
        if n:
            out[sid] = n
    return out


def describe_saved_search(row: SavedSearch, hook: Webhook | None = None, *, with_secret: bool = False
                          ) -> dict[str, Any]:
    out = {"id": row.id, "owner": row.owner, "name": row.name, "kind": row.kind, "query": row.query,
           "cursor": row.cursor, "matches": row.matches, "created_at": _iso(row.created_at),
           "evaluated_at": _iso(row.evaluated_at),
           "notifications_url": f"/api/v1/saved-searches/{row.id}/notifications",
           "search_url": f"/api/v1/{row.kind}", "webhook": None}
    if hook is not None:
        out["webhook"] = notify.describe_webhook(hook, with_secret=with_secret)
    return out


def describe_notification(n: SavedSearchNotification) -> dict[str, Any]:
    return {"id": n.id, "saved_search_id": n.saved_search_id, "item_kind": n.item_kind, "item_id": n.item_id,
            "summary": n.summary, "created_at": _iso(n.created_at)}


def list_saved_searches(session: Session, owner: str) -> list[SavedSearch]:
    return list(session.scalars(select(SavedSearch).where(SavedSearch.owner == owner).order_by(SavedSearch.id)))


def notifications_of(session: Session, search_id: int, *, limit: int = 50, offset: int = 0
                     ) -> tuple[list[SavedSearchNotification], int]:
    """Notifications of a search, newest first, and their count."""
    q = select(SavedSearchNotification).where(SavedSearchNotification.saved_search_id == search_id)
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = list(session.scalars(q.order_by(SavedSearchNotification.id.desc()).limit(limit).offset(offset)))
    return rows, total
