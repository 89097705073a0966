"""Issue 10: the database is the source of truth for progress; claims make redelivery
harmless; the reconciler leaves nothing unfinished for ever.

These tests drive the functions on rows (PostgreSQL ``db_session``, rolled back; SQLite for
the task paths). The fault suite (tests/faults) runs the same machinery with real workers,
kills and frozen servers.
"""

from __future__ import annotations

import datetime as dt
import os
import socket

import pytest
from sqlalchemy import select

from backend.broker import InFlight, TaskName
from backend.models import (FollowUpState, Frame, ItemOutcome, Job, JobFollowUp, JobItem, JobState, Product,
                            ProductState)
from backend.settings import Settings
from backend.state import Claim, claim_product, confirm_claim, move_product
from backend.worker import reconcile
from backend.worker.processing import count_item

NOW = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
SETTINGS = Settings(TASK_TIME_LIMIT_S=100, TASK_SOFT_TIME_LIMIT_S=90, RECONCILE_INTERVAL_S=5, MAX_DELIVERIES=3)


def _job(s, states, *, channel="WST", device="cpu", job_state=JobState.running, ago_s=0.0, attempts=0,
         claimed_by=None):
    """A job over one frame per entry of ``states``, each with a product in that state and a
    pending item."""
    job = Job(parameters={"channels": [channel], "start": NOW.isoformat(), "end": NOW.isoformat()},
              state=job_state, total=len(states), done=0, failed=0, skipped=0)
    s.add(job)
    s.flush()
    when = NOW - dt.timedelta(seconds=ago_s)
    prods = []
    for i, state in enumerate(states):
        f = Frame(channel_code=channel, date_obs=NOW, exposure_s=1.0, naxis1=8, naxis2=8, path=f"/x/{job.id}/{i}",
                  original_name=f"{i}.fits", sha256=f"{job.id[:8]}{i:056d}", size_bytes=1, header={})
        s.add(f)
        s.flush()
        p = Product(frame_id=f.id, calibration_key="k", params_hash=f"h{device}", software_version="t", state=state,
                    job_id=job.id, error="bad frame" if state == ProductState.failed else None,
                    parameters={"options": {"device": device}}, attempts=attempts, sent_at=when, updated_at=when,
                    claimed_at=when if state == ProductState.writing else None,
                    claimed_by=claimed_by if state == ProductState.writing else None)
        s.add(p)
        s.flush()
        s.add(JobItem(job_id=job.id, frame_id=f.id, product_id=p.id, outcome=ItemOutcome.pending))
        prods.append(p)
    s.flush()
    return job, prods


@pytest.fixture
def sent(monkeypatch):
    """What the reconciler sends, by kind, instead of the broker."""
    out = {"calibrations": [], "tasks": []}
    monkeypatch.setattr(reconcile, "send_calibration", lambda pid, job_id, queue="cpu":
                        out["calibrations"].append((pid, job_id, queue)))
    monkeypatch.setattr(reconcile, "send", lambda name, args=None, kwargs=None, queue="cpu":
                        out["tasks"].append((name, list(args or []), dict(kwargs or {}))))
    return out


def _pass(s, flight=None, now=NOW):
    return reconcile.reconcile_once(s, SETTINGS, now=now, flight=InFlight() if flight is None else flight)


# ----------------------------------------------------------------------------------- counts
pytestmark = pytest.mark.postgres


def test_items_settle_once_and_exactly_one_call_ends_the_job(db_session):
    s = db_session
    job, (p0, p1, p2) = _job(s, [ProductState.written, ProductState.failed, ProductState.planned])
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
    outcomes = sorted(i.outcome.value for i in s.scalars(select(JobItem).where(JobItem.job_id == job.id)))
    assert outcomes == ["done", "done", "failed"]
    # the job's follow-ups were recorded once, in the transaction that ended it
    assert [(f.detector, f.channel) for f in s.scalars(select(JobFollowUp).where(JobFollowUp.job_id == job.id))] \
        == [("white-light", "WST")]


