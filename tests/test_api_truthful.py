"""Truthful inputs and outputs of the API (real PostgreSQL, per-test rollback).

* no request makes a 500: a cursor whose id overflows an integer, NaN/Infinity/1e400 in a
  job body, a NUL character in a job's text (PostgreSQL refuses it);
* unknown enumerated filter values (``source``, ``channel``, ``type``) are 422; a time whose
  ``+`` arrived as a space is a 422 that says to encode it as ``%2B``; HEAD on every GET
  route of the OpenAPI;
* the exports name the observatory and instrument of the catalogue an event came from;
* the light-curve window is bounded and missing samples are ``null`` gaps;
* the timeline route documents what it draws (the newest events).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from sqlalchemy import select

from backend.models import Job
from backend.services.event_search import EventFilters
from tests.test_api import (  # noqa: F401 - fixtures
    MIN,
    T0,
    client,
    make_event,
    make_frame,
    make_product,
    route_celery_to_this_data_dir,
    settings,
    write_product_fits,
)

pytestmark = pytest.mark.postgres

JOB = {"channels": ["SDI"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z"}


def _cursor(i, v="2024-05-14T16:00:00+00:00", sort="-start_time", filters=EventFilters()) -> str:
    raw = json.dumps({"s": sort, "v": v, "i": i, "f": filters.fingerprint()}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _assert_422(r, *needles):
    assert r.status_code == 422, (r.status_code, r.text)
    body = r.json()
    assert isinstance(body["detail"], str) and body["detail"]
    for n in needles:
        assert n in body["detail"], (n, body["detail"])
    return body


# -- 13: no request makes a 500 ---------------------------------------------------------------


@pytest.mark.parametrize("cursor", [
    _cursor(10**30),
    _cursor(2**31),
    _cursor(-1),
    _cursor(5, v=10**30, sort="id"),
    _cursor(5, v=1e400, sort="-goes_flux"),
    _cursor(5, v="0001-01-01T00:00:00+05:00"),
], ids=["id-1e30", "id-2^31", "id-negative", "id-key-1e30", "flux-inf", "time-before-year-1"])
def test_cursor_with_overflowing_values_is_422(client, cursor):
    sort = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))["s"]
    _assert_422(client.get("/api/v1/events", params={"cursor": cursor, "sort": sort}), "cursor")


@pytest.mark.parametrize("fragment", [
    '"options": {"flat_smooth": NaN}',
    '"options": {"x": Infinity}',
    '"pinned_calibrations": {"flat": 1e400}',
    '"channels": [-Infinity]',
    '"extra": [1, 2, NaN]',
])
def test_non_finite_numbers_in_a_job_body_are_422(client, db_session, fragment):
    route_celery_to_this_data_dir()
    n_before = len(db_session.scalars(select(Job.id)).all())
    body = '{"channels": ["SDI"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z", ' + fragment + "}"
    r = client.post("/api/v1/jobs", content=body, headers={"content-type": "application/json"})
    out = _assert_422(r, "not a finite number")
    json.dumps(out, allow_nan=False)  # the error body itself is valid JSON
    assert len(db_session.scalars(select(Job.id)).all()) == n_before


def test_validation_error_echoing_a_non_finite_float_is_json():
    from backend.api.app import clean_validation_errors

    out = clean_validation_errors([{"loc": ("body", "x"), "msg": "bad", "type": "t", "input": float("nan")},
                                   {"loc": ("body", "y"), "msg": "bad", "type": "t", "input": float("-inf")}])
    assert [e["input"] for e in out] == ["nan", "-inf"]
    json.dumps(out, allow_nan=False)


@pytest.mark.parametrize("payload", [
    {**JOB, "options": {"device": "c\x00pu"}},
    {**JOB, "channels": ["SDI\x00"]},
    {**JOB, "options": {"device\x00": "cpu"}},
])
def test_nul_in_a_job_body_is_422_on_postgresql(client, db_session, payload):
    route_celery_to_this_data_dir()
    _assert_422(client.post("/api/v1/jobs", json=payload), "NUL")


def test_database_data_error_is_422_not_500(client, monkeypatch):
    """A value PostgreSQL refuses that got past the checks is the request's fault: 422."""
    from backend.services import event_search

    real = event_search.filter_conditions

    def nul_filter(session, f):
        from backend.models import Event

        return [*real(session, f), Event.__table__.c.frm_name == "a\x00b"]

    monkeypatch.setattr(event_search, "filter_conditions", nul_filter)
    # a parameter the lean events path does not read sends the request to the route's handler
    _assert_422(client.get("/api/v1/events", params={"not_a_filter": "1"}), "cannot be used", "NUL")


