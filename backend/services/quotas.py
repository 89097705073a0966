"""Fair use: per-user quotas, the write rate limit, and the queue's positions and ETAs.

Quotas (settings, :mod:`backend.settings`; 0 turns one off):

``QUOTA_CONCURRENT_JOBS``
    recalibration jobs and movies of one owner ``queued`` or ``running`` at once;
``QUOTA_FRAMES_PER_DAY``
    frames one owner's recalibration jobs covered, summed over the jobs submitted in the last
    24 h; each job's count is taken at submit time from the frames its request covers (its
    channels, DATE-OBS in its range, as the planner selects them) and kept as a
    :class:`~backend.models.QuotaCharge`;
``RATE_LIMIT_WRITES`` per ``RATE_LIMIT_WINDOW_S``
    writes (POST/DELETE with a token) per user in a fixed window (windows start at whole
    multiples of the window since the Unix epoch), counted in :class:`~backend.models.WriteCount`.

Over any of them the answer is **429** with ``Retry-After`` [s] and a message naming the
limit, the usage and the limit: for the frames per day, when enough of the oldest counted
jobs leave the 24 h window; for the write rate, when the window resets; for concurrent jobs,
the earliest measured ETA among the owner's unfinished jobs (or :data:`CONCURRENT_RETRY_S`
when nothing is measured yet: a polling interval, and the message says so). A request that
covers more frames than the whole daily quota is a 422 (waiting would not help).
**Admins are exempt** from every quota and from the rate limit (their jobs are still
charged, so ``/me`` shows their usage).

Several API processes share the counts: they live in the database. The write counter is one
conditional upsert per write (``INSERT .. ON CONFLICT DO UPDATE .. WHERE writes < limit
RETURNING``: no row back means over the limit, and nothing was changed); the job quotas are
checked under a per-user transaction lock (PostgreSQL ``pg_advisory_xact_lock``; SQLite has
one writer at a time) and the job and its charge are committed together, so two processes
cannot both admit the fourth job. Everything happens in the request's transaction: a request
that is refused (or fails validation) stores nothing, its write count included.

Queue (:func:`queue_snapshot`): per lane (``Job.lane``, ``cpu``/``gpu``) the measured
throughput is the frames written per second by that lane's jobs over the last
``THROUGHPUT_WINDOW_S``: ``(n - 1) / (last - first)`` over the ``updated_at`` of the ``n``
products in ``written`` state whose job is of the lane (the rate while the lane was
working; ``None``, with the reason, below two products). A job's position is its place
(1 = next) among the lane's unfinished jobs, first come first served by ``created_at``;
frames ahead are the pending frames of the jobs before it; ETA = (frames ahead + its own
pending frames) / throughput.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import case, func, or_, select, text, true
from sqlalchemy.orm import Session

from backend.auth import Principal
from backend.models import ApiToken, Frame, Job, JobState, Movie, MovieState, Product, ProductState, QuotaCharge, \
    WriteCount, utcnow
from backend.settings import Settings, get_settings
from pipelines.errors import DataError, LSTDPError
from pipelines.utc import assume_utc

__all__ = ["LANES", "DAY", "CONCURRENT_RETRY_S", "QuotaExceeded", "QuotaError", "WriteState", "count_write",
           "write_state", "admit_job", "admit_movie", "charge_job", "frames_covered", "concurrent_usage",
           "frames_usage", "Throughput", "JobQueue", "LaneState", "QueueSnapshot", "queue_snapshot",
           "me_summary"]

#: The worker lanes (``Job.lane``): each has its own queue, workers and throughput.
LANES = ("cpu", "gpu")
#: The frames-per-day quota's sliding window.
DAY = dt.timedelta(hours=24)
#: Retry-After of the concurrent-jobs quota when no ETA is measured [s]: a polling interval
#: (a choice), not a prediction; the 429 message says so.
CONCURRENT_RETRY_S = 30
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_UNFINISHED = (JobState.queued, JobState.running)
_MOVIE_UNFINISHED = (MovieState.queued, MovieState.running)
EXEMPT = "admins are exempt from quotas and rate limits"


class QuotaExceeded(LSTDPError):
    """Over a quota or the write rate: the API answers 429 with ``detail`` and ``headers``
    (``Retry-After`` in whole seconds, at least 1; :mod:`backend.api.app`).

    Attributes ``limit_name``, ``usage``, ``limit`` and ``retry_after_s`` hold the numbers the
    message gives; ``status_code`` (429), ``detail`` (the message) and ``headers`` the answer's."""

    status_code = 429

    def __init__(self, limit_name: str, usage: int, limit: int, retry_after_s: float, message: str) -> None:
        self.limit_name, self.usage, self.limit = limit_name, usage, limit
        self.retry_after_s = max(1, math.ceil(retry_after_s))
        self.detail = message
        self.headers = {"Retry-After": str(self.retry_after_s)}
        super().__init__(message)


