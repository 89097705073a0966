"""Calibration sets in detections, the event catalogue and light curves (issue 12, item 4).

Live: real PostgreSQL, Redis (database 14) and a real Celery worker process, on simulated SDI
frames that hold a flare. The platform's default job and its detection make the public
catalogue; a user's job with a non-default option (interpolation_order 1) leaves the anonymous
catalogue exactly as it was (ids, total, each event's associations and product links) while
its owner sees their detections marked with their set, and nobody else does; the products of a
set are one query and share files and options on every frame; an admin's promotion (403 for a
user) makes the set and its detections public; light curves use the public set unless asked.

Quick (one rolled-back PostgreSQL transaction): visibility of search, detail and associations,
and ``associate_events`` never linking an owner's event to another owner's nor displacing a
public link.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from sqlalchemy import func, select

from backend.models import (
    CalibrationSet,
    Event,
    EventAssociation,
    EventProduct,
    Frame,
    JobFollowUp,
    JobState,
    Product,
    ProductState,
)

SIZE = 128


# -- quick: visibility and associations on the database -------------------------------------------


def _flare(session, key: str, *, owner: str | None, source: str = "detected", peak_min: int = 10,
           x: float = 100.0, y: float = 200.0, ar: int | None = None) -> Event:
    t0 = dt.datetime(2024, 5, 14, 10, 0, tzinfo=dt.UTC)
    ev = Event(event_type="FL", source=source, source_key=key, start_time=t0,
               peak_time=t0 + dt.timedelta(minutes=peak_min), end_time=t0 + dt.timedelta(minutes=30),
               hpc_x=x, hpc_y=y, noaa_ar=ar, owner=owner, channels="SDI" if source == "detected" else None,
               attributes={})
    session.add(ev)
    session.flush()
    return ev


@pytest.fixture
def owned(db_session):
    """A GOES flare (public), a public LST detection, alice's and bob's private detections of it."""
    goes = _flare(db_session, "g1", owner=None, source="goes_xrs", peak_min=11, ar=3664)
    pub = _flare(db_session, "p1", owner=None)
    alice = _flare(db_session, "p1@set9~alice", owner="alice", x=101)
    bob = _flare(db_session, "p1@set9~bob", owner="bob", x=99)
    return goes, pub, alice, bob


def _links(session) -> set[tuple[int, int]]:
    return set(session.execute(select(EventAssociation.event_id, EventAssociation.other_event_id)).all())


def test_associate_links_private_events_to_public_and_own_only(db_session, owned):
    from backend.services.events import associate_events

    goes, pub, alice, bob = owned
    associate_events(db_session)
    links = _links(db_session)
    assert (pub.id, goes.id) in links and (goes.id, pub.id) in links, "the public link is made"
    assert (alice.id, goes.id) in links and (bob.id, goes.id) in links, "each private flare links to the public one"
    assert (alice.id, bob.id) not in links and (bob.id, alice.id) not in links, "never across owners"
    assert not {(alice.id, pub.id), (pub.id, alice.id)} & links, "two detected flares are one source"


def test_private_event_does_not_displace_public_link(db_session):
    """A CME's best detected flare: a private one nearer in time must not take the public one's link."""
    from backend.services.events import associate_events

    t0 = dt.datetime(2024, 5, 14, 10, 0, tzinfo=dt.UTC)
    pub = _flare(db_session, "pf", owner=None, peak_min=10, x=-600, y=0)
    priv = _flare(db_session, "pf@set3~alice", owner="alice", peak_min=10, x=-601, y=0)
    priv.start_time = t0 + dt.timedelta(minutes=5)  # nearer the CME: the better match were both one pool
    cme = Event(event_type="CE", source="cdaw", source_key="c1", start_time=t0 + dt.timedelta(minutes=20),
                position_angle=90.0, angular_width=120.0, speed_km_s=800.0, attributes={})
    db_session.add(cme)
    db_session.flush()
    associate_events(db_session)
    links = _links(db_session)
    assert (pub.id, cme.id) in links, "the public flare keeps its CME"
    assert (priv.id, cme.id) in links, "the private flare is linked to the public CME for its owner"


def test_search_detail_and_associations_by_viewer(db_session, owned):
    from backend.auth import Principal
    from backend.services.event_search import EventFilters, search_events
    from backend.services.events import associate_events, associated_events, get_event

    goes, pub, alice, bob = owned
    associate_events(db_session)
    ids = lambda f: {e.id for e in search_events(db_session, f, limit=50).items}  # noqa: E731
    assert ids(EventFilters()) == {goes.id, pub.id}
    assert ids(EventFilters(viewer="alice")) == {goes.id, pub.id, alice.id}
    assert ids(EventFilters(sees_all=True)) == {goes.id, pub.id, alice.id, bob.id}
    assert search_events(db_session, EventFilters(viewer="bob")).total == 3

    a = Principal("alice", frozenset({"jobs:submit"}))
    root = Principal("root", frozenset({"admin"}))
    assert get_event(db_session, alice.id) is None and get_event(db_session, alice.id, Principal(
        "bob", frozenset({"jobs:submit"}))) is None
    assert get_event(db_session, alice.id, a) is alice and get_event(db_session, bob.id, root) is bob
    assert {e.id for e, _ in associated_events(db_session, goes.id)} == {pub.id}
    assert {e.id for e, _ in associated_events(db_session, goes.id, a)} == {pub.id, alice.id}
    assert {e.id for e, _ in associated_events(db_session, goes.id, root)} == {pub.id, alice.id, bob.id}
    # "has an associated FL": the GOES flare's partners counted only where visible
    f = EventFilters(associated_type="FL", sources=("goes_xrs",))
    assert ids(f) == {goes.id}


def test_detection_scope_key_never_collides():
    from backend.services.detection import PUBLIC_SCOPE, DetectionScope

    base = "lst-sdi-flare/1/2024-05-14T10:10:00/100,200"
    assert PUBLIC_SCOPE.key(base) == base
    a, b = DetectionScope((4,), "alice"), DetectionScope((4,), "bob")
    assert a.key(base) != base and a.key(base) != b.key(base)
    assert a.key(base) == f"{base}@set4~alice"


def test_calibration_set_filter_accepts_an_id():
    from backend.services.event_filters import parse_event_filters

    assert parse_event_filters(calibration_set="12").filters.calibration_set == "12"
    assert parse_event_filters(calibration_set="dark:3,flat:5").filters.calibration_set == "dark:3,flat:5"
    bad = parse_event_filters(calibration_set="12x")
    assert bad.filters.calibration_set is None and bad.problems[0].param == "calibration_set"


# -- live: the whole path through the API, a real worker and real products -------------------------


@pytest.fixture(scope="module")
def simulated(simulated_dataset):
    res = simulated_dataset(naxis=SIZE, noise=True, seed=3, sdi_sequence=True)  # shared, read-only
    return res.out_dir, res


@pytest.fixture
def stack(settings_env, tmp_path):
    from tests.live import live_stack

    with live_stack(settings_env, tmp_path, redis_db=14) as st:
        yield st


def _wait_follow_ups(job_id: str, timeout: float = 240.0) -> list[JobFollowUp]:
    from backend.db import session_scope

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with session_scope() as s:
            rows = list(s.scalars(select(JobFollowUp).where(JobFollowUp.job_id == job_id)))
            if rows and all(r.state.value != "queued" for r in rows):
                for r in rows:
                    s.expunge(r)
                return rows
        time.sleep(0.5)
    raise AssertionError(f"the follow-up detections of job {job_id} did not end in {timeout} s")


def _catalogue(client) -> dict:
    """The anonymous catalogue as the API shows it: ids, total, and each event's associations."""
    r = client.get("/api/v1/events", params={"limit": 500, "sort": "id"})
    assert r.status_code == 200, r.text
    body = r.json()
    out = {"total": body["total"], "ids": [e["id"] for e in body["items"]], "assoc": {}}
    for i in out["ids"]:
        d = client.get(f"/api/v1/events/{i}")
        assert d.status_code == 200
        out["assoc"][i] = sorted((a["event"]["id"], a["kind"]) for a in d.json()["associated"])
        assert d.json()["owner"] is None
    return out


