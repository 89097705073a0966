"""Authorization matrix, generated from the app's route table (issue 24, point 2).

User A ("alice") owns one private object of every kind (a private calibration set with a
written product, a job with its item, an event detected on the private product, a movie, a
saved search with a notification, a webhook with a delivery, a manifest, a second API
token); every id is distinctive (``MARKERS``). For every route of ``create_app()`` (read
from ``app.routes`` at test time, through included routers), the generator fills path
parameters from ``PATH_VALUES`` and id-bearing query parameters from ``QUERY_IDS``, and
calls it as anonymous, as user B ("bob") and as A (and an admin for reads):

* anonymous and B must get 404, or a refusal that does not depend on the id (401/403 that
  the same route gives for an unknown id), and no answer of theirs may contain a marker
  (list routes, archives, pages included);
* A (and an admin) must reach the object (2xx for reads, not 404 for writes): the fixture
  is right, so a 404 for B means something.

A route the generator cannot fill (an unknown path parameter, a required query parameter
with no value, an id-like query parameter not described) FAILS ``test_every_route_is_described``
until it is put in ``PATH_VALUES``/``QUERY_IDS``/``QUERY_VALUES`` or ``EXEMPT`` (with a
reason). :func:`matrix_leaks` returns the leaks as a list, so that the mutation check
(``test_each_rule_off_makes_the_matrix_fail``) can switch each rule of
:mod:`backend.services.visibility` off in turn and require the matrix to fail.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi.params import Path as PathParam
from fastapi.params import Query
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.dependencies.utils import get_flat_params

from backend.models import (
    ApiToken,
    CalibrationFile,
    CalibrationKind,
    CalibrationSet,
    DeliveryState,
    Event,
    EventFrame,
    EventProduct,
    ItemOutcome,
    Job,
    JobItem,
    JobState,
    Movie,
    MovieState,
    Product,
    ProductCalibrationFile,
    ProductState,
    SavedSearch,
    SavedSearchNotification,
    Webhook,
    WebhookDelivery,
)
from tests.conftest import make_token
from tests.test_api import make_frame, product_image, write_png, write_product_fits

MARK = "alicesecret7f3"
T0 = dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC)
PRIV_PRODUCT, PUB_PRODUCT = 97531001, 97531002
PRIV_SET, PUB_SET = 97531011, 97531012
PRIV_EVENT = 97531021
SEARCH = 97531031
WEBHOOK = 97531041
JOB = "a11ce0b0-0000-4000-8000-000000000001"
MOVIE = "a11ce0b0-0000-4000-8000-000000000002"
DELIVERY = "a11ce0b0-0000-4000-8000-000000000003"
TOKEN_ID = 97531051
#: A's queued job (GET /queue), her failed and her written private products on frames of their
#: own (coverage; their ids are the largest product ids, as a new search's cursor would show).
QUEUED_JOB = "a11ce0b0-0000-4000-8000-000000000004"
FAILED_PRODUCT, LONE_PRODUCT = 97531003, 97531004
#: Strings none of which may appear in an answer to anonymous or B.
MARKERS = (MARK, str(PRIV_PRODUCT), str(PRIV_SET), str(PRIV_EVENT), str(SEARCH), str(WEBHOOK), JOB, MOVIE,
           DELIVERY, QUEUED_JOB, str(FAILED_PRODUCT), str(LONE_PRODUCT))
UNKNOWN_INT, UNKNOWN_STR = 2_000_000_001, "0000dead-0000-4000-8000-000000000000"

#: Path parameter name -> (fixture value, value that names nothing). ``frame_id``,
#: ``calibration_file_id`` and ``code`` name public objects: routes under them are checked
#: for absence of A's ids (their private part comes from the query: ``a``/``b``).
PATH_VALUES: dict[str, tuple[object, object]] = {
    "product_id": (PRIV_PRODUCT, UNKNOWN_INT), "set_id": (PRIV_SET, UNKNOWN_INT),
    "event_id": (PRIV_EVENT, UNKNOWN_INT), "job_id": (JOB, UNKNOWN_STR), "movie_id": (MOVIE, UNKNOWN_STR),
    "search_id": (SEARCH, UNKNOWN_INT), "webhook_id": (WEBHOOK, UNKNOWN_INT), "token_id": (TOKEN_ID, UNKNOWN_INT),
    "frame_id": ("frame", None), "calibration_file_id": ("calfile", None), "code": ("SDI", None),
}
PUBLIC_PATH_PARAMS = {"frame_id", "calibration_file_id", "code"}
#: Id-bearing query parameters -> fixture value (a name that is private makes the call private).
QUERY_IDS: dict[str, object] = {
    "a": PUB_PRODUCT, "b": PRIV_PRODUCT, "ref": PUB_PRODUCT, "job_id": JOB, "frame_id": "frame",
    "calibration_set": PRIV_SET, "calibration_file": "calfile", "event": PRIV_EVENT, "user": "alice",
}
#: Private query ids that make the call name A's object (404 required, as a path id); the
#: other query ids (``calibration_set``, ``event``, ``user`` as filters) need only leave A's
#: objects out of the answer (a filter on an unseen set is an empty page, as an unknown one).
PRIVATE_QUERY_IDS = {"b", "job_id"}
#: Other required query parameters -> a valid value.
QUERY_VALUES: dict[str, object] = {"start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z", "channels": "SDI"}
#: Query parameters a route needs although each is optional alone (x/y or tx/ty: one pair),
#: or that make it answer about the fixture's day.
_DAY = {"start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z"}
ROUTE_QUERY: dict[str, dict[str, object]] = {"/api/v1/products/{product_id}/pixel": {"x": 10, "y": 10},
                                             "/api/v1/coverage": _DAY, "/coverage": _DAY}
#: Query names that look like ids and must be described above (or the test fails): a name
#: holding one of ID_LIKE, or one of ID_NAMES exactly.
ID_LIKE = ("_id", "ref", "event", "job", "product", "movie", "search", "webhook", "token", "user",
           "calibration_set", "calibration_file")
ID_NAMES = ("id", "ids")


def _id_like(name: str) -> bool:
    return name in ID_NAMES or any(k in name for k in ID_LIKE)


@dataclass(frozen=True)
class Filler:
    """How to call a route with A's ids where its declared parameters do not say it (an
    endpoint that reads ``Request`` itself, or takes a body). ``query``/``body``: added to the
    URL / sent as JSON (the strings ``"frame"``/``"calfile"`` are replaced by the fixture's
    ids); ``private``: the call names A's object (404 required), else it must only leave A's
    objects out; ``unknown_body``: the same body naming nothing (for a refusal that must not
    depend on the object)."""

    query: dict = field(default_factory=dict)
    body: dict | None = None
    private: bool = False
    unknown_body: dict | None = None


def _search(kind: str, query: dict) -> dict:
    return {"name": "matrix", "kind": kind, "query": query}


#: Every route whose endpoint takes a ``Request`` or a body must be here or in ``EXEMPT``: a
#: list of fillers (each one call, besides the generated one) or, for a ``Request`` used for
#: something else than parameters, why its declared parameters say everything (a string;
#: the generated call is made). test_every_route_is_described fails on a route missing here.
DESCRIBED: dict[tuple[str, str], list[Filler] | str] = {
    ("GET", "/api/v1/hek"): [Filler(query={"cmd": "search", "type": "column", "event_type": "**",
                                           "event_starttime": "2024-05-14T00:00:00",
                                           "event_endtime": "2024-05-15T00:00:00"})],
    ("GET", "/api/v1/events"): "reads only the names of its query parameters (to refuse HEK's); every value is "
                               "a declared parameter",
    ("GET", "/api/v1/products/download.sh"): "the Request gives the script's base URL only",
    ("GET", "/api/v1/events/{event_id}/products/download.sh"): "the Request gives the script's base URL only",
    ("GET", "/api/v1/session"): "reads the session cookie (the caller's own); no object id",
    **{("GET", f): "the Request gives the conditional headers only (If-None-Match, If-Modified-Since: "
                   "backend.api.conditional); the object is the declared path id"
       for f in ("/api/v1/products/{product_id}/fits", "/api/v1/products/{product_id}/quicklook.png",
                 "/api/v1/movies/{movie_id}/file")},
    ("POST", "/api/v1/saved-searches"): [
        Filler(body=_search("products", {"job_id": JOB}), private=True,
               unknown_body=_search("products", {"job_id": UNKNOWN_STR})),
        Filler(body=_search("events", {"calibration_set": str(PRIV_SET)}), private=True,
               unknown_body=_search("events", {"calibration_set": str(UNKNOWN_INT)})),
        Filler(body=_search("products", {"channel": "SDI"})),  # its cursor must not be A's product id
        Filler(body=_search("events", {})),  # nor A's event id
    ],
    **{("GET", page): "a page: the Request renders the template only; its parameters are declared"
       for page in ("/", "/events/{event_id}", "/products", "/jobs/new", "/jobs", "/jobs/{job_id}",
                    "/products/{product_id}/view", "/movies", "/coverage", "/frames/{frame_id}/diff",
                    "/events", "/products/search", "/saved-searches")},
    ("PATCH", "/api/v1/saved-searches/{search_id}"): [
        Filler(body={"name": "renamed"}, private=True, unknown_body={"name": "renamed"}),
        Filler(body={"query": {"channel": "SDI"}}, private=True, unknown_body={"query": {"channel": "SDI"}}),
    ],
}
#: Routes not in the matrix, each with why.
EXEMPT: dict[tuple[str, str], str] = {
    ("GET", "/docs"): "Swagger UI: static, no data",
    ("GET", "/docs/oauth2-redirect"): "Swagger UI's OAuth redirect: static, no data",
    ("GET", "/redoc"): "ReDoc: static, no data",
    ("POST", "/api/v1/jobs"): "creates a job of the caller; its body names no object: channels, a DATE-OBS range, "
                              "calibration file versions (public rows), options, a webhook URL",
    ("POST", "/api/v1/movies"): "creates a movie of the caller; its body names no object (channel, window, "
                                "difference, fps, size) but the event it marks or crops to: an event the "
                                "caller may not see is refused as an unknown id (422, test_movies."
                                "test_bad_movie_sizes_and_events_are_422), and a movie shows public products only",
    ("POST", "/api/v1/session"): "sign-in with a token in the body: no object id",
    ("DELETE", "/api/v1/session"): "sign-out clears the caller's cookie: no object id",
    ("POST", "/api/v1/tokens"): "an admin makes a token from a body: no id to read",
}
#: List routes whose answer to A must show A's private object (the fixture is seen where it should be).
MUST_LIST = {"/api/v1/jobs", "/jobs", "/api/v1/products", "/api/v1/calibration-sets", "/api/v1/events",
             "/api/v1/saved-searches", "/api/v1/webhooks", "/saved-searches", "/products/search"}
#: Writes A may call without destroying the fixture for later calls; done after every read,
#: in this order (the destructive ones last).
WRITE_ORDER = ["/saved-searches", "/cancel", "/retry", "/rerun", "/notifications", "/saved-searches/{search_id}", "/tokens/{token_id}",
               "/promote"]


@dataclass
class Call:
    method: str
    path: str  # the route's template
    url: str
    unknown_url: str | None  # the same call naming nothing (None: the private part is a query id)
    private: bool  # the call names a private object of A
    body: dict | None = None  # JSON body
    unknown_body: dict | None = None


@dataclass
class Plan:
    calls: list[Call] = field(default_factory=list)
    undescribed: list[str] = field(default_factory=list)


def _routes(app):
    for ctx in iter_route_contexts(app.routes):
        route = ctx.original_route
        if isinstance(route, APIRoute):
            yield ctx.path_format or route.path_format, route


def plan_calls(app, ids: dict[str, object]) -> Plan:
    """Every call the matrix makes, from the app's route table; routes it cannot fill in
    ``undescribed`` (with why)."""
    from urllib.parse import urlencode

    plan = Plan()
    for path, route in _routes(app):
        for method in sorted(route.methods - {"HEAD", "OPTIONS"}):
            if (method, path) in EXEMPT:
                continue
            described = DESCRIBED.get((method, path))
            if (route.dependant.request_param_name or route.dependant.body_params) and described is None:
                why = "a body" if route.dependant.body_params else "the Request (it may read parameters itself)"
                plan.undescribed.append(f"{method} {path}: takes {why}; describe it in DESCRIBED or EXEMPT")
                continue
            params = get_flat_params(route.dependant)
            path_names = [p.alias for p in params if isinstance(p.field_info, PathParam)]
            queries = [p for p in params if isinstance(p.field_info, Query)]
            missing = [n for n in path_names if n not in PATH_VALUES]
            fixed, optional_ids = dict(ROUTE_QUERY.get(path, {})), []
            for q in queries:
                name = q.alias
                if name in QUERY_IDS:
                    (fixed.__setitem__(name, ids.get(name, QUERY_IDS[name])) if q.field_info.is_required()
                     else optional_ids.append(name))
                elif _id_like(name):
                    missing.append(f"query {name}")
                elif q.field_info.is_required():
                    if name in QUERY_VALUES:
                        fixed[name] = QUERY_VALUES[name]
                    else:
                        missing.append(f"required query {name}")
            if missing:
                plan.undescribed.append(f"{method} {path}: no fixture for {', '.join(missing)}")
                continue
            url, unknown, private = path, path, False
            for n in path_names:
                value, nothing = PATH_VALUES[n]
                value = ids.get(value, value) if isinstance(value, str) else value
                url = url.replace("{" + n + "}", str(value))
                unknown = unknown.replace("{" + n + "}", str(nothing if nothing is not None else value))
                private |= n not in PUBLIC_PATH_PARAMS
            private |= bool(set(fixed) & PRIVATE_QUERY_IDS)
            qs = urlencode({k: ids.get(v, v) if isinstance(v, str) else v for k, v in fixed.items()})
            sep = "?" if qs else ""
            has_unknown = any(n not in PUBLIC_PATH_PARAMS for n in path_names)
            for f in described if isinstance(described, list) else ():
                fq = urlencode({**{k: ids.get(v, v) if isinstance(v, str) else v for k, v in fixed.items()},
                                **{k: ids.get(v, v) if isinstance(v, str) else v for k, v in f.query.items()}})
                fs = "?" if fq else ""
                plan.calls.append(Call(method, path, url + fs + fq, (unknown + fs + fq) if has_unknown else
                                       (url + fs + fq if f.unknown_body is not None else None),
                                       private or f.private, f.body, f.unknown_body))
            if isinstance(described, list) and method != "GET":
                continue  # a write is called with its fillers' bodies only
            plan.calls.append(Call(method, path, url + sep + qs, (unknown + sep + qs) if has_unknown else None, private))
            for name in optional_ids if method == "GET" else ():
                extra = {name: ids.get(QUERY_IDS[name], QUERY_IDS[name])}
                q2 = urlencode({**{k: ids.get(v, v) if isinstance(v, str) else v for k, v in fixed.items()}, **extra})
                plan.calls.append(Call(method, path, f"{url}?{q2}", None,
                                       private or name in PRIVATE_QUERY_IDS))
    return plan


def _order(call: Call) -> tuple[int, str]:
    if call.method == "GET":
        return (0, call.url)
    for i, tail in enumerate(WRITE_ORDER):
        if call.path.endswith(tail):
            return (1 + i, call.url)
    return (len(WRITE_ORDER) + 1, call.url)


def _body(resp) -> str:
    return resp.content.decode("latin-1")


def _effects(session) -> tuple:
    """What a refused write must leave as it was: the rows of every kind a write makes, and
    the state of A's objects a write could change."""
    from sqlalchemy import func, select

    counts = tuple(session.scalar(select(func.count()).select_from(m)) for m in
                   (Job, Movie, SavedSearch, Webhook, SavedSearchNotification, WebhookDelivery, ApiToken))
    job = session.get(Job, JOB)
    token = session.get(ApiToken, TOKEN_ID)
    return counts + (job.state if job else None, getattr(session.get(SavedSearch, SEARCH), "id", None),
                     getattr(token, "revoked_at", None), session.get(CalibrationSet, PRIV_SET).public)


