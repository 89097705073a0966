"""The lean events path (``backend/api/lean_events.py``, issue 29 item 4) answers
``GET /api/v1/events`` and ``GET /api/v1/events/{id}`` byte for byte as the routes' own
handlers do (the app built with ``LEAN_EVENTS=0``), on every query parameter the search route
declares (the list comes from the route, so a new filter fails here until it has values), for
anonymous and signed-in callers; and the catalogue coverage it keeps follows every change of
``catalogue_coverage`` (migration 0022's generation number), also one made by another
connection.
"""

from __future__ import annotations

import datetime as dt
import random
import uuid

import pytest
from fastapi.testclient import TestClient

from backend.api import lean_events
from backend.api.deps import get_session
from backend.models import (CatalogueCoverage, Event, EventAssociation, EventFrame, EventProduct, Frame,
                            Product, ProductState)
from tests.conftest import auth_headers

pytestmark = pytest.mark.postgres

T0 = dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)


def _ev(s, event_type, start, end=None, *, peak=None, source="goes_xrs", **kw) -> Event:
    e = Event(event_type=event_type, source=source, source_key=uuid.uuid4().hex, start_time=start, peak_time=peak,
              end_time=end, attributes=kw.pop("attributes", {"obs_observatory": "GOES"}), **kw)
    s.add(e)
    s.flush()
    return e


@pytest.fixture
def world(db_session):
    """Events of every kind the filters look at (public, the tester's and another user's), links,
    frames and products, catalogue coverage."""
    s = db_session
    rng = random.Random(29)
    out = []
    classes = ["B2.0", "C5.0", "M1.0", "M9.9", "X2.1", "X10", None]
    for i in range(60):
        t = T0 + dt.timedelta(minutes=37 * i)
        kind = ["FL", "CE", "PR", "AR"][i % 4]
        owner = "tester" if i % 11 == 3 else ("other" if i % 13 == 5 else None)
        kw = dict(owner=owner)
        if kind == "FL":
            kw.update(goes_class=classes[i % len(classes)], hpc_x=rng.uniform(-900, 900), hpc_y=rng.uniform(-900, 900),
                      noaa_ar=rng.choice([3664, 13664, 13700, None]), peak=t + 5 * MIN)
        if kind in ("CE", "PR"):
            kw.update(position_angle=rng.uniform(0, 360), angular_width=rng.choice([40.0, 80.0, 360.0]),
                      speed_km_s=rng.choice([None, 400.5, 1234.25]))
        src = {"FL": rng.choice(["goes_xrs", "hek", "detected"]), "CE": "cdaw", "PR": "detected", "AR": "noaa_srs"}[kind]
        if src == "detected":
            kw.update(channels=rng.choice(["SDI", "SDI,WST", "SCI-UV"]), frm_name="lst-sdi-flare",
                      frm_version=rng.choice(["1.0.0", "0.9.0"]), peak_value=rng.uniform(1, 300), peak_unit="%")
        end = None if i % 5 == 0 else t + dt.timedelta(minutes=rng.choice([3, 30, 600]))
        if i == 7:
            kw["peak_value"] = float("nan")  # stored NaN: JSON null on both paths
        out.append(_ev(s, kind, t, end, source=src, **kw))
    for a, b in [(0, 1), (4, 5), (8, 9), (3, 1), (12, 13), (2, 5)]:
        for x, y in ((out[a], out[b]), (out[b], out[a])):
            s.add(EventAssociation(event_id=x.id, other_event_id=y.id, kind="flare_cme", reason="test link",
                                   other_event_type=y.event_type, other_owner=y.owner))
    for j in range(3):
        f = Frame(channel_code="SDI", date_obs=T0 + dt.timedelta(hours=3 * j), exposure_s=1.0, naxis1=8, naxis2=8,
                  path=f"/x/{uuid.uuid4().hex}", original_name="f.fits", sha256=uuid.uuid4().hex * 2, size_bytes=10,
                  header={}, level="L1")
        s.add(f)
        s.flush()
        p = Product(frame_id=f.id, state=ProductState.written, path=f"/p/{uuid.uuid4().hex}", calibration_key="dark:1",
                    params_hash="0" * 64, software_version="t")
        s.add(p)
        s.flush()
        s.add(EventFrame(event_id=out[0].id, frame_id=f.id))
        s.add(EventProduct(event_id=out[0].id, product_id=p.id))
    s.add(CatalogueCoverage(source="goes_xrs", file="a.txt", covers_start=T0 - dt.timedelta(days=1),
                            covers_end=T0 + dt.timedelta(days=2), complete=True, basis="file span"))
    s.add(CatalogueCoverage(source="cdaw", file="b.txt", covers_start=T0, covers_end=T0 + dt.timedelta(hours=12),
                            complete=False, basis="selection"))
    s.flush()
    return out


