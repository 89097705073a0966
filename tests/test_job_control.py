"""Cancel and retry of recalibration jobs (issue 12 item 3), on real PostgreSQL, Redis
(database 10) and a real Celery worker.

The worker runs through ``tests.faults.worker_main`` (``lstdp`` with test hooks) so that
``LSTDP_FAULTS_FRAME_DELAY_FILE`` slows the calibrations of the cancel test's first job: a
30-frame job then runs long enough to be cancelled half-way on any machine (its last 26
frames take at least 26 x 0.5 s / 2 processes = 6.5 s after the cancel's trigger, whatever
the machine's speed). The retry test, and the cancel test's second job, run without the
delay (nothing in them races the worker). The reconciler runs every 2 s beside it, so the
waits after a cancel also prove that it re-sends nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import (CalibrationFile, Frame, ItemOutcome, Job, JobFollowUp, JobItem, JobState, Product,
                            ProductState)
from backend.broker import TaskName
from backend.state import move_job, move_product
from tests.conftest import make_token
from tests.live import ingest_simulated, live_stack, live_worker, wait_job

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

REDIS_DB = 10
SIZE = 128
SDI_FRAMES = 13  # the simulated SDI series
#: 17 WST frames (with the SDI series, 30 in a job): the count only has to leave frames queued
#: when the cancel comes (see the module docstring) and to make the retry's failed frames many;
#: it was 37 (50 in all), which only made every job, ingest and simulation longer.
WST_FRAMES = 17
N_FRAMES = SDI_FRAMES + WST_FRAMES
FRAME_DELAY_S = 0.5
RECONCILE_S = 2


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """30 raw frames at 128 px: the 13-frame SDI series and 17 WST frames, with their masters."""
    from pipelines.simulation import simulate

    out = tmp_path_factory.mktemp("sim")
    simulate(out, channels=("SDI", "WST"), naxis=SIZE, noise=True, seed=3, sdi_sequence=True,
             frames_per_channel=WST_FRAMES)
    assert len(list((out / "raw").glob("*.fits"))) == N_FRAMES
    return out


@contextlib.contextmanager
def _stack(settings_env, tmp_path, sim_dir, *, worker: bool = True, frame_delay_s: float = FRAME_DELAY_S):
    """The live stack with the simulated frames ingested and (``worker``) a worker whose every
    calibration first sleeps the number of seconds in ``tmp_path/frame-delay`` (written here
    as ``frame_delay_s``; a test may change it while the worker runs)."""
    delay_file = tmp_path / "frame-delay"
    delay_file.write_text(str(frame_delay_s))
    env = {"LSTDP_FAULTS_FRAME_DELAY_FILE": str(delay_file), "RECONCILE_INTERVAL_S": str(RECONCILE_S)}
    with live_stack(settings_env, tmp_path, redis_db=REDIS_DB, env=env, start_worker=False) as st:
        counts = ingest_simulated(sim_dir)
        assert counts.get("ingested") == N_FRAMES, counts
        with contextlib.ExitStack() as workers:
            if worker:
                workers.enter_context(live_worker(tmp_path / "worker.log", name=f"jobctl-{os.getpid()}@%h"))
            yield st


@pytest.fixture
def stack(settings_env, tmp_path, simulated):
    with _stack(settings_env, tmp_path, simulated) as st:
        yield st


@pytest.fixture
def undelayed_stack(settings_env, tmp_path, simulated):
    """The stack whose worker calibrates at the machine's own speed (no frame delay)."""
    with _stack(settings_env, tmp_path, simulated, frame_delay_s=0) as st:
        yield st