class QuotaError(DataError):
    """A request no wait can admit (it covers more frames than the whole daily quota): 422."""


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else assume_utc(t).isoformat().replace("+00:00", "Z")


def _limit(n: int) -> int | None:
    return n if n > 0 else None


# -- write rate -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteState:
    """The write rate limit of one user now: ``limit`` writes per ``window_s`` [s] (None: no
    limit, or exempt), ``used`` in the window that started at ``window_start`` and ends at
    ``resets_at``."""

    limit: int | None
    window_s: float
    used: int
    window_start: dt.datetime
    resets_at: dt.datetime
    exempt: bool = False

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.used)

    def as_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "window_s": self.window_s, "used": self.used, "remaining": self.remaining,
                "window_start": _iso(self.window_start), "resets_at": _iso(self.resets_at),
                "exempt": self.exempt}


def _window_start(now: dt.datetime, window_s: float) -> dt.datetime:
    k = math.floor((now - _EPOCH).total_seconds() / window_s)
    return (_EPOCH + dt.timedelta(seconds=k * window_s)).replace(microsecond=0) if float(window_s).is_integer() \
        else _EPOCH + dt.timedelta(seconds=k * window_s)


def write_state(session: Session, principal: Principal, *, now: dt.datetime | None = None,
                settings: Settings | None = None) -> WriteState:
    """The rate-limit state of ``principal`` (reads only)."""
    settings = settings or get_settings()
    now = now or utcnow()
    w = settings.rate_limit_window_s
    start = _window_start(now, w)
    row = session.get(WriteCount, principal.user)
    used = row.writes if row is not None and assume_utc(row.window_start) >= start else 0
    return WriteState(None if principal.is_admin else _limit(settings.rate_limit_writes), w, used, start,
                      start + dt.timedelta(seconds=w), exempt=principal.is_admin)


def _insert(session: Session):
    name = session.get_bind().dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - the platform runs on these two
        raise RuntimeError(f"the write rate limit needs PostgreSQL or SQLite, not {name}")
    return insert


def count_write(session: Session, principal: Principal, *, now: dt.datetime | None = None,
                settings: Settings | None = None) -> WriteState:
    """Count one write of ``principal`` in the current window, in the session's transaction
    (committed with what the request stores; rolled back with it).

    One statement, atomic across processes: ``INSERT .. ON CONFLICT (user) DO UPDATE`` that
    starts a new window or adds one ``WHERE writes < limit``, ``RETURNING writes``; the row
    stays locked until the transaction ends, so one user's writes are serialized.

    Raises
    ------
    QuotaExceeded
        429 when the window already holds ``RATE_LIMIT_WRITES`` writes (nothing is changed);
        ``Retry-After`` is the time to the window's end.
    """
    settings = settings or get_settings()
    now = now or utcnow()
    if principal.is_admin or settings.rate_limit_writes <= 0:
        return write_state(session, principal, now=now, settings=settings)
    limit, w = settings.rate_limit_writes, settings.rate_limit_window_s
    start = _window_start(now, w)
    stmt = _insert(session)(WriteCount).values(user=principal.user, window_start=start, writes=1)
    new = WriteCount.window_start < stmt.excluded.window_start
    stmt = stmt.on_conflict_do_update(
        index_elements=[WriteCount.user],
        set_={"writes": case((new, 1), else_=WriteCount.writes + 1),
              "window_start": case((new, stmt.excluded.window_start), else_=WriteCount.window_start)},
        where=or_(new, WriteCount.writes < limit),
    ).returning(WriteCount.writes)
    got = session.execute(stmt).scalar()
    resets = start + dt.timedelta(seconds=w)
    if got is None:
        raise _refused(session, QuotaExceeded(
            "RATE_LIMIT_WRITES", limit, limit, (resets - now).total_seconds(),
            f"write rate limit: user {principal.user!r} made {limit} writes in the current {w:g} s window "
            f"(limit {limit} writes per {w:g} s, RATE_LIMIT_WRITES); the window resets at {_iso(resets)}"))
    return WriteState(limit, w, got, start, resets)


