"""Celery tasks: thin wrappers that load rows by id, call the services, record state.

Registered under the names of :class:`backend.broker.TaskName` (``pipelines.tasks.*``, the
first release's module path), so messages queued by an earlier version are still consumed.

Pass ids, not objects (Celery guide). Data errors are never retried; transient database or
broker faults (``OperationalError``) are retried with exponential backoff. State changes go
through :mod:`backend.state`. The detections that follow a calibration job come from the
detector registry (:data:`pipelines.detect.registry.DETECTORS`): one generic task,
:func:`detect_events`, runs any of them.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys

from celery.signals import worker_init, worker_process_init, worker_ready
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from backend.broker import TaskName, app
from backend.db import forget_connections_after_fork, session_scope
from backend.identity import heartbeat_running, start_heartbeat
from backend.models import FollowUpState, ItemOutcome, Job, JobFollowUp, JobItem, JobState
from backend.services.detection import PUBLIC_SCOPE, job_detection_scope, run_detector
from backend.services.events import associate_around
from backend.services.ingest import ingest_path
from backend.settings import get_settings
from backend.state import JOB_FINAL, move_job, settle_follow_up, this_process
from backend.worker.gpu_batch import calibrate_products_batch, fail_unfinished, settle_after_time_limit
from backend.worker.processing import calibrate_product as _calibrate_product
from backend.worker.processing import RESEND, count_item, lock_job, plan_job, soft_time_limit_in
from backend.worker.reconcile import send_calibration, send_follow_ups
from backend.worker import notify as _notify_tasks  # noqa: F401 - registers deliver_webhook
from pipelines.calibration import as_options
from pipelines.calibration import available_cores, set_default_threads
from pipelines.detect.flares import SeriesTooShortError
from pipelines.detect.registry import get_detector
from pipelines.errors import DataError, failure_reason
from pipelines.fitsio import PARTIAL_MAX_AGE_S, sweep_dead_writers, sweep_partial_files

log = logging.getLogger(__name__)


@worker_init.connect
def _share_cores(sender=None, **_kwargs) -> None:
    """Give each of the worker's ``c`` processes ``cores // c`` threads for the threaded steps.

    Sent in the main process before the pool forks (``sender`` is the ``WorkController``;
    its ``concurrency`` is the process count), so the children inherit the setting.
    """
    try:
        processes = int(getattr(sender, "concurrency", 0) or 0)
    except (TypeError, ValueError):  # "auto": resolved later; keep one thread per core
        return
    if processes > 0:
        from pipelines.calibration import kernels

        set_default_threads(max(1, available_cores() // processes))
        kernels.set_threads(max(1, available_cores() // processes))
        log.info("threaded calibration steps: %d thread(s) in each of %d worker processes",
                 max(1, available_cores() // processes), processes)


@worker_init.connect
def _preload_lazy_imports(**_kwargs) -> None:
    """Import, before the pool forks, the modules the tasks import lazily (matplotlib for the
    quicklooks and diff images). A time limit raised inside a child's first ``import
    matplotlib`` (a frozen database makes a task run out its soft limit at any line) leaves
    the module half-initialised in that child, and every later product there fails with
    ``KeyError: 'Rectangle:kwdoc'``; imported in the parent, no task ever runs an import.
    Numba likewise (the compiled north-up pass and centre rays, :mod:`pipelines.calibration.l2.fused`):
    a child whose first ``import numba`` was cut by a time limit failed every later product
    with ``module 'numba' has no attribute 'core'`` (seen under load in ``benchmarks/faults.py``)."""
    import io

    import matplotlib
    import numpy as np

    matplotlib.use("Agg", force=False)
    from matplotlib import colormaps
    from matplotlib.image import imsave

    # imsave imports matplotlib.figure, axes, table... on its first call: make that call here
    imsave(io.BytesIO(), np.zeros((2, 2), dtype=np.float32), cmap=colormaps["gray"], format="png")
    from pipelines.calibration.l2 import fused

    if fused.enabled():
        fused._kernels()  # numba and the kernels' module, whole
        import numba.core.entrypoints

        # what a kernel's first call runs (caching.load_overload -> context.refresh) imports the
        # entry points' registries: load them here too
        numba.core.entrypoints.init_all()
    # sunpy.coordinates (with pandas, requests...: 0.3 s) and scipy.interpolate: a calibration
    # imports them on its first frame (the observer's position, the Sun's angular radius); a
    # soft limit inside that import (a host frozen and thawed in benchmarks/cluster.py) left
    # 'sunpy' partially initialised in the child, and the 240 frames it took next failed
    # "cannot import name 'extern' from partially initialized module 'sunpy'"
    import scipy.interpolate  # noqa: F401
    import sunpy.coordinates  # noqa: F401
    import sunpy.coordinates.sun  # noqa: F401


def _forget_broken_imports() -> list[str]:
    """Remove from ``sys.modules`` the modules whose import was cut short and never cleaned
    up (their spec still says ``_initializing``): a time limit raised inside an import, at a
    point of the import machinery's own clean-up, leaves the module there half-initialised, and
    every later ``from module import name`` in this process fails with "partially initialized
    module" (a pool child would then fail each frame it takes, in milliseconds). Removed, the
    next import runs the module again. Called before each task (:func:`_beating`), when this
    thread is inside no import; a module another thread is importing now (its import lock
    held: a threads pool) is left alone. Returns the names removed."""
    import importlib._bootstrap as bootstrap

    def importing(name: str) -> bool:
        ref = bootstrap._module_locks.get(name)
        lock = ref() if ref is not None else None
        return lock is not None and bool(getattr(lock, "count", 0))

    broken = [name for name, module in list(sys.modules.items())
              if getattr(getattr(module, "__spec__", None), "_initializing", False) is True and not importing(name)]
    for name in broken:
        sys.modules.pop(name, None)
    if broken:
        log.warning("removed %d half-initialised modules (an import cut short by a time limit): %s; they are "
                    "imported again when next needed", len(broken), ", ".join(sorted(broken)[:10]))
    return broken


@worker_process_init.connect
def _own_connections(**_kwargs) -> None:
    """A pool child (also one that replaces a killed child) never uses its parent's database
    connections (the start-up reaper opened some in the parent). Its worker id is its own
    (:func:`backend.identity.worker_id`, made again after the fork); its heartbeat starts
    with its first task (:func:`_beating`): a child that dies at start must not raise here,
    or the pool's start-up fails."""
    forget_connections_after_fork()