def _tokens(**users: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Bearer headers per user name, committed."""
    with session_scope() as s:
        out = {u: {"Authorization": f"Bearer {make_token(s, u, scopes)}"} for u, scopes in users.items()}
    return out


def _span() -> dict[str, str]:
    with session_scope() as s:
        t0, t1 = s.execute(select(func.min(Frame.date_obs), func.max(Frame.date_obs))).one()
    return {"start": t0.isoformat(), "end": t1.isoformat()}


def _sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _outcomes(job_id: str) -> dict[ItemOutcome, int]:
    with session_scope() as s:
        return dict(s.execute(select(JobItem.outcome, func.count()).where(JobItem.job_id == job_id)
                              .group_by(JobItem.outcome)).all())


def _store_state(settings, job_id: str) -> dict:
    """What the product store and the database say about job ``job_id``'s products."""
    with session_scope() as s:
        rows = s.execute(select(JobItem.outcome, Product).join(Product, Product.id == JobItem.product_id)
                         .where(JobItem.job_id == job_id)).all()
        written = {p.id: (p.path, p.sha256) for o, p in rows if o == ItemOutcome.done}
        stopped = {p.id: (p.state, p.error, p.path) for o, p in rows if o == ItemOutcome.cancelled}
        all_written = s.scalar(select(func.count()).select_from(Product).where(Product.state == ProductState.written))
    tmp = settings.products / ".tmp"
    return {"written": written, "stopped": stopped, "all_written": all_written,
            "fits": sorted(p for p in settings.products.rglob("*.fits") if ".tmp" not in p.parts),
            "partial": sorted(p for p in tmp.rglob("*") if p.is_file()) if tmp.exists() else []}


def test_cancel_of_a_running_30_frame_job(stack):
    settings = stack.settings
    headers = _tokens(alice=("jobs:submit", "jobs:cancel"))["alice"]
    with stack.client(**headers) as c:
        r = c.post("/api/v1/jobs", json={"channels": ["SDI", "WST"], **_span()})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        running = wait_job(job_id, until=lambda j: j.state == JobState.running and j.done >= 4)
        assert running.done < N_FRAMES, "the job ended before it could be cancelled: raise the frame delay"
        r = c.post(f"/api/v1/jobs/{job_id}/cancel")
        assert r.status_code in (200, 202), r.text
        body = r.json()
        assert body["cancel_requested_at"] and body["cancelled_by"] == "alice"
        assert body["state"] == ("cancelled" if r.status_code == 200 else "running")
        assert body["cancelled"] > 0, "queued frames are cancelled at once"

    job = wait_job(job_id, timeout=120)
    assert job.state == JobState.cancelled, (job.state, job.error, stack.worker_log())
    assert job.total == N_FRAMES
    assert job.done + job.failed + job.skipped + job.cancelled == N_FRAMES
    assert job.failed == 0 and job.skipped == 0 and 4 <= job.done < N_FRAMES and job.cancelled > 0
    assert job.cancel_requested_at is not None and job.cancelled_by == "alice" and job.finished_at is not None
    items = _outcomes(job_id)
    assert items == {k: v for k, v in {ItemOutcome.done: job.done, ItemOutcome.cancelled: job.cancelled}.items() if v}

    def check() -> dict:
        st = _store_state(settings, job_id)
        assert len(st["written"]) == job.done == st["all_written"]
        for path, sha in st["written"].values():  # each written frame whole, as its row says
            assert path and Path(path).is_file() and _sha256(path) == sha
        assert {Path(p) for p, _ in st["written"].values()} == set(st["fits"]), "no other FITS file in the store"
        assert st["partial"] == [], f"partial files left: {st['partial']}"
        assert len(st["stopped"]) == job.cancelled
        for state, error, path in st["stopped"].values():
            assert state == ProductState.failed and path is None
            assert error == f"cancelled: job {job_id} was cancelled before this frame started"
        return st

    first = check()
    time.sleep(3 * RECONCILE_S + 2 * FRAME_DELAY_S)  # reconciler passes, and any late message, would act now
    later = check()
    assert later["written"] == first["written"], "no frame was calibrated after the job ended"
    with session_scope() as s:
        again = s.get(Job, job_id)
        assert (again.state, again.done, again.cancelled) == (JobState.cancelled, job.done, job.cancelled)
        assert s.scalar(select(func.count()).select_from(JobFollowUp).where(JobFollowUp.job_id == job_id)) == 0, \
            "a cancelled job queues no detection"

    # a later job re-plans the cancelled frames (their products failed, not stuck planned);
    # nothing races it, so its calibrations run at the machine's speed
    (stack.tmp / "frame-delay").write_text("0")
    with stack.client(**headers) as c:
        r = c.post("/api/v1/jobs", json={"channels": ["SDI", "WST"], **_span()})
        assert r.status_code == 202, r.text
    job2 = wait_job(r.json()["id"], timeout=240)
    assert job2.state == JobState.succeeded, job2.error
    assert (job2.skipped, job2.done) == (job.done, job.cancelled)


def test_retry_runs_only_the_failed_frames(undelayed_stack):
    stack = undelayed_stack
    headers = _tokens(alice=("jobs:submit", "jobs:cancel"))["alice"]
    with session_scope() as s:
        flat = s.scalar(select(CalibrationFile).where(CalibrationFile.channel_code == "WST",
                                                      CalibrationFile.kind == "flat"))
        flat_path = Path(flat.path)
    saved = flat_path.read_bytes()
    flat_path.write_bytes(b"not a fits file")  # every WST frame fails on its flat
    with stack.client(**headers) as c:
        r = c.post("/api/v1/jobs", json={"channels": ["SDI", "WST"], **_span()})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        job = wait_job(job_id, timeout=240)
        assert job.state == JobState.failed, (job.state, job.error)
        assert (job.done, job.failed) == (SDI_FRAMES, WST_FRAMES)
        with session_scope() as s:
            before = {p.id: (p.sha256, p.path, p.updated_at) for p in s.scalars(
                select(Product).where(Product.state == ProductState.written))}
            failed_ids = set(s.scalars(select(Product.id).where(Product.state == ProductState.failed)))
            n_products = s.scalar(select(func.count()).select_from(Product))
        assert len(before) == SDI_FRAMES and len(failed_ids) == WST_FRAMES

        with session_scope() as s:
            sent_before = {(r.detector, r.channel): r.sent_at for r in s.scalars(
                select(JobFollowUp).where(JobFollowUp.job_id == job_id))}
        assert sent_before, "an SDI job queues detections when it ends, also failed"
        flat_path.write_bytes(saved)  # fixed
        r = c.post(f"/api/v1/jobs/{job_id}/retry")
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["state"] == "running" and body["retries"] == 1
        assert (body["done"], body["failed"], body["total"]) == (SDI_FRAMES, 0, N_FRAMES)
        assert body["error"] is None

    job = wait_job(job_id, timeout=240)
    assert job.state == JobState.succeeded, (job.error, stack.worker_log())
    assert (job.done, job.failed, job.skipped, job.cancelled, job.total) == (N_FRAMES, 0, 0, 0, N_FRAMES)
    assert job.retries == 1 and job.finished_at is not None and job.finished_at >= job.started_at
    with session_scope() as s:
        after = {p.id: (p.sha256, p.path, p.updated_at) for p in s.scalars(select(Product))}
        assert s.scalar(select(func.count()).select_from(Product)) == n_products, "no new product version"
        for pid, (sha, path, updated) in before.items():
            assert after[pid] == (sha, path, updated), f"product {pid} of a done frame was touched"
            assert _sha256(path) == sha
        for pid in failed_ids:  # the very same product rows, now written
            sha, path, _ = after[pid]
            assert sha and _sha256(path) == sha
    # its follow-up detections were queued and sent again when the retry ended
    deadline = time.monotonic() + 60
    while True:
        with session_scope() as s:
            sent_after = {(r.detector, r.channel): r.sent_at for r in s.scalars(
                select(JobFollowUp).where(JobFollowUp.job_id == job_id))}
        again = {k for k, t in sent_after.items() if t is not None and (sent_before.get(k) is None or t > sent_before[k])}
        if again == set(sent_before) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(sent_after) == set(sent_before) and again == set(sent_before)


@pytest.fixture
def idle_stack(settings_env, tmp_path, simulated):
    """The live database and broker without a worker (nor reconciler): jobs stay as left."""
    with _stack(settings_env, tmp_path, simulated, worker=False) as st:
        yield st


def test_cancel_and_retry_refusals(idle_stack):
    from backend.services.jobs import JobRequest, submit_job

    stack = idle_stack

    hs = _tokens(alice=("jobs:submit", "jobs:cancel"), bob=("jobs:submit", "jobs:cancel"),
                 carol=("jobs:submit",), root=("admin",))
    span = _span()
    with session_scope() as s:  # stored, not sent: it stays queued while this test runs
        # a user's job, as POST /jobs makes it for a non-admin (publishes=False): private to alice
        queued = submit_job(s, JobRequest(channels=["SDI", "WST"], **span), owner="alice", publishes=False,
                            enqueue=False).id
        done = submit_job(s, JobRequest(channels=["SDI"], **span), owner="alice", enqueue=False)
        move_job(done, JobState.running)
        move_job(done, JobState.succeeded)
        done = done.id
    with stack.client() as anon:
        r = anon.post(f"/api/v1/jobs/{queued}/cancel")
        assert r.status_code == 401 and "jobs:cancel" in r.json()["detail"]
        assert anon.post(f"/api/v1/jobs/{queued}/retry").status_code == 401
    with stack.client(**hs["carol"]) as c:
        r = c.post(f"/api/v1/jobs/{queued}/cancel")
        assert r.status_code == 403 and "lacks scope 'jobs:cancel'" in r.json()["detail"]
    with stack.client(**hs["bob"]) as c:
        r = c.post(f"/api/v1/jobs/{queued}/cancel")  # alice's private job: unknown to bob (never 403)
        assert r.status_code == 404, r.text
        assert "no job" in r.json()["detail"] and "alice" not in r.text
        r = c.post("/api/v1/jobs/00000000-0000-0000-0000-000000000000/cancel")
        assert r.status_code == 404 and "no job" in r.json()["detail"]
        assert c.post("/api/v1/jobs/not%20an%20id/retry").status_code == 404
    with stack.client(**hs["alice"]) as c:
        r = c.post(f"/api/v1/jobs/{done}/retry")
        assert r.status_code == 409 and "succeeded" in r.json()["detail"]
        r = c.post(f"/api/v1/jobs/{done}/cancel")
        assert r.status_code == 409 and "already ended (succeeded" in r.json()["detail"]
        r = c.post(f"/api/v1/jobs/{queued}/retry")
        assert r.status_code == 409 and "queued" in r.json()["detail"]
    with stack.client(**hs["root"]) as c:  # an admin may cancel anyone's job: a queued one ends at once
        r = c.post(f"/api/v1/jobs/{queued}/cancel")
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["state"], body["cancelled_by"], body["total"], body["progress"]) == ("cancelled", "root", 0, 1.0)
        r = c.post(f"/api/v1/jobs/{queued}/cancel")
        assert r.status_code == 409 and "already ended (cancelled" in r.json()["detail"]
    with stack.client(**hs["bob"]) as c:
        r = c.post(f"/api/v1/jobs/{queued}/retry")  # another user's private job: unknown (never 403)
        assert r.status_code == 404 and "no job with id" in r.json()["detail"] and "alice" not in r.text
    with stack.client(**hs["alice"]) as c:  # a job cancelled before it was planned: a retry plans it whole
        r = c.post(f"/api/v1/jobs/{queued}/retry")
        assert r.status_code == 202, r.text
        assert (r.json()["state"], r.json()["total"], r.json()["retries"]) == ("running", N_FRAMES, 1)
        assert r.json()["cancel_requested_at"] is None and r.json()["cancelled_by"] is None
        page = c.get(f"/jobs/{queued}")
        assert page.status_code == 200 and 'id="job-actions"' in page.text and "job_actions.js" in page.text
    with session_scope() as s:  # planned whole and sent (no worker here consumes them)
        assert _outcomes(queued) == {ItemOutcome.pending: N_FRAMES}
        sent = list(s.scalars(select(Product.sent_at).join(JobItem, JobItem.product_id == Product.id)
                              .where(JobItem.job_id == queued, Product.state == ProductState.planned)))
        assert len(sent) == N_FRAMES and all(sent)


