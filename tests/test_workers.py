"""Issue 28, items 3 and 4: workers with an identity and the database's clock, a supervised
reconciler, a pool that outlives its children, storage faults that pause a lane.

* ``lstdp worker`` is started for real (a subprocess, embedded SQLite or the test Redis), its
  reconciler and a pool child are killed with SIGKILL: the reconciler runs again within one
  reconcile interval, and the worker stays up with its pool refilled.
* A full disk is the kernel's: the product's temporary file is opened on ``/dev/full``, whose
  every write fails with ENOSPC (astropy then hides it behind an ``AttributeError``): the reason
  recorded is "No space left on device", the lane pauses, no frame fails until the fault has
  outlasted ``STORAGE_FAULT_BOUND_S``, and the first write that succeeds ends the pause.
* A worker whose clock is 2 h ahead runs under ``faketime`` against a PostgreSQL database of
  its own: it takes no live claim of another worker, its reconciler takes none back, and the
  times it writes are the database's.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from backend.broker import InFlight
from backend.models import Frame, Job, JobState, LaneFault, Product, ProductState
from tests.conftest import REDIS_URL, require

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- helpers
def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the direct children of process ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _wait(predicate, timeout_s: float, step_s: float = 0.05):
    """``predicate()``'s first truthy value within ``timeout_s``, else None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(step_s)
    return None