def _public_db_state(session) -> dict:
    pub = select(Event.id).where(Event.owner.is_(None))
    return {
        "events": sorted(session.scalars(pub)),
        "products": sorted(session.execute(select(EventProduct.event_id, EventProduct.product_id)
                                           .where(EventProduct.event_id.in_(pub))).all()),
        "links": sorted(session.execute(select(EventAssociation.event_id, EventAssociation.other_event_id)
                                        .where(EventAssociation.event_id.in_(pub),
                                               EventAssociation.other_event_id.in_(pub))).all()),
    }


def _wait(pred, what: str, timeout: float = 240.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout} s")


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_sets_keep_the_public_catalogue_and_mark_private_detections(simulated, stack):
    from backend.db import session_scope
    from backend.services.jobs import JobRequest, submit_job
    from tests.conftest import make_token
    from tests.live import ingest_simulated, wait_job

    sim_dir, _res = simulated
    ingest_simulated(sim_dir)
    with session_scope() as s:
        t0, t1 = s.execute(select(func.min(Frame.date_obs), func.max(Frame.date_obs))
                           .where(Frame.channel_code == "SDI")).one()
        n_sdi = s.scalar(select(func.count()).select_from(Frame).where(Frame.channel_code == "SDI"))
        tokens = {u: make_token(s, u, scopes) for u, scopes in
                  (("alice", ("jobs:submit",)), ("bob", ("jobs:submit",)), ("root", ("admin",)))}
        s.commit()
    assert n_sdi >= 10

    # -- the platform's default job and its detection make the public catalogue ------------------
    with session_scope() as s:
        job0 = submit_job(s, JobRequest(channels=["SDI"], start=t0, end=t1), owner="system", publishes=True).id
    assert wait_job(job0).state == JobState.succeeded
    assert {f.state.value for f in _wait_follow_ups(job0)} == {"done"}, stack.worker_log()

    anon = stack.client()
    alice = stack.client(Authorization=f"Bearer {tokens['alice']}")
    bob = stack.client(Authorization=f"Bearer {tokens['bob']}")
    root = stack.client(Authorization=f"Bearer {tokens['root']}")
    with anon, alice, bob, root:
        before = _catalogue(anon)
        flares = anon.get("/api/v1/events", params={"source": "detected", "type": "FL"}).json()["items"]
        assert flares, f"the platform's detection found the injected flare\n{stack.worker_log()}"
        default_set = anon.get(f"/api/v1/jobs/{job0}").json()["calibration_sets"]
        assert len(default_set) == 1
        d_id = default_set[0]
        assert {f["calibration_set_id"] for f in flares} == {d_id}
        with session_scope() as s:
            public_before = _public_db_state(s)

        # -- a user's job with a non-default option, through the HTTP API ------------------------
        r = alice.post("/api/v1/jobs", json={"channels": ["SDI"], "start": t0.isoformat(), "end": t1.isoformat(),
                                             "options": {"interpolation_order": 1}})
        assert r.status_code == 202, r.text
        job1 = r.json()["id"]
        assert wait_job(job1).state == JobState.succeeded
        assert {f.state.value for f in _wait_follow_ups(job1)} == {"done"}, stack.worker_log()
        assert anon.get(f"/api/v1/jobs/{job1}").status_code == 404  # alice's job is hers (and admins')
        assert bob.get(f"/api/v1/jobs/{job1}").status_code == 404
        sets1 = alice.get(f"/api/v1/jobs/{job1}").json()["calibration_sets"]
        assert len(sets1) == 1 and sets1[0] != d_id
        s_id = sets1[0]

        # the anonymous public catalogue is the same, and so are the public rows behind it
        assert _catalogue(anon) == before
        with session_scope() as s:
            assert _public_db_state(s) == public_before

        # the owner sees their detections, marked with their set; nobody else does
        mine = alice.get("/api/v1/events", params={"limit": 500}).json()
        private = [e for e in mine["items"] if e["owner"] is not None]
        assert private, f"alice's job found the flare on her products\n{stack.worker_log()}"
        assert {e["owner"] for e in private} == {"alice"} and {e["calibration_set_id"] for e in private} == {s_id}
        assert all(e["source_key"].endswith(f"@set{s_id}~alice") for e in private)
        assert mine["total"] == before["total"] + len(private)
        assert bob.get("/api/v1/events", params={"limit": 500}).json()["total"] == before["total"]
        pid = private[0]["id"]
        assert alice.get(f"/api/v1/events/{pid}").json()["calibration_set_id"] == s_id
        for who in (anon, bob):
            r = who.get(f"/api/v1/events/{pid}")
            assert r.status_code == 404 and "no event" in r.json()["detail"]
        assert root.get(f"/api/v1/events/{pid}").status_code == 200
        assert alice.get("/api/v1/events", params={"calibration_set": str(s_id)}).json()["total"] == len(private)
        assert anon.get("/api/v1/events", params={"calibration_set": str(s_id)}).json()["total"] == 0

        # -- the set: one id for the same files and options on every frame -----------------------
        assert anon.get(f"/api/v1/calibration-sets/{s_id}").status_code == 404
        assert bob.get(f"/api/v1/calibration-sets/{s_id}").status_code == 404
        desc = alice.get(f"/api/v1/calibration-sets/{s_id}").json()
        assert desc["public"] is False and desc["owner"] == "alice" and desc["options"] == {"interpolation_order": 1}
        assert desc["frames"] == desc["written_products"] == n_sdi
        assert {s["id"] for s in anon.get("/api/v1/calibration-sets", params={"channel": "SDI"}).json()["items"]} \
            == {d_id}
        assert s_id in {s["id"] for s in alice.get("/api/v1/calibration-sets").json()["items"]}
        page = alice.get(f"/api/v1/calibration-sets/{s_id}/products", params={"limit": 5}).json()
        assert page["total"] == n_sdi and len(page["items"]) == 5
        assert {p["calibration_set_id"] for p in page["items"]} == {s_id} == {p["version"] for p in page["items"]}
        assert len({p["frame_id"] for p in page["items"]}) == 5
        with session_scope() as s:
            same = s.execute(select(Product.calibration_key, Product.params_hash).distinct()
                             .where(Product.calibration_set_id == s_id)).all()
            other = s.execute(select(Product.calibration_key, Product.params_hash).distinct()
                              .where(Product.calibration_set_id == d_id)).all()
            row = s.get(CalibrationSet, s_id)
            assert len(same) == 1 and len(other) == 1 and same != other
            assert {f["kind"] for f in row.files} >= {"dark", "flat"}
        # products of the private set: listed to alice, hidden (404) from others
        assert anon.get("/api/v1/products", params={"calibration_set": s_id}).json()["total"] == 0
        assert alice.get("/api/v1/products", params={"calibration_set": s_id}).json()["total"] == n_sdi
        one = page["items"][0]["id"]
        assert anon.get(f"/api/v1/products/{one}").status_code == 404
        assert alice.get(f"/api/v1/products/{one}").json()["calibration_set_id"] == s_id

        # -- light curves: the public set unless asked ------------------------------------------
        fl = flares[0]["id"]
        c = anon.get(f"/api/v1/events/{fl}/curves").json()
        assert c["calibration"]["set_id"] == d_id and c["calibration"]["public"] is True
        assert anon.get(f"/api/v1/events/{fl}/curves", params={"calibration_set": s_id}).status_code == 404
        c = alice.get(f"/api/v1/events/{fl}/curves", params={"calibration_set": s_id}).json()
        assert c["calibration"]["set_id"] == s_id and c["calibration"]["owner"] == "alice"
        assert set(c["product_ids"]) <= {p["id"] for p in alice.get(
            f"/api/v1/calibration-sets/{s_id}/products", params={"limit": 500}).json()["items"]}
        csv = alice.get(f"/api/v1/events/{fl}/curves", params={"calibration_set": s_id, "format": "csv"}).text
        assert f"calibration_set_id: {s_id} (private (alice))" in csv
        lc = anon.get(f"/api/v1/events/{fl}/lightcurve").json()
        assert [x["id"] for x in lc["calibration_sets"]] == [d_id]
        lc = alice.get(f"/api/v1/events/{fl}/lightcurve", params={"calibration_set": s_id}).json()
        assert [x["id"] for x in lc["calibration_sets"]] == [s_id]

        # -- promotion: admins only; the set and its detections become public ---------------------
        r = alice.post(f"/api/v1/calibration-sets/{s_id}/promote")
        assert r.status_code == 403 and "admin" in r.json()["detail"]
        assert anon.post(f"/api/v1/calibration-sets/{s_id}/promote").status_code == 401
        r = root.post(f"/api/v1/calibration-sets/{s_id}/promote")
        assert r.status_code == 200, r.text
        assert r.json()["set"]["public"] is True and r.json()["set"]["promoted_by"] == "root"
        assert {q["detector"] for q in r.json()["detections_queued"]} >= {"flares"}
        assert anon.get(f"/api/v1/calibration-sets/{s_id}").json()["public"] is True
        _wait(lambda: anon.get("/api/v1/events", params={"calibration_set": str(s_id), "type": "FL"})
              .json()["total"] > 0, "public detections on the promoted set")
        c = anon.get(f"/api/v1/events/{fl}/curves").json()
        assert c["calibration"]["set_id"] == s_id, "the set promoted last is the public one"
        assert anon.get("/api/v1/products", params={"calibration_set": s_id}).json()["total"] == n_sdi
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Product).where(
            Product.state != ProductState.written)) == 0
