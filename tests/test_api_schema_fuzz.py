"""Schema-driven property test: no request makes a 5xx.

Every GET route of the OpenAPI document is called with query and path parameters that
hypothesis generates from the route's parameter schemas (valid values, values just out of
range, huge integers, NaN/Infinity/1e400, NUL characters, other unicode, a raw ``+`` in a
time, wrong types); ``POST /api/v1/jobs`` with JSON bodies built from the ``JobRequest``
schema (also with NaN, Infinity, 1e400 and NUL anywhere). The app runs as in production on
its own PostgreSQL database (one session per request), seeded with a few events, frames,
a product and a calibration file.

Bounded in time: a fixed seed (``derandomize``), no example database, a few examples per
route (:data:`EXAMPLES_PER_ROUTE`); it prints the number of requests and of server errors.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from backend import db as dbmod
from backend.models import CalibrationKind, EventAssociation
from tests.conftest import create_pg_database, drop_pg_database, make_token
from tests.test_api import MIN, T0, make_calibration, make_event, make_frame, make_product, route_celery_to_this_data_dir

pytestmark = pytest.mark.postgres

#: Examples per GET route and for the job bodies (fixed seed: the same requests every run).
EXAMPLES_PER_ROUTE = 25
JOB_EXAMPLES = 120

ODD_TEXT = ["", " ", "\x00", "a\x00b", "%00", "null", "-0", "1e400", "-1e400", "NaN", "Infinity", "-Infinity",
            "9" * 40, "-" + "9" * 40, "'; DROP TABLE events; --", "９", "𝔰𝔡𝔦", "\u202e", "\ufeff", "x" * 2000,
            "2024-05-10T00:00:00 00:00", "2024-05-10T00:00:00+00:00", "0001-01-01T00:00:00+05:00",
            "9999-12-31T23:59:59-05:00", "2024-02-30", "Z", "T", ",", ",,,", "SDI,,WST"]
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
_JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**31 - 3, max_value=2**70)
                 | st.floats(allow_nan=True, allow_infinity=True) | _TEXT | st.sampled_from(ODD_TEXT))
_JSON = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6)


def _schema_types(schema: dict) -> tuple[set[str], dict]:
    """The types a parameter schema allows and the first non-null branch (anyOf flattened)."""
    branches = schema.get("anyOf") or [schema]
    types = {b.get("type", "string") for b in branches}
    main = next((b for b in branches if b.get("type") != "null"), schema)
    return types, main


def _scalar(schema: dict) -> st.SearchStrategy:
    """Text of a query or path value for one (non-array) schema: valid and invalid values."""
    options = [st.sampled_from(ODD_TEXT), _TEXT]
    if "enum" in schema:
        options.append(st.sampled_from([str(v) for v in schema["enum"]]))
    t = schema.get("type", "string")
    if t == "integer":
        lo, hi = schema.get("minimum", -(2**31)), schema.get("maximum", 2**31)
        options += [st.integers(lo - 2, hi + 2).map(str), st.integers().map(str),
                    st.integers(min_value=2**31 - 2, max_value=2**80).map(str)]
    elif t == "number":
        options += [st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.floats(schema.get("minimum", -1e6), schema.get("maximum", 1e6)).map(repr)]
    elif t == "boolean":
        options.append(st.sampled_from(["true", "false", "1", "0"]))
    if schema.get("format") == "date-time" or "time" in schema.get("title", "").lower():
        options.append(st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),
                                    timezones=st.none() | st.timezones()).map(dt.datetime.isoformat))
    return st.one_of(options)


def _param_value(schema: dict) -> st.SearchStrategy:
    types, main = _schema_types(schema)
    if "array" in types:
        item = main.get("items", {}) if main.get("type") == "array" else {}
        return st.lists(_scalar(item), min_size=1, max_size=3)
    return _scalar(main)


def _query_strategy(params: list[dict]) -> st.SearchStrategy:
    """A dict of some of the route's query parameters (each present or not)."""
    fields = {}
    for p in params:
        if p["in"] != "query":
            continue
        value = _param_value(p.get("schema", {}))
        if p["name"] in QUERY_EXAMPLES:
            value = st.sampled_from(QUERY_EXAMPLES[p["name"]]) | value
        fields[p["name"]] = st.none() | value
    generated = st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not None})
    if "cursor" in fields:  # a cursor alone (with the filters it was made for)
        return generated | st.sampled_from([{"cursor": c} for c in QUERY_EXAMPLES["cursor"]])
    return generated