def _beating() -> None:
    """Start this process's heartbeat (:func:`backend.identity.start_heartbeat`) if it is not
    running: every task that claims work calls it first, whatever the pool (prefork child,
    solo or threads in the main process). A database fault raises ``OperationalError``: the
    task's retry applies. First, modules whose import a time limit cut short
    are forgotten (:func:`_forget_broken_imports`)."""
    _forget_broken_imports()
    if not heartbeat_running():
        start_heartbeat(get_settings())


@worker_ready.connect
def _sweep_on_start(**_kwargs) -> None:
    """A starting worker removes the temporary files of killed writes from the product store:
    those of dead processes of this host at once, others older than an hour (or the lease). (Work that dead workers left behind is the reconciler's,
    :mod:`backend.worker.reconcile`, which ``lstdp worker`` starts beside the worker.)"""
    try:
        settings = get_settings()
        swept = sweep_dead_writers(settings.products) + sweep_partial_files(
            settings.products, older_than_s=max(PARTIAL_MAX_AGE_S, settings.lease_s))
        if swept:
            log.warning("removed %d partial files of killed writes, e.g. %s", len(swept), swept[0].name)
    except OSError:
        log.exception("could not sweep partial files")


#: Database faults are retried 2, 4, 8, 16, 32 s later (62 s in all; without jitter, which
#: shortened the waits to 13 s in all when PostgreSQL restarted mid-job). Work still
#: unsettled after that is the reconciler's.
RETRY = dict(autoretry_for=(OperationalError,), retry_backoff=2, retry_backoff_max=60, retry_jitter=False,
             max_retries=5)


