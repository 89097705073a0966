"""Bad input a reviewer found answering 500 after issue 25's merge, as requests (each a 4xx or
an ordinary answer, never a 5xx): times whose UTC offset or leap-second handling leaves
``datetime``'s range, and ids written with non-ASCII digits (``"²".isdigit()`` is True, but
``int("²")`` raises)."""

from __future__ import annotations

import pytest

from tests.conftest import auth_headers

GETS = [
    "/api/v1/events?start=9999-12-31T23:59:59.9995Z",
    "/api/v1/events?start=0001-01-01T00:00:60%2B05:00",
    "/api/v1/events?end=9999-12-31T23:59:60-01:00",
    "/api/v1/products?start=99991231T235959.9995Z",
    "/products/search?start=9999-12-31T23:59:59.9995Z",
    "/?tl_start=9999-12-31T23:59:59.9995Z&tl_end=9999-12-31T23:59:59.9998Z",
    "/movies?start=0001-01-01T00:00:60%2B05:00",
    "/products/search?calibration_set=%C2%B2",
    "/api/v1/events?calibration_set=%C2%B2",
    "/?calibration_set=%C2%B2",
    "/movies?event=%C2%B2",
]


@pytest.mark.parametrize("path", GETS)
def test_bad_times_and_ids_are_never_a_server_error(api_client, path):
    r = api_client.get(path)
    assert r.status_code < 500, (path, r.status_code, r.text[:300])


def test_bad_times_and_ids_in_bodies_are_4xx(api_client, db_session):
    h = auth_headers(db_session, "alice", ("jobs:submit",))
    for body in ({"channels": ["SDI"], "start": "2011-06-07", "end": "9999-12-31T23:59:60-01:00"},
                 {"channels": ["SDI"], "start": "0001-01-01T00:00:60+05:00", "end": "2011-06-08"}):
        r = api_client.post("/api/v1/jobs", json=body, headers=h)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text[:300])
    for kind, query in (("products", "calibration_set=%C2%B2"), ("events", "calibration_set=%C2%B2")):
        r = api_client.post("/api/v1/saved-searches", json={"name": "b", "kind": kind, "query": query}, headers=h)
        assert r.status_code < 500, (kind, r.status_code, r.text[:300])