def matrix_leaks(client, headers: dict[str, dict[str, str]], ids: dict[str, object], *,
                 stop_at_first: bool = False, check_owner: bool = True) -> list[str]:
    """Run the matrix; the leaks (and broken fixtures, lines starting ``fixture:``) found, as
    lines. ``headers``: the request headers of ``anonymous``, ``bob``, ``alice`` and ``admin``.
    ``stop_at_first``: return at the first leak; ``check_owner``: also call as A and admin
    (the mutation check needs neither). A write refused to anonymous or B must change nothing
    (:func:`_effects`, read on ``ids["session"]``)."""
    plan = plan_calls(client.app, ids)
    session = ids["session"]
    problems = [] if stop_at_first else list(plan.undescribed)  # undescribed routes: test_every_route_is_described
    seen_by_owner: dict[str, bool] = {}
    for call in sorted(plan.calls, key=_order):
        for who in ("anonymous", "bob"):
            before = _effects(session) if call.method != "GET" else None
            r = client.request(call.method, call.url, headers=headers[who], json=call.body)
            if before is not None and r.status_code >= 400:
                session.expire_all()
                if _effects(session) != before:
                    problems.append(f"{who}: {call.method} {call.url} {call.body} -> {r.status_code} but it changed "
                                    f"{before} -> {_effects(session)}")
            body = _body(r)
            asked = call.url + json.dumps(call.body)
            shown = [m for m in MARKERS if m in body and m not in asked]  # echoing the id asked for is no leak
            if r.status_code < 400 and (call.private or shown):
                problems.append(f"{who}: {call.method} {call.url} -> {r.status_code}"
                                + (f" showing {shown}" if shown else ""))
            elif shown:
                problems.append(f"{who}: {call.method} {call.url} -> {r.status_code} showing {shown}")
            elif call.private and r.status_code != 404:
                if r.status_code >= 500:
                    problems.append(f"{who}: {call.method} {call.url} -> {r.status_code}")
                elif r.status_code in (401, 403, 422) and call.unknown_url is not None:
                    u = client.request(call.method, call.unknown_url, headers=headers[who], json=call.unknown_body)
                    if u.status_code != r.status_code:  # the refusal depends on the object: it confirms it
                        problems.append(f"{who}: {call.method} {call.url} -> {r.status_code}, "
                                        f"unknown id -> {u.status_code}")
                elif r.status_code not in (401, 403):
                    problems.append(f"{who}: {call.method} {call.url} -> {r.status_code}, not 404")
            if stop_at_first and problems:
                return problems
        if not check_owner:
            continue
        owners = ("alice", "admin") if call.method == "GET" else ("alice",)
        if call.path.endswith("/promote"):
            owners = ("admin",)  # only an admin promotes: the call makes A's set public, so it runs last
        for who in owners:
            r = client.request(call.method, call.url, headers=headers[who], json=call.body)
            ok = r.status_code < 400 if call.method == "GET" or call.body is not None else r.status_code not in (404,) and r.status_code < 500
            if call.private and not ok:
                problems.append(f"fixture: {who} {call.method} {call.url} -> {r.status_code} {r.text[:200]}")
            if call.method == "GET" and call.path in MUST_LIST and call.url == call.path and who == "alice":
                seen_by_owner[call.path] = any(m in _body(r) for m in MARKERS)
    if check_owner:  # only the owner's calls fill seen_by_owner
        problems += [f"fixture: alice does not see her object in {p}" for p, seen in seen_by_owner.items() if not seen]
        problems += [f"fixture: {p} not called" for p in MUST_LIST - set(seen_by_owner)]
    return problems