# -- job quotas -------------------------------------------------------------------------------


def _refused(session: Session, exc: Exception) -> Exception:
    """Roll the request's transaction back before refusing it (its write count and anything
    else it added are undone, its locks released): a refused request stores nothing, whoever
    handles the session afterwards."""
    session.rollback()
    return exc


def _lock_user(session: Session, user: str) -> None:
    """Serialize the quota checks of ``user`` until the transaction ends (PostgreSQL advisory
    transaction lock; SQLite admits one writer at a time, which the charge makes us)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": f"lstdp-quota:{user}"})


def frames_covered(session: Session, channels: list[str], start: dt.datetime, end: dt.datetime) -> int:
    """Frames of ``channels`` with DATE-OBS in [``start``, ``end``] (what the planner,
    ``backend.worker.processing.frames_for_job``, will give the job)."""
    return session.scalar(select(func.count()).select_from(Frame).where(
        Frame.channel_code.in_(channels), Frame.date_obs >= start, Frame.date_obs <= end)) or 0


def concurrent_usage(session: Session, user: str) -> tuple[int, int]:
    """``(jobs, movies)`` of ``user`` queued or running."""
    jobs = session.scalar(select(func.count()).select_from(Job).where(Job.owner == user, Job.state.in_(_UNFINISHED)))
    movies = session.scalar(select(func.count()).select_from(Movie).where(
        Movie.owner == user, Movie.state.in_(_MOVIE_UNFINISHED)))
    return int(jobs or 0), int(movies or 0)


def frames_usage(session: Session, user: str, now: dt.datetime) -> list[tuple[dt.datetime, int]]:
    """The charges of ``user`` in the last 24 h: ``[(created_at, frames)]``, oldest first."""
    rows = session.execute(select(QuotaCharge.created_at, QuotaCharge.frames).where(
        QuotaCharge.owner == user, QuotaCharge.created_at > now - DAY).order_by(QuotaCharge.created_at))
    return [(assume_utc(t), int(n)) for t, n in rows]


def _check_concurrent(session: Session, principal: Principal, settings: Settings, now: dt.datetime) -> None:
    limit = settings.quota_concurrent_jobs
    if limit <= 0:
        return
    jobs, movies = concurrent_usage(session, principal.user)
    n = jobs + movies
    if n < limit:
        return
    etas = [q.eta_s for q in queue_snapshot(session, now=now, settings=settings).jobs.values()
            if q.owner == principal.user and q.eta_s is not None]
    if etas:
        after, why = min(etas), "the earliest measured ETA of your unfinished jobs"
    else:
        after, why = CONCURRENT_RETRY_S, "no ETA is measured yet, so this is a polling interval"
    raise _refused(session, QuotaExceeded(
        "QUOTA_CONCURRENT_JOBS", n, limit, after,
        f"concurrent jobs quota: user {principal.user!r} has {n} jobs queued or running ({jobs} recalibrations, "
        f"{movies} movies; limit {limit}, QUOTA_CONCURRENT_JOBS); retry when one ends (Retry-After: {why})"))


def admit_job(session: Session, principal: Principal, channels: list[str], start: dt.datetime, end: dt.datetime,
              *, now: dt.datetime | None = None, settings: Settings | None = None) -> int:
    """Check the quotas of ``principal`` for a recalibration of ``channels`` over DATE-OBS
    [``start``, ``end``], under the user's lock; returns the frames it covers (to
    :func:`charge_job` in the same transaction). Admins pass (their frames are still counted).

    Raises
    ------
    QuotaExceeded
        429: ``QUOTA_CONCURRENT_JOBS`` jobs already queued or running, or the frames of the
        last 24 h plus these over ``QUOTA_FRAMES_PER_DAY`` (``Retry-After``: when enough of the
        oldest charges leave the 24 h window).
    QuotaError
        422: the request alone covers more frames than ``QUOTA_FRAMES_PER_DAY``.
    """
    _lock_user(session, principal.user)
    return admit_frames(session, principal, frames_covered(session, channels, start, end), now=now,
                        settings=settings)


def admit_frames(session: Session, principal: Principal, frames: int, *, what: str = "this request",
                 now: dt.datetime | None = None, settings: Settings | None = None) -> int:
    """Check the quotas of ``principal`` for work on ``frames`` frames (a new job's, a
    retry's failed frames, a re-run's products), under the user's lock (taken here, or
    already by :func:`admit_job`); returns ``frames`` (to :func:`charge_job` in the same
    transaction). Admins pass. Raises as :func:`admit_job`; ``what`` names the work in the
    messages."""
    settings = settings or get_settings()
    now = now or utcnow()
    _lock_user(session, principal.user)
    if principal.is_admin:
        return frames
    _check_concurrent(session, principal, settings, now)
    limit = settings.quota_frames_per_day
    if limit <= 0:
        return frames
    if frames > limit:
        session.rollback()
        raise QuotaError(f"frames per day quota: {what} covers {frames} frames, more than the whole daily "
                         f"quota of {limit} (QUOTA_FRAMES_PER_DAY): "
                         + ("split its DATE-OBS range into smaller jobs" if what == "this request"
                            else "ask an admin to run it"))
    charges = frames_usage(session, principal.user, now)
    used = sum(n for _, n in charges)
    if used + frames <= limit:
        return frames
    need, freed, at = used + frames - limit, 0, now
    for t, n in charges:  # the oldest charges leave the window first
        freed += n
        if freed >= need:
            at = t + DAY
            break
    raise _refused(session, QuotaExceeded(
        "QUOTA_FRAMES_PER_DAY", used, limit, (at - now).total_seconds(),
        f"frames per day quota: user {principal.user!r} used {used} of {limit} frames in the last 24 h "
        f"(QUOTA_FRAMES_PER_DAY) and {what} covers {frames} more; enough frames leave the 24 h window "
        f"at {_iso(at)}"))


def charge_job(session: Session, job: Job, frames: int, *, owner: str | None = None,
               at: dt.datetime | None = None) -> QuotaCharge:
    """Record that ``job`` (flushed, so it has its id) covered ``frames`` frames, charged to
    ``owner`` (default the job's owner; a retry is charged to whoever retries it) at ``at``
    (default the job's creation); the caller commits it with the job."""
    row = QuotaCharge(owner=owner or job.owner, job_id=job.id, frames=frames,
                      created_at=at or job.created_at or utcnow())
    session.add(row)
    return row


def admit_movie(session: Session, principal: Principal, *, now: dt.datetime | None = None,
                settings: Settings | None = None) -> None:
    """The concurrent-jobs quota for a movie (a movie is a job too; it covers no
    recalibration frames). Raises :class:`QuotaExceeded` (429) over it; admins pass."""
    settings = settings or get_settings()
    _lock_user(session, principal.user)
    if not principal.is_admin:
        _check_concurrent(session, principal, settings, now or utcnow())


# -- queue ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    """The measured throughput of one lane: ``frames_per_s`` (None: not measured, ``basis``
    says why) from ``products`` written between ``first`` and ``last`` within the last
    ``window_s`` seconds."""

    lane: str
    frames_per_s: float | None
    products: int
    first: dt.datetime | None
    last: dt.datetime | None
    window_s: float
    basis: str

    def as_dict(self) -> dict[str, Any]:
        return {"frames_per_s": self.frames_per_s, "products": self.products, "first": _iso(self.first),
                "last": _iso(self.last), "window_s": self.window_s, "basis": self.basis}


@dataclass(frozen=True)
class JobQueue:
    """Where one unfinished job stands in its lane. ``position`` 1 is next (or running
    first); ``eta_s`` [s] and ``eta_at`` are None when the lane has no measured throughput
    (``basis`` says why)."""

    job_id: str
    owner: str
    lane: str
    state: str
    position: int
    jobs_ahead: int
    frames_ahead: int
    frames_pending: int
    frames_per_s: float | None
    eta_s: float | None
    eta_at: dt.datetime | None
    basis: str

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["eta_at"] = _iso(self.eta_at)
        return out


@dataclass
class LaneState:
    """One lane now: jobs queued and running, their pending frames, the measured throughput,
    the oldest job still waiting (queued) and how long it has waited [s]."""

    lane: str
    queued: int = 0
    running: int = 0
    frames_pending: int = 0
    throughput: Throughput | None = None
    oldest_waiting: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"lane": self.lane, "queued": self.queued, "running": self.running,
                "frames_pending": self.frames_pending,
                "throughput": self.throughput.as_dict() if self.throughput else None,
                "oldest_waiting": self.oldest_waiting}


@dataclass
class QueueSnapshot:
    """Every lane and every unfinished job's place, measured at ``at``."""

    at: dt.datetime
    lanes: dict[str, LaneState]
    jobs: dict[str, JobQueue] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"measured_at": _iso(self.at), "lanes": [self.lanes[k].as_dict() for k in self.lanes]}