@app.task(name=TaskName.ingest_file, bind=True, ignore_result=False, **RETRY)
def ingest_file(self, path: str, move: bool = True) -> dict:
    """Ingest one file; returns the outcome (status, reason, ids). Never fails on bad data."""
    with session_scope() as s:
        out = ingest_path(s, path, get_settings(), move=move)
    log.info("ingest %s", out.line())
    return out.__dict__


@app.task(name=TaskName.run_job, bind=True, **RETRY)
def run_job(self, job_id: str) -> dict:
    """Plan a job and fan out its work.

    CPU jobs: one message per product, calibrate then settle (queue ``cpu``). GPU jobs
    (option ``device: gpu``): batches of ``GPU_BATCH_SIZE`` products, one
    :func:`calibrate_products_gpu_batch` task each (queue ``gpu``), which count every
    product as it finishes.

    Idempotent: a redelivered message of a job planned already sends nothing (products whose
    messages were lost are re-sent by the reconciler). Each delivery is counted first, in a
    commit of its own: a job whose planning kills its worker every time fails after
    ``MAX_DELIVERIES`` deliveries instead of looping.
    """
    settings = get_settings()
    with session_scope() as s:
        job = lock_job(s, job_id)
        if job is None:
            return {"job_id": job_id, "planned": 0, "note": "no such job"}
        if job.state != JobState.queued:
            return {"job_id": job_id, "planned": 0, "note": f"already {job.state.value}"}
        if (job.deliveries or 0) >= settings.max_deliveries:
            move_job(job, JobState.failed, f"planning did not finish after {job.deliveries} deliveries of its plan "
                                           "message (its worker died each time)")
            return {"job_id": job_id, "planned": 0, "note": "gave up"}
        job.deliveries = (job.deliveries or 0) + 1
        kind = job.kind
    if kind == "rerun":  # recompute a manifest's frames (backend.worker.rerun)
        return _run_rerun_job(job_id)
    try:
        with session_scope() as s:
            todo = plan_job(s, job_id)
            job = s.get(Job, job_id)
            ended = job.state in JOB_FINAL
    except OperationalError:
        if self.request.retries < (self.max_retries or 0):
            _forget_delivery(job_id)  # this try raised and is retried: it did not kill its worker
        raise
    except Exception as exc:  # the job must end failed with the reason, never stay queued
        with session_scope() as s:
            job = s.get(Job, job_id)
            if job is not None and job.state not in JOB_FINAL:
                move_job(job, JobState.failed, failure_reason(exc))
        raise
    if ended:  # nothing to calibrate: its follow-ups (if any) go now
        with session_scope() as s:
            send_follow_ups(s, job_id)
        return {"job_id": job_id, "planned": 0}
    with session_scope() as s:
        options = as_options((s.get(Job, job_id).parameters or {}).get("options"))
    if options.device == "gpu":
        # GPU workers take batches: masters stay on the device, copies overlap compute
        size = settings.gpu_batch_size
        batches = [todo[i:i + size] for i in range(0, len(todo), size)]
        for batch in batches:
            calibrate_products_gpu_batch.apply_async(args=[job_id, batch], queue="gpu")
        return {"job_id": job_id, "planned": len(todo), "gpu_batches": len(batches)}
    if settings.cpu_batch_size > 1:
        # CPU batches: the overlapped host executor reads, calibrates and writes at once
        size = settings.cpu_batch_size
        batches = [todo[i:i + size] for i in range(0, len(todo), size)]
        for batch in batches:
            calibrate_products_cpu_batch.apply_async(args=[job_id, batch], queue="cpu")
        return {"job_id": job_id, "planned": len(todo), "cpu_batches": len(batches)}
    for pid in todo:
        send_calibration(pid, job_id)  # calibrate then settle, as the reconciler re-sends it
    return {"job_id": job_id, "planned": len(todo)}