# -- the fixture ---------------------------------------------------------------------------------


@pytest.fixture
def world(db_session, settings_env, tmp_path):
    """A's private objects (see the module docstring), tokens of anonymous/B/A/admin, and a
    TestClient on the rolled-back session."""
    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.api.deps import get_session
    from backend.services.movies import movie_dir

    s = settings_env()
    db = db_session
    frame = make_frame(db, "SDI", T0)
    cal = CalibrationFile(channel_code="SDI", kind=CalibrationKind.dark, version=97, valid_from=T0 - dt.timedelta(days=30),
                          valid_to=None, path="/cal/sdi_dark_v97.fits", sha256=hashlib.sha256(b"dark97").hexdigest(),
                          parameters={}, description="master dark")
    db.add(cal)
    db.flush()
    sets = {}
    for sid, public, owner in ((PRIV_SET, False, "alice"), (PUB_SET, True, None)):
        sets[sid] = CalibrationSet(id=sid, channel_code="SDI", calibration_key=f"key-{sid}", params_hash=f"h{sid}",
                                   options={"note": MARK} if not public else {}, pinned={}, files=[],
                                   software_version="t", public=public, owner=owner, epoch_start=T0 - dt.timedelta(days=1))
        db.add(sets[sid])
    db.flush()
    job = Job(id=JOB, owner="alice", publishes=False, parameters={"note": MARK}, state=JobState.succeeded, total=1,
              done=1, finished_at=T0)
    db.add(job)
    db.flush()
    folder = Path(s.products)
    for pid, sid in ((PRIV_PRODUCT, PRIV_SET), (PUB_PRODUCT, PUB_SET)):
        stem = f"lst_sdi_l2_{MARK if sid == PRIV_SET else 'pub'}_{pid}"
        data, dq = product_image(100.0 if sid == PUB_SET else 110.0)
        fpath = write_product_fits(folder / f"{stem}.fits", data, dq, T0)
        p = Product(id=pid, frame_id=frame.id, level="L2", version=sid, calibration_set_id=sid,
                    calibration_key=f"key-{sid}", params_hash=f"h{sid}", parameters={}, software_version="t",
                    state=ProductState.written, path=str(fpath), sha256=hashlib.sha256(fpath.read_bytes()).hexdigest(),
                    quicklook_path=str(write_png(folder / f"{stem}.png")), header={"BUNIT": "erg cm-2 s-1 sr-1"},
                    stats={"mean": 100.0},
                    manifest={"schema": "t", "file": stem, "input": {"sha256": frame.sha256},
                              "calibration_set": {"files": []}, "options": {}, "backend": {"array_backend": "numpy"},
                              "product": {"sha256": "0" * 64, "data_sha256": {}}},
                    job_id=JOB if sid == PRIV_SET else None)
        db.add(p)
        db.flush()
        db.add(ProductCalibrationFile(product_id=pid, calibration_file_id=cal.id))
    db.add(JobItem(job_id=JOB, frame_id=frame.id, product_id=PRIV_PRODUCT, outcome=ItemOutcome.done))
    # A's job still queued (GET /queue), over a frame of its own
    db.add(Job(id=QUEUED_JOB, owner="alice", publishes=False, parameters={"note": MARK}, state=JobState.queued,
               total=1, created_at=T0))
    db.flush()
    db.add(JobItem(job_id=QUEUED_JOB, frame_id=frame.id))
    # a frame whose only product is A's failed one, another whose only one is A's written one:
    # coverage must show neither (a gap without her error text, not a covered span)
    for pid, state, minutes in ((FAILED_PRODUCT, ProductState.failed, 180), (LONE_PRODUCT, ProductState.written, 300)):
        f = make_frame(db, "SDI", T0 + dt.timedelta(minutes=minutes))
        db.add(Product(id=pid, frame_id=f.id, level="L2", version=PRIV_SET, calibration_set_id=PRIV_SET,
                       calibration_key=f"key-{PRIV_SET}", params_hash=f"h{PRIV_SET}", parameters={},
                       software_version="t", state=state, job_id=JOB,
                       error=f"{MARK} calibration failed" if state == ProductState.failed else None))
    db.flush()
    ev = Event(id=PRIV_EVENT, event_type="FL", source="detected", source_key=f"{MARK}-flare", start_time=T0,
               peak_time=T0 + dt.timedelta(minutes=5), end_time=T0 + dt.timedelta(minutes=20), hpc_x=100.0,
               hpc_y=100.0, owner="alice", channels="SDI", calibration_set_id=PRIV_SET, attributes={})
    db.add(ev)
    db.flush()
    db.add(EventProduct(event_id=PRIV_EVENT, product_id=PRIV_PRODUCT))
    db.add(EventFrame(event_id=PRIV_EVENT, frame_id=frame.id))
    mdir = movie_dir(s.root)
    mdir.mkdir(parents=True, exist_ok=True)
    (mdir / f"{MOVIE}.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    db.add(Movie(id=MOVIE, owner="alice", channel_code="SDI", start_time=T0, end_time=T0 + dt.timedelta(hours=1),
                 state=MovieState.succeeded, frames_total=1, frames_done=1, path=str(mdir / f"{MOVIE}.mp4"),
                 finished_at=T0))
    db.add(SavedSearch(id=SEARCH, owner="alice", name=f"{MARK} search", kind="events", query={"type": "FL"}))
    db.flush()
    db.add(SavedSearchNotification(saved_search_id=SEARCH, item_kind="event", item_id=PRIV_EVENT,
                                   summary={"note": MARK}))
    db.add(Webhook(id=WEBHOOK, owner="alice", url=f"https://example.org/{MARK}", secret="s" * 32, job_id=JOB))
    db.flush()
    db.add(WebhookDelivery(id=DELIVERY, webhook_id=WEBHOOK, event="job.ended", payload={"job": JOB},
                           state=DeliveryState.delivered))
    db.flush()
    headers = {"anonymous": {}}
    for user, scopes in (("bob", ("jobs:submit", "jobs:cancel")), ("alice", ("jobs:submit", "jobs:cancel")),
                         ("admin", ("admin",))):
        headers[user] = {"Authorization": f"Bearer {make_token(db, user, scopes)}"}
    make_token(db, "alice", ("jobs:submit",))  # the token A's DELETE /tokens/{id} revokes (not the one in use)
    spare = db.query(ApiToken).filter(ApiToken.user == "alice").order_by(ApiToken.id.desc()).first()
    db.query(ApiToken).filter(ApiToken.id == spare.id).update({"id": TOKEN_ID})
    db.flush()
    app = create_app()

    def _session():
        yield db

    app.dependency_overrides[get_session] = _session
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, headers, {"frame": frame.id, "calfile": cal.id, "session": db}