def test_two_jobs_waiting_on_one_product_each_count_it_once(db_session):
    """counted_for_job held one job: a product re-planned by a second job was counted twice
    for the first. Each job has its own item now."""
    s = db_session
    a, (p,) = _job(s, [ProductState.written])
    b = Job(parameters=dict(a.parameters), state=JobState.running, total=1, done=0, failed=0, skipped=0)
    s.add(b)
    s.flush()
    s.add(JobItem(job_id=b.id, frame_id=p.frame_id, product_id=p.id, outcome=ItemOutcome.pending))
    s.flush()
    for _ in range(2):
        for j in (a, b, a):
            count_item(s, j.id, p.id)
    for j in (a, b):
        s.refresh(j)
        assert (j.done, j.total, j.state) == (1, 1, JobState.succeeded)


# ----------------------------------------------------------------------------------- claims
def test_a_claim_is_taken_once_and_a_dead_or_expired_one_is_taken_back(db_session):
    s = db_session
    _, (p,) = _job(s, [ProductState.planned])
    kw = dict(lease_s=100, max_deliveries=3, now=NOW)
    first = claim_product(s, p.id, holder="elsewhere:1", **kw)
    assert first == Claim("claimed", 1)
    assert claim_product(s, p.id, holder="elsewhere:2", **kw).status == "busy"  # a live claim holds it
    # the holder's lease passed (another host: its pid cannot be checked here)
    later = NOW + dt.timedelta(seconds=101)
    second = claim_product(s, p.id, holder="elsewhere:2", lease_s=100, max_deliveries=3, now=later)
    assert second == Claim("claimed", 2)
    assert not confirm_claim(s, p.id, 1)  # the first holder, woken up, may not write
    assert confirm_claim(s, p.id, 2)
    # a holder on this host whose process is gone is dead at once, lease or not
    dead = f"{socket.gethostname()}:{_dead_pid()}"
    s.refresh(p)
    p.claimed_by = dead
    s.flush()
    assert claim_product(s, p.id, holder="elsewhere:3", **kw) == Claim("claimed", 3)
    # the limit: three starts without a finish, the next delivery fails it with the reason
    s.refresh(p)
    p.claimed_by = dead
    s.flush()
    assert claim_product(s, p.id, holder="elsewhere:4", **kw).status == "exhausted"
    s.refresh(p)
    assert p.state == ProductState.failed and "gave up after 3 deliveries" in p.error
    assert claim_product(s, p.id, holder="elsewhere:5", **kw).status == "finished"


def test_this_process_retaking_its_own_claim_is_the_same_attempt(db_session):
    """A task retried after a database fault takes its own claim again: not a new start."""
    s = db_session
    _, (p,) = _job(s, [ProductState.planned])
    kw = dict(lease_s=100, max_deliveries=1, now=NOW)
    assert claim_product(s, p.id, **kw) == Claim("claimed", 1)
    assert claim_product(s, p.id, **kw) == Claim("claimed", 1)


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


# ------------------------------------------------------------------------------- reconciler
def test_written_products_never_counted_are_settled_and_the_job_ends(db_session, sent):
    """A progress message lost (Redis flushed after the product was written)."""
    s = db_session
    job, _ = _job(s, [ProductState.written, ProductState.written])
    report = _pass(s)
    s.refresh(job)
    assert report.settled == 2 and job.state == JobState.succeeded and (job.done, job.total) == (2, 2)
    # its follow-up detection was sent, keyed by the job, once
    follow = [t for t in sent["tasks"] if t[0] == TaskName.detect_events]
    assert [t[2]["job_id"] for t in follow] == [job.id]
    assert _pass(s).settled == 0 and len([t for t in sent["tasks"] if t[0] == TaskName.detect_events]) == 1