def _run_rerun_job(job_id: str) -> dict:
    """Plan a ``rerun`` job and send one ``rerun_frame`` per frame on its lane; the job ends
    ``failed`` with the reason if planning breaks (a database fault is retried)."""
    from backend.worker.rerun import plan_rerun, send_rerun

    try:
        with session_scope() as s:
            frames = plan_rerun(s, job_id)
            lane = s.get(Job, job_id).lane
    except OperationalError:
        raise
    except Exception as exc:
        with session_scope() as s:
            job = s.get(Job, job_id)
            if job is not None and job.state not in JOB_FINAL:
                move_job(job, JobState.failed, failure_reason(exc))
        raise
    for frame_id in frames:
        send_rerun(job_id, frame_id, lane)
    return {"job_id": job_id, "planned": len(frames), "kind": "rerun"}


@app.task(name=TaskName.rerun_frame, bind=True, **RETRY)
def rerun_frame(self, job_id: str, frame_id: int) -> dict:
    """Re-run one frame of a ``rerun`` job and compare it with the original
    (:func:`backend.worker.rerun.rerun_frame`); a redelivered message does nothing twice."""
    from backend.worker.rerun import rerun_frame as _rerun_frame

    _beating()
    with session_scope() as s:
        item = _rerun_frame(s, get_settings(), job_id, int(frame_id),
                            holder=this_process(self.request.id, self.request.retries or 0))
        if item is None:
            return {"job_id": job_id, "frame_id": frame_id, "note": "nothing to do"}
        return {"job_id": job_id, "frame_id": frame_id, "verdict": item.verdict, "reason": item.reason}


def _forget_delivery(job_id: str) -> None:
    """Take back the delivery :func:`run_job` counted for a try whose planning raised a
    database fault and is retried (only a start that never finished counts towards
    ``MAX_DELIVERIES``). Best effort: with the database down the count stays."""
    try:
        with session_scope() as s:
            s.execute(update(Job).where(Job.id == job_id, Job.state == JobState.queued, Job.deliveries > 0)
                      .values(deliveries=Job.deliveries - 1).execution_options(synchronize_session=False))
    except OperationalError:
        log.warning("job %s: could not take back the count of a retried plan delivery", job_id)


@app.task(name=TaskName.calibrate_product, bind=True, **RETRY)
def calibrate_product(self, product_id: int, job_id: str | None = None) -> dict:
    """Calibrate one product (state planned -> writing -> written | failed), then, with
    ``job_id``, settle its item of that job in the same task (:func:`_settle`), so that the
    job's counts move as each frame finishes: a settling message chained after it would wait
    behind every calibration queued before it, and a job's progress would read 0 until its
    last frames. (Messages of earlier versions, ``[product_id]`` with a ``record_progress``
    link, are still consumed: their link settles.) A database fault while settling retries
    the task; the product, written by then, is not calibrated again and settling is idempotent."""
    _beating()
    with session_scope() as s:
        try:
            prod = _calibrate_product(s, product_id, get_settings(),
                                      holder=this_process(self.request.id, self.request.retries or 0))
            out = {"product_id": product_id, "state": prod.state.value, "error": prod.error}
        except OperationalError:
            raise
        except Exception as exc:  # recorded as failed on the row; it is counted below all the same
            log.exception("product %s failed", product_id)
            out = {"product_id": product_id, "state": "failed", "error": str(exc)}
        again = s.info.pop(RESEND, [])
    for pid, lane in again:  # given back after the soft time limit: its next delivery, now
        _send_again(pid, job_id, lane)
    if job_id:
        out["job_state"] = _settle(job_id, product_id)
    return out