def test_every_route_is_described(world):
    """A route the generator cannot fill fails here until PATH_VALUES/QUERY_* or EXEMPT say it."""
    client, _headers, ids = world
    plan = plan_calls(client.app, ids)
    assert not plan.undescribed, "routes the matrix cannot fill:\n" + "\n".join(plan.undescribed)
    stale = [k for k in (*EXEMPT, *DESCRIBED) if k not in {(m, p) for p, r in _routes(client.app) for m in r.methods}]
    assert not stale, f"exemptions of routes that no longer exist: {stale}"


def test_private_objects_are_404_to_anonymous_and_other_users(world):
    client, headers, ids = world
    leaks = matrix_leaks(client, headers, ids)
    assert not leaks, f"{len(leaks)} problem(s):\n" + "\n".join(leaks)


#: Every rule of backend.services.visibility (a webhook delivery has none of its own: it is read
#: only through its webhook, ``webhook_rule``; test_mutated_rules_are_all_the_rules checks the list).
MUTATED_RULES = ["set_rule", "product_rule", "job_rule", "event_rule", "movie_rule", "saved_search_rule",
                 "webhook_rule", "token_rule"]


_BASELINE: dict[str, list[str]] = {}


@pytest.mark.parametrize("rule", MUTATED_RULES)
def test_each_rule_off_makes_the_matrix_fail(world, monkeypatch, rule):
    """Mutation check: with one rule of backend.services.visibility answering "everything
    visible", the matrix finds a leak (so each rule is exercised by some route)."""
    from backend.services import visibility

    assert set(visibility.RULES.values()) >= {rule}
    client, headers, ids = world
    # unmutated, the same call finds nothing: a leak found below is the rule's, not a fixture
    # line (the fixture is rebuilt identically for each test: the answer is computed once)
    if "unmutated" not in _BASELINE:
        _BASELINE["unmutated"] = matrix_leaks(client, headers, ids, stop_at_first=True, check_owner=False)
    assert _BASELINE["unmutated"] == []
    monkeypatch.setattr(visibility, rule, lambda v, **kw: None)
    leaks = matrix_leaks(client, headers, ids, stop_at_first=True, check_owner=False)
    assert leaks, f"the matrix found no leak with {rule} switched off"
    assert not [line for line in leaks if line.startswith("fixture:")], leaks


def test_mutated_rules_are_all_the_rules():
    """A rule added to backend.services.visibility is switched off by the mutation check too."""
    from backend.services import visibility

    assert sorted(MUTATED_RULES) == sorted(visibility.RULES.values())