def measure_throughput(session: Session, *, now: dt.datetime, window_s: float) -> dict[str, Throughput]:
    """Each lane's throughput (one grouped query over the products written in the window)."""
    since = now - dt.timedelta(seconds=window_s)
    rows = session.execute(
        select(Job.lane, func.count(Product.id), func.min(Product.updated_at), func.max(Product.updated_at))
        .join(Job, Product.job_id == Job.id)
        .where(Product.state == ProductState.written, Product.updated_at > since, Product.updated_at <= now)
        .group_by(Job.lane))
    got = {lane: (int(n), assume_utc(lo), assume_utc(hi)) for lane, n, lo, hi in rows}
    out = {}
    for lane in sorted(set(LANES) | set(got)):
        n, lo, hi = got.get(lane, (0, None, None))
        span = (hi - lo).total_seconds() if n else 0.0
        if n >= 2 and span > 0:
            rate = (n - 1) / span
            basis = (f"{n} products written by {lane} jobs from {_iso(lo)} to {_iso(hi)} ({n - 1} intervals in "
                     f"{span:.1f} s) within the last {window_s:g} s")
        elif n == 0:
            rate, basis = None, f"no product written by {lane} jobs in the last {window_s:g} s: no throughput measured yet"
        else:
            rate, basis = None, (f"{n} product(s) written by {lane} jobs in the last {window_s:g} s, all at "
                                 f"{_iso(hi)}: a rate needs two at different times")
        out[lane] = Throughput(lane, rate, n, lo, hi, window_s, basis)
    return out