def test_planned_work_whose_message_is_gone_is_sent_again(db_session, sent):
    s = db_session
    job, (lost, queued, fresh) = _job(s, [ProductState.planned] * 3, ago_s=60)
    fresh.sent_at = NOW - dt.timedelta(seconds=2)  # just sent: a worker may hold it
    s.flush()
    report = _pass(s, InFlight(products={queued.id}))
    assert report.resent == [lost.id]
    assert sent["calibrations"] == [(lost.id, job.id, "cpu")]
    s.refresh(lost)
    assert lost.sent_at == NOW  # not again before the grace passes
    assert _pass(s, InFlight(products={queued.id}), now=NOW + dt.timedelta(seconds=3)).resent == []
    assert sorted(_pass(s, InFlight(products={queued.id}), now=NOW + dt.timedelta(seconds=20)).resent) \
        == sorted([lost.id, fresh.id])
    # a broker that cannot be read: nothing is re-sent on a guess
    n = len(sent["calibrations"])
    reconcile.reconcile_once(s, SETTINGS, now=NOW + dt.timedelta(hours=1), flight=None)
    assert len(sent["calibrations"]) == n


def test_a_dead_claim_is_taken_back_and_a_poison_frame_fails_after_the_limit(db_session, sent):
    s = db_session
    dead = f"{socket.gethostname()}:{_dead_pid()}"
    job, (p,) = _job(s, [ProductState.writing], ago_s=5, attempts=1, claimed_by=dead)
    report = _pass(s)
    s.refresh(p)
    assert report.taken_back == [p.id] and p.state == ProductState.planned
    assert sent["calibrations"] == [(p.id, job.id, "cpu")]
    # the same again until the limit: then failed with the reason, counted, the job ends
    for attempt in (2, 3):
        move_product(p, ProductState.writing)
        p.attempts, p.claimed_by, p.claimed_at = attempt, dead, NOW
        s.flush()
        report = _pass(s)
    s.refresh(p)
    s.refresh(job)
    assert report.given_up == [p.id] and p.state == ProductState.failed
    assert "gave up after 3 deliveries" in p.error
    assert job.state == JobState.failed and (job.failed, job.total) == (1, 1) and "gave up" in job.error


def test_a_live_claim_on_another_host_waits_for_its_lease(db_session, sent):
    s = db_session
    _, (p,) = _job(s, [ProductState.writing], ago_s=50, attempts=1, claimed_by="another-host:1")
    assert _pass(s).taken_back == []
    assert _pass(s, now=NOW + dt.timedelta(seconds=SETTINGS.lease_s)).taken_back == [p.id]


def test_a_queue_nobody_consumes_fails_its_products_with_the_reason(db_session, sent):
    s = db_session
    _, (gpu,) = _job(s, [ProductState.planned], device="gpu", ago_s=reconcile.STALE_AFTER_S + 60)
    _, (cpu,) = _job(s, [ProductState.planned], device="cpu", ago_s=reconcile.STALE_AFTER_S + 60)
    _, (busy,) = _job(s, [ProductState.written], device="cpu", ago_s=30)  # the cpu queue is working
    report = _pass(s, InFlight(products={gpu.id, cpu.id}))
    assert report.unconsumed == [gpu.id]
    s.refresh(gpu)
    assert "queue 'gpu'" in gpu.error and s.get(Product, cpu.id).state == ProductState.planned


def test_a_queued_job_whose_plan_message_is_gone_is_sent_again_then_given_up(db_session, sent):
    s = db_session
    job = Job(parameters={"channels": ["SDI"]}, state=JobState.queued, created_at=NOW - dt.timedelta(minutes=5))
    waiting = Job(parameters={"channels": ["SDI"]}, state=JobState.queued, created_at=NOW - dt.timedelta(minutes=5))
    s.add_all([job, waiting])
    s.flush()
    report = _pass(s, InFlight(jobs={waiting.id}))
    assert report.jobs_resent == [job.id] and sent["tasks"] == [(TaskName.run_job, [job.id], {})]
    job.deliveries = SETTINGS.max_deliveries
    s.flush()
    report = _pass(s, InFlight(jobs={waiting.id}))
    s.refresh(job)
    assert report.jobs_failed == [job.id] and job.state == JobState.failed and "deliveries" in job.error


