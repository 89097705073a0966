"""A job's counts agree with its products after a cancel and a retry (issue 25 point 5), on
real PostgreSQL (a database of this module's own, committed rows, two connections).

The defect: a cancelled job retried read "succeeded 24 / 25" with all 25 products written.
A settlement (``count_item``, the worker's or the reconciler's) read the cancelled frame's
product as failed by the cancel, then a retry committed (product planned again, its item
pending again), then the settlement settled the re-opened item with what it had read before:
the job counted the frame ``failed``/``cancelled`` and ended, and the retried frame's
product was written after that without being counted. ``count_item`` now takes the job's
row lock before it reads the product, so a settlement and a retry run one after the other.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text

from backend.auth import Principal
from backend.db import session_scope
from backend.models import CalibrationFile, CalibrationKind, ItemOutcome, Job, JobItem, JobState, Product, ProductState
from backend.services import job_plan
from backend.services.job_control import cancel_job, retry_job
from backend.services.job_plan import count_item
from backend.state import claim_product, move_product
from backend.worker.processing import plan_job
from tests.conftest import create_pg_database, drop_pg_database, make_token
from tests.test_api import T0, make_calibration, make_frame

pytestmark = [pytest.mark.postgres]

N_FRAMES = 3
WAIT_S = 60  # bound of the waits on the other connection (a condition, never a delay)
ALICE = Principal("alice", frozenset({"jobs:submit", "jobs:cancel"}))


@pytest.fixture(scope="module")
def pg_db():
    from backend.migrate import upgrade

    url = create_pg_database("lstdp_counts")
    upgrade(url)
    yield url
    drop_pg_database(url)


@pytest.fixture
def pg_live(pg_db, settings_env):
    """Settings on this module's database (``session_scope`` and the app use it)."""
    return settings_env(DATABASE_URL=pg_db)


def _cancelled_job() -> tuple[str, list[int]]:
    """A job of ``N_FRAMES`` SDI frames, its first frames written and counted, cancelled
    before its last frame started (real planning, settling and cancel); returns its id and
    its product ids in DATE-OBS order."""
    t0 = T0 + dt.timedelta(days=7)
    with session_scope() as s:
        for kind in (CalibrationKind.dark, CalibrationKind.flat, CalibrationKind.radiometric):
            if not s.scalar(select(func.count()).select_from(CalibrationFile).where(CalibrationFile.kind == kind)):
                make_calibration(s, "SDI", kind, 1)
        frames = [make_frame(s, "SDI", t0 + dt.timedelta(minutes=i)) for i in range(N_FRAMES)]
        job = Job(owner="alice", kind="calibrate", state=JobState.queued, publishes=False,
                  parameters={"channels": ["SDI"], "start": frames[0].date_obs.isoformat(),
                              "end": frames[-1].date_obs.isoformat(), "options": {}, "pinned_calibrations": {}})
        s.add(job)
        s.flush()
        job_id = job.id
    with session_scope() as s:
        todo = plan_job(s, job_id)
    assert len(todo) == N_FRAMES
    for pid in todo[:-1]:  # the worker calibrates all but the last frame
        _write(pid, job_id)
    with session_scope() as s:
        job = cancel_job(s, job_id, ALICE)
        assert job.state == JobState.cancelled and (job.done, job.cancelled) == (N_FRAMES - 1, 1)
    return job_id, todo


def _write(pid: int, job_id: str) -> None:
    """What a worker does with one product: claim, write (the row; no file is read here), settle."""
    with session_scope() as s:
        assert claim_product(s, pid, lease_s=60, max_deliveries=3).status == "claimed"
    with session_scope() as s:
        prod = s.get(Product, pid)
        prod.path, prod.sha256 = f"/store/{pid}.fits", f"{pid:064d}"
        move_product(prod, ProductState.written)
        s.flush()
        count_item(s, job_id, pid)


def _waiting_on_lock(pid: int) -> bool:
    with session_scope() as s:
        return bool(s.scalar(text("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :p"),
                             {"p": pid}))


def test_a_settlement_racing_a_retry_counts_what_the_retry_runs(pg_live, monkeypatch):
    job_id, products = _cancelled_job()
    last = products[-1]

    # the settlement of the cancelled frame's product (a late message of the cancelled run)
    # is held after it has read the product, while the retry runs on another connection
    read_product = threading.Event()
    retry_done = threading.Event()
    retry_pid: list[int] = []
    real = job_plan.is_cancel_reason

    def held(reason):
        if threading.current_thread().name == "settle":
            read_product.set()
            # until the retry has committed, or is waiting for a lock this settlement holds
            for _ in range(WAIT_S * 20):
                if retry_done.wait(0.05) or (retry_pid and _waiting_on_lock(retry_pid[0])):
                    break
        return real(reason)

    monkeypatch.setattr(job_plan, "is_cancel_reason", held)
    errors: list[BaseException] = []

    def settle():
        try:
            with session_scope() as s:
                count_item(s, job_id, last)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=settle, name="settle")
    t.start()
    assert read_product.wait(WAIT_S), "the settlement never read the product"

    def retry():
        try:
            with session_scope() as s:
                retry_pid.append(s.scalar(text("SELECT pg_backend_pid()")))
                job, todo = retry_job(s, job_id, ALICE)
                assert todo == [last]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            retry_done.set()

    r = threading.Thread(target=retry, name="retry")
    r.start()
    r.join(WAIT_S)
    t.join(WAIT_S)
    assert not r.is_alive() and not t.is_alive(), "deadlock between the settlement and the retry"
    assert errors == []

    with session_scope() as s:
        job = s.get(Job, job_id)
        item = s.scalar(select(JobItem).where(JobItem.job_id == job_id, JobItem.product_id == last))
        assert (job.state, job.retries) == (JobState.running, 1)
        assert item.outcome == ItemOutcome.pending, "the retried frame's item was settled by the stale settlement"
        assert (job.done, job.failed, job.cancelled) == (N_FRAMES - 1, 0, 0)
        assert s.get(Product, last).state == ProductState.planned

    _write(last, job_id)  # the retried frame is calibrated

    with session_scope() as s:
        token = make_token(s, "alice", ("jobs:submit",))
    from backend.api.app import create_app

    with TestClient(create_app()) as c:
        c.headers["Authorization"] = f"Bearer {token}"
        shown = c.get(f"/api/v1/jobs/{job_id}").json()
        listed = c.get("/api/v1/products", params={"job_id": job_id, "limit": 100}).json()
    written = [p for p in listed["items"] if p["state"] == "written"]
    assert shown["state"] == "succeeded"
    assert len(written) == listed["total"] == N_FRAMES
    # the counts shown agree with the products: every frame done, none cancelled or failed
    assert (shown["done"], shown["failed"], shown["skipped"], shown["cancelled"], shown["total"]) == \
        (len(written), 0, 0, 0, N_FRAMES)
    assert shown["progress"] == 1.0
