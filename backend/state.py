"""The state machines, product, job and follow-up: the only place a state changes.

Product (one L2 file of one frame under one calibration set)::

    planned -> planned | writing | failed
    writing -> writing | written | failed | planned   (redelivered; re-planned by a new run)
    failed  -> planned | writing | written | failed   (re-planned; or its message ran after the
                                                        reaper gave it up: the file it then
                                                        wrote is sound; a new reason replaces
                                                        the old)
    written -> failed                                 (only ``lstdp fsck --repair``: its file is
                                                        missing on disk or differs from its SHA-256;
                                                        failed, the next job re-plans it)

Job (a recalibration request)::

    queued  -> running | failed | cancelled              (failed: could not be sent or planned)
    running -> running | succeeded | failed | cancelled  (running again: a redelivered plan message)
    failed, cancelled -> running                         (only a retry of its failed frames,
                                                          ``move_job(..., retry=True)``)
    succeeded -> (final: a late plan message for an ended job is not acted on,
                  ``backend.worker.processing.plan_job``)

:func:`move_product` and :func:`move_job` refuse any other move (:class:`IllegalTransition`)
and record the reason of a failure with one rule: the text as given (callers pass
:func:`pipelines.errors.failure_reason` of an exception: its first line), cut to
:data:`MAX_REASON_CHARS`. A product's reason is cleared when it goes back to work; a job
gets ``started_at`` when it starts running and ``finished_at`` when it ends. No other
module assigns ``.state`` (a test walks the code).

Claims (at-most-once effects for at-least-once delivery)
--------------------------------------------------------
A calibration message may be delivered twice (a killed worker's message is redelivered, a
visibility timeout passes, the reconciler re-sends one it found lost). Each delivery first
**claims** its product (:func:`claim_product`): one conditional ``UPDATE`` moves it
``planned -> writing`` (or takes back a ``writing`` claim whose lease expired or whose
process is gone), adds one to ``attempts`` and records who holds it. A delivery that finds
the product finished, or held by a live claim, does nothing. Before its row is marked
``written`` the holder confirms the claim is still its own (:func:`confirm_claim`, which also
takes the row's write lock for the rest of the transaction), so a worker that was frozen
past its lease cannot overwrite the work of the one that took the product over. After
``MAX_DELIVERIES`` claims without a finish the product fails with the reason (a poison frame
stops instead of killing workers for ever).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass, field

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from backend.models import (FollowUpState, ItemOutcome, Job, JobFollowUp, JobItem, JobState, Movie, MovieState,
                            Product, ProductState, utcnow)
from backend.clock import db_now
from backend.identity import beat, display, worker_id
from pipelines.tmpfiles import process_alive

__all__ = ["IllegalTransition", "MAX_REASON_CHARS", "PRODUCT_MOVES", "JOB_MOVES", "reason_text",
           "move_product", "move_job", "JOB_FINAL", "JOB_RETRY_MOVES", "Claim", "claim_product", "confirm_claim", "this_process",
           "claim_is_dead", "is_retry_of", "worker_of", "give_up_reason", "settle_follow_up", "requeue_follow_up", "MOVIE_MOVES",
           "MOVIE_FINAL", "move_movie", "CANCEL_REASON_PREFIX", "cancel_reason", "is_cancel_reason",
           "cancelling_waiter", "DELIVERY_MOVES", "move_delivery", "claim_delivery"]

#: Longest error text stored on a product or a job [characters]; longer text is cut.
MAX_REASON_CHARS = 4000

P, J = ProductState, JobState

#: Legal product moves: state -> the states it may go to.
PRODUCT_MOVES: dict[ProductState, frozenset[ProductState]] = {
    P.planned: frozenset({P.planned, P.writing, P.failed}),
    P.writing: frozenset({P.writing, P.written, P.failed, P.planned}),
    P.failed: frozenset({P.planned, P.writing, P.written, P.failed}),
    # a written product stays written (a new calibration makes a new version), unless its
    # file is lost or damaged on disk: backend.services.fsck fails it so it is made again
    P.written: frozenset({P.failed}),
}

#: Legal job moves (``running -> running``: a redelivered plan message re-plans the job).
JOB_MOVES: dict[JobState, frozenset[JobState]] = {
    J.queued: frozenset({J.running, J.failed, J.cancelled}),
    J.running: frozenset({J.running, J.succeeded, J.failed, J.cancelled}),
    J.succeeded: frozenset(),
    J.failed: frozenset(),
    J.cancelled: frozenset(),
}

#: Moves only a retry makes (``move_job(..., retry=True)``, ``POST /jobs/{id}/retry``): an
#: ended job whose failed (or cancelled) frames run again.
JOB_RETRY_MOVES: dict[JobState, frozenset[JobState]] = {J.failed: frozenset({J.running}),
                                                        J.cancelled: frozenset({J.running})}

#: Job states that end a job.
JOB_FINAL = frozenset({J.succeeded, J.failed, J.cancelled})


class IllegalTransition(RuntimeError):
    """A state change that the state machine does not allow (the message says which): a bug
    in the caller, not bad data, so it is reported with its type."""


def clock_of(row) -> dt.datetime:
    """The time to stamp on ``row``: the database's (:func:`backend.clock.db_now`) when the row
    belongs to a session, this host's only for a row outside any (built in memory)."""
    from sqlalchemy.orm import object_session

    session = object_session(row)
    return db_now(session) if session is not None else utcnow()