def test_a_follow_up_not_yet_sent_by_the_process_that_ended_its_job_is_left_to_it(db_session, sent):
    """The process that ends a job commits its follow-ups (``sent_at`` NULL), then sends them. A
    reconcile pass between the two sent the detection too (CI: the fault suite's frozen-database
    case counted the white-light follow-up queued twice). Within the grace after the job ended
    it is that process's to send; after it, one never sent is lost and sent."""
    s = db_session
    job, _ = _job(s, [ProductState.written], job_state=JobState.succeeded)
    job.finished_at = NOW - dt.timedelta(seconds=1)
    s.add(JobFollowUp(job_id=job.id, detector="white-light", channel="WST", state=FollowUpState.queued))
    s.flush()
    assert _pass(s).follow_ups_resent == 0 and sent["tasks"] == []
    job.finished_at = NOW - dt.timedelta(seconds=reconcile.grace_s(SETTINGS) + 1)
    s.flush()
    assert _pass(s).follow_ups_resent == 1
    (name, _, kwargs), = sent["tasks"]
    assert name == TaskName.detect_events and kwargs["detector"] == "white-light"


def test_follow_ups_whose_message_is_gone_are_sent_again(db_session, sent):
    s = db_session
    job, _ = _job(s, [ProductState.written], job_state=JobState.succeeded)
    s.add(JobFollowUp(job_id=job.id, detector="white-light", channel="WST", state=FollowUpState.queued,
                      sent_at=NOW - dt.timedelta(minutes=5)))
    s.add(JobFollowUp(job_id=job.id, detector="flares", channel="SDI", state=FollowUpState.done,
                      sent_at=NOW - dt.timedelta(minutes=5)))
    s.flush()
    assert _pass(s, InFlight(follow_ups={(job.id, "white-light", "WST")})).follow_ups_resent == 0
    assert _pass(s).follow_ups_resent == 1
    (name, _, kwargs), = sent["tasks"]
    assert name == TaskName.detect_events and (kwargs["job_id"], kwargs["detector"]) == (job.id, "white-light")


def test_counts_are_repaired_from_the_items(db_session, sent):
    s = db_session
    job, (p,) = _job(s, [ProductState.planned])
    s.execute(JobItem.__table__.update().where(JobItem.job_id == job.id).values(outcome=ItemOutcome.done))
    job.done = 7  # drifted
    s.flush()
    report = _pass(s, InFlight(products={p.id}))
    s.refresh(job)
    assert report.jobs_ended == [job.id] and (job.done, job.total, job.state) == (1, 1, JobState.succeeded)


# ------------------------------------------------------------------------------ the broker
def test_in_flight_reads_the_embedded_brokers_messages(sqlite_env):
    from backend.broker import ensure_configured, in_flight, send
    from backend.worker.reconcile import send_calibration

    ensure_configured()
    send_calibration(41, "job-a")
    send(TaskName.run_job, ["job-b"])
    send(TaskName.detect_events, kwargs={"detector": "flares", "channel": "SDI", "job_id": "job-a"})
    send(TaskName.calibrate_products_gpu_batch, ["job-a", [7, 8]], queue="gpu")
    flight = in_flight(unacked_within_s=60)
    assert flight.products == {41, 7, 8} and flight.jobs == {"job-b"}
    assert flight.follow_ups == {("job-a", "flares", "SDI")} and flight.messages == 4