@pytest.fixture
def clients(db_session, settings_env, monkeypatch):
    """(lean, route): two apps on the test's session, one with the lean path, one without."""
    from backend.api.app import create_app

    settings_env()

    def _session():
        yield db_session

    apps = []
    for lean in ("1", "0"):
        monkeypatch.setenv("LEAN_EVENTS", lean)
        app = create_app()
        app.dependency_overrides[get_session] = _session
        apps.append(app)
    monkeypatch.delenv("LEAN_EVENTS")
    with TestClient(apps[0], raise_server_exceptions=False) as a, TestClient(apps[1], raise_server_exceptions=False) as b:
        yield a, b


#: Values tried for each query parameter of GET /events: valid ones, edge ones and refused ones
#: (a refused value must get the route's own 422 from both). The test fails for a declared
#: parameter that has none here.
VALUES: dict[str, list] = {
    "limit": ["1", "3", "500", "0", "501", "abc", "07"],
    "offset": ["0", "2", "40", "-1", "x"],
    "start": ["2024-05-14T18:00:00Z", "2024-05-14T18:00", "20240514", "2024-05-15T00:00:00+08:00", "yesterday", "0",
              "2024-05-14T18:00:00 08:00"],
    "end": ["2024-05-14T20:00:00Z", "2024-05-15", "2023-01-01", "nope"],
    "type": ["FL", "fl", ["FL", "CE"], "FL,CE", "XX", ["PR", "PR"]],
    "source": ["cdaw", ["goes_xrs", "detected"], "hek,noaa_srs", "nope", "a b"],
    "channel": ["SDI", "sdi", "WST", "SCI-UV", "nope"],
    "hpc_x_min": ["-100", "0.5", "-2000", "1e2", "nan", "-99999"],
    "hpc_x_max": ["100", "-0.25", "99999"],
    "hpc_y_min": ["-300", "12.75"],
    "hpc_y_max": ["300", "-12"],
    "pa_min": ["10", "300", "0", "361", "-1"],
    "pa_max": ["90", "30", "360"],
    "min_goes_class": ["M1", "C5.0", "X10", "m1", "Q9", "A"],
    "min_peak_value": ["50", "0", "1e9", "inf", "-3.5"],
    "frm_name": ["lst-sdi-flare", "SWPC", "a\x00b"],
    "frm_version": ["1.0.0", "0.9.0"],
    "noaa_ar": ["3664", "13664", "13700", "0", "100000"],
    "associated_type": ["CE", "FL", "ZZ", "XXXXX"],
    "calibration_set": ["1", "dark:3,flat:5", "bogus:1", "0"],
    "calibration_file": ["1", "0"],
    "min_angular_width": ["60", "360", "400"],
    "systematics": ["any", "centre_refused", "nope"],
    "sort": ["start_time", "-start_time", "id", "-id", "peak_time", "-peak_time", "end_time", "-goes_flux",
             "speed_km_s", "-speed_km_s", "nothing", "+id"],
    "cursor": ["abc", "", "eyJzIjoiLXN0YXJ0X3RpbWUiLCJ2IjpudWxsLCJpIjoxLCJmIjoieCJ9"],
    "format": ["json", "csv", "votable", "hek", "xml"],
}