def _path_strategy(params: list[dict], known: dict[str, list[str]]) -> st.SearchStrategy:
    fields = {}
    for p in params:
        if p["in"] != "path":
            continue
        generated = _param_value(p.get("schema", {}))
        values = known.get(p["name"], [])
        fields[p["name"]] = st.one_of(st.sampled_from(values), generated) if values else generated
    return st.fixed_dictionaries(fields)


#: Values that have broken APIs: non-finite floats (``1e400`` decodes to infinity), NUL, big ints.
NASTY = [float("nan"), float("inf"), float("-inf"), "a\x00b", "\x00", 2**31, 2**63, -(2**63), 10**30, "", None,
         [], {}, "９", "1e400"]
_NASTY = st.sampled_from(NASTY) | _JSON_SCALARS
VALID_JOB = {"channels": ["SDI"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z"}


def _mutated(mutations: list[tuple[str, object]]) -> dict:
    body = json.loads(json.dumps(VALID_JOB))
    for target, value in mutations:
        parts = target.split(".")
        node = body
        for key in parts[:-1]:
            if not isinstance(node.get(key), dict):  # an earlier mutation made it a scalar: a dict again
                node[key] = {}
            node = node[key]
        last = parts[-1]
        if last.endswith("[0]"):
            node[last[:-3]] = [value]
        else:
            node[last] = value
    return body


def _job_body(option_names: list[str]) -> st.SearchStrategy:
    """A JSON text for POST /jobs: a valid request with one or two fields (top level, a pinned
    version, a calibration option) set to a nasty value, or a body built from the JobRequest
    fields with arbitrary values and extra keys. NaN and Infinity are written as Python's
    JSON encoder writes them (``NaN``, ``Infinity``), which the server's decoder reads."""
    targets = ["channels", "channels[0]", "start", "end", "pinned_calibrations", "pinned_calibrations.flat",
               "pinned_calibrations.\x00", "options", "extra", "extra.deep[0]", *(f"options.{n}" for n in option_names)]
    mutated = st.lists(st.tuples(st.sampled_from(targets), _NASTY), min_size=1, max_size=2).map(_mutated)
    channels = st.lists(st.sampled_from(["SDI", "wst", "SCI-UV", "sci_wl", "AIA", "", "\x00"]) | _JSON, max_size=3)
    times = st.sampled_from(["2024-05-14T00:00:00Z", "2024-05-15T00:00:00Z"]) | _JSON_SCALARS
    pinned = st.dictionaries(st.sampled_from(["dark", "flat", "psf", "bias", "\x00"]) | _TEXT,
                             st.integers(-2, 10) | _JSON_SCALARS, max_size=2)
    options = st.dictionaries(st.sampled_from(option_names) | _TEXT, _JSON, max_size=3)
    free = st.fixed_dictionaries({}, optional={
        "channels": channels | _JSON, "start": times, "end": times, "pinned_calibrations": pinned | _JSON,
        "options": options | _JSON, "extra": _JSON,
    })
    return (mutated | mutated | free | _JSON).map(lambda b: json.dumps(b, allow_nan=True))


def _cursor(i, v, sort: str) -> str:
    """A cursor as the API makes them (default filters), with the given id and value."""
    from backend.services.event_search import EventFilters

    raw = json.dumps({"s": sort, "v": v, "i": i, "f": EventFilters().fingerprint()}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


#: Values of particular query parameters that random text would never hit: cursors that are
#: well formed but carry an id or a value out of range.
QUERY_EXAMPLES = {
    "cursor": [_cursor(10**30, "2024-05-14T16:00:00+00:00", "-start_time"), _cursor(2**31, None, "-peak_time"),
               _cursor(1, 10**30, "id"), _cursor(-5, "2024-05-14T16:00:00", "-start_time"),
               _cursor(1, "0001-01-01T00:00:00+05:00", "-start_time")],
}


@pytest.fixture(scope="module")
def fuzz_url():
    from backend.migrate import upgrade

    url = create_pg_database("lstdp_fuzz")
    upgrade(url)
    yield url
    dbmod.reset_caches()
    drop_pg_database(url)


def _seed(url: str, folder) -> dict[str, list[str]]:
    engine = dbmod.make_engine(url)
    with Session(engine, expire_on_commit=False) as s:
        fl = make_event(s, "FL", T0, T0 + 12 * MIN, T0 + 30 * MIN, goes_class="M1.2", hpc_x=-420.5, hpc_y=310.0)
        ce = make_event(s, "CE", T0 + 20 * MIN, None, T0 + 200 * MIN, source="cdaw", position_angle=285.0)
        hek = make_event(s, "FL", T0, T0 + 3 * MIN, None, source="hek", attributes={"obs_instrument": "AIA"})
        s.add(EventAssociation(event_id=fl.id, other_event_id=ce.id, kind="flare_cme"))
        f = make_frame(s, "SDI", T0 + 5 * MIN)
        p = make_product(s, f, folder)
        c = make_calibration(s, "SDI", CalibrationKind.dark, 1)
        token = make_token(s, "fuzz", ["jobs:submit"])  # POST /jobs needs one: the bodies must reach validation
        s.commit()
        known = {"event_id": [str(fl.id), str(ce.id), str(hek.id)], "frame_id": [str(f.id)],
                 "product_id": [str(p.id)], "calibration_file_id": [str(c.id)], "code": ["SDI", "sci-uv"],
                 "job_id": ["00000000-0000-0000-0000-000000000000"], "token": [token]}
    engine.dispose()
    return known


def test_no_route_answers_5xx_to_schema_driven_requests(fuzz_url, settings_env, tmp_path, capsys):
    from fastapi.testclient import TestClient

    from backend.api.app import create_app

    settings_env(DATABASE_URL=fuzz_url)
    route_celery_to_this_data_dir()
    known = _seed(fuzz_url, tmp_path / "products")
    app = create_app()
    spec = app.openapi()
    option_names = list(spec["components"]["schemas"].get("CalibrationOptions", {}).get("properties", {}))
    t0 = time.monotonic()
    stats = {"requests": 0, "5xx": 0, "401": 0}
    errors: list[str] = []

    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {known.pop('token')[0]}"

        def call(method: str, url: str, **kw) -> None:
            r = client.request(method, url, **kw)
            stats["requests"] += 1
            stats["401"] += r.status_code == 401
            if r.status_code >= 500:
                stats["5xx"] += 1
                if len(errors) < 20:
                    errors.append(f"{method} {url} {kw} -> {r.status_code} {r.text[:200]}")

        common = settings(max_examples=EXAMPLES_PER_ROUTE, derandomize=True, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck))
        routes = 0
        for path, ops in spec["paths"].items():
            op = ops.get("get")
            if op is None:
                continue
            routes += 1
            params = op.get("parameters", [])

            def make(path: str):
                @common
                @given(path_values=_path_strategy(params, known), query=_query_strategy(params))
                def get_route(path_values, query):
                    url = path
                    for k, v in path_values.items():
                        url = url.replace("{" + k + "}", quote(str(v), safe=""))
                    call("GET", url, params=query)

                return get_route

            make(path)()

        @settings(max_examples=JOB_EXAMPLES, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(body=_job_body(option_names))
        def post_job(body):
            call("POST", "/api/v1/jobs", content=body.encode("utf-8", "surrogatepass"),
                 headers={"content-type": "application/json"})

        post_job()

    elapsed = time.monotonic() - t0
    with capsys.disabled():
        print(f"\nschema-driven API test: {stats['requests']} requests over {routes} GET routes and POST "
              f"/api/v1/jobs, {stats['5xx']} server errors, {elapsed:.1f} s")
    assert routes >= 15
    assert stats["5xx"] == 0, "\n".join(errors)
    assert stats["401"] == 0  # every request was authorized: the job bodies were read, not refused at the door
    # its run time is printed, not asserted: speed is checked by benchmarks, never by timed tests