def test_database_data_error_is_422_not_500_on_the_lean_path(client, monkeypatch):
    """The same on the lean events path (backend/api/lean_events.py): psycopg's error is
    answered by the app's handler of SQLAlchemy's DataError."""
    from backend.services import event_search_lean

    real_conditions, real_params = event_search_lean._conditions, event_search_lean._params
    monkeypatch.setattr(event_search_lean, "_SQL", {})  # the SQL texts made with the fault are not kept
    monkeypatch.setattr(event_search_lean, "_conditions",
                        lambda f, lower: [*real_conditions(f, lower), "events.frm_name = %(nul)s"])
    monkeypatch.setattr(event_search_lean, "_params", lambda f, lower: {**real_params(f, lower), "nul": "a\x00b"})
    client.headers.pop("Authorization", None)
    _assert_422(client.get("/api/v1/events"), "cannot be used", "NUL")


# -- 14: unknown enumerated values, '+' as a space, HEAD ----------------------------------------


@pytest.mark.parametrize("url,needles", [
    ("/api/v1/events?source=nosuch", ["query.source", "unknown event source 'nosuch'", "goes_xrs"]),
    ("/api/v1/events?source=goes_xrs,cdaw,SOHO", ["unknown event source 'SOHO'"]),
    ("/api/v1/events/timeline/figure?source=lasco", ["unknown event source 'lasco'"]),
    ("/api/v1/events?channel=AIA", ["unknown LST channel"]),
    ("/api/v1/events?type=XX", ["unknown HEK event type"]),
])
def test_unknown_filter_values_are_422(client, url, needles):
    _assert_422(client.get(url), *needles)


def test_known_sources_still_filter(client, db_session):
    e = make_event(db_session, "CE", T0, None, T0 + 60 * MIN, source="cdaw")
    r = client.get("/api/v1/events", params={"source": ["cdaw", "detected"]})
    assert r.status_code == 200 and [x["id"] for x in r.json()["items"]] == [e.id]


@pytest.mark.parametrize("route", ["/api/v1/events", "/api/v1/frames", "/api/v1/products",
                                   "/api/v1/events/timeline/figure"])
@pytest.mark.parametrize("raw", ["start=2024-05-10T00:00:00+00:00", "end=2024-05-10T00:00:00+0530",
                                 "start=2024-05-10 00:00 00:00"])
def test_plus_sent_raw_is_a_422_saying_to_encode_it(client, route, raw):
    body = _assert_422(client.get(f"{route}?{raw}"), "%2B", raw.split("=")[0])
    assert "space" in body["detail"]
    name, value = raw.split("=")
    if "+" in value:  # encoded (%2B), the same time is accepted
        assert client.get(route, params={name: value}).status_code == 200


def _get_routes(app) -> list[str]:
    spec = app.openapi()
    return [p for p, ops in spec["paths"].items() if "get" in ops]


def test_head_works_on_every_get_route(client, db_session, tmp_path):
    """HEAD on every GET route of the OpenAPI (downloads included) answers as GET does,
    with the same headers and no body."""
    f = make_frame(db_session, "SDI", T0)
    p = make_product(db_session, f, tmp_path)
    e = make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 10 * MIN)
    from backend.models import CalibrationKind
    from tests.test_api import make_calibration

    c = make_calibration(db_session, "SDI", CalibrationKind.dark, 1)
    ids = {"frame_id": f.id, "product_id": p.id, "event_id": e.id, "calibration_file_id": c.id,
           "code": "SDI", "job_id": "x", "movie_id": "x",
           # absent ids of the issue-12 resources: HEAD must still answer as GET does (404/401)
           "set_id": 999999, "search_id": 999999, "webhook_id": 999999}
    routes = _get_routes(client.app)
    assert len(routes) >= 15
    for path in routes:
        url = path
        for k, v in ids.items():
            url = url.replace("{" + k + "}", str(v))
        assert "{" not in url, f"no id for {path}"
        g = client.get(url)
        h = client.head(url)
        assert h.status_code == g.status_code, (path, h.status_code, g.status_code)
        assert h.status_code != 405
        assert h.content == b""
        if g.status_code == 200:
            assert h.headers.get("content-type") == g.headers.get("content-type"), path
    for url in ("/", "/products", f"/events/{e.id}", "/static/style.css", "/docs"):
        g, h = client.get(url), client.head(url)
        assert h.status_code == g.status_code and h.content == b"", url


