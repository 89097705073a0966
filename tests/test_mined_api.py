"""Defects reported on the public trackers of FastAPI, Starlette, pydantic and plotly that
could reach this platform's API, each turned into a test named after its thread (the URL
is in the comment above each test). Real PostgreSQL, per-test rollback.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.test_api import (  # noqa: F401 - fixtures
    MIN,
    T0,
    client,
    make_event,
    make_frame,
    make_product,
    route_celery_to_this_data_dir,
    settings,
)

pytestmark = pytest.mark.postgres

JOB = {"channels": ["SDI"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z"}


def _strict_json(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity (not JSON)."""
    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _post_job_text(client, text: str):
    return client.post("/api/v1/jobs", content=text.encode("utf-8", "surrogatepass"),
                       headers={"content-type": "application/json"})


# https://github.com/fastapi/fastapi/issues/459 (jsonable_encoder should handle "nan"):
# a stored float that is NaN (PostgreSQL double precision holds NaN and infinities) made
# JSONResponse raise "Out of range float values are not JSON compliant" -> 500.
def test_fastapi_459_nan_stored_in_an_event_is_null_in_every_json_export(client, db_session):
    e = make_event(db_session, "CE", T0, None, T0 + 60 * MIN, source="cdaw", speed_km_s=float("nan"),
                   angular_width=float("inf"), hpc_x=float("-inf"), hpc_y=1.0)
    for params in ({}, {"format": "hek"}):
        r = client.get("/api/v1/events", params=params)
        assert r.status_code == 200, (params, r.status_code, r.text[:200])
        _strict_json(r.text)
    hek = _strict_json(client.get("/api/v1/events", params={"format": "hek"}).text)["result"][0]
    assert hek["cme_radiallinvel"] is None and hek["cme_angularwidth"] is None and hek["hpc_x"] is None
    r = client.get(f"/api/v1/events/{e.id}")
    assert r.status_code == 200 and _strict_json(r.text)["speed_km_s"] is None
    assert client.get(f"/api/v1/events/{e.id}/voevent").status_code == 200
    assert b"nan" not in client.get(f"/api/v1/events/{e.id}/voevent").content.lower()
    fig = client.get("/api/v1/events/timeline/figure")
    assert fig.status_code == 200
    _strict_json(fig.text)


# https://github.com/fastapi/fastapi/issues/1310 (OpenAPI page cannot load if a schema
# includes lt=inf): the OpenAPI document must be strict JSON (no Infinity in any bound).
def test_fastapi_1310_openapi_document_is_strict_json(client):
    r = client.get("/api/v1/openapi.json")
    assert r.status_code == 200
    spec = _strict_json(r.text)
    assert "/api/v1/jobs" in spec["paths"]


# https://github.com/Kludex/starlette/issues/548 (Starlette allows NaN as input JSON, but
# not as return JSON): NaN/Infinity in a request body must be answered like any malformed
# value (a 4xx), not accepted and then fail when the answer is written.
@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_starlette_548_nan_in_the_request_body_is_a_4xx_not_a_500(client, token):
    route_celery_to_this_data_dir()
    body = json.dumps(JOB)[:-1] + f', "options": {{"saturation_dn": {token}}}}}'
    r = _post_job_text(client, body)
    assert r.status_code == 422, (r.status_code, r.text)
    _strict_json(r.text)


# https://github.com/pydantic/pydantic/pull/3994 (JSON-compatible float constraints for NaN
# and Inf): pydantic parses the *strings* "NaN"/"inf" for a float field; every float the API
# reads (query parameters, job options) must refuse them.
@pytest.mark.parametrize("url", [
    "/api/v1/events?min_peak_value=NaN",
    "/api/v1/events?min_peak_value=inf",
    "/api/v1/events?pa_min=NaN",
    "/api/v1/events?hpc_x_min=-inf",
    "/api/v1/events/timeline/figure?hpc_y_max=nan",
    "/api/v1/events/1/lightcurve?margin_min=NaN",
    "/api/v1/events/1/lightcurve/figure?margin_min=inf",
])
def test_pydantic_3994_nan_and_inf_strings_in_float_query_parameters_are_422(client, db_session, url):
    make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN)
    r = client.get(url)
    assert r.status_code == 422, (url, r.status_code, r.text)
    _strict_json(r.text)


@pytest.mark.parametrize("value", ["NaN", "inf", "-Infinity"])
def test_pydantic_3994_nan_string_in_a_float_job_option_is_422(client, value):
    route_celery_to_this_data_dir()
    r = client.post("/api/v1/jobs", json={**JOB, "options": {"saturation_dn": value}})
    assert r.status_code == 422, (r.status_code, r.text)
    assert "saturation_dn" in r.json()["detail"]
    _strict_json(r.text)


# https://github.com/fastapi/fastapi/issues/1773 (Automatically support HEAD method for all
# GET routes, as Starlette does): HEAD on a GET route was a 405.
def test_fastapi_1773_head_on_get_routes_answers_like_get_without_a_body(client, db_session, settings):
    f = make_frame(db_session, "SDI", T0)
    p = make_product(db_session, f, settings.products / "SDI")
    for url in ("/api/v1/health", "/api/v1/events?format=csv", f"/api/v1/products/{p.id}/fits",
                f"/api/v1/products/{p.id}/quicklook.png", "/api/v1/events/424242"):
        g, h = client.get(url), client.head(url)
        assert h.status_code == g.status_code, url
        assert h.content == b"", url
        if "content-length" in g.headers:
            assert h.headers.get("content-length") == g.headers["content-length"], url
    # a POST-only method is still refused
    assert client.put("/api/v1/events").status_code == 405