def _send_again(product_id: int, job_id: str | None, lane: str) -> None:
    """Send product ``product_id``'s calibration again (given back after the soft time limit,
    its ``sent_at`` committed): a broker that does not take it leaves it to the reconciler,
    which re-sends a ``planned`` product whose message is gone after its grace."""
    try:
        send_calibration(product_id, job_id, lane)
    except Exception:  # noqa: BLE001 - the reconciler re-sends it
        log.warning("product %s: could not send its calibration again; the reconciler will", product_id,
                    exc_info=True)


def _settle(job_id: str, product_id: int) -> str | None:
    """Settle one product's item of its job (:func:`count_item`, committed), then the items
    of every other job that waits on the same product (a frame two jobs planned with one
    calibration set is calibrated once: each job's count moves now, not at the reconciler's
    next pass). The call that ends a job sends its follow-up detections. Returns the state
    of job ``job_id``."""
    with session_scope() as s:
        job, closed = count_item(s, job_id, product_id)
        state = job.state.value if job else None
        others = list(s.scalars(select(JobItem.job_id).where(
            JobItem.product_id == product_id, JobItem.job_id != job_id, JobItem.outcome == ItemOutcome.pending)))
    ended = [job_id] if closed else []
    for other in others:  # each under its own job row lock, in a transaction of its own
        with session_scope() as s:
            if count_item(s, other, product_id)[1]:
                ended.append(other)
    for j in ended:
        with session_scope() as s:
            send_follow_ups(s, j)
    return state


@app.task(name=TaskName.calibrate_product_gpu, bind=True, **RETRY)
def calibrate_product_gpu(self, product_id: int) -> dict:
    """The same as :func:`calibrate_product`, routed to the ``gpu`` queue.

    No longer sent by :func:`run_job` (GPU jobs go in batches, :func:`calibrate_products_gpu_batch`);
    kept so that messages queued by an earlier version are still consumed.
    """
    return calibrate_product.run(product_id)


@app.task(name=TaskName.calibrate_products_gpu_batch, bind=True, **RETRY)
def calibrate_products_gpu_batch(self, job_id: str | None, product_ids: list[int]) -> dict:
    """Calibrate a batch of products on this worker's GPU (queue ``gpu``) and count each
    towards its job as it is written or fails (:func:`backend.worker.gpu_batch.calibrate_products_batch`).

    Without a usable GPU the batch runs on NumPy and the products say so (see that module).
    If the batch breaks as a whole (not a database fault, which is retried), its products
    not yet finished fail with the reason, so the job ends. Past the task's soft time limit,
    the product under way is given back (its start counted; failed on its ``MAX_DELIVERIES``-th)
    and the batch's unfinished products are sent again (:func:`backend.worker.gpu_batch.settle_after_time_limit`).
    When the job ends, its follow-up detections are queued.
    """
    return _run_batch(self, calibrate_products_gpu_batch, job_id, product_ids, "gpu")


@app.task(name=TaskName.calibrate_products_cpu_batch, bind=True, **RETRY)
def calibrate_products_cpu_batch(self, job_id: str | None, product_ids: list[int]) -> dict:
    """Calibrate a batch of products on this CPU worker (queue ``cpu``; sent by :func:`run_job`
    when ``CPU_BATCH_SIZE`` > 1) and count each towards its job as it is written or fails:
    :func:`backend.worker.gpu_batch.calibrate_products_batch` with ``device='cpu'``, whose
    NumPy executor reads the next raw frame and writes the previous product while the
    current one computes. One bad frame fails its product alone; a batch that breaks as a
    whole (not a database fault, which is retried) fails its unfinished products; past the
    soft time limit, as :func:`calibrate_products_gpu_batch`."""
    return _run_batch(self, calibrate_products_cpu_batch, job_id, product_ids, "cpu")