def test_a_product_another_live_job_waits_on_stays_planned(settings_env, tmp_path, simulated):
    """Two jobs share their products (planned, nothing sent); cancelling one leaves them
    planned for the other and the worker's claim still takes them; cancelling the other
    too stops them, and the claim then refuses them (a message still in the broker)."""
    from backend.auth import SYSTEM
    from backend.services.job_control import cancel_job
    from backend.services.jobs import JobRequest, submit_job
    from backend.settings import get_settings
    from backend.state import claim_product
    from backend.worker.processing import count_item, plan_job

    with _stack(settings_env, tmp_path, simulated, worker=False):
        span = _span()
        with session_scope() as s:
            a = submit_job(s, JobRequest(channels=["WST"], **span), owner="alice", enqueue=False).id
            b = submit_job(s, JobRequest(channels=["WST"], **span), owner="bob", enqueue=False).id
        with session_scope() as s:
            todo_a = plan_job(s, a)
        with session_scope() as s:
            plan_job(s, b)
        assert len(todo_a) == WST_FRAMES
        with session_scope() as s:
            job = cancel_job(s, a, SYSTEM)
            assert (job.state, job.cancelled, job.total) == (JobState.cancelled, WST_FRAMES, WST_FRAMES)
        with session_scope() as s:
            states = set(s.scalars(select(Product.state).where(Product.id.in_(todo_a))))
            assert states == {ProductState.planned}, "job b still waits on them"
            settings = get_settings()
            first, second = todo_a[0], todo_a[1]
            assert claim_product(s, first, lease_s=settings.lease_s, max_deliveries=3).status == "claimed"
        with session_scope() as s:
            job = cancel_job(s, b, SYSTEM)
            # the frame being calibrated (claimed above) finishes; the others are stopped
            assert (job.state, job.cancelled, job.total) == (JobState.running, WST_FRAMES - 1, WST_FRAMES)
        with session_scope() as s:
            prod = s.get(Product, second)
            assert prod.state == ProductState.failed and prod.error.startswith(f"cancelled: job {b}")
            claim = claim_product(s, second, lease_s=settings.lease_s, max_deliveries=3)
            assert claim.status == "finished"
        # the claimed frame fails on its data: counted failed, and the job ends cancelled
        with session_scope() as s:
            move_product(s.get(Product, first), ProductState.failed, "bad frame")
        with session_scope() as s:
            job, closed = count_item(s, b, first)
            assert closed and job.state == JobState.cancelled
            assert (job.done, job.failed, job.cancelled, job.total) == (0, 1, WST_FRAMES - 1, WST_FRAMES)
            assert s.scalar(select(func.count()).select_from(JobFollowUp).where(JobFollowUp.job_id == b)) == 0