def _same(lean: TestClient, route: TestClient, params, headers=None) -> tuple[int, bytes]:
    a = lean.get(lean_events.SEARCH_PATH, params=params, headers=headers)
    b = route.get(lean_events.SEARCH_PATH, params=params, headers=headers)
    assert (a.status_code, a.content) == (b.status_code, b.content), params
    assert a.headers.get("content-type") == b.headers.get("content-type"), params
    assert a.headers.get("content-length") == b.headers.get("content-length"), params
    return a.status_code, a.content


def test_every_declared_parameter_has_values_and_a_lean_reader(clients):
    lean, _route = clients
    declared = lean_events.declared_query_params(lean.app)
    assert declared and set(declared) == set(VALUES), set(declared) ^ set(VALUES)
    assert set(declared) <= set(lean_events.SEARCH_PARAMS), set(declared) - set(lean_events.SEARCH_PARAMS)


@pytest.mark.parametrize("who", ["anonymous", "tester"])
def test_each_parameter_alone_same_bytes(clients, world, db_session, who):
    """Anonymous: every value of every parameter; signed in: the first two values of each."""
    lean, route = clients
    headers = {} if who == "anonymous" else auth_headers(db_session, who, ("jobs:submit",))
    before = lean_events.STATS.lean[lean_events.SEARCH_PATH]
    statuses = set()
    for name in VALUES:
        for v in VALUES[name] if who == "anonymous" else VALUES[name][:2]:
            params = {name: v}
            if name == "end":
                params["start"] = "2024-05-14T12:00:00Z"
            statuses.add(_same(lean, route, params, headers)[0])
    _same(lean, route, {}, headers)
    assert {200, 422} <= statuses if who == "anonymous" else 200 in statuses
    assert lean_events.STATS.lean[lean_events.SEARCH_PATH] - before > (60 if who == "anonymous" else 35)


def test_combinations_and_paging_same_bytes(clients, world, db_session):
    lean, route = clients
    rng = random.Random(4)
    valid = {"type": ["FL", ["FL", "CE"], "CE,PR"], "source": ["detected", ["goes_xrs", "hek"], "cdaw"],
             "start": ["2024-05-14T18:00:00Z", "2024-05-15T02:00:00Z"], "end": ["2024-05-15T06:00:00Z", "2024-05-16"],
             "hpc_x_min": ["-500", "0"], "hpc_x_max": ["500", "900"], "hpc_y_min": ["-800"], "hpc_y_max": ["800"],
             "pa_min": ["300", "20"], "pa_max": ["60", "200"], "min_goes_class": ["C1", "M1"],
             "channel": ["SDI"], "noaa_ar": ["3664"], "limit": ["1", "2", "7"], "offset": ["1", "3"],
             "sort": ["start_time", "-start_time", "id", "-id", "peak_time", "-speed_km_s", "goes_flux"],
             "frm_version": ["1.0.0"], "min_peak_value": ["20"], "min_angular_width": ["60"],
             "associated_type": ["CE"]}
    headers = [{}, auth_headers(db_session, "tester", ("jobs:submit",)), auth_headers(db_session, "admin", ("admin",))]
    for i in range(30):
        params = {k: rng.choice(v) for k, v in rng.sample(sorted(valid.items()), rng.randint(1, 5))}
        if "start" in params and "end" in params and params["end"] < params["start"]:
            params.pop("end")
        _same(lean, route, params, headers[i % 3])
    # cursor paging, each sort, to the end
    for sort, h in (("-start_time", headers[0]), ("id", headers[1]), ("-peak_time", headers[1]),
                    ("speed_km_s", headers[0]), ("-goes_flux", headers[2])):
        if True:
            params = {"sort": sort, "limit": "9"}
            for _ in range(40):
                status, body = _same(lean, route, params, h)
                assert status == 200
                import json

                nxt = json.loads(body)["next_cursor"]
                if nxt is None:
                    break
                params["cursor"] = nxt
            else:
                pytest.fail("paging did not end")


