"""The reconciler: nothing stays unfinished for ever.

Messages are delivered at least once and may be lost (Redis flushed or restarted without
persistence, a worker killed while it held them, the embedded broker's file taken by a
worker that then died). The database says what work there is; the broker is only the way
it travels. Every ``RECONCILE_INTERVAL_S`` (default 30 s) one pass of :func:`reconcile_once`
compares the two and repairs:

1. **counts**: a pending item of a running job whose product is written or failed (its
   progress message was lost) is settled;
2. **lost calibrations**: a product of a running job still ``planned`` whose message is
   neither queued nor recently delivered (:func:`backend.broker.in_flight`), and sent more
   than a grace ago, is sent again; a ``writing`` product whose claim is dead (the process
   on this host is gone) or older than its lease (``Settings.lease_s``: the hard time
   limit plus a margin) is taken back and sent again, or failed with the reason once it
   has started ``MAX_DELIVERIES`` times (a poison frame stops); a product that only jobs
   asked to cancel wait on is never re-sent: it fails with
   :func:`backend.state.cancel_reason` and its items settle ``cancelled``
   (:mod:`backend.services.job_control`);
3. **queues nobody consumes**: a product ``planned`` for ``STALE_AFTER_S`` whose queue saw
   no calibration start or finish in that time fails with the reason (a GPU job and no GPU
   worker);
4. **lost plans**: a ``queued`` job whose plan message is gone is sent again (a job whose
   plan message was delivered ``MAX_DELIVERIES`` times without a plan fails);
5. **lost follow-ups**: a queued follow-up detection of an ended job whose message is gone
   is sent again;
6. **ends**: a running job whose items are all settled ends, its counts recomputed from
   its items (a job asked to cancel ends ``cancelled``);
7. **partial files**: temporary files of writers on this host that are gone (killed
   mid-write) are removed from the store's ``.tmp/``; **placed objects**
   (:mod:`backend.worker.placements`): a file or object that a calibration attempt recorded
   before placing it and whose row never committed (the writer was killed, passed its soft
   time limit or ran out of disk between placing and committing) is removed once that
   attempt's claim is no longer live (taken back, claimed again, written or failed by
   another, or past its lease), unless its product row names it; the records of such an
   attempt are deleted once they are older than the lease;
8. **lost movies** (:mod:`backend.worker.movies`): a ``queued`` movie whose ``make_movie``
   message is gone, sent more than a grace ago, and a ``running`` one whose claim is dead or
   past its lease and whose message is gone, are sent again; one delivered
   ``MAX_DELIVERIES`` times without finishing fails with the reason;
9. **lost re-runs** (:mod:`backend.worker.rerun`): a pending frame of a ``rerun`` job whose
   ``rerun_frame`` message is gone and whose claim is dead or past its lease is sent again.
10. **storage faults** (:mod:`backend.worker.storage_faults`): a ``planned`` product of a
   lane paused by a storage fault is not re-sent before the lane's ``retry_at``, then one per
   pass (it tries the store; the others wait for its outcome); it is never failed as
   "unconsumed". Once the fault has lasted ``STORAGE_FAULT_BOUND_S`` they are all re-sent and
   fail with the fault's reason if it persists;
11. **workers**: heartbeat rows (``worker_heartbeats``) not renewed for a day are removed;
12. **notifications** (:func:`backend.worker.notify.reconcile_notifications`): saved searches
   are evaluated for new matches, and webhook deliveries whose message was lost are sent
   again.

Every repair is idempotent (the tasks claim their work, :mod:`backend.state`), so a pass
that races a worker, or two reconcilers at once, at worst sends a message that does
nothing. On PostgreSQL one pass runs at a time across all workers (an advisory lock).

Bound: after a fault, with a worker running, a job settles within about
``3 x RECONCILE_INTERVAL_S`` plus the frames' calibration time when a worker on any host died,
froze or was cut off (its heartbeat, :mod:`backend.identity`, is stale after one interval;
the next pass takes its claims back), ``2 x RECONCILE_INTERVAL_S`` plus the calibration time
after a lost message, and ``lease_s + 2 x RECONCILE_INTERVAL_S`` for a worker that keeps
beating but never finishes. Defaults: 90 s, 60 s and 960 s + 60 s. Times are the database's
(:mod:`backend.clock`), so a host whose clock is off judges no lease wrong.

Started by ``lstdp worker`` (a child process, started again within one interval when it dies:
``backend.cli.ReconcilerSupervisor``; ``--no-reconciler`` to leave it out), so the
demo and every compose worker run one; ``lstdp reconcile [--once]`` runs it on its own.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine, delete, select, text
from sqlalchemy.orm import Session

from backend.clock import db_now
from backend.broker import InFlight, TaskName, in_flight, send, send_calibration  # noqa: F401 - re-exported
from backend.models import (FollowUpState, ItemOutcome, Job, JobFollowUp, JobItem, JobState, LaneFault, Product,
                            ProductState, WorkerHeartbeat)
from backend.settings import Settings, get_settings
from backend.state import (cancel_reason, cancelling_waiter, claim_is_dead, confirm_claim, give_up_reason, move_job,
                           move_product, settle_follow_up)
from backend.services.job_plan import count_item, lock_job, recount_job
from backend.worker.notify import reconcile_notifications
from backend.worker.placements import sweep_placements
from backend.worker.storage_faults import outlasted_reason
from pipelines.calibration import as_options
from pipelines.errors import DataError
from pipelines.tmpfiles import sweep_dead_writers

log = logging.getLogger(__name__)

__all__ = ["ReconcileReport", "reconcile_once", "run_forever", "send_calibration", "send_follow_ups",
           "STALE_AFTER_S", "grace_s"]

#: A product ``planned`` this long [s] while no calibration of its queue started or finished
#: is failed: no worker consumes that queue. A full-size frame calibrates in tens of
#: seconds (benchmarks/calibrate.py), so 30 min is a wide margin for a busy queue.
STALE_AFTER_S = 1800.0

#: PostgreSQL advisory lock key of a reconcile pass (any constant: "LSTR").
ADVISORY_KEY = 0x4C535452


def grace_s(settings: Settings) -> float:
    """How long [s] after it was sent a message may be missing from the broker before it is
    taken as lost: one reconcile interval, at least 10 s (a sender commits ``sent_at``
    before it publishes, and a worker takes a message from the queue a moment before it
    claims the product). One, not two: the pass that finds it lost comes up to another
    interval later, and the README's bound for a lost message is two intervals."""
    return max(10.0, settings.reconcile_interval_s)