def _pending(total: int, done: int, failed: int, skipped: int, cancelled: int, state: JobState,
             charged: int | None) -> int:
    if state == JobState.queued and total == 0:  # not planned yet: the frames it was charged
        return int(charged or 0)
    return max(0, total - done - failed - skipped - (cancelled or 0))


def queue_snapshot(session: Session, *, now: dt.datetime | None = None,
                   settings: Settings | None = None, viewer: Any = None) -> QueueSnapshot:
    """Every lane's state and every queued or running job's position and ETA, in two queries
    (the unfinished jobs with their charges, the throughput per lane).

    ``viewer`` (a Principal, a :class:`backend.services.visibility.Viewer`; None: anonymous)
    is who reads the lanes: a lane's ``oldest_waiting.job_id`` is null when the viewer may not
    see that job (:func:`backend.services.visibility.job_rule`); counts, frames and waiting
    times are everyone's. ``jobs`` holds every unfinished job (for the callers that pick
    the viewer's own)."""
    from backend.services import visibility

    settings = settings or get_settings()
    seen = visibility.condition(Job, viewer)
    seen_col = (case((seen, True), else_=False) if seen is not None else true()).label("seen")
    now = now or utcnow()
    tp = measure_throughput(session, now=now, window_s=settings.throughput_window_s)
    lanes = {lane: LaneState(lane, throughput=tp.get(lane)) for lane in tp}
    rows = session.execute(
        select(Job.id, Job.owner, Job.lane, Job.state, Job.created_at, Job.total, Job.done, Job.failed, Job.skipped,
               Job.cancelled, func.sum(QuotaCharge.frames), seen_col)
        .outerjoin(QuotaCharge, QuotaCharge.job_id == Job.id)
        .where(Job.state.in_(_UNFINISHED))
        .group_by(Job.id)
        .order_by(Job.created_at, Job.id))
    snap = QueueSnapshot(now, lanes)
    for jid, owner, lane, state, created, total, done, failed, skipped, cancelled, charged, visible in rows:
        ls = lanes.get(lane)
        if ls is None:
            ls = lanes[lane] = LaneState(lane, throughput=Throughput(lane, None, 0, None, None,
                                                                     settings.throughput_window_s, "unknown lane"))
        pending = _pending(total, done, failed, skipped, cancelled, state, charged)
        ahead = ls.frames_pending
        rate = ls.throughput.frames_per_s if ls.throughput else None
        if rate:
            eta = (ahead + pending) / rate
            basis = f"({ahead} frames ahead + {pending} own) / {rate:.4g} frames/s measured: {ls.throughput.basis}"
            eta_at = now + dt.timedelta(seconds=eta)
        else:
            eta, eta_at = None, None
            basis = ls.throughput.basis if ls.throughput else "no throughput measured yet"
        snap.jobs[jid] = JobQueue(jid, owner, lane, state.value, ls.queued + ls.running + 1, ls.queued + ls.running,
                                  ahead, pending, rate, None if eta is None else round(eta, 3), eta_at, basis)
        if state == JobState.queued:
            ls.queued += 1
            if ls.oldest_waiting is None:
                ls.oldest_waiting = {"job_id": jid if visible else None, "created_at": _iso(created),
                                     "waiting_s": round((now - assume_utc(created)).total_seconds(), 3)}
        else:
            ls.running += 1
        ls.frames_pending += pending
    return snap