def test_estimate_above_the_exact_limit_same_bytes(clients, world, monkeypatch):
    from backend.services import event_search

    monkeypatch.setattr(event_search, "EXACT_COUNT_LIMIT", 5)
    lean, route = clients
    for params in ({}, {"type": "FL"}, {"start": "2024-05-14T00:00:00Z", "limit": "2"}, {"sort": "-goes_flux"}):
        status, body = _same(lean, route, params)
        assert status == 200 and b'"total_is_estimate":true' in body


def test_detail_same_bytes_and_private_events_stay_private(clients, world, db_session):
    lean, route = clients
    anon, tester, other = {}, auth_headers(db_session, "tester", ("jobs:submit",)), auth_headers(db_session, "other", ("jobs:submit",))
    admin = auth_headers(db_session, "boss", ("admin",))
    mine = next(e for e in world if e.owner == "tester")
    theirs = next(e for e in world if e.owner == "other")
    before = lean_events.STATS.lean[lean_events.DETAIL_PATH]
    for h in (anon, tester, other, admin):
        for e in world[:6] + [mine, theirs]:
            a = lean.get(f"/api/v1/events/{e.id}", headers=h)
            b = route.get(f"/api/v1/events/{e.id}", headers=h)
            assert (a.status_code, a.content, a.headers["content-type"]) == \
                (b.status_code, b.content, b.headers["content-type"]), (e.id, h)
        for raw in ("0", "007", "x", "99999999999", str(world[-1].id + 1000)):
            a, b = lean.get(f"/api/v1/events/{raw}", headers=h), route.get(f"/api/v1/events/{raw}", headers=h)
            assert (a.status_code, a.content) == (b.status_code, b.content), raw
    assert lean_events.STATS.lean[lean_events.DETAIL_PATH] - before >= 4 * 8
    # another user's private event is 404 on the lean path, the owner's and an admin's 200
    assert lean.get(f"/api/v1/events/{theirs.id}", headers=tester).status_code == 404
    assert lean.get(f"/api/v1/events/{theirs.id}").status_code == 404
    assert lean.get(f"/api/v1/events/{mine.id}", headers=tester).status_code == 200
    assert lean.get(f"/api/v1/events/{theirs.id}", headers=admin).status_code == 200
    body = lean.get(f"/api/v1/events/{world[0].id}").json()
    assert len(body["frame_ids"]) == 3 and len(body["product_ids"]) == 3 and body["associated"]
    # nor does a search show it
    ids = {x["id"] for x in lean.get(lean_events.SEARCH_PATH, params={"limit": "500"}, headers=tester).json()["items"]}
    assert mine.id in ids and theirs.id not in ids


def test_kept_coverage_follows_changes_of_the_table(clients, world, db_session, pg_engine):
    """The catalogue spans are kept per process; a change of ``catalogue_coverage`` (in this
    transaction, or committed by another connection) is seen by the next search."""
    from sqlalchemy import text

    lean, route = clients
    params = {"start": "2024-05-14T00:00:00Z", "end": "2024-05-20T00:00:00Z"}
    _same(lean, route, params)
    first = lean.get(lean_events.SEARCH_PATH, params=params).json()["coverage"]
    db_session.add(CatalogueCoverage(source="hek", file="h.json", covers_start=T0 - dt.timedelta(days=30),
                                     covers_end=T0 + dt.timedelta(days=30), complete=True, basis="file span"))
    db_session.flush()
    _, body = _same(lean, route, params)
    import json

    assert json.loads(body)["coverage"]["hek"]["status"] == "covered" != first["hek"]["status"]
    db_session.execute(text("UPDATE catalogue_coverage SET complete = false WHERE source = 'hek'"))
    _, body = _same(lean, route, params)
    assert json.loads(body)["coverage"]["hek"]["status"] == "selection"
    db_session.execute(text("DELETE FROM catalogue_coverage WHERE source = 'hek'"))
    _same(lean, route, params)


