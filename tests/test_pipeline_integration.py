"""End to end on real PostgreSQL, real Redis and a real Celery worker process:
simulate -> ingest task -> calibration job -> L2 products -> flare detection.

Also: bad input is rejected and quarantined while the worker stays up; the same file
ingested twice and the same job run twice add nothing; a failing frame leaves its job
``failed`` with the reason while the other products are written.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import astropy.units as u
import pytest
import redis
from astropy.coordinates import SkyCoord
from astropy.io import fits
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import (
    CalibrationFile,
    Event,
    Frame,
    Job,
    JobState,
    Product,
    ProductState,
)
from backend.services.jobs import JobRequest, submit_job
from tests.conftest import REDIS_URL, SAMPLE, create_pg_database, drop_pg_database

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

SIZE = 128


@pytest.fixture(scope="module")
def simulated(simulated_dataset):
    res = simulated_dataset(naxis=SIZE, noise=True, seed=3, sdi_sequence=True)  # shared, read-only
    return res.out_dir, res


@pytest.fixture
def production(settings_env, tmp_path):
    """Production-mode settings on a fresh PostgreSQL database and Redis db 15, and a worker."""
    from backend.migrate import upgrade

    url = create_pg_database("lstdp_e2e")
    r = redis.Redis.from_url(REDIS_URL)
    r.flushdb()
    s = settings_env(DATABASE_URL=url, CELERY_BROKER_URL=REDIS_URL, CELERY_RESULT_BACKEND=REDIS_URL)
    upgrade(url)
    from backend.broker import ensure_configured

    ensure_configured()
    env = os.environ.copy()
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "backend.cli", "worker", "--queues", "cpu", "--concurrency", "2",
         "--name", f"e2e-{os.getpid()}@%h"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield s, worker
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
        log.close()
        from backend import db as dbmod

        dbmod.reset_caches()
        drop_pg_database(url)
        r.flushdb()
        print((tmp_path / "worker.log").read_text()[-3000:])


def _wait_job(job_id: str, timeout: float = 240.0) -> Job:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with session_scope() as s:
            job = s.get(Job, job_id)
            if job.state in (JobState.succeeded, JobState.failed):
                return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


def _ingest_via_worker(paths: list[Path], move: bool = False) -> list[dict]:
    from backend.worker.tasks import ingest_file

    results = [ingest_file.apply_async(args=[str(p), move], queue="cpu") for p in paths]
    return [r.get(timeout=120) for r in results]


def test_end_to_end_with_worker(simulated, production, tmp_path):
    sim_dir, res = simulated
    settings, worker = production

    # -- ingest through the Celery task: calibration masters, then frames --------------------
    cal_files = sorted((sim_dir / "calibration").glob("*.fits"))
    raw_files = sorted((sim_dir / "raw").glob("*.fits"))
    outs = _ingest_via_worker(cal_files)
    assert {o["status"] for o in outs} == {"calibration"}, outs
    outs = _ingest_via_worker(raw_files)
    assert {o["status"] for o in outs} == {"ingested"}, outs
    # the same files again: nothing added
    again = _ingest_via_worker(raw_files[:3] + cal_files[:2])
    assert {o["status"] for o in again} == {"duplicate"}
    with session_scope() as s:
        n_frames = s.scalar(select(func.count()).select_from(Frame))
        channels = set(s.scalars(select(Frame.channel_code).distinct()))
    assert n_frames == len(raw_files)
    assert channels == {"SDI", "WST", "SCI-UV", "SCI-WL"}

    # -- bad input: each rejected with a one-line reason, quarantined; worker stays up --------
    inbox = tmp_path / "inbox"
    shutil.copytree(SAMPLE / "bad-input", inbox)
    bad = sorted(inbox.iterdir())
    outs = _ingest_via_worker(bad, move=True)
    for o in outs:
        assert o["status"] == "rejected", o
        assert o["reason"] and "\n" not in o["reason"] and "Traceback" not in o["reason"]
        assert Path(o["stored_path"]).exists() and Path(o["stored_path"] + ".reason").exists()
    assert not any(inbox.iterdir()), "rejected files are moved to quarantine"
    assert worker.poll() is None, "the worker must survive bad input"

    # -- a broken calibration master makes WST fail; the others are written ------------------
    with session_scope() as s:
        wst_flat = s.scalar(select(CalibrationFile).where(
            CalibrationFile.channel_code == "WST", CalibrationFile.kind == "flat"))
        flat_path = Path(wst_flat.path)
        t_min, t_max = s.execute(select(func.min(Frame.date_obs), func.max(Frame.date_obs))).one()
    saved = flat_path.read_bytes()
    flat_path.write_bytes(b"not a fits file")
    req = JobRequest(channels=["SDI", "WST", "SCI-UV", "SCI-WL"], start=t_min, end=t_max)
    with session_scope() as s:
        job_id = submit_job(s, req).id
    job = _wait_job(job_id)
    assert job.state == JobState.failed
    assert "frame" in (job.error or "") and job.failed >= 1
    assert job.done == n_frames - job.failed
    with session_scope() as s:
        states = dict(s.execute(select(Product.state, func.count()).group_by(Product.state)).all())
    assert states.get(ProductState.written) == n_frames - job.failed
    assert worker.poll() is None

    # -- fix the master, run the same job again: only the failed frame is redone --------------
    flat_path.write_bytes(saved)
    with session_scope() as s:
        job2 = submit_job(s, req).id
    job2 = _wait_job(job2)
    assert job2.state == JobState.succeeded, job2.error
    assert job2.skipped == n_frames - job.failed and job2.done == job.failed
    # -- and once more: adds nothing ----------------------------------------------------------
    with session_scope() as s:
        n_products = s.scalar(select(func.count()).select_from(Product))
        job3 = submit_job(s, req).id
    job3 = _wait_job(job3)
    assert job3.state == JobState.succeeded and job3.skipped == n_frames and job3.done == 0
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Product)) == n_products == n_frames

    # -- every product: checksum verifies, provenance in the header, sunpy opens it ----------
    import sunpy.map

    with session_scope() as s:
        products = list(s.scalars(select(Product)))
        for p in products:
            assert p.state == ProductState.written and Path(p.path).exists()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with fits.open(p.path, checksum=True) as hdul:
                    assert hdul[0].header["LEVEL"].strip() == "L2"
                    assert "DQ" in hdul
            assert len(p.calibration_files) >= 3
        for p in products:
            m = sunpy.map.Map(p.path, hdus=0)  # the data map (UNCERT and DQ are image extensions)
            assert isinstance(m, sunpy.map.GenericMap)
            cx, cy = m.wcs.world_to_pixel(SkyCoord(0 * u.arcsec, 0 * u.arcsec, frame=m.coordinate_frame))
            ny, nx = m.data.shape
            assert abs(cx - (nx - 1) / 2) < 1 and abs(cy - (ny - 1) / 2) < 1, "Sun centred after north-up"

    # -- flare detection was queued when the jobs finished: the injected flare is found ------
    flare = res.injected_flare
    t_peak = dt.datetime.fromisoformat(flare["peak"]).replace(tzinfo=dt.UTC) if isinstance(flare, dict) \
        else flare.peak
    deadline = time.monotonic() + 120
    found = []
    while time.monotonic() < deadline and not found:
        with session_scope() as s:
            found = list(s.scalars(select(Event).where(Event.source == "detected", Event.event_type == "FL")))
        time.sleep(1)
    assert found, "the detector task stored no flare"
    best = min(found, key=lambda e: abs((e.peak_time - t_peak).total_seconds()))
    assert abs((best.peak_time - t_peak).total_seconds()) <= 3600