def reason_text(reason: str | None) -> str | None:
    """``reason`` cut to :data:`MAX_REASON_CHARS` (``None`` and ``''`` stay ``None``)."""
    if not reason:
        return None
    return reason[:MAX_REASON_CHARS]


def move_product(product: Product, to: ProductState, reason: str | None = None) -> Product:
    """Move ``product`` to state ``to``; the caller flushes or commits.

    Parameters
    ----------
    product : backend.models.Product
    to : ProductState
    reason : str, optional
        Why it failed (required for ``failed``; stored cut to :data:`MAX_REASON_CHARS`).
        Moving to any other state clears the product's error.

    Raises
    ------
    IllegalTransition
        If the machine does not allow ``product.state -> to``, or ``failed`` has no reason.
    """
    was = product.state
    if was is not None and to not in PRODUCT_MOVES[ProductState(was)]:
        raise IllegalTransition(f"product {product.id}: {ProductState(was).value} -> {to.value} is not allowed")
    if to == ProductState.failed and not reason:
        raise IllegalTransition(f"product {product.id}: failed needs a reason")
    product.state = to
    product.error = reason_text(reason) if to == ProductState.failed else None
    return product


def move_job(job: Job, to: JobState, reason: str | None = None, *, retry: bool = False) -> Job:
    """Move ``job`` to state ``to`` (setting ``started_at``/``finished_at``); the caller commits.

    Parameters
    ----------
    job : backend.models.Job
    to : JobState
    reason : str, optional
        Stored as the job's error (cut to :data:`MAX_REASON_CHARS`) when given; a job that
        ends ``failed`` without one keeps the error its products gave it, or else says how
        many frames failed.
    retry : bool
        A retry of an ended job (:data:`JOB_RETRY_MOVES`: ``failed``/``cancelled`` -> ``running``).

    Raises
    ------
    IllegalTransition
        If the machine does not allow ``job.state -> to``.
    """
    was = JobState(job.state) if job.state is not None else JobState.queued
    if to not in JOB_MOVES[was] and not (retry and to in JOB_RETRY_MOVES.get(was, ())):
        raise IllegalTransition(f"job {job.id}: {was.value} -> {to.value} is not allowed")
    job.state = to
    now = clock_of(job)
    if to == JobState.running:
        if was in JOB_FINAL:  # a retry: it runs again, and ends again
            job.finished_at = None
        job.started_at = job.started_at if was in JOB_FINAL and job.started_at else now
    if to in JOB_FINAL:
        job.finished_at = now
    if reason:
        job.error = reason_text(reason)
    elif to == JobState.failed and not job.error:
        job.error = f"{job.failed or 0} of {job.total or 0} frames failed"
    return job


