"""Fair use (issue 12 item 2): quotas, the write rate limit, ``/me``, queue positions and ETAs.

Real PostgreSQL (each test in a transaction rolled back at its end, through the app's
TestClient), and one test on a live stack (PostgreSQL, Redis database 11, a real Celery
worker) for the ETA against real throughput.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import time

import pytest
from sqlalchemy import func, select

from backend.api.deps import CancelPrincipal, SessionDep, WriteLimited
from backend.models import Job, JobState, Movie, MovieState, Product, QuotaCharge, WriteCount, utcnow
from backend.settings import get_settings
from tests.conftest import auth_headers
from tests.test_api import make_frame, make_product

T0 = dt.datetime(2024, 5, 14, 12, 0, tzinfo=dt.UTC)
_VERSIONS = itertools.count(1)  # products are unique per (frame, version)


@pytest.fixture
def limits(monkeypatch):
    """Set fair-use settings for the test (environment, as production reads them)."""

    def apply(**kw):
        # Write windows are fixed (multiples of the window since the epoch): a test that counts
        # writes and crosses a window's end sees its count start again at one (CI failed that
        # way once at the 60 s default). Unless the test sets its own window, use an hour, and
        # start the test well inside the window it runs in.
        kw.setdefault("RATE_LIMIT_WINDOW_S", 3600)
        for k, v in kw.items():
            monkeypatch.setenv(k, str(v))
        get_settings.cache_clear()
        settings = get_settings()
        window = settings.rate_limit_window_s
        left = window - (utcnow().timestamp() % window)
        if left < min(30.0, window / 4):
            time.sleep(left + 0.05)
        return settings

    return apply


@pytest.fixture
def frames(db_session):
    """Ten SDI frames one minute apart from T0, two WST frames."""
    out = [make_frame(db_session, "SDI", T0 + dt.timedelta(minutes=i)) for i in range(10)]
    out += [make_frame(db_session, "WST", T0 + dt.timedelta(minutes=i)) for i in range(2)]
    return out


@pytest.fixture
def client(api_client, db_session, frames):
    """The app's TestClient (token of user "tester") with the frames, all committed: a
    refused request rolls the session back (``backend.services.quotas._refused``), and the
    test's rows must survive it (the test's outer transaction is still rolled back at its end)."""
    db_session.commit()
    return api_client


def _body(n_sdi: int = 1, channels=("SDI",), **kw) -> dict:
    """A job request covering the first ``n_sdi`` SDI frames (DATE-OBS T0 .. T0 + n-1 min)."""
    end = T0 + dt.timedelta(minutes=max(n_sdi - 1, 0), seconds=30 if n_sdi else -30)
    return {"channels": list(channels), "start": T0.isoformat(), "end": end.isoformat(), **kw}


def _count(session, model, **where) -> int:
    q = select(func.count()).select_from(model)
    for k, v in where.items():
        q = q.where(getattr(model, k) == v)
    return session.scalar(q)


def _job(session, owner: str, lane: str, state: JobState, created: dt.datetime, *, total=0, done=0, failed=0,
         skipped=0, cancelled=0, charged: int | None = None) -> Job:
    j = Job(owner=owner, kind="calibrate", parameters={}, state=state, lane=lane, created_at=created, total=total,
            done=done, failed=failed, skipped=skipped, cancelled=cancelled)
    session.add(j)
    session.flush()
    if charged is not None:
        session.add(QuotaCharge(owner=owner, job_id=j.id, frames=charged, created_at=created))
    session.commit()
    return j


def _written(session, frame, job: Job, times: list[dt.datetime]) -> list[Product]:
    """Products of ``frame`` written by ``job`` at ``times`` (``updated_at``)."""
    out = []
    for t in times:
        p = make_product(session, frame, None, version=next(_VERSIONS))
        p.job_id = job.id
        session.flush()
        p.updated_at = t
        out.append(p)
    session.flush()
    # updated_at has onupdate=utcnow: set it with a plain UPDATE after the insert
    from sqlalchemy import update

    for p, t in zip(out, times):
        session.execute(update(Product).where(Product.id == p.id).values(updated_at=t))
    session.commit()
    session.expire_all()
    return out


# -- concurrent jobs --------------------------------------------------------------------------


def test_concurrent_jobs_quota_is_429_with_the_numbers_and_stores_nothing(client, db_session, limits):
    limits(QUOTA_CONCURRENT_JOBS=2, QUOTA_FRAMES_PER_DAY=1000, RATE_LIMIT_WRITES=100)
    for _ in range(2):
        assert client.post("/api/v1/jobs", json=_body(2)).status_code == 202
    jobs, charges = _count(db_session, Job), _count(db_session, QuotaCharge)
    writes = db_session.get(WriteCount, "tester").writes
    r = client.post("/api/v1/jobs", json=_body(2))
    assert r.status_code == 429, r.text
    d = r.json()["detail"]
    assert "concurrent jobs quota" in d and "'tester' has 2 jobs queued or running" in d, d
    assert "(2 recalibrations, 0 movies; limit 2, QUOTA_CONCURRENT_JOBS)" in d, d
    # nothing measured yet: Retry-After is the polling interval, and the message says so
    assert r.headers["Retry-After"] == "30" and "polling interval" in d
    db_session.expire_all()
    assert _count(db_session, Job) == jobs and _count(db_session, QuotaCharge) == charges
    assert db_session.get(WriteCount, "tester").writes == writes == 2  # the refused write is not counted
    # a job that ends frees its place
    first = db_session.scalars(select(Job).where(Job.owner == "tester").order_by(Job.created_at)).first()
    first.state = JobState.succeeded
    db_session.commit()
    assert client.post("/api/v1/jobs", json=_body(2)).status_code == 202


def test_movies_count_against_the_concurrent_quota(client, db_session, frames, limits):
    limits(QUOTA_CONCURRENT_JOBS=2, RATE_LIMIT_WRITES=100)
    db_session.add(Movie(owner="tester", channel_code="SDI", start_time=T0, end_time=T0, state=MovieState.running,
                         frames_total=3))
    db_session.commit()
    assert client.post("/api/v1/jobs", json=_body(1)).status_code == 202
    r = client.post("/api/v1/jobs", json=_body(1))
    assert r.status_code == 429 and "(1 recalibrations, 1 movies; limit 2" in r.json()["detail"], r.text
    # and a movie itself is refused by the same quota (the window holds a written product)
    make_product(db_session, frames[0], None)
    db_session.commit()
    body = {"channel": "SDI", "start": T0.isoformat(), "end": (T0 + dt.timedelta(seconds=30)).isoformat()}
    movies = _count(db_session, Movie)
    r = client.post("/api/v1/movies", json=body)
    assert r.status_code == 429 and "has 2 jobs queued or running" in r.json()["detail"], r.text
    assert _count(db_session, Movie) == movies


def test_movies_need_jobs_submit_and_take_their_owner_from_the_token(client, db_session, frames, limits):
    limits(QUOTA_CONCURRENT_JOBS=5, RATE_LIMIT_WRITES=100)
    make_product(db_session, frames[0], None)
    db_session.commit()
    body = {"channel": "SDI", "start": T0.isoformat(), "end": (T0 + dt.timedelta(seconds=30)).isoformat()}
    del client.headers["Authorization"]
    r = client.post("/api/v1/movies", json=body)
    assert r.status_code == 401 and "jobs:submit" in r.json()["detail"], r.text
    r = client.post("/api/v1/movies", json=body,
                        headers=auth_headers(db_session, "reader", ("jobs:cancel",)))
    assert r.status_code == 403 and "lacks scope 'jobs:submit'" in r.json()["detail"]
    h = auth_headers(db_session, "alice")
    r = client.post("/api/v1/movies", json={**body, "owner": "mallory"}, headers=h)
    assert r.status_code == 422 and "owner is the user of the API token" in r.json()["detail"]
    r = client.post("/api/v1/movies", json=body, headers=h)
    assert r.status_code == 202, r.text
    assert db_session.get(Movie, r.json()["id"]).owner == "alice"


# -- frames per day ---------------------------------------------------------------------------


def test_frames_per_day_quota_counts_the_frames_each_request_covers(client, db_session, limits):
    limits(QUOTA_CONCURRENT_JOBS=10, QUOTA_FRAMES_PER_DAY=12, RATE_LIMIT_WRITES=100)
    r = client.post("/api/v1/jobs", json=_body(8))
    assert r.status_code == 202
    charge = db_session.scalars(select(QuotaCharge).where(QuotaCharge.job_id == r.json()["id"])).one()
    assert charge.frames == 8 and charge.owner == "tester"
    # WST has 2 frames in the same range: SDI + WST over 2 min = 4 frames
    r = client.post("/api/v1/jobs", json=_body(2, channels=("SDI", "WST")))
    assert r.status_code == 202
    assert db_session.scalars(select(QuotaCharge.frames).where(QuotaCharge.job_id == r.json()["id"])).one() == 4
    # the first charge was made 23 h ago: it leaves the window in 1 h, and frees enough
    set_at = time.monotonic()
    charge.created_at = utcnow() - dt.timedelta(hours=23)
    db_session.commit()
    jobs = _count(db_session, Job)
    r = client.post("/api/v1/jobs", json=_body(1))
    took = time.monotonic() - set_at  # the wait is 1 h less what has passed since (a loaded machine: seconds)
    assert r.status_code == 429, r.text
    d = r.json()["detail"]
    assert "frames per day quota: user 'tester' used 12 of 12 frames in the last 24 h" in d, d
    assert "this request covers 1 more" in d
    assert 3600 - took - 1 <= int(r.headers["Retry-After"]) <= 3601, (r.headers["Retry-After"], took)
    assert _count(db_session, Job) == jobs and _count(db_session, QuotaCharge) == 2
    # more than the whole quota alone: waiting cannot help, so 422, not 429
    limits(QUOTA_FRAMES_PER_DAY=11, QUOTA_CONCURRENT_JOBS=10, RATE_LIMIT_WRITES=100)
    r = client.post("/api/v1/jobs", json={**_body(10), "channels": ["SDI", "WST"]})
    assert r.status_code == 422
    assert "covers 12 frames, more than the whole daily quota of 11" in r.json()["detail"], r.text
    # once the old charge is out of the window, its frames are free again
    charge.created_at = utcnow() - dt.timedelta(hours=24, seconds=1)
    db_session.commit()
    assert client.post("/api/v1/jobs", json=_body(7)).status_code == 202  # 4 + 7 = 11


# -- write rate -------------------------------------------------------------------------------


def test_write_rate_limit_is_429_until_the_window_resets(client, db_session, limits):
    limits(QUOTA_CONCURRENT_JOBS=100, QUOTA_FRAMES_PER_DAY=1000, RATE_LIMIT_WRITES=3, RATE_LIMIT_WINDOW_S=3600)
    for i in range(3):
        r = client.post("/api/v1/jobs", json=_body(1))
        assert r.status_code == 202
        assert r.headers["RateLimit-Limit"] == "3" and r.headers["RateLimit-Remaining"] == str(2 - i)
    jobs = _count(db_session, Job)
    r = client.post("/api/v1/jobs", json=_body(1))
    now = utcnow()
    assert r.status_code == 429, r.text
    d = r.json()["detail"]
    assert "write rate limit: user 'tester' made 3 writes in the current 3600 s window" in d, d
    assert "(limit 3 writes per 3600 s, RATE_LIMIT_WRITES)" in d
    # windows start on whole hours (multiples of 3600 s since the epoch)
    resets = now.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
    assert abs(int(r.headers["Retry-After"]) - math.ceil((resets - now).total_seconds())) <= 2
    assert resets.isoformat().replace("+00:00", "Z") in d
    assert _count(db_session, Job) == jobs and db_session.get(WriteCount, "tester").writes == 3
    # a new window starts at one again
    db_session.get(WriteCount, "tester").window_start = resets - dt.timedelta(hours=2)
    db_session.commit()
    r = client.post("/api/v1/jobs", json=_body(1))
    assert r.status_code == 202 and r.headers["RateLimit-Remaining"] == "2"
    db_session.expire_all()
    assert db_session.get(WriteCount, "tester").writes == 1


def test_admins_are_exempt(client, db_session, limits):
    limits(QUOTA_CONCURRENT_JOBS=1, QUOTA_FRAMES_PER_DAY=2, RATE_LIMIT_WRITES=1)
    h = auth_headers(db_session, "root", ("admin",))
    for _ in range(3):
        r = client.post("/api/v1/jobs", json=_body(5), headers=h)
        assert r.status_code == 202, r.text
        assert "RateLimit-Limit" not in r.headers
    me = client.get("/api/v1/me", headers=h).json()
    assert me["admin"] is True and me["exempt"] == "admins are exempt from quotas and rate limits"
    assert me["quotas"]["concurrent_jobs"]["limit"] is None and me["quotas"]["concurrent_jobs"]["usage"] == 3
    assert me["quotas"]["frames_per_day"]["limit"] is None and me["quotas"]["frames_per_day"]["usage"] == 15
    assert me["rate_limit"]["limit"] is None and me["rate_limit"]["exempt"] is True
    assert db_session.get(WriteCount, "root") is None


def test_two_users_quotas_are_independent(client, db_session, limits):
    limits(QUOTA_CONCURRENT_JOBS=1, QUOTA_FRAMES_PER_DAY=5, RATE_LIMIT_WRITES=2)
    alice, bob = auth_headers(db_session, "alice"), auth_headers(db_session, "bob")
    assert client.post("/api/v1/jobs", json=_body(5), headers=alice).status_code == 202
    r = client.post("/api/v1/jobs", json=_body(1), headers=alice)
    assert r.status_code == 429 and "'alice' has 1 jobs" in r.json()["detail"]
    r = client.post("/api/v1/jobs", json=_body(5), headers=bob)
    assert r.status_code == 202, r.text
    a = client.get("/api/v1/me", headers=alice).json()
    b = client.get("/api/v1/me", headers=bob).json()
    for me, user in ((a, "alice"), (b, "bob")):
        assert me["user"] == user
        c = me["quotas"]["concurrent_jobs"]
        assert (c["limit"], c["usage"], c["remaining"]) == (1, 1, 0)
        assert me["quotas"]["frames_per_day"]["usage"] == 5 and me["quotas"]["frames_per_day"]["remaining"] == 0
        assert me["rate_limit"]["used"] == 1 and me["rate_limit"]["remaining"] == 1


# -- /me --------------------------------------------------------------------------------------


def test_me_gives_the_token_the_quotas_and_the_rate_limit(client, db_session, limits):
    # an hour's window, the test started with at least 30 s of it left (``limits``; 60 s left
    # only 15 s, which a loaded machine can spend between the first POST and /me, whose count
    # then starts again)
    limits(QUOTA_CONCURRENT_JOBS=4, QUOTA_FRAMES_PER_DAY=100, RATE_LIMIT_WRITES=30, RATE_LIMIT_WINDOW_S=3600)
    h = auth_headers(db_session, "carol", ("jobs:submit",), expires_in_days=10)
    first = client.post("/api/v1/jobs", json=_body(8), headers=h)
    assert client.post("/api/v1/jobs", json=_body(2), headers=h).status_code == 202
    r = client.get("/api/v1/me", headers=h)
    assert r.status_code == 200
    me = r.json()
    token = h["Authorization"].split()[1]
    assert token not in r.text  # never the token itself
    assert me["user"] == "carol" and me["scopes"] == ["jobs:submit"] and me["admin"] is False
    assert me["token"]["prefix"] == token[:10] and isinstance(me["token"]["id"], int)
    exp = dt.datetime.fromisoformat(me["token"]["expires_at"])
    assert abs((exp - utcnow()).total_seconds() - 10 * 86400) < 60
    c = me["quotas"]["concurrent_jobs"]
    assert (c["limit"], c["usage"], c["remaining"], c["recalibrations"], c["movies"]) == (4, 2, 2, 2, 0)
    f = me["quotas"]["frames_per_day"]
    assert (f["limit"], f["usage"], f["remaining"], f["jobs"]) == (100, 10, 90, 2)
    created = db_session.scalars(select(QuotaCharge.created_at).where(
        QuotaCharge.job_id == first.json()["id"])).one()
    assert dt.datetime.fromisoformat(f["resets_at"]) == created + dt.timedelta(hours=24)
    w = me["rate_limit"]
    assert (w["limit"], w["window_s"], w["used"], w["remaining"]) == (30, 3600.0, 2, 28)
    assert dt.datetime.fromisoformat(w["resets_at"]) - dt.datetime.fromisoformat(w["window_start"]) \
        == dt.timedelta(seconds=3600)
    assert [q["position"] for q in me["queue"]] == [1, 2]


def test_me_without_a_token_is_401_and_says_reads_need_none(client):
    del client.headers["Authorization"]
    r = client.get("/api/v1/me")
    assert r.status_code == 401 and "reads need no token" in r.json()["detail"]
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/api/v1/queue").status_code == 200  # reads stay anonymous


# -- queue ------------------------------------------------------------------------------------


@pytest.fixture
def lanes(db_session, frames, limits):
    """A controlled queue: measured products in both lanes, jobs queued and running in both.

    cpu: 10 products written 10 s apart (9 intervals in 90 s: 0.1 frames/s);
    gpu: 5 products written 1 s apart (4 intervals in 4 s: 1 frame/s).
    """
    limits(THROUGHPUT_WINDOW_S=3600, QUOTA_CONCURRENT_JOBS=2, RATE_LIMIT_WRITES=100)
    now = utcnow()
    old_cpu = _job(db_session, "system", "cpu", JobState.succeeded, now - dt.timedelta(hours=1))
    old_gpu = _job(db_session, "system", "gpu", JobState.succeeded, now - dt.timedelta(hours=1))
    _written(db_session, frames[0], old_cpu, [now - dt.timedelta(seconds=100 - 10 * i) for i in range(10)])
    _written(db_session, frames[1], old_gpu, [now - dt.timedelta(seconds=30 - i) for i in range(5)])
    # outside the window: not counted
    _written(db_session, frames[2], old_cpu, [now - dt.timedelta(hours=2)])
    j1 = _job(db_session, "tester", "cpu", JobState.running, now - dt.timedelta(minutes=10), total=20, done=5,
              failed=1, skipped=2, charged=20)  # 12 pending
    g1 = _job(db_session, "bob", "gpu", JobState.queued, now - dt.timedelta(minutes=8), charged=4)
    j2 = _job(db_session, "tester", "cpu", JobState.queued, now - dt.timedelta(minutes=5), charged=7)
    j3 = _job(db_session, "bob", "cpu", JobState.queued, now - dt.timedelta(minutes=1), total=0)  # charged nothing
    return {"j1": j1, "j2": j2, "j3": j3, "g1": g1}


def test_queue_position_and_eta_from_measured_throughput(client, lanes, db_session):
    client.headers.update(auth_headers(db_session, "ops", ["admin"]))  # bob's jobs too (an admin sees every job)
    q1 = client.get(f"/api/v1/jobs/{lanes['j1'].id}").json()["queue"]
    assert (q1["lane"], q1["position"], q1["jobs_ahead"], q1["frames_ahead"], q1["frames_pending"]) == \
        ("cpu", 1, 0, 0, 12)
    assert q1["frames_per_s"] == pytest.approx(0.1)
    assert q1["eta_s"] == pytest.approx(120.0, abs=1e-3)  # 12 frames / 0.1 frames/s
    before = utcnow()
    q2 = client.get(f"/api/v1/jobs/{lanes['j2'].id}").json()["queue"]
    after = utcnow()
    assert (q2["position"], q2["jobs_ahead"], q2["frames_ahead"], q2["frames_pending"]) == (2, 1, 12, 7)
    assert q2["eta_s"] == pytest.approx(190.0, abs=1e-3)  # (12 + 7) / 0.1
    eta_at = dt.datetime.fromisoformat(q2["eta_at"])  # 190 s after the request was answered
    assert before + dt.timedelta(seconds=189) <= eta_at <= after + dt.timedelta(seconds=191), (before, eta_at, after)
    assert "10 products written by cpu jobs" in q2["basis"]
    q3 = client.get(f"/api/v1/jobs/{lanes['j3'].id}").json()["queue"]
    assert (q3["position"], q3["frames_ahead"], q3["frames_pending"], q3["eta_s"]) == (3, 19, 0, pytest.approx(190.0))
    # the gpu lane is separate: its job is first there, at its own throughput
    g = client.get(f"/api/v1/jobs/{lanes['g1'].id}").json()["queue"]
    assert (g["lane"], g["position"], g["frames_ahead"], g["frames_pending"]) == ("gpu", 1, 0, 4)
    assert g["frames_per_s"] == pytest.approx(1.0) and g["eta_s"] == pytest.approx(4.0, abs=1e-3)
    # the list carries the same numbers; finished jobs carry none
    items = {j["id"]: j for j in client.get("/api/v1/jobs?limit=100").json()["items"]}
    assert items[lanes["j2"].id]["queue"]["eta_s"] == pytest.approx(190.0, abs=1e-3)
    # finished jobs carry no queue (an admin's list also holds jobs other tests committed)
    finished = [j for j in items.values() if j["state"] in ("succeeded", "failed", "cancelled")]
    assert len(finished) >= 2 and all(j["queue"] is None for j in finished)
    assert all(items[lanes[k].id]["queue"] is not None for k in ("j1", "j2", "j3", "g1"))


def test_queue_lanes(client, lanes):
    body = client.get("/api/v1/queue").json()
    by = {lane["lane"]: lane for lane in body["lanes"]}
    assert set(by) == {"cpu", "gpu"}
    cpu, gpu = by["cpu"], by["gpu"]
    assert (cpu["queued"], cpu["running"], cpu["frames_pending"]) == (2, 1, 19)
    assert cpu["throughput"]["frames_per_s"] == pytest.approx(0.1) and cpu["throughput"]["products"] == 10
    assert cpu["oldest_waiting"]["job_id"] == lanes["j2"].id
    # created 5 min before the fixture's "now"; the wait grows by however long the fixture and this
    # request took since then (seconds on a loaded machine), never less than 300 s
    assert 299 <= cpu["oldest_waiting"]["waiting_s"] <= 300 + 120
    assert (gpu["queued"], gpu["running"], gpu["frames_pending"]) == (1, 0, 4)
    assert gpu["throughput"]["frames_per_s"] == pytest.approx(1.0) and gpu["throughput"]["products"] == 5
    # g1 is bob's private job: tester sees how long it waits, never its id
    assert gpu["oldest_waiting"]["job_id"] is None and gpu["oldest_waiting"]["waiting_s"] >= 479


def test_concurrent_retry_after_is_the_earliest_measured_eta(client, lanes):
    # tester has j1 (ETA 120 s) and j2 (ETA 190 s) unfinished; the quota is 2
    r = client.post("/api/v1/jobs", json=_body(1))
    assert r.status_code == 429 and "earliest measured ETA" in r.json()["detail"]
    assert 119 <= int(r.headers["Retry-After"]) <= 121


def test_no_measurement_gives_null_eta_and_why(client, db_session, frames, limits):
    limits(THROUGHPUT_WINDOW_S=600)
    now = utcnow()
    j = _job(db_session, "tester", "gpu", JobState.queued, now, charged=3)
    q = client.get(f"/api/v1/jobs/{j.id}").json()["queue"]
    assert (q["position"], q["frames_pending"], q["eta_s"], q["eta_at"]) == (1, 3, None, None)
    assert q["basis"] == "no product written by gpu jobs in the last 600 s: no throughput measured yet"
    # one product is not a rate
    done = _job(db_session, "system", "gpu", JobState.succeeded, now - dt.timedelta(minutes=5))
    _written(db_session, frames[0], done, [now - dt.timedelta(seconds=20)])
    q = client.get(f"/api/v1/jobs/{j.id}").json()["queue"]
    assert q["eta_s"] is None and "a rate needs two at different times" in q["basis"]


def test_pages_show_the_lanes_and_the_jobs_place(client, lanes):
    page = client.get("/jobs").text
    assert 'id="queue-lanes"' in page and 'data-lane="cpu"' in page and 'data-lane="gpu"' in page
    assert "0.1 frames/s" in page and "1 frames/s" in page
    page = client.get(f"/jobs/{lanes['j2'].id}").text
    assert 'id="job-queue"' in page and "12 frames)" in page and "190 s" in page


# -- live: a real worker's throughput ---------------------------------------------------------


@pytest.fixture
def stack(settings_env, tmp_path):
    from tests.live import live_stack

    with live_stack(settings_env, tmp_path, redis_db=11, concurrency=2) as st:
        yield st


def test_eta_from_a_real_workers_throughput(stack, simulated_dataset):
    from backend.db import session_scope
    from backend.services import quotas
    from tests.conftest import make_token
    from tests.live import ingest_simulated, wait_job

    sim = simulated_dataset(channels=("SDI",), naxis=128, noise=True, seed=3, sdi_sequence=True).out_dir  # shared
    ingest_simulated(sim)
    with session_scope() as s:
        from backend.models import Frame

        dates = sorted(s.scalars(select(Frame.date_obs).where(Frame.channel_code == "SDI")))
        token = make_token(s, "dana", ("jobs:submit",))
    assert len(dates) >= 8
    half = dates[len(dates) // 2 - 1]
    first = {"channels": ["SDI"], "start": dates[0].isoformat(), "end": half.isoformat()}
    second = {"channels": ["SDI"], "start": dates[len(dates) // 2].isoformat(), "end": dates[-1].isoformat()}
    with stack.client(Authorization=f"Bearer {token}") as c:
        r = c.post("/api/v1/jobs", json=first)
        assert r.status_code == 202, r.text
        job = wait_job(r.json()["id"])
        assert job.state == JobState.succeeded and job.done == len(dates) // 2, stack.worker_log()
        with session_scope() as s:
            written = sorted(s.scalars(select(Product.updated_at).where(Product.job_id == job.id)))
        n = len(written)
        rate = (n - 1) / (written[-1] - written[0]).total_seconds()
        lane = {x["lane"]: x for x in c.get("/api/v1/queue").json()["lanes"]}["cpu"]
        assert lane["throughput"]["products"] == n
        assert lane["throughput"]["frames_per_s"] == pytest.approx(rate, rel=1e-6)
        # hold the next job in the queue (no worker) to read its ETA before it runs
        os_kill_worker(stack)
        r = c.post("/api/v1/jobs", json=second)
        assert r.status_code == 202
        q = r.json()["queue"]
        pending = len(dates) - len(dates) // 2
        assert (q["position"], q["frames_ahead"], q["frames_pending"]) == (1, 0, pending)
        assert q["eta_s"] == pytest.approx(pending / rate, rel=1e-3, abs=1e-3)  # served to ms
        with session_scope() as s:
            snap = quotas.queue_snapshot(s)
        assert snap.lanes["cpu"].queued == 1 and snap.lanes["cpu"].frames_pending == pending


def os_kill_worker(stack) -> None:
    """Stop the live stack's worker (SIGTERM to its process group, waited for)."""
    import os
    import signal

    os.killpg(stack.worker.pid, signal.SIGTERM)
    stack.worker.wait(timeout=60)