@dataclass
class ReconcileReport:
    """What one pass repaired (JSON-ready through :meth:`as_dict`)."""

    settled: int = 0
    resent: list[int] = field(default_factory=list)
    taken_back: list[int] = field(default_factory=list)
    given_up: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    unconsumed: list[int] = field(default_factory=list)
    jobs_resent: list[str] = field(default_factory=list)
    jobs_failed: list[str] = field(default_factory=list)
    jobs_ended: list[str] = field(default_factory=list)
    follow_ups_resent: int = 0
    partial_files_removed: int = 0
    placed_removed: int = 0
    movies_resent: list[str] = field(default_factory=list)
    movies_failed: list[str] = field(default_factory=list)
    reruns_resent: list[str] = field(default_factory=list)
    notifications: dict = field(default_factory=dict)
    broker: str = "ok"
    skipped: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def changed(self) -> bool:
        return bool(self.settled or self.resent or self.taken_back or self.given_up or self.stopped or self.unconsumed
                    or self.jobs_resent or self.jobs_failed or self.jobs_ended or self.follow_ups_resent
                    or self.partial_files_removed or self.placed_removed or self.movies_resent or self.movies_failed
                    or self.reruns_resent or self.notifications)


def _aware(t: dt.datetime | None) -> dt.datetime | None:
    return t.replace(tzinfo=dt.UTC) if t is not None and t.tzinfo is None else t