def this_process(task_id: str | None = None, retries: int = 0) -> str:
    """Who holds a claim: ``host:pid worker=<id>`` (:func:`backend.identity.display`: the id is
    unique per process start, the host and pid are for people), and for a Celery task
    ``... task=<id> try=<n>`` (its id and retry number: a retry keeps the id and adds one to
    the number, a redelivery after a crash keeps both)."""
    who = display()
    return f"{who} task={task_id} try={retries}" if task_id else who


def _parts(holder: str | None) -> dict[str, str]:
    return dict(p.split("=", 1) for p in (holder or "").split()[1:] if "=" in p)


def _task_of(holder: str | None) -> tuple[str | None, int]:
    parts = _parts(holder)
    try:
        return parts.get("task"), int(parts.get("try", 0))
    except ValueError:
        return parts.get("task"), 0


def worker_of(holder: str | None) -> str | None:
    """The worker id (:func:`backend.identity.worker_id`) in claim holder ``holder``, or None
    (a holder written before worker ids: ``host:pid`` only)."""
    return _parts(holder).get("worker")


def is_retry_of(holder: str, claimed_by: str | None) -> bool:
    """Whether ``holder`` is a later try of the task that holds the claim (the earlier try
    raised a database fault and was retried: it is not running any more, and it was no
    crash), or the very same holder."""
    if holder == claimed_by:
        return True
    mine, my_try = _task_of(holder)
    theirs, their_try = _task_of(claimed_by)
    return mine is not None and mine == theirs and my_try > their_try


def claim_is_dead(claimed_by: str | None, session: Session | None = None, *, now: dt.datetime | None = None,
                  timeout_s: float | None = None) -> bool:
    """Whether the process holding a claim is known to be gone.

    A holder with a worker id (:func:`backend.identity.worker_id`) is judged by its heartbeat
    (``worker_heartbeats``), the same way on every host: dead when its row is missing or was
    last renewed more than ``timeout_s`` (default ``Settings.heartbeat_timeout_s``) before
    ``now`` (default: the database's time, :func:`backend.clock.db_now`), never by its pid (two
    hosts may share a name, a restarted host may reuse pids). A claim of this very process
    is never dead (a ``threads`` pool runs several tasks in one process; a retry of the same
    task is told by :func:`is_retry_of`). Without ``session`` (or for a holder written before
    worker ids): dead only when it ran on this host and its pid no longer exists; a claim from
    another host is then never known dead here, and its lease decides.
    """
    if not claimed_by:
        return True
    wid = worker_of(claimed_by)
    if wid is not None and wid == worker_id():
        return False
    if wid is not None and session is not None:
        from backend.models import WorkerHeartbeat

        last = session.scalar(select(WorkerHeartbeat.heartbeat_at).where(WorkerHeartbeat.id == wid))
        if last is None:
            return True
        if timeout_s is None:
            from backend.settings import get_settings

            timeout_s = get_settings().heartbeat_timeout_s
        now = now or db_now(session)
        last = last.replace(tzinfo=dt.UTC) if last.tzinfo is None else last
        return last < now - dt.timedelta(seconds=timeout_s)
    host, _, pid = claimed_by.split()[0].rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return int(pid) != os.getpid() and not process_alive(int(pid))


@dataclass(frozen=True)
class Claim:
    """The outcome of :func:`claim_product`.

    ``status``: ``claimed`` (this delivery calibrates; ``attempt`` is its number),
    ``finished`` (written or failed already: nothing to do), ``busy`` (a live claim holds
    it), ``exhausted`` (it reached the delivery limit and is now ``failed``, to be counted),
    ``cancelled`` (every job waiting on it asked to cancel: it is now ``failed`` with
    :func:`cancel_reason`, to be counted as ``cancelled`` items),
    ``missing`` (no such product). ``holder``: who holds the claim taken (pass it to
    :func:`confirm_claim` with ``attempt``: a re-planned product numbers its claims from 1
    again, so the number alone may be an old holder's too).
    """

    status: str
    attempt: int = 0
    holder: str | None = field(default=None, compare=False)