@pytest.mark.redis
def test_in_flight_reads_redis_queues_and_recent_unacknowledged_deliveries(settings_env):
    """A message a worker took and has not acknowledged is in flight while it is recent; one
    delivered longer ago than the window (its worker taken as dead) is not."""
    import time

    from kombu import Connection

    from tests.conftest import REDIS_URL

    base = REDIS_URL.rsplit("/", 1)[0]
    settings_env(CELERY_BROKER_URL=f"{base}/13", CELERY_RESULT_BACKEND=f"{base}/13")
    from backend.broker import app, ensure_configured, in_flight, send

    ensure_configured()
    with Connection(f"{base}/13") as c:
        c.default_channel.client.flushdb()
    send(TaskName.run_job, ["job-q"])
    send(TaskName.calibrate_product, [5])
    # a consumer takes the calibration without acknowledging it (as a worker with acks_late)
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue("cpu", no_ack=False)
        taken = [queue.get(timeout=2) for _ in range(2)]
        time.sleep(0.05)
        flight = in_flight(unacked_within_s=60)
        assert flight.jobs == {"job-q"} and flight.products == {5}
        assert in_flight(unacked_within_s=0.01).products == set()
        for m in taken:
            m.ack()
        queue.close()


@pytest.mark.redis
def test_a_delivery_older_than_the_visibility_timeout_is_sent_again_before_the_lease(db_session, settings_env, sent):
    """A worker killed after taking a calibration and before claiming its product leaves the
    message unacknowledged and the product ``planned``. Once the delivery is older than the
    broker's visibility timeout (the broker's own word that its worker is gone) the reconciler
    sends it again, not only after the lease (``TASK_TIME_LIMIT_S`` + 60 s: 160 s here, 16 min
    by default).

    The visibility timeout is 5 s: the first pass must read the delivery as younger than it,
    and the time from ``queue.get`` to that pass's broker read (a database pass, a new Redis
    connection) is the machine's; a 1 s timeout left a loaded machine less than that."""
    import time

    from kombu import Connection

    from tests.conftest import REDIS_URL

    VISIBILITY_S = 5.0  # noqa: N806 - a constant of this test
    base = REDIS_URL.rsplit("/", 1)[0]
    settings = settings_env(CELERY_BROKER_URL=f"{base}/13", CELERY_RESULT_BACKEND=f"{base}/13",
                            TASK_TIME_LIMIT_S="100", TASK_SOFT_TIME_LIMIT_S="90",
                            BROKER_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S))
    from backend.broker import app, ensure_configured, send

    ensure_configured()
    with Connection(f"{base}/13") as c:
        c.default_channel.client.flushdb()
    s = db_session
    job, (p,) = _job(s, [ProductState.planned], ago_s=60)
    send(TaskName.calibrate_product, [p.id, job.id])
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue("cpu", no_ack=False)
        taken = queue.get(timeout=2)  # taken by a worker that is then killed: never acknowledged
        taken_at = time.monotonic()
        try:
            report = reconcile.reconcile_once(s, settings, now=NOW, flight=True)
            assert time.monotonic() - taken_at < VISIBILITY_S, "the first pass came too late to see it in flight"
            assert report.resent == [] and sent["calibrations"] == []  # delivered a moment ago: in flight
            time.sleep(max(0.0, VISIBILITY_S + 0.2 - (time.monotonic() - taken_at)))
            report = reconcile.reconcile_once(s, settings, now=NOW, flight=True)
            assert report.resent == [p.id] and sent["calibrations"] == [(p.id, job.id, "cpu")]
        finally:
            taken.ack()
            queue.close()


def test_follow_ups_are_sent_once_however_often_the_last_message_comes(sqlite_env, sent):
    """88 redundant detection runs for one job: every late progress message queued them."""
    from backend.db import session_scope
    from backend.worker import tasks

    with session_scope() as s:
        job, prods = _job(s, [ProductState.written, ProductState.written])
        job_id, ids = job.id, [p.id for p in prods]
    for pid in ids + ids + ids:  # every message delivered three times
        tasks.record_progress.run(job_id, pid)
    follow = [t for t in sent["tasks"] if t[0] == TaskName.detect_events]
    assert [(k["detector"], k["channel"], k["job_id"]) for _, _, k in follow] == [("white-light", "WST", job_id)]
    with session_scope() as s:
        j = s.get(Job, job_id)
        assert (j.done, j.failed, j.total, j.state.value) == (2, 0, 2, "succeeded")
        assert reconcile.reconcile_once(s, SETTINGS, flight=InFlight()).follow_ups_resent == 0  # sent just now