def test_generation_numbers_are_never_given_twice(pg_engine):
    """A change of ``catalogue_coverage`` rolled back leaves a gap, never a number another change
    gets again (the kept spans of a rolled-back change could otherwise pass for current)."""
    from sqlalchemy import text

    def generation(c):
        return c.execute(text("SELECT value FROM data_generations WHERE name = 'catalogue_coverage'")).scalar()

    with pg_engine.connect() as c:
        g0 = generation(c)
        c.rollback()
        c.execute(text("DELETE FROM catalogue_coverage WHERE id < 0"))  # a statement changing nothing bumps too
        g1 = generation(c)
        c.rollback()
        c.execute(text("DELETE FROM catalogue_coverage WHERE id < 0"))
        g2 = generation(c)
        c.rollback()
    assert g0 != g1 != g2 != g0


def test_anonymous_requests_on_the_pool_same_bytes(pg_url, settings_env, monkeypatch):
    """Without an overridden session (as served), an anonymous request reads on a connection of
    the API engine's pool directly (``_Reads`` without a session): the same bytes as the route,
    and the connection goes back to the pool as it came (not in autocommit)."""
    from sqlalchemy import delete
    from sqlalchemy.orm import Session

    from backend import db as dbmod
    from backend.api.app import create_app

    settings_env(DATABASE_URL=pg_url)
    engine = dbmod.make_engine(pg_url)
    tag = f"lean-pool-{uuid.uuid4().hex[:8]}"
    with Session(engine) as s:
        rows = [Event(event_type="FL", source="hek", source_key=f"{tag}-{i}", start_time=T0 + i * MIN,
                      end_time=T0 + (i + 3) * MIN, goes_class="M1.0", hpc_x=10.0 * i, hpc_y=-5.0 * i,
                      owner="someone" if i == 2 else None, attributes={}) for i in range(5)]
        s.add_all(rows)
        s.commit()
        ids = [r.id for r in rows]
    try:
        apps = []
        for lean in ("1", "0"):
            monkeypatch.setenv("LEAN_EVENTS", lean)
            apps.append(create_app())
        assert lean_events._uses_pool(apps[0])
        with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
            before = lean_events.STATS.lean[lean_events.SEARCH_PATH]
            for params in ({"type": "FL", "start": "2024-05-14T16:00:00Z", "end": "2024-05-14T16:10:00Z"},
                           {"hpc_x_min": "15", "hpc_x_max": "35", "start": "2024-05-14T15:00:00Z"},
                           {"min_goes_class": "M1", "limit": "2", "start": "2024-05-14T16:00:00Z",
                            "end": "2024-05-14T16:30:00Z"}):
                _same(a, b, params)
            assert lean_events.STATS.lean[lean_events.SEARCH_PATH] - before == 3
            for i in ids:
                ra, rb = a.get(f"/api/v1/events/{i}"), b.get(f"/api/v1/events/{i}")
                assert (ra.status_code, ra.content) == (rb.status_code, rb.content)
            assert a.get(f"/api/v1/events/{ids[2]}").status_code == 404  # private: not for anonymous
        pool_engine = dbmod.get_engine("api")
        conn = pool_engine.raw_connection()
        try:
            assert conn.dbapi_connection.autocommit is False
        finally:
            conn.close()
    finally:
        with Session(engine) as s:
            s.execute(delete(Event).where(Event.source_key.like(f"{tag}-%")))
            s.commit()
        engine.dispose()
        dbmod.reset_caches()