# -- 15: provenance of the exports --------------------------------------------------------------


@pytest.fixture
def provenance_events(db_session):
    return {
        "cdaw": make_event(db_session, "CE", T0, None, T0 + 60 * MIN, source="cdaw", channels="LASCO-C2,LASCO-C3"),
        "goes_xrs": make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN, source="goes_xrs",
                               channels="XRS 0.1-0.8 nm", goes_class="M1.0"),
        "hek": make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN, source="hek", channels="AIA 131",
                          attributes={"obs_observatory": "SDO", "obs_instrument": "AIA", "obs_channelid": "131"}),
        "donki": make_event(db_session, "CE", T0, None, None, source="donki", channels="LASCO-C2,COR2-A",
                            attributes={"instruments": ["SOHO: LASCO/C2", "STEREO A: SECCHI/COR2"]}),
        "noaa_srs": make_event(db_session, "AR", T0, None, None, source="noaa_srs"),
        "lst_wst": make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN, source="lst_wst", channels="WST"),
        "stix": make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN, source="stix", channels="4-10 keV"),
        "detected": make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN, source="detected", channels="SDI"),
    }


EXPECTED_OBS = {
    "cdaw": ("SOHO", "LASCO", "LASCO-C2,LASCO-C3"),
    "goes_xrs": ("GOES", "XRS", "XRS 0.1-0.8 nm"),
    "hek": ("SDO", "AIA", "131"),
    "donki": ("SOHO,STEREO A", "LASCO,SECCHI", "C2,COR2"),
    "noaa_srs": ("NOAA SWPC", "SRS", None),
    "lst_wst": ("ASO-S", "LST", "WST"),
    "stix": ("Solar Orbiter", "STIX", "4-10 keV"),
    "detected": ("ASO-S", "LST", "SDI"),
}


def test_hek_json_and_voevent_name_the_source_observatory(client, provenance_events):
    rows = client.get("/api/v1/events", params={"format": "hek", "limit": 50}).json()["result"]
    by_source = {r["lst_source"]: r for r in rows}
    ns = {"voe": "http://www.ivoa.net/xml/VOEvent/v2.0"}
    for source, ev in provenance_events.items():
        rec = by_source[source]
        got = (rec["obs_observatory"], rec["obs_instrument"], rec["obs_channelid"])
        assert got == EXPECTED_OBS[source], (source, got)
        root = ET.fromstring(client.get(f"/api/v1/events/{ev.id}/voevent").content)
        params = {p.get("name"): p.get("value") for p in root.findall("voe:What/Param", ns) + root.findall("What/Param")}
        assert params.get("obs_observatory") == EXPECTED_OBS[source][0], source
        assert params.get("obs_instrument") == EXPECTED_OBS[source][1], source
        assert params.get("obs_channelid") == EXPECTED_OBS[source][2], source
    assert all(r["obs_observatory"] != "ASO-S" for s, r in by_source.items() if s not in ("detected", "lst_wst"))


# -- 16: light-curve window bounded, missing samples are gaps ---------------------------------


def test_lightcurve_window_is_bounded_around_the_event(client, db_session, tmp_path):
    e = make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 10 * MIN, hpc_x=0.0, hpc_y=0.0)
    old = make_frame(db_session, "SDI", dt.datetime(2004, 5, 14, 16, 0, tzinfo=dt.UTC))
    make_product(db_session, old, tmp_path, disk_value=1.0)
    late = make_frame(db_session, "SDI", T0 + dt.timedelta(days=40))
    make_product(db_session, late, tmp_path, disk_value=2.0)
    near = make_frame(db_session, "SDI", T0 - dt.timedelta(hours=3))
    pn = make_product(db_session, near, tmp_path, disk_value=3.0)
    lc = client.get(f"/api/v1/events/{e.id}/lightcurve", params={"region": "disk", "context_frames": 3}).json()
    assert lc["product_ids"] == [pn.id], "a 2024 event never returns points from 2004 or 40 days later"
    assert lc["window_start"] == "2024-05-14T13:00:00Z"
    assert lc["window_end"] == "2024-05-14T16:40:00Z"
    spec = client.get("/api/v1/openapi.json").json()
    assert "6 hours" in spec["paths"]["/api/v1/events/{event_id}/lightcurve"]["get"]["description"]


