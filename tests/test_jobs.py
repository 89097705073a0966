"""Job requests: strict options, bounded values, and what makes a product the same."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from backend.models import Job
from backend.services.jobs import JobRequest
from pipelines.calibration.options import CalibrationOptions
from backend.services.registry import params_hash

pytestmark = pytest.mark.postgres

BASE = {"channels": ["SDI"], "start": "2004-03-01T00:00:00", "end": "2004-03-02T00:00:00"}


@pytest.fixture
def client(api_client):
    return api_client


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"options": {"bogus": [1, 2]}}, "bogus"),
        ({"options": {"deconvolve_psf": "yes"}}, "deconvolve_psf"),
        ({"options": {"interpolation_order": 9}}, "interpolation_order"),
        ({"options": {"device": "tpu"}}, "device"),
        ({"start": "9999-12-31T23:00:00-05:00"}, "out of range"),
        ({"start": "0001-01-01T00:00:00+05:00"}, "out of range"),
        ({"pinned_calibrations": {"flat": 99999999999999999999999}}, "between 1 and"),
        # a key misplaced or misnamed at the top level is refused, not dropped (it would run
        # another job than the one asked for)
        ({"device": "gpu"}, "device"),
        ({"pins": {"flat": 2}}, "pins"),
    ],
)
def test_bad_options_and_values_are_422(client, db_session, extra, needle):
    r = client.post("/api/v1/jobs", json={**BASE, **extra})
    assert r.status_code == 422, r.text
    assert needle in r.text
    assert db_session.scalar(select(func.count()).select_from(Job)) == 0


def test_gpu_device_is_refused_in_the_embedded_mode(client, db_session):
    r = client.post("/api/v1/jobs", json={**BASE, "options": {"device": "gpu"}})
    assert r.status_code in (400, 422) and "GPU workers" in r.json()["detail"]
    assert db_session.scalar(select(func.count()).select_from(Job)) == 0


def test_psf_deconvolution_needs_a_psf_master(client, db_session):
    r = client.post("/api/v1/jobs", json={**BASE, "options": {"deconvolve_psf": True}})
    assert r.status_code in (400, 422) and "psf calibration" in r.json()["detail"]


def test_spelled_out_defaults_identify_the_same_product():
    explicit = CalibrationOptions(rotate_north_up=True, subtract_stray_light=True, interpolation_order=3, device="cpu")
    assert params_hash(explicit.identity()) == params_hash(CalibrationOptions().identity()) == params_hash({})
    assert params_hash(CalibrationOptions(interpolation_order=1).identity()) != params_hash({})
    req = JobRequest(**BASE, options={"remove_cosmic_rays": True})
    assert req.options.identity() == {"remove_cosmic_rays": True}


def test_lost_work_is_reaped_and_the_job_ends(db_session):
    """A worker killed mid-task leaves a product 'writing': the reaper fails it and the job ends."""
    import datetime as dt

    from backend.models import Frame, JobState, Product, ProductState
    from backend.worker.processing import reap_stale_work

    s = db_session
    now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    job = Job(parameters={"channels": ["SDI"]}, state=JobState.running, total=2, done=1)
    s.add(job)
    s.flush()
    prods = []
    for i, state in enumerate((ProductState.written, ProductState.writing)):
        f = Frame(channel_code="SDI", date_obs=now, exposure_s=1.0, naxis1=8, naxis2=8, path=f"/x/{i}",
                  original_name=f"{i}.fits", sha256=f"{i:064d}", size_bytes=1, header={})
        s.add(f)
        s.flush()
        p = Product(frame_id=f.id, calibration_key="k", params_hash="h", software_version="t", state=state,
                    job_id=job.id, updated_at=now - dt.timedelta(hours=2))
        s.add(p)
        prods.append(p)
    s.flush()
    assert reap_stale_work(s, now=now - dt.timedelta(hours=1, minutes=45)) == 0  # not stale yet
    assert reap_stale_work(s, now=now) == 1
    s.refresh(job)
    assert prods[0].state == ProductState.written
    assert prods[1].state == ProductState.failed and "lost: writing" in prods[1].error
    assert job.state == JobState.failed and job.failed == 1 and "lost" in job.error
    assert reap_stale_work(s, now=now) == 0


def test_masters_stay_resident_and_are_checked_against_the_registry(tmp_path):
    from types import SimpleNamespace

    from backend.models import CalibrationKind
    from backend.worker.processing import resident_master
    from pipelines.errors import DataError
    from pipelines.fitsio import sha256_file
    from tests.test_ingest import cal_master

    path = cal_master(tmp_path / "flat_v1.fits")
    row = SimpleNamespace(id=7, version=1, path=str(path), sha256=sha256_file(path), kind=CalibrationKind.flat)
    first = resident_master(row)
    assert resident_master(row) is first and (first.id, first.version) == (7, 1)
    other = cal_master(tmp_path / "flat_v2.fits", version=2)
    stale = SimpleNamespace(id=8, version=2, path=str(other), sha256="0" * 64, kind=CalibrationKind.flat)
    with pytest.raises(DataError, match="changed on disk"):
        resident_master(stale)


def test_products_queued_behind_a_busy_queue_are_not_reaped(db_session):
    """A long backlog: products 'planned' for hours are waiting, not lost, while workers of
    their queue keep finishing others; with no activity on their queue they are lost."""
    import datetime as dt

    from backend.models import Frame, JobState, Product, ProductState
    from backend.worker.processing import reap_stale_work

    s = db_session
    now = dt.datetime(2026, 2, 1, 12, tzinfo=dt.UTC)
    job = Job(parameters={"channels": ["WST"]}, state=JobState.running, total=3)
    s.add(job)
    s.flush()
    prods = []
    for i, (state, age_min, device) in enumerate(((ProductState.planned, 120, "gpu"),
                                                  (ProductState.written, 5, "gpu"),
                                                  (ProductState.planned, 120, "cpu"))):
        f = Frame(channel_code="WST", date_obs=now, exposure_s=1.0, naxis1=8, naxis2=8, path=f"/q/{i}",
                  original_name=f"q{i}.fits", sha256=f"{i + 100:064d}", size_bytes=1, header={})
        s.add(f)
        s.flush()
        p = Product(frame_id=f.id, calibration_key="k", params_hash=f"h{i}", software_version="t", state=state,
                    job_id=job.id, parameters={"options": {"device": device}},
                    updated_at=now - dt.timedelta(minutes=age_min))
        s.add(p)
        prods.append(p)
    s.flush()
    # the gpu queue finished a product 5 min ago: its planned product waits; the cpu one is lost
    assert reap_stale_work(s, now=now) == 1
    assert prods[0].state == ProductState.planned
    assert prods[2].state == ProductState.failed and "queue 'cpu'" in prods[2].error
    # an hour later nothing moved on the gpu queue either: lost
    assert reap_stale_work(s, now=now + dt.timedelta(hours=1)) == 1
    assert prods[0].state == ProductState.failed and "lost: planned" in prods[0].error


def _job_with_products(s, states, *, total=None):
    import datetime as dt

    from backend.models import Frame, JobState, Product

    now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    job = Job(parameters={"channels": ["WST"], "start": now.isoformat(), "end": now.isoformat()},
              state=JobState.running, total=len(states) if total is None else total, done=0, failed=0, skipped=0)
    s.add(job)
    s.flush()
    prods = []
    for i, state in enumerate(states):
        f = Frame(channel_code="WST", date_obs=now, exposure_s=1.0, naxis1=8, naxis2=8, path=f"/x/{job.id}/{i}",
                  original_name=f"{i}.fits", sha256=f"{job.id[:8]}{i:056d}", size_bytes=1, header={})
        s.add(f)
        s.flush()
        p = Product(frame_id=f.id, calibration_key="k", params_hash="h", software_version="t", state=state,
                    job_id=job.id, error="bad frame" if state.value == "failed" else None)
        s.add(p)
        prods.append(p)
    s.flush()
    return job, prods


def test_progress_counts_each_product_once_and_close_the_job_once(db_session):
    """Issue 10: a redelivered or duplicated progress message counted a product twice (a
    100-frame job ended with done 106). Counts are taken once per (product, job); a product
    not finished yet counts nothing; exactly one call closes the job."""
    from backend.models import JobState, ProductState
    from backend.state import move_product
    from backend.worker.processing import count_item

    s = db_session
    job, (p0, p1, p2) = _job_with_products(s, [ProductState.written, ProductState.failed, ProductState.planned])
    assert count_item(s, job.id, p0.id)[1] is False
    for _ in range(3):  # redelivered
        count_item(s, job.id, p0.id)
    count_item(s, job.id, p2.id)  # not finished: nothing
    s.refresh(job)
    assert (job.done, job.failed, job.state) == (1, 0, JobState.running)
    count_item(s, job.id, p1.id)
    count_item(s, job.id, p1.id)
    move_product(p2, ProductState.writing)
    move_product(p2, ProductState.written)
    s.flush()
    closes = [count_item(s, job.id, p2.id)[1] for _ in range(3)]
    s.refresh(job)
    assert closes == [True, False, False]
    assert (job.done, job.failed, job.done + job.failed) == (2, 1, job.total) and job.state == JobState.failed
    assert job.error.count("bad frame") == 1


def test_a_replanned_product_counts_again(db_session):
    from backend.models import ProductState
    from backend.worker.processing import count_item

    s = db_session
    job, (p0,) = _job_with_products(s, [ProductState.failed], total=2)
    count_item(s, job.id, p0.id)
    assert p0.counted_for_job == job.id
    from sqlalchemy import update

    from backend.models import Product

    s.execute(update(Product).where(Product.id == p0.id).values(counted_for_job=None))  # as plan_product does
    s.expire(p0)
    count_item(s, job.id, p0.id)
    s.refresh(job)
    assert job.failed == 2


def test_follow_ups_are_queued_once_however_often_the_last_message_comes(sqlite_env, monkeypatch):
    from backend.db import session_scope
    from backend.models import ProductState
    from backend.worker import tasks

    with session_scope() as s:
        job, prods = _job_with_products(s, [ProductState.written, ProductState.written])
        job_id, ids = job.id, [p.id for p in prods]
    sent = []
    monkeypatch.setattr(tasks.detect_events, "apply_async", lambda *a, **k: sent.append(k["kwargs"]))
    for pid in ids + ids + ids:  # every message delivered three times
        tasks.record_progress.run(job_id, pid)
    assert sent == [{"detector": "white-light", "channel": "WST", "start": sent[0]["start"], "end": sent[0]["end"]}]
    with session_scope() as s:
        j = s.get(Job, job_id)
        assert (j.done, j.failed, j.total, j.state.value) == (2, 0, 2, "succeeded")


def test_a_starting_worker_sweeps_partial_files_of_killed_writes(sqlite_env):
    import os
    import time

    from backend.worker import tasks

    d = sqlite_env.products / "WST" / "2024"
    d.mkdir(parents=True, exist_ok=True)
    stale = d / ".lst_wst_l2_a.fits.x1.part"
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    tasks._reap_on_start()
    assert not stale.exists()