def _queue_of(parameters: dict | None) -> str:
    try:
        return as_options((parameters or {}).get("options")).device
    except DataError:  # options no worker would take: its products wait on the default queue
        return "cpu"


def send_follow_ups(session: Session, job_id: str, *, only_unsent: bool = True) -> int:
    """Send the queued follow-up detections of ended job ``job_id`` (each keyed by
    (job, detector, channel), so a second message runs nothing); marks them sent and
    commits. Returns how many were sent."""
    job = session.get(Job, job_id)
    if job is None:
        return 0
    rows = list(session.scalars(select(JobFollowUp).where(JobFollowUp.job_id == job_id,
                                                         JobFollowUp.state == FollowUpState.queued)))
    if only_unsent:
        rows = [r for r in rows if r.sent_at is None]
    span = {"start": (job.parameters or {}).get("start"), "end": (job.parameters or {}).get("end")}
    for r in rows:
        r.sent_at = db_now(session)
    session.commit()
    for r in rows:
        send(TaskName.detect_events, kwargs={"detector": r.detector, "channel": r.channel, "job_id": job_id, **span})
    return len(rows)


def _settle_finished(session: Session, report: ReconcileReport, closed: list[str]) -> None:
    """Step 1: settle pending items of running jobs whose product has finished."""
    rows = session.execute(
        select(JobItem.job_id, JobItem.product_id).join(Job, Job.id == JobItem.job_id)
        .join(Product, Product.id == JobItem.product_id)
        .where(Job.state == JobState.running, JobItem.outcome == ItemOutcome.pending,
               Product.state.in_([ProductState.written, ProductState.failed]))).all()
    for job_id, product_id in rows:
        job, was_closed = count_item(session, job_id, product_id)
        session.commit()
        report.settled += 1
        if was_closed:
            closed.append(job_id)


def _claim_lost(session: Session, settings: Settings, prod: Product, now: dt.datetime, lease: dt.timedelta) -> bool:
    """Whether ``writing`` product ``prod``'s claim is past its lease or its holder is dead
    (its heartbeat stopped, :func:`backend.state.claim_is_dead`)."""
    claimed_at = _aware(prod.claimed_at)
    return claimed_at is None or claimed_at < now - lease or claim_is_dead(
        prod.claimed_by, session, now=now, timeout_s=settings.heartbeat_timeout_s)


