"""A live LST data platform for the Python client's and the Fido client's tests.

One per test package (``scope="package"``): embedded mode (SQLite in a temporary DATA_DIR,
the filesystem broker), the simulated 2004-03-01 SDI series (``pipelines.simulation``,
13 frames at :data:`NAXIS` px) ingested with its calibration masters, a real Celery worker
process (``python -m tests.faults.worker_main worker``: ``lstdp worker`` with the test hooks,
here a :data:`FRAME_DELAY_S` pause per calibration so that a job can be cancelled while it
runs), the API served by uvicorn in a thread (``tests.test_browser.served_app``), and real
catalogue events (the GOES XRS event list of 2004 and the HEK sample of 2024-05-10 from
``sample-data/real/events``).

The SDI products are made by a recalibration job submitted through the client itself
(``Client.submit_job``) and followed to its end over the server-sent events stream
(``Client.follow_job``); the fixture keeps what it saw for the job tests.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, SAMPLE

# the client of this checkout, not an installed copy (the project's venv may hold another
# checkout's editable install)
if str(ROOT / "clients" / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "clients" / "python"))

#: Side of the simulated frames [pixel] (small: the tests are about the clients, not the science).
NAXIS = 64
#: Seconds each calibration waits first (LSTDP_FAULTS_FRAME_DELAY_S of tests.faults.worker_main).
FRAME_DELAY_S = 0.4
SDI_FRAMES = 13


@pytest.fixture(scope="package")
def live(tmp_path_factory):
    """The live platform: ``url``, ``token`` (user ``ada``, jobs:submit and jobs:cancel),
    ``job`` (the calibration job's final JSON), ``job_events`` (what ``follow_job`` yielded),
    ``span`` (DATE-OBS of the first and last SDI frame), ``settings``, ``tmp``."""
    from backend import db as dbmod
    from backend.cli import ingest_files
    from backend.db import session_scope
    from backend.migrate import upgrade
    from backend.services.events import import_all
    from backend.settings import get_settings
    from lstdp_client import Client
    from pipelines.simulation import simulate
    from tests.conftest import make_token
    from tests.live import live_worker
    from tests.test_browser import served_app

    tmp = tmp_path_factory.mktemp("lstdp_client")
    mp = pytest.MonkeyPatch()
    try:
        for k in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATA_DIR"):
            mp.delenv(k, raising=False)
            mp.delenv(f"LSTDP_{k}", raising=False)
        for k in ("LSTDP_URL", "LSTDP_TOKEN"):
            mp.delenv(k, raising=False)
        mp.setenv("DATA_DIR", str(tmp / "var"))
        mp.setenv("LSTDP_FAULTS_FRAME_DELAY_S", str(FRAME_DELAY_S))
        get_settings.cache_clear()
        dbmod.reset_caches()
        settings = get_settings()
        assert settings.embedded, "the client tests run on the embedded mode (SQLite, filesystem broker)"
        settings.ensure_dirs()
        upgrade(settings.sqlalchemy_url)
        from backend.broker import app as celery_app
        from backend.broker import ensure_configured

        ensure_configured()
        celery_app.amqp._producer_pool = None  # forget a producer of an earlier test's broker

        sim = tmp / "sim"
        simulate(sim, channels=("SDI",), naxis=NAXIS, noise=False, seed=3, sdi_sequence=True)
        counts = ingest_files(sorted((sim / "calibration").glob("*.fits")), move=False, progress=False)
        counts2 = ingest_files(sorted((sim / "raw").glob("*.fits")), move=False, progress=False)
        assert counts2.get("ingested") == SDI_FRAMES, (counts, counts2)

        events = tmp / "events"
        (events / "goes_xrs_reports").mkdir(parents=True)
        shutil.copy2(SAMPLE / "events" / "goes_xrs_reports" / "goes-xrs-report_2004.txt", events / "goes_xrs_reports")
        shutil.copytree(SAMPLE / "events" / "hek", events / "hek")
        with session_scope() as s:
            run = import_all(s, events)
            assert not run.failed, run.lines()

        from sqlalchemy import func, select

        from backend.models import Frame

        with session_scope() as s:
            span = s.execute(select(func.min(Frame.date_obs), func.max(Frame.date_obs))).one()
            token = make_token(s, "ada", ("jobs:submit", "jobs:cancel"))
        span = tuple(t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t for t in span)

        with live_worker(tmp / "worker.log", name=f"client-{os.getpid()}@%h"), served_app() as url:
            with Client(url, token=token) as c:
                created = c.submit_job(["SDI"], span[0], span[1])
                job_events = list(c.follow_job(created["id"], timeout=300))
                job = c.job(created["id"])
            assert job["state"] == "succeeded", (job, (tmp / "worker.log").read_text()[-3000:])
            yield SimpleNamespace(url=url, token=token, created=created, job=job, job_events=job_events,
                                  span=span, settings=settings, tmp=tmp)
    finally:
        mp.undo()
        get_settings.cache_clear()
        dbmod.reset_caches()