def test_a_longer_event_stored_after_a_search_is_found(clients, world, db_session):
    """The lean path keeps the longest duration of the types searched (the time-overlap lower
    bound) and checks it in the same statement: an event longer than any before, stored after
    a search, is found by the next one; one deleted changes nothing."""
    import json

    lean, route = clients
    params = {"start": "2024-05-16T00:00:00Z", "end": "2024-05-16T01:00:00Z", "type": "FL", "limit": "500"}
    _same(lean, route, params)
    _same(lean, route, params)  # the kept value now
    longest = _ev(db_session, "FL", T0 - dt.timedelta(days=20), T0 + dt.timedelta(days=5), goes_class="C1.0")
    _, body = _same(lean, route, params)
    assert longest.id in {x["id"] for x in json.loads(body)["items"]}
    db_session.delete(longest)
    db_session.flush()
    _, body = _same(lean, route, params)
    assert longest.id not in {x["id"] for x in json.loads(body)["items"]}


def test_a_pooled_connection_the_server_dropped_is_a_reconnect_not_an_error(pg_url, settings_env, monkeypatch):
    """An anonymous lean read checks its pooled connection out without the pool's pre-ping
    (``backend.db.checkout_without_ping``: no ``SELECT 1`` round trip per request); when that
    connection turns out dropped by the server (here ``pg_terminate_backend``), the read is
    repeated on a pinged connection, so the caller gets its answer, as the pre-ping gave it:
    the search and the detail, each the same bytes as the route, and the repeat is seen."""
    import psycopg
    from sqlalchemy import delete
    from sqlalchemy.orm import Session

    from backend import db as dbmod
    from backend.api.app import create_app

    settings_env(DATABASE_URL=pg_url)
    engine = dbmod.make_engine(pg_url)
    tag = f"lean-drop-{uuid.uuid4().hex[:8]}"
    with Session(engine) as s:
        ev = Event(event_type="FL", source="hek", source_key=f"{tag}-0", start_time=T0, end_time=T0 + 3 * MIN,
                   goes_class="M1.0", attributes={})
        s.add(ev)
        s.commit()
        eid = ev.id
    lost = []
    real_lost = lean_events._Reads.lost_unpinged

    def spy(self):
        out = real_lost(self)
        lost.append(out)
        return out

    monkeypatch.setattr(lean_events._Reads, "lost_unpinged", spy)

    def drop_pooled_connections():
        pool_engine = dbmod.get_engine("api")
        pids = []
        held = []
        try:
            for _ in range(pool_engine.pool.checkedin()):
                conn = pool_engine.raw_connection()
                held.append(conn)
                pids.append(conn.dbapi_connection.info.backend_pid)
        finally:
            for conn in held:
                conn.close()
        assert pids
        with psycopg.connect(pg_url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as admin:
            for pid in pids:
                assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
            for _ in range(100):
                if not admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone()[0]:
                    break
                import time

                time.sleep(0.05)

    try:
        apps = []
        for lean in ("1", "0"):
            monkeypatch.setenv("LEAN_EVENTS", lean)
            apps.append(create_app())
        params = {"type": "FL", "start": "2024-05-14T15:00:00Z", "end": "2024-05-14T17:00:00Z"}
        with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
            want_search = b.get("/api/v1/events", params=params)
            want_detail = b.get(f"/api/v1/events/{eid}")
            assert want_search.status_code == 200 and want_detail.status_code == 200
            assert a.get("/api/v1/events", params=params).content == want_search.content  # the pool has one now
            assert lost == []
            drop_pooled_connections()
            got = a.get("/api/v1/events", params=params)
            assert (got.status_code, got.content) == (200, want_search.content)
            assert lost == [True]  # the unpinged connection was found lost, the read repeated
            drop_pooled_connections()
            got = a.get(f"/api/v1/events/{eid}")
            assert (got.status_code, got.content) == (200, want_detail.content)
            assert lost == [True, True]
            assert a.get(f"/api/v1/events/{eid}").content == want_detail.content
            assert lost == [True, True]
    finally:
        with Session(engine) as s:
            s.execute(delete(Event).where(Event.source_key.like(f"{tag}-%")))
            s.commit()
        engine.dispose()
        dbmod.reset_caches()


def test_plain_utc_times_are_read_as_the_route_reads_them():
    """The lean path reads ``YYYY-MM-DDTHH:MM:SSZ`` itself (``lean_events._time``): the same value
    and time zone as the route's validators (``_time_general``), or the same refusal, on random
    and edge texts (leap-second days, second 60, hour 24, month 13, day 0, year 0)."""
    rng = random.Random(29)
    texts = ["2016-12-31T23:59:59Z", "2016-12-31T23:59:60Z", "2015-06-30T23:59:59Z", "2015-06-30T23:59:60Z",
             "2020-02-29T12:00:00Z", "2019-02-29T12:00:00Z", "2020-13-01T00:00:00Z", "2020-01-01T24:00:00Z",
             "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "2020-01-01T00:00:60Z",
             "2020-00-10T00:00:00Z", "2020-01-00T00:00:00Z"]
    texts += [f"{rng.randint(1, 9999):04d}-{rng.randint(0, 13):02d}-{rng.randint(0, 32):02d}T{rng.randint(0, 24):02d}:"
              f"{rng.randint(0, 60):02d}:{rng.randint(0, 61):02d}Z" for _ in range(3000)]
    read = 0
    for text in texts:
        got = want = "refused"
        try:
            got = lean_events._time(text)
        except lean_events._Refuse:
            pass
        try:
            want = lean_events._time_general(text)
        except lean_events._Refuse:
            pass
        assert got == want, text
        if want != "refused":
            assert (got.tzinfo, got.isoformat()) == (want.tzinfo, want.isoformat()), text
            read += 1
    assert read > 1000


def test_a_cursor_made_before_keeps_working():
    """``EventFilters.fingerprint`` (in every cursor) is the hash it always was: the SHA-256 of
    the fields' JSON, keys sorted, times as ISO text."""
    import hashlib
    import json
    from dataclasses import fields

    from backend.services.event_search import EventFilters

    def before(f):
        d = {x.name: getattr(f, x.name) for x in fields(f)}
        d = {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in d.items()}
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]

    for f in (EventFilters(), EventFilters(event_types=("CE", "FL"), start=T0, end=T0 + MIN, pa_min=350.0,
                                           pa_max=10.0, viewer="someone", sources=("detected",), noaa_ar=12345)):
        assert f.fingerprint() == before(f)