def test_the_claim_refuses_a_product_only_cancelled_jobs_wait_on(settings_env, tmp_path, simulated):
    """A product left planned whose every waiting job asked to cancel (two cancels that each
    saw the other job live) is refused by the claim and counted cancelled."""
    from backend.settings import get_settings
    from backend.state import claim_product
    from backend.worker.processing import count_item, plan_job

    with _stack(settings_env, tmp_path, simulated, worker=False):
        span = _span()
        from backend.services.jobs import JobRequest, submit_job

        with session_scope() as s:
            a = submit_job(s, JobRequest(channels=["WST"], **span), owner="alice", enqueue=False).id
        with session_scope() as s:
            todo = plan_job(s, a)
        with session_scope() as s:  # asked to cancel, its items not yet stopped (as seen by a racing claim)
            s.get(Job, a).cancel_requested_at = s.get(Job, a).created_at
        with session_scope() as s:
            claim = claim_product(s, todo[0], lease_s=get_settings().lease_s, max_deliveries=3)
            assert claim.status == "cancelled"
            prod = s.get(Product, todo[0])
            assert prod.state == ProductState.failed and prod.path is None
        with session_scope() as s:
            job, closed = count_item(s, a, todo[0])
            assert not closed and (job.cancelled, job.failed) == (1, 0)