def claim_product(session: Session, product_id: int, *, lease_s: float, max_deliveries: int,
                  holder: str | None = None, now: dt.datetime | None = None,
                  heartbeat_timeout_s: float | None = None) -> Claim:
    """Claim product ``product_id`` for one calibration, committed before the work starts.

    Parameters
    ----------
    session : Session
        Committed by this function (the claim must be visible before the work starts).
    lease_s : float
        A ``writing`` claim older than this [s] is taken back (``Settings.lease_s``: the
        hard task time limit plus a margin, after which no live worker still runs it).
    max_deliveries : int
        Claims a product may take without finishing (``Settings.max_deliveries``); the next
        delivery fails it, with the reason, instead of calibrating again.
    holder : str, optional
        Who claims (default :func:`this_process`; a task passes its id and retry number).
        A holder of this process writes its heartbeat in the claim's transaction
        (:func:`backend.identity.beat`), so its claim is never judged by a missing row.
    now : datetime, optional
        The time the claim is taken and leases are judged at; default the database's
        (:func:`backend.clock.db_now`), never this host's clock (tests pass one).
    heartbeat_timeout_s : float, optional
        A holder whose heartbeat is older is dead (:func:`claim_is_dead`); default
        ``Settings.heartbeat_timeout_s``.

    Returns
    -------
    Claim
    """
    now = now or db_now(session)
    holder = holder or this_process()
    if worker_of(holder) == worker_id():
        beat(session)
    prod = session.scalar(select(Product).where(Product.id == product_id).execution_options(populate_existing=True))
    if prod is None:
        return Claim("missing")
    if prod.state in (ProductState.written, ProductState.failed):
        return Claim("finished")
    if prod.state == ProductState.writing:
        claimed_at = prod.claimed_at
        if claimed_at is not None and claimed_at.tzinfo is None:
            claimed_at = claimed_at.replace(tzinfo=dt.UTC)
        live = claimed_at is not None and claimed_at > now - dt.timedelta(seconds=lease_s)
        if live and not claim_is_dead(prod.claimed_by, session, now=now, timeout_s=heartbeat_timeout_s) \
                and not is_retry_of(holder, prod.claimed_by):
            return Claim("busy")
    # the frame boundary of a cancel: a product that only cancelled jobs wait on never starts
    # (also one whose message was in the broker when its job was cancelled)
    stopper = cancelling_waiter(session, product_id)
    if stopper is not None:
        held = session.execute(
            update(Product).where(Product.id == product_id, Product.state == prod.state,
                                  Product.attempts == (prod.attempts or 0))
            .values(attempts=Product.attempts).execution_options(synchronize_session=False))
        if held.rowcount != 1:  # claimed or finished meanwhile: its outcome stands
            session.commit()
            return Claim("busy")
        session.refresh(prod)
        move_product(prod, ProductState.failed, cancel_reason(stopper))
        session.commit()
        return Claim("cancelled")
    # a retry of the task that holds the claim (after a database fault) takes it again as
    # the same attempt: only a start that never finished counts towards the limit
    again = prod.state == ProductState.writing and is_retry_of(holder, prod.claimed_by)
    seen = prod.attempts or 0
    if not again and seen >= max_deliveries:
        # fail it only while it is as read (locked until the commit): a holder that woke and
        # wrote it meanwhile keeps its product
        held = session.execute(
            update(Product).where(Product.id == product_id, Product.state == prod.state, Product.attempts == seen)
            .values(attempts=Product.attempts).execution_options(synchronize_session=False))
        if held.rowcount != 1:
            session.commit()
            return Claim("busy")
        session.refresh(prod)
        move_product(prod, ProductState.failed, give_up_reason(seen))
        session.commit()
        return Claim("exhausted")
    attempt = seen if again and seen else seen + 1
    won = session.execute(
        update(Product).where(Product.id == product_id, Product.state == prod.state, Product.attempts == seen)
        .values(state=ProductState.writing, attempts=attempt, claimed_at=now, claimed_by=holder, error=None)
        .execution_options(synchronize_session=False))
    session.commit()
    if won.rowcount != 1:  # another delivery claimed it between our read and our update
        return Claim("busy")
    session.expire(prod)
    return Claim("claimed", attempt, holder)