def _lost_products(session: Session, settings: Settings, report: ReconcileReport, flight: InFlight | None,
                   now: dt.datetime, closed: list[str]) -> None:
    """Steps 2 and 3: products of running jobs whose work is lost."""
    lease = dt.timedelta(seconds=settings.lease_s)
    grace = dt.timedelta(seconds=grace_s(settings))
    stale = now - dt.timedelta(seconds=STALE_AFTER_S)
    waited_on = (select(JobItem.product_id).join(Job, Job.id == JobItem.job_id)
                 .where(Job.state == JobState.running, JobItem.outcome == ItemOutcome.pending))
    rows = list(session.scalars(
        select(Product).where(Product.id.in_(waited_on),
                              Product.state.in_([ProductState.planned, ProductState.writing]))
        .order_by(Product.id).execution_options(populate_existing=True)))
    busy_queues: set[str] | None = None
    faults = {f.lane: f for f in session.scalars(select(LaneFault).execution_options(populate_existing=True))}
    probing: set[str] = set()
    for prod in rows:
        queue = _queue_of(prod.parameters)
        if prod.state == ProductState.writing:
            if not _claim_lost(session, settings, prod, now, lease):
                continue
            # lock the row while it still holds the claim read (a holder that woke and wrote
            # it meanwhile keeps its product), and look again under the lock
            if not confirm_claim(session, prod.id, prod.attempts or 0, prod.claimed_by):
                session.rollback()
                continue
            session.refresh(prod)
            if not _claim_lost(session, settings, prod, now, lease):  # re-taken meanwhile (a retry of its task)
                session.rollback()
                continue
            stopper = cancelling_waiter(session, prod.id)
            if stopper is not None:  # its jobs were cancelled: not calibrated again
                move_product(prod, ProductState.failed, cancel_reason(stopper))
                report.stopped.append(prod.id)
            elif (prod.attempts or 0) >= settings.max_deliveries:
                move_product(prod, ProductState.failed, give_up_reason(prod.attempts or 0))
                report.given_up.append(prod.id)
            else:
                move_product(prod, ProductState.planned)  # a later wake of the old holder writes nothing
                prod.sent_at = now
                report.taken_back.append(prod.id)
                session.commit()
                send_calibration(prod.id, prod.job_id, queue)
            session.commit()
            continue
        # planned
        stopper = cancelling_waiter(session, prod.id)
        if stopper is not None:  # only cancelled jobs wait on it: stop it, never re-send it
            held = session.scalar(select(Product).where(Product.id == prod.id, Product.state == ProductState.planned)
                                  .with_for_update(skip_locked=True).execution_options(populate_existing=True))
            if held is not None:
                move_product(held, ProductState.failed, cancel_reason(stopper))
                report.stopped.append(prod.id)
            session.commit()
            continue
        if flight is None:
            continue
        fault = faults.get(queue)
        if fault is not None and outlasted_reason(fault, settings, now) is None:
            # its lane is paused by a storage fault (backend.worker.storage_faults): nothing
            # is sent before retry_at, then one frame per pass tries the store
            if _aware(fault.retry_at) > now or queue in probing:
                continue
            probing.add(queue)
        sent_at = _aware(prod.sent_at) or _aware(prod.updated_at) or now
        if prod.id in flight.products:
            if fault is None and sent_at < stale and _aware(prod.updated_at) < stale:
                if busy_queues is None:
                    busy_queues = {_queue_of(p) for p in session.scalars(
                        select(Product.parameters).where(Product.updated_at >= stale,
                                                         Product.state != ProductState.planned))}
                if queue not in busy_queues:
                    move_product(prod, ProductState.failed,
                                 f"lost: planned for more than {STALE_AFTER_S / 60:.0f} min and no worker took "
                                 f"any work from queue '{queue}' meanwhile (no worker consumes it?)")
                    session.commit()
                    report.unconsumed.append(prod.id)
            continue
        if sent_at < now - grace:
            prod.sent_at = now
            session.commit()
            send_calibration(prod.id, prod.job_id, queue)
            report.resent.append(prod.id)
    if report.given_up or report.unconsumed or report.stopped:
        _settle_finished(session, report, closed)


def _lost_plans(session: Session, settings: Settings, report: ReconcileReport, flight: InFlight | None,
                now: dt.datetime) -> None:
    """Step 4: queued jobs whose plan message is gone."""
    if flight is None:
        return
    cutoff = now - dt.timedelta(seconds=grace_s(settings))
    for job in list(session.scalars(select(Job).where(Job.state == JobState.queued, Job.created_at < cutoff))):
        if job.id in flight.jobs:
            continue
        job = lock_job(session, job.id)
        if job is None or job.state != JobState.queued:
            session.commit()
            continue
        if (job.deliveries or 0) >= settings.max_deliveries:
            move_job(job, JobState.failed, f"planning did not finish after {job.deliveries} deliveries of its plan "
                                           "message (its worker died each time)")
            session.commit()
            report.jobs_failed.append(job.id)
            continue
        session.commit()
        send(TaskName.run_job, [job.id])
        report.jobs_resent.append(job.id)


