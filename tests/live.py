"""A live production stack for integration tests: a fresh PostgreSQL database, a Redis
database of the test's own, a real Celery worker process, and a small simulated data set
ingested into it.

Usage::

    @pytest.fixture
    def stack(settings_env, tmp_path):
        with live_stack(settings_env, tmp_path, redis_db=11) as st:
            yield st

    def test_x(stack):
        ingest_simulated(stack, simulated_dir)       # calibration masters + raw frames
        ...  # HTTP through stack.client() (TestClient on the live database)

Each test module uses a Redis database number of its own (``redis_db``), flushed at start
and end; the shared server's other databases are never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.conftest import REDIS_URL, create_pg_database, drop_pg_database

__all__ = ["Stack", "live_stack", "live_worker", "ingest_simulated", "wait_job", "redis_url"]


def redis_url(db: int) -> str:
    """The shared test Redis server's database ``db``."""
    return REDIS_URL.rsplit("/", 1)[0] + f"/{db}"


@dataclass
class Stack:
    settings: object
    database_url: str
    redis_url: str
    worker: subprocess.Popen
    log: Path
    tmp: Path
    extra: dict = field(default_factory=dict)

    def client(self, **headers: str):
        """A TestClient of the app on this stack (its own sessions on the live database).
        Use it as a context manager."""
        from fastapi.testclient import TestClient

        from backend.api.app import create_app

        c = TestClient(create_app(), raise_server_exceptions=False)
        c.headers.update(headers)
        return c

    def worker_log(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:] if self.log.exists() else ""


@contextlib.contextmanager
def live_stack(settings_env, tmp_path: Path, *, redis_db: int, concurrency: int = 2, queues: str = "cpu",
               env: dict[str, str] | None = None, start_worker: bool = True):
    """Production settings on a fresh PostgreSQL database and Redis database ``redis_db``,
    migrated, with a Celery worker process (``lstdp worker``) consuming ``queues``."""
    from backend import db as dbmod
    from backend.broker import ensure_configured
    from backend.migrate import upgrade

    url = create_pg_database("lstdp_live")
    rurl = redis_url(redis_db)
    r = redis.Redis.from_url(rurl)
    r.flushdb()
    extra = dict(env or {})
    s = settings_env(DATABASE_URL=url, CELERY_BROKER_URL=rurl, CELERY_RESULT_BACKEND=rurl, **extra)
    upgrade(url)
    ensure_configured()
    from backend.broker import app as celery_app

    celery_app.amqp._producer_pool = None  # forget a producer of an earlier test's broker
    log = tmp_path / "worker.log"
    log.write_bytes(b"")
    try:
        with contextlib.ExitStack() as stack:
            worker = (stack.enter_context(live_worker(log, name=f"live-{os.getpid()}-{redis_db}@%h", queues=queues,
                                                      concurrency=concurrency, module="backend.cli"))
                      if start_worker else None)
            yield Stack(s, url, rurl, worker, log, tmp_path)
    finally:
        dbmod.reset_caches()
        drop_pg_database(url)
        r.flushdb()


@contextlib.contextmanager
def live_worker(log: Path, *, name: str, queues: str = "cpu", concurrency: int = 2,
                module: str = "tests.faults.worker_main"):
    """A Celery worker process (``python -m <module> worker``, default the fault-injecting
    one whose ``LSTDP_FAULTS_*`` hooks slow or break calibrations) on the current
    environment's settings, logging to ``log``; stopped on exit (SIGTERM to its process
    group, SIGKILL after 5 s: Celery's warm shutdown waits for the tasks in flight, which a
    test that is over does not need; it held the client package's teardown 30 s). Yields
    the process."""
    fh = open(log, "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "worker", "--queues", queues, "--concurrency", str(concurrency),
         "--name", name],
        env=os.environ.copy(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        fh.close()


def ingest_simulated(sim_dir: Path) -> dict[str, int]:
    """Ingest ``sim_dir/calibration`` then ``sim_dir/raw`` (in this process, on the current
    settings' database); returns the outcome counts."""
    from backend.cli import ingest_files

    files = sorted((sim_dir / "calibration").glob("*.fits"))
    counts = ingest_files(files, move=False, progress=False)
    more = ingest_files(sorted((sim_dir / "raw").glob("*.fits")), move=False, progress=False)
    for k, v in more.items():
        counts[k] = counts.get(k, 0) + v
    return counts


def wait_job(job_id: str, timeout: float = 240.0, *, until=None):
    """Poll job ``job_id`` until it ends (or ``until(job)`` is true); returns the job row."""
    from backend.db import session_scope
    from backend.models import Job
    from backend.state import JOB_FINAL

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with session_scope() as s:
            job = s.get(Job, job_id)
            if job is not None and ((until is not None and until(job)) or (until is None and job.state in JOB_FINAL)):
                s.expunge(job)
                return job
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} did not reach the wanted state in {timeout} s")