def _run_batch(task, task_fn, job_id: str | None, product_ids: list[int], queue: str) -> dict:
    """The body of the two batch tasks (``queue`` 'gpu' or 'cpu', the device asked for)."""
    _beating()
    holder = this_process(task.request.id, task.request.retries or 0)
    label = queue.upper()
    kw = {} if queue == "gpu" else {"device": "cpu"}
    try:
        with session_scope() as s:
            report = calibrate_products_batch(s, list(product_ids), get_settings(), job_id=job_id, holder=holder, **kw)
    except OperationalError:
        raise
    except Exception as exc:  # noqa: BLE001 - the job must end, never wait for the reaper
        if soft_time_limit_in(exc):  # the batch's limit: given back and sent again, failed only when bounded
            with session_scope() as s:
                report, again = settle_after_time_limit(s, get_settings(), list(product_ids), job_id, exc,
                                                        holder=holder)
            if again:  # a new batch message (their sent_at committed; if it is lost the reconciler re-sends)
                log.warning("%s batch of job %s: soft time limit; %d products sent again", label, job_id, len(again))
                try:
                    task_fn.apply_async(args=[job_id, again], queue=queue)
                except Exception:  # noqa: BLE001 - the reconciler re-sends planned products whose message is gone
                    log.warning("%s batch of job %s: could not send %d products again; the reconciler will", label,
                                job_id, len(again), exc_info=True)
            if report.job_finished:
                with session_scope() as s:
                    send_follow_ups(s, job_id)
            return {"job_id": job_id, **report.as_dict()}
        log.exception("%s batch of job %s failed", label, job_id)
        with session_scope() as s:
            report = fail_unfinished(s, list(product_ids), job_id, f"{label} batch failed: {failure_reason(exc)}",
                                     holder=holder)
    if report.job_finished:
        with session_scope() as s:
            send_follow_ups(s, job_id)
    return {"job_id": job_id, **report.as_dict()}


@app.task(name=TaskName.make_movie, bind=True, **RETRY)
def make_movie(self, movie_id: str) -> dict:
    """Render movie ``movie_id`` into its MP4 (:func:`backend.worker.movies.make_movie`):
    claimed first, so a redelivered or re-sent message of a movie that is being rendered or
    has ended does nothing; any failure but a database fault (retried) ends it ``failed``
    with the reason."""
    from backend.worker.movies import make_movie as _make_movie

    _beating()
    with session_scope() as s:
        movie = _make_movie(s, movie_id, get_settings(), holder=this_process(self.request.id, self.request.retries or 0))
        if movie is None:
            return {"movie_id": movie_id, "note": "no such movie"}
        return {"movie_id": movie_id, "state": movie.state.value, "frames": movie.frames_done, "error": movie.error}


@app.task(name=TaskName.record_progress, bind=True, **RETRY)
def record_progress(self, job_id: str, product_id: int) -> dict:
    """Settle one product's item of its job; the call that ends the job sends its follow-up
    detections (a late or redelivered message of an ended job sends nothing). No longer
    sent (:func:`calibrate_product` settles itself); kept for the chains that earlier
    versions queued."""
    return {"job_id": job_id, "state": _settle(job_id, product_id)}