def test_a_follow_up_done_runs_nothing_again(sqlite_env, monkeypatch):
    from backend.db import session_scope
    from backend.worker import tasks

    runs = []
    monkeypatch.setattr(tasks, "run_detector", lambda s, name, **kw: runs.append(name) or [])
    with session_scope() as s:
        job, _ = _job(s, [ProductState.written], job_state=JobState.succeeded)
        s.add(JobFollowUp(job_id=job.id, detector="white-light", channel="WST", state=FollowUpState.queued))
        job_id = job.id
    for _ in range(3):  # redelivered, or re-sent by the reconciler
        tasks.detect_events.run("white-light", "WST", None, None, job_id=job_id)
    assert runs == ["white-light"]
    with session_scope() as s:
        row = s.get(JobFollowUp, (job_id, "white-light", "WST"))
        assert (row.state, row.deliveries, row.events) == (FollowUpState.done, 1, 0)


def test_a_retried_task_retakes_its_claim_but_a_redelivery_after_a_crash_is_a_new_attempt(db_session):
    """A retry (database fault) keeps the task id and adds one to its try number; a message
    redelivered after its worker died keeps both."""
    from backend.state import this_process

    s = db_session
    _, (p,) = _job(s, [ProductState.planned])
    kw = dict(lease_s=100, max_deliveries=3, now=NOW)
    first = this_process("task-1", 0).replace(socket.gethostname(), "other-host")
    assert claim_product(s, p.id, holder=first, **kw) == Claim("claimed", 1)
    retry = first.replace("try=0", "try=1")  # in another process, on another host
    assert claim_product(s, p.id, holder=retry, **kw) == Claim("claimed", 1)
    redelivered = retry.replace("other-host", "third-host")  # same id, same try: a live claim
    assert claim_product(s, p.id, holder=redelivered, **kw).status == "busy"


def test_a_frozen_holder_that_writes_while_the_reconciler_takes_its_claim_back_keeps_its_product(
        sqlite_env, sent, monkeypatch):
    """The holder's lease passed (frozen worker on another host) and it wakes: it confirms its
    claim and commits ``written`` between the reconciler's read of the product and its
    take-back. The take-back must not move the written product back to ``planned`` (a
    second calibration would write the same file again) nor fail it."""
    from backend.db import get_sessionmaker, session_scope

    with session_scope() as s:
        job, (p,) = _job(s, [ProductState.writing], ago_s=SETTINGS.lease_s + 10, attempts=1,
                         claimed_by="another-host:1")
        job_id, pid = job.id, p.id
    real_queue_of = reconcile._queue_of
    woke = []

    def holder_wakes_and_writes(parameters):
        if not woke:
            woke.append(True)
            with get_sessionmaker()() as w:
                assert confirm_claim(w, pid, 1)
                prod = w.get(Product, pid)
                prod.path, prod.sha256 = "/store/p.fits", "0" * 64
                move_product(prod, ProductState.written)
                w.commit()
        return real_queue_of(parameters)

    monkeypatch.setattr(reconcile, "_queue_of", holder_wakes_and_writes)
    with session_scope() as s:
        report = _pass(s)
    with session_scope() as s:
        prod = s.get(Product, pid)
        assert (prod.state, prod.path) == (ProductState.written, "/store/p.fits"), report.as_dict()
        assert sent["calibrations"] == []  # nothing sent to calibrate it again
        _pass(s)
        job = s.get(Job, job_id)
        s.refresh(job)
        assert (job.state, job.done, job.failed) == (JobState.succeeded, 1, 0)