def test_angle_ranges_and_boxes_keep_every_row_same_bytes(clients, world, db_session, monkeypatch):
    """The conditions the lean search adds beside the exact ones (migration 0024) keep the same
    rows: the whole-degree condition of an angle range (on stored angles at and around the
    degree edges, below 0, at and above 360, NaN, +-inf; ranges inside, through 0 deg, touching
    0 and 360, one bound alone, with and without a time window), and the box over a time window
    read once for its count and page (every sort, offsets, and above the exact count's limit,
    where the page is read again from the index)."""
    from backend.services import event_search

    lean, route = clients
    t = T0 + dt.timedelta(hours=2)
    for i, pa in enumerate((float("nan"), float("inf"), float("-inf"), -5.0, -0.5, 0.0, 0.5, 59.5, 60.0, 60.25, 200.0,
                            299.999, 300.0, 359.99, 360.0, 361.0, 720.0)):
        _ev(db_session, "CE" if i % 3 else "PR", t + i * MIN, t + (i + 30) * MIN, source="cdaw", position_angle=pa,
            hpc_x=-100.0 + 25 * i, hpc_y=50.0 - 10 * i)
    window = {"start": "2024-05-14T17:00:00Z", "end": "2024-05-15T20:00:00Z"}
    before = lean_events.STATS.lean[lean_events.SEARCH_PATH]
    ranges = [("60", "300"), ("300", "60"), ("0", "360"), ("60", "60"), ("359.5", "0.5"), ("0", "0"), ("360", "360"),
              ("59.5", "60.25"), ("300", None), (None, "60"), ("0.5", "359.99"), ("200", "199.9")]
    for lo, hi in ranges:
        pa = {k: v for k, v in (("pa_min", lo), ("pa_max", hi)) if v is not None}
        for extra in ({}, window, dict(window, type="CE"), {"type": ["CE", "PR"], "sort": "id", "offset": "2"}):
            status, _ = _same(lean, route, {**pa, **extra, "limit": "500"})
            assert status == 200
    box = dict(window, hpc_x_min="-200", hpc_x_max="400", hpc_y_min="-900", hpc_y_max="900")
    for extra in ({}, {"sort": "id"}, {"sort": "-id", "limit": "3"}, {"sort": "peak_time", "offset": "1"},
                  {"sort": "-speed_km_s", "offset": "2", "limit": "2"}, {"limit": "2", "offset": "3"},
                  {"type": "CE", "pa_min": "300", "pa_max": "60"}):
        _same(lean, route, {**box, **extra})
    monkeypatch.setattr(event_search, "EXACT_COUNT_LIMIT", 3)
    for extra in ({}, {"sort": "id", "limit": "2"}, {"offset": "1", "limit": "2"}):
        status, body = _same(lean, route, {**box, **extra})
        assert status == 200 and b'"total_is_estimate":true' in body
    assert lean_events.STATS.lean[lean_events.SEARCH_PATH] - before == len(ranges) * 4 + 7 + 3