# -- the app's own sessions (no test transaction): refusals store nothing, processes race ----


@pytest.fixture
def bare_stack(settings_env, tmp_path, monkeypatch):
    """A fresh PostgreSQL database and Redis database 11, no worker: requests use the app's
    own sessions (one per request, rolled back unless the route commits), as in production."""
    from tests.live import live_stack

    # An hour's write window, entered well before its end (as ``limits`` does): the tests count
    # writes across several requests, and CI once crossed the 60 s default's end between a
    # submit and the /me that read its count (used 0, expected 1).
    window = 3600
    for k, v in {"QUOTA_CONCURRENT_JOBS": "1", "QUOTA_FRAMES_PER_DAY": "1000", "RATE_LIMIT_WRITES": "100",
                 "RATE_LIMIT_WINDOW_S": str(window)}.items():
        monkeypatch.setenv(k, v)
    left = window - (utcnow().timestamp() % window)
    if left < 120:
        time.sleep(left + 0.05)
    with live_stack(settings_env, tmp_path, redis_db=11, start_worker=False) as st:
        yield st


def test_refused_and_invalid_writes_store_nothing_and_racing_submits_admit_one(bare_stack):
    from concurrent.futures import ThreadPoolExecutor

    from backend.db import session_scope
    from tests.conftest import make_token

    with session_scope() as s:
        for i in range(3):
            make_frame(s, "SDI", T0 + dt.timedelta(minutes=i))
        token = make_token(s, "erin", ("jobs:submit",))
    h = {"Authorization": f"Bearer {token}"}
    with bare_stack.client(**h) as c:
        # invalid (422 from the body, and from the database check): nothing counted
        assert c.post("/api/v1/jobs", json={**_body(1), "channels": ["XRT"]}).status_code == 422
        assert c.post("/api/v1/jobs", json={**_body(1), "pinned_calibrations": {"dark": 99}}).status_code == 422
        assert c.get("/api/v1/me").json()["rate_limit"]["used"] == 0

    # four submits at once, each on its own connection: the quota of one admits exactly one
    def submit(_):
        with bare_stack.client(**h) as c:
            return c.post("/api/v1/jobs", json=_body(3))

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(submit, range(4)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [202, 429, 429, 429], [r.text for r in answers]
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 1
        assert s.scalars(select(QuotaCharge.frames)).all() == [3]
        assert s.get(WriteCount, "erin").writes == 1  # the three refused writes left no count
    with bare_stack.client(**h) as c:
        me = c.get("/api/v1/me").json()
    assert me["quotas"]["concurrent_jobs"]["usage"] == 1 and me["quotas"]["frames_per_day"]["usage"] == 3
    assert me["rate_limit"]["used"] == 1


def test_write_limited_is_one_line_for_any_route(db_session, settings_env, limits):
    """(The route's annotations resolve in this module's globals: CancelPrincipal, WriteLimited.)
    ``_: WriteLimited`` beside a route's own scope dependency: 401 without a token, the
    scope's 403 before anything is counted, then one write counted per call, 429 over."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from backend.api.deps import get_session

    settings_env()
    limits(RATE_LIMIT_WRITES=2, RATE_LIMIT_WINDOW_S=3600)
    app = FastAPI()

    @app.delete("/thing")
    def delete_thing(session: SessionDep, principal: CancelPrincipal, _: WriteLimited) -> dict:
        session.commit()  # a write stores what it changes, and its count with it
        return {"user": principal.user}

    def _session():
        yield db_session

    app.dependency_overrides[get_session] = _session
    with TestClient(app) as c:
        assert c.delete("/thing").status_code == 401
        r = c.delete("/thing", headers=auth_headers(db_session, "frank", ("jobs:submit",)))
        assert r.status_code == 403 and db_session.get(WriteCount, "frank") is None
        h = auth_headers(db_session, "frank", ("jobs:cancel",))
        assert [c.delete("/thing", headers=h).status_code for _ in range(3)] == [200, 200, 429]
        db_session.expire_all()
        assert db_session.get(WriteCount, "frank").writes == 2


# -- every write route counts, retries are charged ----------------------------------------------


def test_every_write_route_counts_against_the_write_rate(client, db_session, limits):
    """Submit, cancel, retry, re-run, saved searches and movies all count one write: past the
    limit each is 429 with Retry-After before it does anything."""
    limits(QUOTA_CONCURRENT_JOBS=100, QUOTA_FRAMES_PER_DAY=1000, RATE_LIMIT_WRITES=1, RATE_LIMIT_WINDOW_S=3600)
    headers = auth_headers(db_session, "wanda", ["jobs:submit", "jobs:cancel"])
    db_session.commit()
    r = client.post("/api/v1/jobs", json=_body(2), headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    writes = [("POST", f"/api/v1/jobs/{job_id}/cancel", None), ("POST", f"/api/v1/jobs/{job_id}/retry", None),
              ("POST", f"/api/v1/jobs/{job_id}/rerun", None), ("POST", "/api/v1/jobs", _body(1)),
              ("POST", "/api/v1/saved-searches", {"name": "x", "kind": "events", "query": {"type": "CE"}}),
              ("DELETE", "/api/v1/saved-searches/1", None),
              ("POST", "/api/v1/movies", {"channel": "SDI", "start": T0.isoformat(),
                                          "end": (T0 + dt.timedelta(minutes=5)).isoformat()})]
    for method, url, body in writes:
        r = client.request(method, url, json=body, headers=headers)
        assert r.status_code == 429, (url, r.status_code, r.text)
        assert "write rate limit: user 'wanda' made 1 writes" in r.json()["detail"] and int(r.headers["Retry-After"]) > 0
    db_session.expire_all()
    assert db_session.get(Job, job_id).state == JobState.queued, "the refused cancel changed nothing"


def test_a_retry_counts_its_frames_against_the_daily_quota(client, db_session, frames, limits):
    from backend.models import ItemOutcome, JobItem

    from backend.models import CalibrationKind
    from tests.test_api import make_calibration

    for kind in ("dark", "flat", "radiometric", "mask_geometry"):  # the frames can be planned again
        make_calibration(db_session, "SDI", CalibrationKind(kind), 1)
    db_session.commit()
    limits(QUOTA_CONCURRENT_JOBS=10, QUOTA_FRAMES_PER_DAY=10, RATE_LIMIT_WRITES=100)
    r = client.post("/api/v1/jobs", json=_body(6))  # 6 of tester's 10 frames today
    assert r.status_code == 202, r.text
    job = db_session.get(Job, r.json()["id"])
    sdi = [f for f in frames if f.channel_code == "SDI"][:6]
    for f in sdi:  # the job ran and every frame failed
        db_session.add(JobItem(job_id=job.id, frame_id=f.id, outcome=ItemOutcome.failed, reason="test: failed",
                               settled_at=utcnow()))
    job.state, job.total, job.failed = JobState.failed, 6, 6
    db_session.commit()
    r = client.post(f"/api/v1/jobs/{job.id}/retry")
    assert r.status_code == 429, r.text
    d = r.json()["detail"]
    assert "used 6 of 10 frames in the last 24 h" in d and f"the retry of job {job.id} covers 6 more" in d, d
    db_session.expire_all()
    assert db_session.get(Job, job.id).state == JobState.failed and db_session.get(Job, job.id).retries == 0
    assert _count(db_session, QuotaCharge, job_id=job.id) == 1, "a refused retry charges nothing"
    # with room for them, the retry runs and is charged to whoever retried it
    limits(QUOTA_CONCURRENT_JOBS=10, QUOTA_FRAMES_PER_DAY=12, RATE_LIMIT_WRITES=100)
    from unittest import mock

    with mock.patch("backend.services.job_control.send_retry"):
        r = client.post(f"/api/v1/jobs/{job.id}/retry")
    assert r.status_code == 202, r.text
    charges = sorted(db_session.scalars(select(QuotaCharge.frames).where(QuotaCharge.job_id == job.id)))
    assert charges == [6, 6]