def _start_worker(folder: Path, *args: str, env: dict | None = None, unset=()) -> subprocess.Popen:
    log = open(folder / "worker.log", "ab")  # noqa: SIM115 - closed with the process
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for k in unset:
        full.pop(k, None)
    return subprocess.Popen([sys.executable, "-m", "backend.cli", "worker", "--concurrency", "2", *args],
                            cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """Stop a worker we started, by its process group (its pool and reconciler too)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def _reconcilers(worker_pid: int) -> list[int]:
    return [p for p, cmd in _children(worker_pid) if " reconcile --parent " in cmd]


def _pool(worker_pid: int) -> list[int]:
    return [p for p, cmd in _children(worker_pid) if " worker " in cmd and " reconcile " not in cmd]


# --------------------------------------------------------------------------- supervision
#: The started worker's RECONCILE_INTERVAL_S [s]: its supervisor checks the reconciler every
#: min(1 s, a quarter of it), so a killed one runs again about 1 s after the kill; the promise
#: tested is "within one interval". At 2 s that left a loaded 2-core machine about 1 s of slack
#: for the supervisor thread's wake-up, the fork/exec and the test's /proc scans, three times in
#: a row; 8 s keeps the promise's bound with slack for the load (a supervisor that never restarts
#: the reconciler, or restarts it only after more than 8 s, still fails; one that waits for its
#: next 1 s check does not, and should not).
STARTED_INTERVAL_S = 8


@pytest.fixture(scope="module")
def started_worker(tmp_path_factory, run_cache):
    """One ``lstdp worker`` (two pool processes, its reconciler every ``STARTED_INTERVAL_S``, the test Redis as
    broker, embedded SQLite) one of whose pool processes was killed with SIGKILL as soon as
    both existed, before the worker's start-up check of its pool (Celery then stopped the
    whole worker with ``WorkerLostError('Could not start worker processes')``).
    Yields (process, folder, killed pid)."""
    import redis

    from tests.conftest import _migrate_sqlite

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError:
        require(False, f"Redis at {REDIS_URL} is needed")
    folder = tmp_path_factory.mktemp("started_worker")
    (folder / "var").mkdir()
    shutil.copyfile(run_cache.get("sqlite-migrated", _migrate_sqlite) / "lstdp.sqlite3", folder / "var" / "lstdp.sqlite3")
    env = {"DATA_DIR": str(folder / "var"), "RECONCILE_INTERVAL_S": str(STARTED_INTERVAL_S), "CELERY_BROKER_URL": REDIS_URL,
           "CELERY_RESULT_BACKEND": REDIS_URL}
    worker = _start_worker(folder, env=env, unset=("DATABASE_URL", "LSTDP_DATABASE_URL", "LSTDP_DATA_DIR",
                                                   "LSTDP_CELERY_BROKER_URL", "LSTDP_CELERY_RESULT_BACKEND"))
    try:
        # both pool processes forked (a lone child seen earlier may be a passing fork of start-up)
        child = _wait(lambda: _pool(worker.pid) if len(_pool(worker.pid)) >= 2 else None, 120, step_s=0.01)
        assert child, (folder / "worker.log").read_text()[-2000:]
        os.kill(child[0], signal.SIGKILL)
        yield worker, folder, child[0]
    finally:
        _stop(worker)
        client.flushdb()


def test_a_pool_childs_death_at_start_leaves_its_worker_up(started_worker):
    """The worker runs on and its pool is refilled to its two processes."""
    worker, folder, killed = started_worker
    # the worker's start (consumer ready, its start-up check of the pool) comes after the kill
    assert _wait(lambda: "ready." in (folder / "worker.log").read_text(), 120)
    time.sleep(1.0)
    log = (folder / "worker.log").read_text()
    assert worker.poll() is None, log[-3000:]
    assert "Could not start worker processes" not in log
    refilled = _wait(lambda: len(_pool(worker.pid)) == 2 and killed not in _pool(worker.pid), 30)
    assert refilled, _pool(worker.pid)


def test_a_killed_reconciler_runs_again_within_one_reconcile_interval(started_worker):
    """``kill -9`` of the worker's reconciler, three times: each time a new one is running
    within one ``RECONCILE_INTERVAL_S`` (``STARTED_INTERVAL_S`` here), and the worker runs on."""
    worker, folder, _ = started_worker
    interval = float(STARTED_INTERVAL_S)
    first = _wait(lambda: _reconcilers(worker.pid), 60)
    assert first, (folder / "worker.log").read_text()[-2000:]
    current = first[0]
    for _ in range(3):
        os.kill(current, signal.SIGKILL)
        t0 = time.monotonic()
        again = _wait(lambda: [p for p in _reconcilers(worker.pid) if p != current], interval)
        took = time.monotonic() - t0
        assert again, f"no reconciler again within {interval} s of the kill"
        assert took <= interval
        current = again[0]
    assert worker.poll() is None
    assert "started again" in (folder / "worker.log").read_text()


# --------------------------------------------------------------------------- storage faults
N_FRAMES = 4


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from pipelines.simulation import simulate

    out = tmp_path_factory.mktemp("workers_sim")
    return simulate(out, channels=("WST",), naxis=64, noise=False, seed=11, sdi_sequence=False,
                    frames_per_channel=N_FRAMES)


def _full_disk(monkeypatch, store: Path) -> None:
    """Every temporary product file under ``store`` is opened on ``/dev/full``: its writes fail
    in the kernel with ENOSPC, as on a full disk (other temporary files are left alone)."""
    import pipelines.fitsio as fitsio

    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        if str(kwargs.get("dir", "")).startswith(str(store)):
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY)
        return fd, name

    monkeypatch.setattr(fitsio.tempfile, "mkstemp", mkstemp)


def test_astropy_hiding_enospc_is_unwrapped(tmp_path, monkeypatch):
    """The real write path on ``/dev/full``: whatever astropy raises on top, the fault found
    is the kernel's ENOSPC; a data error is none."""
    import numpy as np
    from astropy.io import fits

    from backend.worker.storage_faults import storage_fault
    from pipelines.errors import DataError
    from pipelines.fitsio import write_fits_atomic

    _full_disk(monkeypatch, tmp_path)
    with pytest.raises(Exception) as info:
        write_fits_atomic(fits.HDUList([fits.PrimaryHDU(np.zeros((256, 256), np.float32))]), tmp_path / "x.fits",
                          tmp_dir=tmp_path / ".tmp")
    err = storage_fault(info.value)
    assert err is not None and err.errno == errno.ENOSPC and "No space left on device" in str(err)
    assert storage_fault(OSError(errno.EROFS, os.strerror(errno.EROFS))).errno == errno.EROFS
    assert storage_fault(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is not None
    assert storage_fault(DataError("bad frame")) is None
    assert storage_fault(FileNotFoundError(errno.ENOENT, "gone")) is None


def test_a_full_disk_pauses_the_lane_and_fails_no_frame_until_the_bound(settings_env, run_cache, simulated,
                                                                         monkeypatch):
    from backend.db import session_scope
    from backend.services.ingest import ingest_path
    from backend.settings import get_settings
    from backend.worker import reconcile
    from backend.worker.processing import calibrate_product, plan_job
    from tests.conftest import _migrate_sqlite, _sqlite_path

    settings = settings_env(STORAGE_RETRY_S="30", STORAGE_FAULT_BOUND_S="3600", RECONCILE_INTERVAL_S="5")
    shutil.copyfile(run_cache.get("sqlite-migrated", _migrate_sqlite) / "lstdp.sqlite3", _sqlite_path(settings))
    sent: list[int] = []
    monkeypatch.setattr(reconcile, "send_calibration", lambda pid, job_id, queue="cpu": sent.append(pid))
    with session_scope() as s:
        for p in [c.path for c in simulated.calibration_files] + list(simulated.raw_files):
            assert ingest_path(s, p, settings, move=False).status in ("ingested", "calibration")
        t0 = min(s.scalars(select(Frame.date_obs)))
        job = Job(parameters={"channels": ["WST"], "start": (t0 - dt.timedelta(days=1)).isoformat(),
                              "end": (t0 + dt.timedelta(days=1)).isoformat(), "options": {}})
        s.add(job)
        s.flush()
        job_id = job.id
    with session_scope() as s:
        todo = plan_job(s, job_id)
    assert len(todo) == N_FRAMES

    _full_disk(monkeypatch, settings.products)
    for pid in todo:  # every delivery of the lane, as a worker takes them
        with session_scope() as s:
            calibrate_product(s, pid, settings)
    with session_scope() as s:
        prods = list(s.scalars(select(Product).where(Product.id.in_(todo))))
        assert [p.state for p in prods] == [ProductState.planned] * N_FRAMES  # none failed
        assert all((p.attempts or 0) == 0 and p.error is None for p in prods)
        fault = s.get(LaneFault, "cpu")
        assert fault is not None and "No space left on device" in fault.reason, fault and fault.reason
        assert "AttributeError" not in fault.reason
        assert fault.failures == 1  # the other deliveries waited: only one tried the store
        retry_at = fault.retry_at.replace(tzinfo=dt.UTC)
        # the reconciler sends nothing of the paused lane before retry_at, then one frame
        first_at = fault.first_at.replace(tzinfo=dt.UTC)
        reconcile.reconcile_once(s, settings, now=retry_at - dt.timedelta(seconds=1), flight=InFlight())
        assert sent == []
        report = reconcile.reconcile_once(s, settings, now=retry_at + dt.timedelta(seconds=1), flight=InFlight())
        assert len(sent) == 1 and not report.unconsumed and not report.given_up
        # a planned product of the paused lane is never failed as "unconsumed", however long
        flight = InFlight(products=set(todo))
        report = reconcile.reconcile_once(s, settings, now=first_at + dt.timedelta(seconds=3000), flight=flight)
        assert report.unconsumed == []

    # the overlapped CPU batch (CPU_BATCH_SIZE > 1) on the full disk: its frames are given
    # back too, none fails, each try counted on the lane's fault
    from backend.worker.gpu_batch import calibrate_products_batch

    with session_scope() as s:
        report = calibrate_products_batch(s, list(todo[1:3]), settings, job_id=job_id, device="cpu")
        assert sorted(report.skipped) == sorted(todo[1:3]) and not report.failed and not report.written
        prods = list(s.scalars(select(Product).where(Product.id.in_(todo[1:3])).execution_options(
            populate_existing=True)))
        assert [p.state for p in prods] == [ProductState.planned] * 2 and all(p.attempts == 0 for p in prods)
        fault = s.get(LaneFault, "cpu")
        s.refresh(fault)
        assert fault.failures == 3 and "No space left on device" in fault.reason

    # the fault outlasts the bound: the next try fails its frame, with the true reason
    monkeypatch.setenv("STORAGE_FAULT_BOUND_S", "0.5")
    get_settings.cache_clear()
    short = get_settings()
    time.sleep(0.6)
    with session_scope() as s:
        prod = calibrate_product(s, todo[0], short)
        assert prod.state == ProductState.failed
        assert "No space left on device" in prod.error and "STORAGE_FAULT_BOUND_S" in prod.error, prod.error

    # space again: while the lane waits (its backoff after the fourth try) nothing is
    # tried; once its retry_at has passed (set here) the next write succeeds and ends the pause
    monkeypatch.undo()
    with session_scope() as s:
        assert calibrate_product(s, todo[1], settings).state == ProductState.planned
        fault = s.get(LaneFault, "cpu")
        s.refresh(fault)
        assert fault.failures == 4
        fault.retry_at = fault.first_at
    with session_scope() as s:
        assert calibrate_product(s, todo[1], settings).state == ProductState.written
        assert s.get(LaneFault, "cpu") is None
        assert calibrate_product(s, todo[2], settings).state == ProductState.written


# --------------------------------------------------------------------------- clock and identity
def test_worker_ids_are_unique_per_process_start():
    from backend.identity import worker_id
    from backend.state import this_process, worker_of

    mine = worker_id()
    assert worker_of(this_process("t", 0)) == mine and len(mine) == 32
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, worker_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 64).decode()
    os.close(r)
    os.close(w)
    assert child and child != mine  # a forked pool child is a worker of its own