# ------------------------------------------------------------------ reconciler (rows only)
from tests.test_reconcile import NOW, SETTINGS, _dead_pid, _job, _pass, sent  # noqa: E402,F401


def test_the_reconciler_stops_the_lost_work_of_a_cancelled_job_instead_of_sending_it(db_session, sent):  # noqa: F811
    import socket

    from backend.broker import InFlight

    s = db_session
    dead = f"{socket.gethostname()}:{_dead_pid()}"
    job, (lost, crashed, live) = _job(s, [ProductState.planned, ProductState.writing, ProductState.writing],
                                      channel="SDI", ago_s=60, attempts=1, claimed_by=dead)
    live.claimed_by, live.claimed_at = "elsewhere:1 task=t try=0", NOW  # a live claim on another host
    job.cancel_requested_at, job.cancelled_by = NOW, "alice"
    s.flush()
    report = _pass(s, InFlight())
    assert sorted(report.stopped) == sorted([lost.id, crashed.id])
    assert report.resent == [] and report.taken_back == [] and sent["calibrations"] == []
    for p in (lost, crashed):
        s.refresh(p)
        assert p.state == ProductState.failed and p.error == f"cancelled: job {job.id} was cancelled before this frame started"
    s.refresh(job)
    assert (job.state, job.cancelled, job.failed, job.done) == (JobState.running, 2, 0, 0)
    # the frame being calibrated elsewhere finishes whole; the next pass counts it and ends the job
    move_product(live, ProductState.written)
    s.flush()
    report = _pass(s, InFlight())
    s.refresh(job)
    assert (job.state, job.done, job.cancelled, job.total) == (JobState.cancelled, 1, 2, 3)
    assert not [t for t in sent["tasks"] if t[0] == TaskName.detect_events], "a cancelled job detects nothing"
    assert s.scalar(select(func.count()).select_from(JobFollowUp).where(JobFollowUp.job_id == job.id)) == 0


def test_a_second_finish_queues_the_follow_ups_again(db_session):
    from backend.models import FollowUpState
    from backend.state import settle_follow_up
    from backend.services.job_plan import finish_job as _finish

    s = db_session
    job, (p,) = _job(s, [ProductState.failed], channel="SDI")
    job.failed = 1
    _finish(s, job)
    rows = list(s.scalars(select(JobFollowUp).where(JobFollowUp.job_id == job.id)))
    assert rows and job.state == JobState.failed
    for r in rows:
        settle_follow_up(r, FollowUpState.done, events=2)
        r.sent_at, r.deliveries = NOW, 1
    move_job(job, JobState.running, retry=True)
    _finish(s, job)
    s.flush()
    again = list(s.scalars(select(JobFollowUp).where(JobFollowUp.job_id == job.id)))
    assert len(again) == len(rows)
    assert {(r.state, r.sent_at, r.deliveries, r.events) for r in again} == {(FollowUpState.queued, None, 0, None)}