def _time(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


@app.task(name=TaskName.detect_events, bind=True, **RETRY)
def detect_events(self, detector: str, channel: str | None = None, start: str | None = None,
                  end: str | None = None, job_id: str | None = None) -> dict:
    """Run registry detector ``detector`` (``flares``, ``cmes``, ``prominences``,
    ``white-light``) on the written L2 products of ``channel`` (default: the detector's) with
    DATE-OBS in ``start``..``end`` (ISO 8601), then link the new events to those of other
    sources and types where they are (:func:`backend.services.events.associate_around`).

    ``job_id``: sent as a follow-up of that job (a ``job_follow_ups`` row keyed by job,
    detector and channel): a follow-up done already runs nothing again; one whose detection
    fails on its data is ``failed`` with the reason. It runs on that job's own calibration
    set(s) of the channel (:func:`backend.services.detection.job_detection_scope`): into the
    public catalogue only when the job publishes and its sets are public, else as its owner's
    private events. Without ``job_id``: the public detection (the public set of each frame).
    A series too short for the detector's background
    (:class:`pipelines.detect.flares.SeriesTooShortError`) is refused: a follow-up is settled
    ``refused`` with that reason (shown on the job's page and in ``GET /api/v1/jobs/{id}``);
    either way the answer carries it as ``refused``.
    """
    t0, t1 = _time(start), _time(end)
    with session_scope() as s:
        channel = get_detector(detector).channel(channel)
        row = None
        if job_id:
            row = s.get(JobFollowUp, (job_id, detector, channel))
            if row is not None and row.state != FollowUpState.queued:
                return {"detector": detector, "channel": channel, "job_id": job_id, "note": f"already {row.state.value}"}
            if row is not None:
                row.deliveries = (row.deliveries or 0) + 1
                s.commit()
        try:
            with s.begin_nested():
                scope = job_detection_scope(s, job_id, channel) if job_id else PUBLIC_SCOPE
                events = run_detector(s, detector, channel=channel, start=t0, end=t1, scope=scope)
                linked = associate_around(s, events)  # where the events are, not the whole span
        except SeriesTooShortError as exc:  # refused by design: said, not a fault
            log.warning("%s detection on %s%s refused: %s", detector, channel, f" (job {job_id})" if job_id else "",
                        failure_reason(exc))
            if row is not None:
                settle_follow_up(row, FollowUpState.refused, reason=failure_reason(exc))
            return {"detector": detector, "channel": channel, "job_id": job_id, "events": [], "associations": 0,
                    "refused": failure_reason(exc)}
        except (DataError, ValueError) as exc:
            if row is None:
                raise
            settle_follow_up(row, FollowUpState.failed, reason=failure_reason(exc))
            return {"detector": detector, "channel": channel, "job_id": job_id, "error": failure_reason(exc)}
        if row is not None:
            settle_follow_up(row, FollowUpState.done, events=len(events))
        return {"detector": detector, "channel": channel, "events": [e.id for e in events], "associations": linked}


# The first release's per-detector tasks: kept so that messages already queued are consumed.
def _legacy(detector: str, channel: str | None, start: str | None, end: str | None, *,
            says_channel: bool) -> dict:
    """:func:`detect_events`, answered as the first release's task did (no detector name; the
    channel only where the task takes one)."""
    out = detect_events.run(detector, channel, start, end)
    out.pop("detector")
    if not says_channel:
        out.pop("channel")
    return out


@app.task(name=TaskName.detect_flares, bind=True, **RETRY)
def detect_flares(self, start: str | None = None, end: str | None = None) -> dict:
    """SDI flares (:func:`detect_events` with ``flares``); the first release's task."""
    return _legacy("flares", None, start, end, says_channel=False)


@app.task(name=TaskName.detect_cmes, bind=True, **RETRY)
def detect_cmes(self, channel: str = "SCI-UV", start: str | None = None, end: str | None = None) -> dict:
    """CMEs on SCI-UV or SCI-WL (:func:`detect_events` with ``cmes``); the first release's task."""
    return _legacy("cmes", channel, start, end, says_channel=True)


@app.task(name=TaskName.detect_prominences, bind=True, **RETRY)
def detect_prominences(self, channel: str = "SDI", start: str | None = None, end: str | None = None) -> dict:
    """Prominence eruptions on SDI or SCI-UV (:func:`detect_events` with ``prominences``)."""
    return _legacy("prominences", channel, start, end, says_channel=True)


@app.task(name=TaskName.detect_white_light_flares, bind=True, **RETRY)
def detect_white_light_flares(self, start: str | None = None, end: str | None = None) -> dict:
    """WST white-light flares (:func:`detect_events` with ``white-light``); the first release's task."""
    return _legacy("white-light", None, start, end, says_channel=False)