CLOCK_SCRIPT = textwrap.dedent("""
    import datetime as dt, json, sys, time
    from backend.broker import InFlight
    from backend.db import session_scope
    from backend.models import Product
    from backend.settings import get_settings
    from backend.state import claim_product, move_product
    from backend.models import ProductState
    from backend.worker import reconcile
    from backend.worker.processing import count_item

    live, other, job_id = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    reconcile.send_calibration = lambda *a, **k: None
    s = get_settings()
    out = {"own_clock": time.time()}
    with session_scope() as session:
        out["live"] = claim_product(session, live, lease_s=s.lease_s, max_deliveries=3).status
        report = reconcile.reconcile_once(session, s, flight=InFlight())
        out["taken_back"] = report.taken_back
        got = claim_product(session, other, lease_s=s.lease_s, max_deliveries=3)
        out["other"] = got.status
        prod = session.get(Product, other)
        move_product(prod, ProductState.failed, "a failure written by the skewed worker")
        session.commit()
        count_item(session, job_id, other)
        session.commit()
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.postgres
def test_a_worker_with_its_clock_2h_off_takes_no_live_claim_and_writes_no_time_of_its_own(settings_env, pg_url,
                                                                                       pg_engine):
    from sqlalchemy import text

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from backend.db import make_engine
    from backend.models import JobItem
    from backend.state import claim_product, this_process
    from tests.conftest import PG_ADMIN, drop_pg_database

    faketime = shutil.which("faketime")
    require(faketime is not None, "faketime (Debian package faketime) is needed")
    # a database of its own (the test commits), copied from the session's migrated one
    pg_engine.dispose()  # CREATE DATABASE ... TEMPLATE needs the template without sessions
    name = f"workers_clock_{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_url.rsplit("/", 1)[1]}"'))
    admin.dispose()
    url = f"{pg_url.rsplit('/', 1)[0]}/{name}"
    engine = make_engine(url)
    try:
        settings_env(DATABASE_URL=url, RECONCILE_INTERVAL_S="30")
        now = dt.datetime.now(dt.UTC)
        with Session(engine) as s:
            job = Job(parameters={"channels": ["WST"]}, state=JobState.running, total=2, done=0, failed=0, skipped=0)
            s.add(job)
            s.flush()
            ids = []
            for i in range(2):
                f = Frame(channel_code="WST", date_obs=now, exposure_s=1.0, naxis1=8, naxis2=8, path=f"/x/{i}",
                          original_name=f"{i}.fits", sha256=f"{i:064d}", size_bytes=1, header={})
                s.add(f)
                s.flush()
                p = Product(frame_id=f.id, calibration_key="k", params_hash="h", software_version="t",
                            state=ProductState.planned, job_id=job.id, parameters={"options": {}}, attempts=0,
                            sent_at=now)
                s.add(p)
                s.flush()
                s.add(JobItem(job_id=job.id, frame_id=f.id, product_id=p.id))
                ids.append(p.id)
            s.commit()
            job_id = job.id
            # this process is the other worker: its live claim (heartbeat written with it)
            assert claim_product(s, ids[0], lease_s=960, max_deliveries=3, holder=this_process("t0", 0)).status \
                == "claimed"
        proc = subprocess.run([faketime, "-f", "+2h", sys.executable, "-c", CLOCK_SCRIPT, str(ids[0]), str(ids[1]),
                               job_id], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": url})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
        out = json.loads(lines[-1].removeprefix("RESULT "))
        with engine.connect() as c:
            db_now = c.execute(text("SELECT clock_timestamp()")).scalar_one()
        assert out["own_clock"] - db_now.timestamp() > 7000  # the rig: its clock was 2 h ahead
        assert out["live"] == "busy" and out["taken_back"] == [] and out["other"] == "claimed"
        with Session(engine) as s:
            live, other = s.get(Product, ids[0]), s.get(Product, ids[1])
            assert live.state == ProductState.writing and live.attempts == 1 and "task=t0" in live.claimed_by
            item = s.scalar(select(JobItem).where(JobItem.product_id == ids[1]))
            stamps = {"claimed_at": other.claimed_at, "updated_at": other.updated_at, "settled_at": item.settled_at}
        for name, t in stamps.items():
            assert t is not None and abs((t - db_now).total_seconds()) < 120, (name, t, db_now)
        assert other.updated_at >= other.created_at
    finally:
        engine.dispose()
        drop_pg_database(url)


@pytest.mark.postgres
def test_a_claim_lives_by_its_workers_heartbeat_on_any_host_whatever_its_host_and_pid(db_session, monkeypatch):
    """Two hosts with one name: a claim whose holder names this host and a pid that is not
    alive here is live while its worker beats (the old ``host:pid`` rule took it); a claim
    whose worker stopped beating more than ``Settings.heartbeat_timeout_s`` ago (one reconcile
    interval, at least 10 s) is taken back by the next pass, from any host."""
    import socket

    from backend.clock import db_now
    from backend.models import WorkerHeartbeat
    from backend.settings import Settings
    from backend.worker import reconcile
    from tests.test_reconcile import _dead_pid, _job

    settings = Settings(TASK_TIME_LIMIT_S=100, TASK_SOFT_TIME_LIMIT_S=90, RECONCILE_INTERVAL_S=5, MAX_DELIVERIES=3)
    s = db_session
    now = db_now(s)
    same_name = f"{socket.gethostname()}:{_dead_pid()}"
    job, (alive, dead) = _job(s, [ProductState.writing, ProductState.writing])
    assert settings.heartbeat_timeout_s == 10.0  # MIN_HEARTBEAT_TIMEOUT_S
    for prod, wid, beat_ago in ((alive, "a" * 32, 8.0), (dead, "b" * 32, 11.0)):
        prod.claimed_by = f"{same_name} worker={wid} task=t try=0"
        prod.claimed_at = now - dt.timedelta(seconds=10)  # well within the 160 s lease
        prod.attempts = 1
        s.add(WorkerHeartbeat(id=wid, host=socket.gethostname(), pid=1, started_at=now - dt.timedelta(seconds=60),
                              heartbeat_at=now - dt.timedelta(seconds=beat_ago)))
    s.flush()
    sent: list[int] = []
    monkeypatch.setattr(reconcile, "send_calibration", lambda pid, job_id, queue="cpu": sent.append(pid))
    report = reconcile.reconcile_once(s, settings, flight=InFlight())
    assert report.taken_back == [dead.id] and sent == [dead.id]
    s.refresh(alive)
    assert alive.state == ProductState.writing and alive.attempts == 1


def test_the_heartbeat_renews_while_the_task_thread_is_busy(sqlite_env):
    """The heartbeat thread writes the database's time every third of the interval while the
    calling thread computes (here: holds the GIL in a Python loop)."""
    from backend import identity
    from backend.db import get_engine
    from backend.models import WorkerHeartbeat
    from backend.settings import Settings
    from sqlalchemy.orm import Session

    if identity.heartbeat_running():  # another test of this process left its heartbeat on: this one's own
        identity.stop_heartbeat()
    assert not identity.heartbeat_running()
    identity.start_heartbeat(Settings(RECONCILE_INTERVAL_S=0.6))
    try:
        with Session(get_engine()) as s:
            first = s.get(WorkerHeartbeat, identity.worker_id()).heartbeat_at
        # busy, as a calibration in pure Python, until a beat at least 0.4 s after the first is
        # seen (beats every 0.2 s): a bound of 30 s, not a speed (a fixed 1 s of work held no
        # beat when the process was descheduled for most of it)
        t0 = time.monotonic()
        last, x = first, 0
        while time.monotonic() - t0 < 30.0 and (last - first).total_seconds() < 0.4:
            for _ in range(200_000):
                x += 1
            with Session(get_engine()) as s:
                last = s.get(WorkerHeartbeat, identity.worker_id()).heartbeat_at
    finally:
        identity.stop_heartbeat()
    assert not identity.heartbeat_running()
    assert (last - first).total_seconds() >= 0.4, (first, last)


def test_messages_are_acknowledged_late_and_no_result_the_platform_does_not_read_is_stored():
    """Every task is acknowledged after its body (``acks_late``, redelivered if its worker
    dies), and none but ``ingest_file`` (read by the CLI) stores a result: a result backend
    that fails after a task's body wrote its product has nothing to store, so it cannot
    turn the written product into a failure."""
    from backend.broker import TaskName, app, configure

    configure(role="worker")
    import backend.worker.tasks  # noqa: F401 - registers the tasks

    for name in TaskName.all():
        task = app.tasks[name]
        assert task.acks_late, name
        assert task.ignore_result == (name != TaskName.ingest_file), name
    assert app.conf.task_reject_on_worker_lost and not app.conf.task_store_errors_even_if_ignored
    configure(role="api")