# -- /me --------------------------------------------------------------------------------------


def me_summary(session: Session, principal: Principal, *, now: dt.datetime | None = None,
               settings: Settings | None = None) -> dict[str, Any]:
    """What ``GET /api/v1/me`` answers: the user, scopes, token (id, prefix, created, expiry),
    each quota (limit, usage, remaining, reset time; limits are None when off or exempt) and
    the write rate limit's state."""
    settings = settings or get_settings()
    now = now or utcnow()
    tok = session.get(ApiToken, principal.token_id) if principal.token_id is not None else None
    admin = principal.is_admin
    jobs, movies = concurrent_usage(session, principal.user)
    climit = None if admin else _limit(settings.quota_concurrent_jobs)
    mine = [q for q in queue_snapshot(session, now=now, settings=settings).jobs.values() if q.owner == principal.user]
    etas = [q.eta_at for q in mine if q.eta_at is not None]
    charges = frames_usage(session, principal.user, now)
    used = sum(n for _, n in charges)
    flimit = None if admin else _limit(settings.quota_frames_per_day)
    return {
        "user": principal.user,
        "scopes": sorted(principal.scopes),
        "admin": admin,
        "exempt": EXEMPT if admin else None,
        "token": {"id": principal.token_id, "prefix": principal.prefix,
                  "created_at": _iso(tok.created_at) if tok else None,
                  "expires_at": _iso(tok.expires_at) if tok else None},
        "quotas": {
            "concurrent_jobs": {
                "setting": "QUOTA_CONCURRENT_JOBS", "limit": climit, "usage": jobs + movies,
                "recalibrations": jobs, "movies": movies,
                "remaining": None if climit is None else max(0, climit - jobs - movies),
                "resets_at": _iso(min(etas)) if etas else None,
                "resets": "when one of your queued or running jobs ends (the earliest measured ETA, if any)"},
            "frames_per_day": {
                "setting": "QUOTA_FRAMES_PER_DAY", "limit": flimit, "usage": used, "jobs": len(charges),
                "remaining": None if flimit is None else max(0, flimit - used),
                "resets_at": _iso(charges[0][0] + DAY) if charges else None,
                "resets": "each job's frames leave the count 24 h after it was submitted (resets_at: the oldest's)"},
        },
        "rate_limit": {"setting": "RATE_LIMIT_WRITES, RATE_LIMIT_WINDOW_S",
                       **write_state(session, principal, now=now, settings=settings).as_dict()},
        "queue": [q.as_dict() for q in mine],
    }