#: Every reason of a product failed by a cancel starts with this
#: (``backend.services.job_plan.count_item`` settles its items of cancelled jobs ``cancelled``).
CANCEL_REASON_PREFIX = "cancelled: "


def cancel_reason(job_id: str) -> str:
    """Why a product that job ``job_id``'s cancel stopped is failed (a later job re-plans it)."""
    return f"{CANCEL_REASON_PREFIX}job {job_id} was cancelled before this frame started"


def is_cancel_reason(reason: str | None) -> bool:
    """Whether a product's error is :func:`cancel_reason`'s (not a failure of its data)."""
    return bool(reason) and reason.startswith(CANCEL_REASON_PREFIX)


def cancelling_waiter(session: Session, product_id: int) -> str | None:
    """The id of a job that asked to cancel and waits on product ``product_id``, when no
    other job still wants it; ``None`` when the product is to be calibrated.

    "Wants it": a pending item of a job that did not ask to cancel. "Waits": any item of a
    cancel-requested job (its item may already be settled ``cancelled`` by the cancel
    itself). A product no job waits on at all (calibrated outside a job) is calibrated.
    """
    live = exists().where(JobItem.product_id == product_id, JobItem.outcome == ItemOutcome.pending,
                          JobItem.job_id == Job.id, Job.cancel_requested_at.is_(None))
    if session.scalar(select(live)):
        return None
    return session.scalar(
        select(Job.id).join(JobItem, JobItem.job_id == Job.id)
        .where(JobItem.product_id == product_id, Job.cancel_requested_at.is_not(None),
               JobItem.outcome.in_([ItemOutcome.pending, ItemOutcome.cancelled]))
        .order_by(Job.cancel_requested_at).limit(1))


def give_up_reason(attempts: int) -> str:
    """Why a product that started ``attempts`` times without finishing is failed."""
    return (f"gave up after {attempts} deliveries: each started calibrating this frame and none finished "
            "(its worker process died or passed the hard time limit each time: a frame that kills its worker)")


def confirm_claim(session: Session, product_id: int, attempt: int, holder: str | None = None) -> bool:
    """Whether the claim ``attempt`` on ``product_id`` is still the product's (``writing``,
    same attempt number, and held by ``holder`` when given: ``Claim.holder``); also takes
    the row's write lock until the transaction ends, so no other delivery can take the
    product over while the holder writes its file and row."""
    held = (Product.claimed_by == holder,) if holder is not None else ()
    res = session.execute(
        update(Product).where(Product.id == product_id, Product.state == ProductState.writing,
                              Product.attempts == attempt, *held)
        .values(claimed_at=Product.claimed_at)
        .execution_options(synchronize_session=False))
    return res.rowcount == 1


def settle_follow_up(row: JobFollowUp, to: FollowUpState, *, events: int | None = None,
                     reason: str | None = None) -> JobFollowUp:
    """Move follow-up detection ``row`` (``queued``) to ``done`` (with its event count),
    ``failed`` or ``refused`` (not run by design, e.g. too few frames; both with the reason); a
    settled row is not moved again.

    Raises
    ------
    IllegalTransition
        If ``row`` is settled already, or ``failed`` or ``refused`` has no reason.
    """
    if row.state != FollowUpState.queued or to == FollowUpState.queued:
        raise IllegalTransition(f"follow-up {row.job_id}/{row.detector}/{row.channel}: "
                                f"{FollowUpState(row.state).value} -> {to.value} is not allowed")
    with_reason = to in (FollowUpState.failed, FollowUpState.refused)
    if with_reason and not reason:
        raise IllegalTransition(f"a {to.value} follow-up needs a reason")
    row.state = to
    row.finished_at = clock_of(row)
    row.events = events
    row.error = reason_text(reason) if with_reason else None
    return row


def requeue_follow_up(row: JobFollowUp) -> JobFollowUp:
    """Queue follow-up detection ``row`` again, as new (a retried job that ends again runs
    its detections again on its new products): ``queued``, not sent, no deliveries."""
    row.state = FollowUpState.queued
    row.sent_at = row.finished_at = row.events = row.error = None
    row.deliveries = 0
    return row