def test_the_added_conditions_match_migration_0024s_indexes(db_session, world):
    """The texts the lean search adds are those migration 0024 indexes (a text that drifted
    would leave the index unused, silently): with sequential scans off, an angle range's
    conditions are read from ``ix_events_pa_deg_start`` (narrow ranges: a few degrees, so that the
    planner prefers it on the small table; one inside, one through 0 deg, one bound), and
    a box over a time window's statement reads ``ix_events_time_hpc_x`` once (its count and page
    from one read of the matches)."""
    from backend.services import event_search_lean as lean

    conn = db_session.connection().connection.dbapi_connection
    conn.execute("ANALYZE events")

    def plan(sql: str, params) -> str:
        with conn.cursor() as cur:
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("SET LOCAL enable_bitmapscan = off")
            cur.execute("EXPLAIN " + sql, params)
            text = "\n".join(r[0] for r in cur.fetchall())
            cur.execute("RESET enable_seqscan")
            cur.execute("RESET enable_bitmapscan")
        return text

    def filters(query: bytes):
        return lean_events._filters(lean_events._read_search_params(query), None)

    for query in (b"pa_min=20&pa_max=22", b"pa_min=359.5&pa_max=0.5", b"pa_min=359.5"):
        f = filters(query)
        where = lean._count_where(f, lean._conditions(f, False))
        text = plan(f"SELECT events.id FROM events WHERE {where}", lean._params(f, None))
        assert "ix_events_pa_deg_start" in text, (query, text)

    seen = []

    class Recording:
        def __init__(self, cur):
            self.cur = cur

        def execute(self, sql, params=None):
            seen.append((sql, params))
            return self.cur.execute(sql, params)

        def __getattr__(self, name):
            return getattr(self.cur, name)

    f = filters(b"start=2024-05-14T00:00:00Z&end=2024-05-16T00:00:00Z&hpc_x_min=-500&hpc_x_max=500&hpc_y_min=-500"
                b"&hpc_y_max=500")
    with conn.cursor() as cur:
        lean.lean_search(Recording(cur), f, sort=None, limit=50, cursor=None, offset=0, detected=True)
    text = plan(*seen[-1])
    assert text.count("ix_events_time_hpc_x") == 1 and "CTE Scan on matches" in text, text