def _lost_follow_ups(session: Session, settings: Settings, report: ReconcileReport, flight: InFlight | None,
                     now: dt.datetime) -> None:
    """Step 5: queued follow-up detections of ended jobs whose message is gone (or was never
    sent: the process that ended the job died before sending; taken as such only when the job
    ended more than the grace ago, :func:`grace_s`, as a sent message is)."""
    if flight is None:
        return
    cutoff = now - dt.timedelta(seconds=grace_s(settings))
    rows = list(session.scalars(select(JobFollowUp).where(JobFollowUp.state == FollowUpState.queued)))
    for r in rows:
        sent = _aware(r.sent_at)
        if (r.job_id, r.detector, r.channel) in flight.follow_ups or (sent is not None and sent >= cutoff):
            continue
        job = session.get(Job, r.job_id)
        if sent is None and job is not None and job.finished_at is not None and _aware(job.finished_at) >= cutoff:
            # never sent, and its job ended within the grace: the process that ended the job commits
            # the rows, then sends them (send_follow_ups); sent now, the detection went out twice
            continue
        if (r.deliveries or 0) >= settings.max_deliveries:
            settle_follow_up(r, FollowUpState.failed, reason=f"gave up after {r.deliveries} deliveries that "
                                                             "did not finish")
            session.commit()
            continue
        span = {"start": (job.parameters or {}).get("start"), "end": (job.parameters or {}).get("end")}
        r.sent_at = now
        session.commit()
        send(TaskName.detect_events, kwargs={"detector": r.detector, "channel": r.channel, "job_id": r.job_id, **span})
        report.follow_ups_resent += 1


def _lost_movies(session: Session, settings: Settings, report: ReconcileReport, flight: InFlight | None,
                 now: dt.datetime) -> None:
    """Step 8: movies whose ``make_movie`` message is gone (queued and sent more than a grace
    ago, or running under a dead or expired claim)."""
    from backend.models import Movie, MovieState
    from backend.state import move_movie
    from backend.worker.movies import claim_lost, movie_give_up_reason

    if flight is None:
        return
    cutoff = now - dt.timedelta(seconds=grace_s(settings))
    rows = list(session.scalars(select(Movie).where(Movie.state.in_([MovieState.queued, MovieState.running]))
                                .order_by(Movie.created_at)))
    for movie in rows:
        if movie.id in flight.movies:
            continue
        if movie.state == MovieState.queued:
            sent = _aware(movie.sent_at) or _aware(movie.created_at)
            if sent is not None and sent >= cutoff:
                continue
        elif not claim_lost(movie, now, settings.lease_s):
            continue
        session.refresh(movie, with_for_update=True)  # look again under the row lock
        if movie.state not in (MovieState.queued, MovieState.running) or (
                movie.state == MovieState.running and not claim_lost(movie, now, settings.lease_s)):
            session.commit()
            continue
        if (movie.deliveries or 0) >= settings.max_deliveries:
            move_movie(movie, MovieState.failed, movie_give_up_reason(movie.deliveries or 0))
            session.commit()
            report.movies_failed.append(movie.id)
            continue
        movie.sent_at = now
        session.commit()
        send(TaskName.make_movie, [movie.id])
        report.movies_resent.append(movie.id)


def _lost_reruns(session: Session, settings: Settings, report: ReconcileReport, flight: InFlight | None,
                 now: dt.datetime, closed: list[str]) -> None:
    """Step 9: frames of ``rerun`` jobs whose message is lost (:func:`backend.worker.rerun.resend_lost_reruns`)."""
    from backend.worker.rerun import resend_lost_reruns

    resent, ended = resend_lost_reruns(session, settings, flight, now, grace_s(settings))
    report.reruns_resent.extend(f"{j}:{f}" for j, f in resent)
    closed.extend(ended)
    report.jobs_ended.extend(ended)


def _end_settled(session: Session, report: ReconcileReport, closed: list[str]) -> None:
    """Step 6: running jobs with every item settled end; counts are recomputed from items."""
    for job_id in list(session.scalars(select(Job.id).where(Job.state == JobState.running))):
        job = lock_job(session, job_id)
        if job is not None and job.state == JobState.running and recount_job(session, job):
            closed.append(job_id)
            report.jobs_ended.append(job_id)
        session.commit()