#: Legal movie moves (``running -> running``: a redelivered or re-sent message of a movie
#: whose worker died takes it over and renders it again from its first frame).
MOVIE_MOVES: dict[MovieState, frozenset[MovieState]] = {
    MovieState.queued: frozenset({MovieState.running, MovieState.failed}),
    MovieState.running: frozenset({MovieState.running, MovieState.succeeded, MovieState.failed}),
    MovieState.succeeded: frozenset(),
    MovieState.failed: frozenset(),
}

#: Movie states that end a movie.
MOVIE_FINAL = frozenset({MovieState.succeeded, MovieState.failed})


def move_movie(movie: Movie, to: MovieState, reason: str | None = None) -> Movie:
    """Move ``movie`` to state ``to`` (setting ``started_at``/``finished_at``); the caller commits.

    Raises
    ------
    IllegalTransition
        If the machine does not allow ``movie.state -> to``, or ``failed`` has no reason.
    """
    was = MovieState(movie.state) if movie.state is not None else MovieState.queued
    if to not in MOVIE_MOVES[was]:
        raise IllegalTransition(f"movie {movie.id}: {was.value} -> {to.value} is not allowed")
    if to == MovieState.failed and not reason:
        raise IllegalTransition(f"movie {movie.id}: failed needs a reason")
    movie.state = to
    now = clock_of(movie)
    if to == MovieState.running:
        movie.started_at = now
    if to in MOVIE_FINAL:
        movie.finished_at = now
    movie.error = reason_text(reason) if to == MovieState.failed else None
    return movie


# -- webhook deliveries (backend.services.notify) -------------------------------------------------

#: Legal webhook delivery moves (``delivering -> delivering``: a claim past its lease taken over).
DELIVERY_MOVES: dict = {}


def _delivery_moves() -> dict:
    from backend.models import DeliveryState as D

    if not DELIVERY_MOVES:
        DELIVERY_MOVES.update({
            D.pending: frozenset({D.delivering, D.failed}),
            D.delivering: frozenset({D.delivering, D.delivered, D.pending, D.failed}),
            D.delivered: frozenset(),
            D.failed: frozenset(),
        })
    return DELIVERY_MOVES


def move_delivery(row, to) -> None:
    """Move webhook delivery ``row`` to state ``to`` (``delivered``, ``pending`` for the next
    attempt, ``failed`` when given up); the caller commits.

    Raises
    ------
    IllegalTransition
        If the machine (:data:`DELIVERY_MOVES`) does not allow it.
    """
    from backend.models import DeliveryState

    was = DeliveryState(row.state) if row.state is not None else DeliveryState.pending
    if to not in _delivery_moves()[was]:
        raise IllegalTransition(f"webhook delivery {row.id}: {was.value} -> {to.value} is not allowed")
    row.state = to


def claim_delivery(session: Session, delivery_id: str, holder: str, *, lease_s: float,
                   now: dt.datetime | None = None) -> int | None:
    """Claim webhook delivery ``delivery_id`` for one attempt: one conditional ``UPDATE``
    moves it ``pending`` (and due: at most 2 s early) -> ``delivering``, or takes over a
    ``delivering`` claim older than ``lease_s`` [s], and adds one to ``attempts``; the caller
    commits. Returns the attempt's number, or None when it is not to be posted now
    (delivered, failed, not yet due, or claimed by a live attempt)."""
    from backend.models import DeliveryState, WebhookDelivery as W

    now = now or utcnow()
    due = now + dt.timedelta(seconds=2)
    stale = now - dt.timedelta(seconds=lease_s)
    from sqlalchemy import or_

    return session.execute(
        update(W).where(W.id == delivery_id, or_(
            (W.state == DeliveryState.pending) & (W.next_attempt_at <= due),
            (W.state == DeliveryState.delivering) & (W.claimed_at < stale)))
        .values(state=DeliveryState.delivering, claimed_at=now, claimed_by=holder[:200], attempts=W.attempts + 1)
        .returning(W.attempts).execution_options(synchronize_session=False)).scalar()