def test_a_delivery_past_the_limit_does_not_fail_a_product_its_woken_holder_just_wrote(sqlite_env, monkeypatch):
    """The third claim's holder froze past its lease; a fourth delivery reads the product
    (``writing``, 3 attempts: exhausted) and the holder wakes and writes it before the
    delivery fails it. The written product must stay written (its file is named by it)."""
    from backend import state
    from backend.db import get_sessionmaker, session_scope

    with session_scope() as s:
        _, (p,) = _job(s, [ProductState.writing], ago_s=SETTINGS.lease_s + 10, attempts=3,
                       claimed_by="another-host:1")
        pid = p.id
    real = state.is_retry_of
    woke = []

    def holder_wakes_and_writes(holder, claimed_by):
        if not woke:
            woke.append(True)
            with get_sessionmaker()() as w:
                assert confirm_claim(w, pid, 3)
                prod = w.get(Product, pid)
                prod.path, prod.sha256 = "/store/p.fits", "0" * 64
                move_product(prod, ProductState.written)
                w.commit()
        return real(holder, claimed_by)

    monkeypatch.setattr(state, "is_retry_of", holder_wakes_and_writes)
    with session_scope() as s:
        got = claim_product(s, pid, lease_s=SETTINGS.lease_s, max_deliveries=3, holder="third-host:9", now=NOW)
    with session_scope() as s:
        prod = s.get(Product, pid)
        assert (prod.state, prod.error) == (ProductState.written, None), got


def test_a_plan_retried_after_database_faults_is_not_given_up_as_a_crashing_delivery(sqlite_env, monkeypatch):
    """Planning raised a database fault (PostgreSQL restarting) on three tries of one
    delivery and the task retried it (``RETRY``): those tries did not kill their worker, so
    the job plans on the fourth instead of failing 'after 3 deliveries'."""
    from sqlalchemy.exc import OperationalError

    from backend.db import session_scope
    from backend.worker import tasks

    with session_scope() as s:
        job = Job(parameters={"channels": ["WST"], "start": NOW.isoformat(), "end": NOW.isoformat()},
                  state=JobState.queued)
        s.add(job)
        s.flush()
        job_id = job.id
    real, faults = tasks.plan_job, []

    def flaky(session, jid):
        if len(faults) < 3:
            faults.append(1)
            raise OperationalError("SELECT ...", {}, Exception("server closed the connection unexpectedly"))
        return real(session, jid)

    monkeypatch.setattr(tasks, "plan_job", flaky)
    monkeypatch.setattr(tasks, "send_follow_ups", lambda s, jid: 0)
    tasks.run_job.apply(args=[job_id])
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert len(faults) == 3 and job.state == JobState.succeeded, (job.state, job.error)
    # a delivery whose every try raises still counts once (its last try is not retried): a
    # plan that always fails this way ends after MAX_DELIVERIES re-sends instead of looping
    with session_scope() as s:
        job = Job(parameters={"channels": ["WST"], "start": NOW.isoformat(), "end": NOW.isoformat()},
                  state=JobState.queued)
        s.add(job)
        s.flush()
        job_id = job.id
    faults.clear()

    def always(session, jid):
        faults.append(1)
        raise OperationalError("SELECT ...", {}, Exception("canceling statement due to statement timeout"))
    monkeypatch.setattr(tasks, "plan_job", always)
    tasks.run_job.apply(args=[job_id])
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert (len(faults), job.deliveries, job.state) == (tasks.RETRY["max_retries"] + 1, 1, JobState.queued)