def test_masked_samples_are_null_and_drawn_as_gaps(client, db_session, tmp_path):
    e = make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 10 * MIN)
    ps = []
    for i in range(3):
        f = make_frame(db_session, "SDI", T0 + (2 + i) * MIN)
        ps.append(make_product(db_session, f, tmp_path, disk_value=100.0 + i))
    # the middle product: every pixel NaN or masked
    data = np.full((64, 64), np.nan, dtype=np.float32)
    write_product_fits(__import__("pathlib").Path(ps[1].path), data, np.ones((64, 64), np.uint8), T0 + 3 * MIN)
    q = {"region": "disk", "context_frames": 0}
    lc = client.get(f"/api/v1/events/{e.id}/lightcurve", params=q).json()
    assert lc["product_ids"] == [p.id for p in ps]
    assert lc["values"][0] == pytest.approx(100.0) and lc["values"][1] is None and lc["values"][2] == pytest.approx(102.0)
    fig = client.get(f"/api/v1/events/{e.id}/lightcurve/figure", params=q).json()
    tr = fig["data"][0]
    assert tr["y"][1] is None and tr["connectgaps"] is False


def test_lightcurve_figure_draws_nan_as_gap():
    from backend.render.figures import lightcurve_figure
    from backend.models import Event

    ev = Event(id=1, event_type="FL", source="detected", source_key="k", start_time=T0)
    fig = json.loads(lightcurve_figure([T0, T0 + MIN, T0 + 2 * MIN], [1.0, float("nan"), 3.0], "DN", ev).to_json())
    assert fig["data"][0]["y"] == [1.0, None, 3.0] and fig["data"][0]["connectgaps"] is False


# -- 17: the timeline documents what it draws ---------------------------------------------------


def test_timeline_route_documents_the_newest_events(client):
    op = client.get("/api/v1/openapi.json").json()["paths"]["/api/v1/events/timeline/figure"]["get"]
    assert "newest" in op["description"] and "earliest" not in op["description"]


@pytest.mark.parametrize("query", ["hpc_x_min=NaN", "pa_min=nan", "pa_max=inf", "hpc_y_max=-Infinity"])
def test_non_finite_filter_values_say_finite_not_out_of_range(client, query):
    """A NaN bound is 'not a finite number', not 'less than or equal to 10000' (reviewer's find)."""
    r = client.get(f"/api/v1/events?{query}")
    assert r.status_code == 422 and "finite" in r.text, r.text


def test_a_request_body_over_the_limit_is_413_before_it_is_read(client, db_session):
    """Issue 10 (limits): a 30 MB job body was accepted. Over 1 MiB is a 413 with a message,
    sent or streamed; nothing is stored."""
    from sqlalchemy import func

    from backend.api.app import MAX_BODY_BYTES

    big = json.dumps({"channels": ["SDI"], "start": "2024-01-01T00:00:00Z", "end": "2024-01-02T00:00:00Z",
                      "padding": "x" * (MAX_BODY_BYTES + 10)})
    r = client.post("/api/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "request body over" in r.json()["detail"]

    def chunks():
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536].encode()

    r = client.post("/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code in (400, 413) and r.status_code < 500
    assert db_session.scalar(select(func.count()).select_from(Job)) == 0
    ok = client.post("/api/v1/jobs", json={"channels": ["SDI"], "start": "2024-01-01T00:00:00Z",
                                           "end": "2024-01-02T00:00:00Z"})
    assert ok.status_code in (202, 422, 503)  # a normal body is read as before


def test_the_api_process_freezes_its_startup_heap():
    """A full garbage collection in the API process walked the ~300,000 objects of its start-up
    (about 130 ms, on one request in a few hundred); the app's start-up freezes them
    (``gc.freeze``), once per process."""
    import subprocess
    import sys

    code = ("import gc\nfrom fastapi.testclient import TestClient\nfrom backend.api.app import create_app\n"
            "before = gc.get_freeze_count()\n"
            "with TestClient(create_app()):\n    after = gc.get_freeze_count()\n"
            "print(before, after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after = map(int, out.stdout.split())
    assert before == 0 and after > 100_000, out.stdout