def reconcile_once(session: Session, settings: Settings | None = None, *, now: dt.datetime | None = None,
                   flight: InFlight | None | bool = True) -> ReconcileReport:
    """One reconcile pass (see the module docstring); commits as it goes.

    Parameters
    ----------
    session : Session
    settings : Settings, optional
    now : datetime, optional
        The pass's clock (tests).
    flight : InFlight, None or True
        What the broker holds; ``True`` (default) reads it (:func:`backend.broker.in_flight`),
        ``None`` means unknown (steps that need it are skipped).

    Returns
    -------
    ReconcileReport
    """
    settings = settings or get_settings()
    report = ReconcileReport()
    bind = session.get_bind()
    lock_conn = None
    if isinstance(bind, Engine) and bind.dialect.name == "postgresql":
        # a connection of its own holds the lock for the pass (the session's connections
        # go back to the pool at each commit)
        lock_conn = bind.connect()
        if not lock_conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY}):
            lock_conn.close()
            report.skipped = True
            return report
        lock_conn.commit()
    try:
        now = now or db_now(session)  # the database's clock: a reconciler whose host clock is off judges no lease wrong
        closed: list[str] = []
        _settle_finished(session, report, closed)
        # read the broker after the database: a message taken meanwhile is at worst sent twice
        if flight is True:
            # a delivery unacknowledged for longer than the broker's visibility timeout is one
            # the broker itself would deliver again (its worker is taken as gone), and none
            # lives longer than a lease: a message delivered to a worker killed before it
            # claimed the product is re-sent then, not only after the lease
            flight = in_flight(unacked_within_s=min(settings.lease_s, settings.broker_visibility_timeout_s),
                               settings=settings)
        if flight is None:
            report.broker = "unreadable"
        _lost_products(session, settings, report, flight, now, closed)
        _lost_plans(session, settings, report, flight, now)
        _lost_reruns(session, settings, report, flight, now, closed)
        _end_settled(session, report, closed)
        for job_id in closed:
            report.follow_ups_resent += send_follow_ups(session, job_id)
        _lost_follow_ups(session, settings, report, flight, now)
        _lost_movies(session, settings, report, flight, now)
        report.notifications = reconcile_notifications(session, settings, now, grace_s(settings))  # step 12
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.heartbeat_at < now - dt.timedelta(days=1))
                        .execution_options(synchronize_session=False))  # step 11
        session.commit()
        # step 7: what writers that stopped between placing and committing left (after step 2,
        # which takes their claims back: the same pass settles them)
        report.placed_removed = len(sweep_placements(session, settings, now=now))
        report.partial_files_removed = len(sweep_dead_writers(settings.products))
    finally:
        if lock_conn is not None:
            try:
                lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
                lock_conn.commit()
            except Exception:  # noqa: BLE001 - the lock goes with the connection anyway
                pass
            finally:
                lock_conn.close()
    return report


def run_forever(settings: Settings | None = None, *, parent_pid: int | None = None) -> None:
    """Run :func:`reconcile_once` every ``RECONCILE_INTERVAL_S`` until killed, or until
    process ``parent_pid`` (the worker that started this one) is gone. A failed pass (the
    database down) is logged and the next one runs on time."""
    from backend.db import session_scope

    settings = settings or get_settings()
    log.info("reconciler: every %.0f s (lease %.0f s, %d deliveries at most)", settings.reconcile_interval_s,
             settings.lease_s, settings.max_deliveries)
    while True:
        if parent_pid is not None and os.getppid() != parent_pid:
            log.info("reconciler: the worker that started it is gone; stopping")
            return
        t0 = time.monotonic()
        try:
            with session_scope() as s:
                report = reconcile_once(s, settings)
            if report.changed():
                said = {k: v for k, v in report.as_dict().items() if v and k != "broker"}
                # settling items whose progress message is merely still queued is routine
                log.log(logging.INFO if set(said) == {"settled"} else logging.WARNING, "reconciler: %s", said)
        except Exception:  # noqa: BLE001 - the next pass tries again
            log.exception("reconciler: pass failed")
        time.sleep(max(0.0, settings.reconcile_interval_s - (time.monotonic() - t0)))