def test_a_frozen_holder_does_not_write_over_a_claim_of_the_same_number_after_a_re_plan(sqlite_env, tmp_path):
    """A failed product re-planned by a later job starts its attempts again from 0, so its
    next claim has the number of a claim an old, frozen holder still thinks it has. The old
    holder, woken, must not pass for the new one (write its file, or fail the product with
    its own reason, while the new holder calibrates)."""
    from backend.db import session_scope

    kw = dict(lease_s=SETTINGS.lease_s, max_deliveries=3)
    with session_scope() as s:
        _, (p,) = _job(s, [ProductState.planned])
        pid = p.id
    with session_scope() as s:
        assert claim_product(s, pid, holder="host-a:1 task=t1 try=0", now=NOW, **kw).attempt == 1  # froze
        later = NOW + dt.timedelta(seconds=SETTINGS.lease_s + 1)
        assert claim_product(s, pid, holder="host-b:2 task=t2 try=0", now=later, **kw).attempt == 2
        prod = s.get(Product, pid)
        move_product(prod, ProductState.failed, "master unreadable")
        # a later job re-plans it (plan_product): a clean slate
        move_product(prod, ProductState.planned)
        prod.attempts, prod.claimed_at, prod.claimed_by = 0, None, None
        s.commit()
        new = claim_product(s, pid, holder="host-c:3 task=t3 try=0", now=later, **kw)
        assert (new.attempt, new.holder) == (1, "host-c:3 task=t3 try=0")
    from backend.worker.processing import _fail_claimed

    with session_scope() as s:
        # the first holder wakes with its claim number 1 and fails (it passed the soft limit)
        _fail_claimed(s, pid, Claim("claimed", 1, "host-a:1 task=t1 try=0"), "passed the soft time limit")
        prod = s.get(Product, pid)
        assert (prod.state, prod.claimed_by) == (ProductState.writing, "host-c:3 task=t3 try=0")
        assert not confirm_claim(s, pid, 1, "host-a:1 task=t1 try=0")
        assert confirm_claim(s, pid, 1, new.holder)


def test_a_lost_calibration_is_sent_again_within_two_intervals_whatever_the_pass_phase(db_session, sent):
    """README: after a lost message a job settles within 2 x RECONCILE_INTERVAL_S plus the
    calibration time. Passes come every interval at a phase unrelated to the send: the
    resend must come at most two intervals after the lost send."""
    s = db_session
    settings = Settings(TASK_TIME_LIMIT_S=100, TASK_SOFT_TIME_LIMIT_S=90, RECONCILE_INTERVAL_S=30, MAX_DELIVERIES=3)
    interval = settings.reconcile_interval_s
    _job(s, [ProductState.planned], ago_s=0)  # sent (and lost) at NOW
    resent_at = None
    for k in range(1, 6):  # passes just before each multiple of the interval after the send
        t = NOW + dt.timedelta(seconds=k * interval - 0.1)
        if reconcile.reconcile_once(s, settings, now=t, flight=InFlight()).resent:
            resent_at = (t - NOW).total_seconds()
            break
    assert resent_at is not None and resent_at <= 2 * interval, resent_at


def test_a_claim_of_this_very_process_is_not_dead():
    """A ``threads`` pool runs several deliveries in one process: another task's claim made
    by this pid is live, not a crash to take over."""
    from backend.state import claim_is_dead, this_process

    assert not claim_is_dead(this_process("task-1", 0))
    assert claim_is_dead(f"{socket.gethostname()}:{_dead_pid()} task=t try=0")
    assert not claim_is_dead("another-host:1 task=t try=0")


def test_a_broken_gpu_batch_fails_its_own_products_not_those_another_delivery_holds(db_session):
    from backend.worker.gpu_batch import fail_unfinished

    s = db_session
    job, (waiting, mine, theirs) = _job(s, [ProductState.planned, ProductState.writing, ProductState.writing])
    mine.claimed_by, theirs.claimed_by = "gpu-host:1 task=b try=0", "gpu-host:2 task=c try=0"
    s.flush()
    report = fail_unfinished(s, [waiting.id, mine.id, theirs.id], job.id, "GPU batch failed: boom",
                             holder="gpu-host:1 task=b try=0")
    assert sorted(report.failed) == sorted([waiting.id, mine.id]) and report.skipped == [theirs.id]
    s.refresh(theirs)
    assert theirs.state == ProductState.writing