# https://github.com/pydantic/pydantic/issues/6889 (Implicit int limits): pydantic v2 accepts
# Python ints of any size, so a huge id or version reaches PostgreSQL ("integer out of range").
@pytest.mark.parametrize("url", [
    f"/api/v1/products?frame_id={2**70}",
    f"/api/v1/frames/{2**63}",
    f"/api/v1/calibration-files/{2**40}/impact",
    f"/api/v1/events?offset={2**64}",
    f"/api/v1/jobs?offset={2**31}",
])
def test_pydantic_6889_huge_integers_in_the_url_are_422(client, url):
    r = client.get(url)
    assert r.status_code == 422, (url, r.status_code, r.text)


@pytest.mark.parametrize("payload", [
    {**JOB, "pinned_calibrations": {"flat": 2**70}},
    {**JOB, "options": {"psf_iterations": 2**70}},
    {**JOB, "options": {"interpolation_order": -(2**63)}},
])
def test_pydantic_6889_huge_integers_in_a_job_body_are_422(client, payload):
    route_celery_to_this_data_dir()
    r = client.post("/api/v1/jobs", json=payload)
    assert r.status_code == 422, (r.status_code, r.text)


# https://github.com/fastapi/fastapi/issues/13111 (Incorrect handling of non utf-8 data in
# body in case of a validation error): the validation handler echoes the body it could not
# read; binary or non-UTF-8 bodies, and lone surrogates, must still be a 4xx with a message
# (a body that is not UTF-8 at all is FastAPI's 400 "error parsing the body"; the others 422).
@pytest.mark.parametrize("content,ctype", [
    (b"\x80\x81\xff\xfe{", "application/json"),
    (b"OggS\x00\x02\x00\x00\xff", "application/octet-stream"),
    (b'{"channels": ["SDI"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z", '
     b'"options": {"device": "a\\ud800b"}}', "application/json"),
    (b'{"channels": ["\\udfff"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z"}',
     "application/json"),
])
def test_fastapi_13111_undecodable_body_is_422_with_a_message(client, content, ctype):
    route_celery_to_this_data_dir()
    r = client.post("/api/v1/jobs", content=content, headers={"content-type": ctype})
    assert r.status_code in (400, 422), (r.status_code, r.text[:300])
    body = r.json()
    assert isinstance(body["detail"], str) and body["detail"]


# https://github.com/plotly/plotly.js/issues/1454 (Strange behaviour for connectgaps): a gap
# is a null value in the data; plotly draws it as a break only when the value is null (or
# NaN) and connectgaps is false. The light curve must give masked samples as null.
def test_plotly_js_1454_masked_light_curve_samples_are_null_gaps(client, db_session, tmp_path):
    import numpy as np

    from tests.test_api import write_product_fits

    e = make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 10 * MIN)
    ps = [make_product(db_session, make_frame(db_session, "SDI", T0 + (1 + i) * MIN), tmp_path,
                       disk_value=50.0 + i) for i in range(4)]
    for p in ps[1:3]:
        from pathlib import Path

        write_product_fits(Path(p.path), np.full((64, 64), np.nan, np.float32), np.zeros((64, 64), np.uint8),
                           T0)
    q = {"region": "disk", "context_frames": 0}
    lc = client.get(f"/api/v1/events/{e.id}/lightcurve", params=q).json()
    assert len(lc["values"]) == 4 and lc["values"][1] is None and lc["values"][2] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in lc["values"] if v is not None)
    fig = _strict_json(client.get(f"/api/v1/events/{e.id}/lightcurve/figure", params=q).text)
    trace = fig["data"][0]
    assert trace["y"][1] is None and trace["y"][2] is None and trace["connectgaps"] is False


# https://github.com/celery/kombu/issues/1067 (JSON serializer to handle numpy/frozendict):
# kombu's JSON serializer raises EncodeError on numpy scalars and other non-JSON types. What
# a job stores and sends must be plain JSON: the stored parameters and the broker message
# are strict JSON, and light-curve values are Python floats (not numpy float32).
def test_kombu_1067_job_message_and_parameters_are_plain_json(client, db_session, settings, tmp_path):
    from kombu.serialization import dumps

    from backend.models import Job

    route_celery_to_this_data_dir()
    before = {p.name for p in (settings.broker_dir / "in").glob("*")}
    r = client.post("/api/v1/jobs", json={**JOB, "options": {"saturation_dn": 60000.5, "psf_iterations": 7}})
    assert r.status_code == 202, r.text
    row = db_session.get(Job, r.json()["id"])
    json.dumps(row.parameters, allow_nan=False)
    dumps(row.parameters, serializer="json")
    new = [p for p in (settings.broker_dir / "in").glob("*") if p.name not in before]
    assert len(new) == 1
    message = _strict_json(new[0].read_text())
    assert row.id in json.dumps(message)

    from backend.services.products import product_lightcurve

    make_product(db_session, make_frame(db_session, "SDI", T0), tmp_path, disk_value=42.0)
    lc = product_lightcurve(db_session, channel="SDI", start=T0 - MIN, end=T0 + MIN, product_root=tmp_path)
    assert lc.values and all(type(v) is float for v in lc.values)
    dumps({"values": lc.values}, serializer="json")
