"""Celery's soft time limit is not by itself a frame failure (issue 28).

A calibration past ``TASK_SOFT_TIME_LIMIT_S`` may be a host frozen past its limit and thawed
(the pool's parent fires the limit at once), a store or database that did not answer, a loaded
machine: none of them the frame's fault. The product goes back (``planned``, the start counted
towards ``MAX_DELIVERIES``) and its calibration is sent again at once; struck while waiting on
storage, the lane pauses too (a storage fault, :mod:`backend.worker.storage_faults`). Only on
its ``MAX_DELIVERIES``-th start does it fail, with a reason naming both settings
(:func:`backend.worker.processing.give_back_after_time_limit`). Before, the first soft limit
failed the product at once: ``benchmarks/cluster.py`` printed ``products=299`` of 300 frames.

Here through the CPU task (``calibrate_product``, Celery's ``apply``: the task body, its
re-send and its settling of the job's item); the batch tasks: ``tests/test_gpu_batch.py``;
every point between placing and committing: ``tests/test_placement_points.py``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import delete, select

from backend.models import Frame, ItemOutcome, Job, JobItem, JobState, LaneFault, PlacedObject, Product, ProductState

N_FRAMES = 3


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from pipelines.simulation import simulate

    out = tmp_path_factory.mktemp("soft_limit_sim")
    return simulate(out, channels=("WST",), naxis=64, noise=False, seed=5, sdi_sequence=False,
                    frames_per_channel=N_FRAMES)


@pytest.fixture
def job(sqlite_env, simulated, monkeypatch):
    """The simulated frames ingested, one CPU job planned over them; the task's sends recorded
    (no broker: ``sent`` lists ``(product id, job id, queue)``), follow-ups not sent. Returns
    (settings, job id, product ids, sent)."""
    from backend.db import session_scope
    from backend.services.ingest import ingest_path
    from backend.worker import reconcile, tasks
    from backend.worker.processing import plan_job

    settings = sqlite_env
    assert (settings.max_deliveries, settings.cpu_batch_size) == (3, 1)
    with session_scope() as s:
        for p in [c.path for c in simulated.calibration_files] + list(simulated.raw_files):
            assert ingest_path(s, p, settings, move=False).status in ("ingested", "calibration")
        t0 = min(s.scalars(select(Frame.date_obs)))
        row = Job(parameters={"channels": ["WST"], "start": (t0 - dt.timedelta(days=1)).isoformat(),
                              "end": (t0 + dt.timedelta(days=1)).isoformat(), "options": {}})
        s.add(row)
        s.flush()
        job_id = row.id
    with session_scope() as s:
        todo = plan_job(s, job_id)
    assert len(todo) == N_FRAMES
    sent: list[tuple] = []
    monkeypatch.setattr(tasks, "send_calibration", lambda pid, jid, queue="cpu": sent.append((pid, jid, queue)))
    monkeypatch.setattr(tasks, "_beating", lambda: None)  # no heartbeat thread left behind
    monkeypatch.setattr(reconcile, "send", lambda *a, **k: None)
    return settings, job_id, todo, sent


def _deliver(pid: int, job_id: str) -> dict:
    """One delivery of product ``pid``'s calibration message (the task body, as a worker runs it)."""
    from backend.worker import tasks

    return tasks.calibrate_product.apply(args=[pid, job_id]).get()


def _limit_for(monkeypatch, pid: int, times: int) -> list[int]:
    """Make the science of product ``pid``'s frame meet the soft time limit on its next
    ``times`` calibrations (raised inside it, as Celery's signal handler raises it wherever the
    task is). Returns the list of products it struck."""
    import pipelines.calibration as calibration
    from backend.db import session_scope

    with session_scope() as s:
        name = Path(s.get(Product, pid).frame.path).name
    real, struck = calibration.calibrate_frame, []

    def limited(data, header, *args, **kw):
        if str(header.get("FILENAME", "")).strip() == name and len(struck) < times:
            struck.append(pid)
            raise SoftTimeLimitExceeded()
        return real(data, header, *args, **kw)

    monkeypatch.setattr(calibration, "calibrate_frame", limited)
    return struck


def _product(pid: int) -> Product:
    from backend.db import session_scope

    with session_scope() as s:
        p = s.get(Product, pid)
        s.expunge(p)
        return p


def _job(job_id: str) -> tuple[Job, dict[int, JobItem]]:
    from backend.db import session_scope

    with session_scope() as s:
        j = s.get(Job, job_id)
        items = {i.product_id: i for i in s.scalars(select(JobItem).where(JobItem.job_id == job_id))}
        s.expunge_all()
        return j, items


def test_a_soft_limit_on_the_first_delivery_gives_the_product_back_and_the_next_writes_it(job, monkeypatch):
    from backend.db import session_scope

    _settings, job_id, todo, sent = job
    pid = todo[0]
    struck = _limit_for(monkeypatch, pid, times=1)
    out = _deliver(pid, job_id)
    assert struck == [pid] and out["state"] == "planned", out
    p = _product(pid)
    # back for another delivery: this start counted, no claim, no reason; not failed
    assert (p.state, p.attempts, p.claimed_by, p.claimed_at, p.error) == (ProductState.planned, 1, None, None, None)
    assert sent == [(pid, job_id, "cpu")]  # sent again at once
    j, items = _job(job_id)
    assert j.state == JobState.running and items[pid].outcome == ItemOutcome.pending
    with session_scope() as s:
        assert s.scalars(select(LaneFault)).all() == []  # not waiting on storage: the lane goes on
    # the message sent again is delivered: written; the other frames too; the job succeeds
    assert _deliver(pid, job_id)["state"] == "written"
    for other in todo[1:]:
        assert _deliver(other, job_id)["state"] == "written"
    p = _product(pid)
    assert (p.state, p.attempts, p.error) == (ProductState.written, 2, None)
    j, items = _job(job_id)
    assert j.state == JobState.succeeded and (j.done, j.failed) == (N_FRAMES, 0)


def test_a_product_past_the_soft_limit_on_every_delivery_ends_failed_with_the_reason(job, monkeypatch):
    settings, job_id, todo, sent = job
    pid = todo[1]
    struck = _limit_for(monkeypatch, pid, times=100)
    deliveries = 0
    while True:  # each message the task sends again is delivered, as a worker takes it
        _deliver(pid, job_id)
        deliveries += 1
        if len(sent) < deliveries:  # not sent again
            break
        assert sent[-1] == (pid, job_id, "cpu") and deliveries < 10, (sent, "not bounded")
    assert deliveries == settings.max_deliveries == len(struck) == 3
    assert len(sent) == 2  # sent again after the first two; the third fails it
    p = _product(pid)
    assert p.state == ProductState.failed and p.attempts == 3
    assert p.error == ("calibration passed the soft time limit of 840 s (TASK_SOFT_TIME_LIMIT_S) on its delivery 3 "
                       "of at most 3 (MAX_DELIVERIES); no delivery of this frame finished"), p.error
    for other in (todo[0], todo[2]):
        assert _deliver(other, job_id)["state"] == "written"
    j, items = _job(job_id)  # the job ends, the frame's reason with it
    assert j.state == JobState.failed and (j.done, j.failed) == (N_FRAMES - 1, 1)
    assert items[pid].outcome == ItemOutcome.failed and "TASK_SOFT_TIME_LIMIT_S" in items[pid].reason


def test_a_soft_limit_while_waiting_on_storage_pauses_the_lane_with_that_reason(job, monkeypatch):
    """Struck inside the product store's I/O (here the rename of the written FITS file, in
    ``pipelines.fitsio``): a storage fault too. The lane pauses with a true reason, the product
    goes back (start counted) for the reconciler to send when the lane is tried again."""
    import os

    from backend.db import session_scope

    settings, job_id, todo, sent = job
    pid = todo[2]
    real, struck = os.replace, []

    def replace(src, dst, *a, **kw):
        if str(dst).endswith(".fits") and "/.tmp/" not in str(dst) and not struck:
            struck.append(dst)
            raise SoftTimeLimitExceeded()
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    assert _deliver(pid, job_id)["state"] == "planned"
    monkeypatch.setattr(os, "replace", real)
    assert struck
    p = _product(pid)
    assert (p.state, p.attempts, p.claimed_by) == (ProductState.planned, 1, None)
    assert sent == []  # the lane waits: the reconciler sends it when the lane is tried again
    with session_scope() as s:
        fault = s.get(LaneFault, "cpu")
        assert fault is not None and "soft time limit of 840 s (TASK_SOFT_TIME_LIMIT_S)" in fault.reason, fault
        assert "[Errno 110]" in fault.reason or "timed out" in fault.reason.lower(), fault.reason
    with session_scope() as s:  # what the attempt recorded before placing is settled (nothing left)
        assert s.scalars(select(PlacedObject)).all() == []
    assert not os.path.exists(struck[0]) and not list((settings.products / ".tmp").rglob("*.fits"))
    # a delivery while the lane waits does nothing; tried again (retry_at passed), it is written
    assert _deliver(pid, job_id)["state"] == "planned"
    with session_scope() as s:
        s.execute(delete(LaneFault))
    assert _deliver(pid, job_id)["state"] == "written"
    assert _product(pid).attempts == 2


def _raised_in(*modules: str, exc_type=SoftTimeLimitExceeded, context: BaseException | None = None):
    """The exception raised by a function of ``modules[-1]`` called through functions of the
    modules before it (each a function whose globals are that module's name, as its frames
    are), while ``context`` is being handled if given."""
    call = None
    for module in reversed(modules):
        g = {"__name__": module, "E": exc_type, "inner": call}
        exec("def f():\n    if inner is None:\n        raise E()\n    inner()\n", g)
        call = g["f"]
    try:
        if context is None:
            call()
        try:
            raise context
        except BaseException:  # the call raises while ``context`` is being handled
            call()
    except BaseException as exc:  # noqa: BLE001
        return exc


def test_where_the_limit_struck_is_read_from_its_traceback():
    from backend.store import StoreError
    from backend.worker.processing import blocked_in

    assert blocked_in(_raised_in("backend.store")) == "store"
    assert blocked_in(_raised_in("backend.worker.processing", "backend.store", "obstore.store")) == "store"
    assert blocked_in(_raised_in("pipelines.fitsio")) == "store"
    assert blocked_in(_raised_in("backend.worker.processing", "sqlalchemy.engine.base", "psycopg.waiting")) == \
        "database"
    assert blocked_in(_raised_in("pipelines.calibration.l2.flow")) is None
    # the innermost frame decides: an import of sunpy that the file I/O started is not the store's
    assert blocked_in(_raised_in("pipelines.fitsio", "importlib._bootstrap", "sunpy.coordinates")) is None
    # the signal handler's own frame (billiard's) and test hooks say nothing
    assert blocked_in(_raised_in("backend.store", "billiard.pool")) == "store"
    assert blocked_in(_raised_in("pipelines.fitsio", "tests.hooks")) == "store"
    # wrapped by the store's client (StoreError from it), or re-raised as the batch does: still the store
    limit = _raised_in("backend.store")
    try:
        raise StoreError("upload failed") from limit
    except StoreError as wrapped:
        assert blocked_in(wrapped) == "store"
        try:
            raise SoftTimeLimitExceeded(str(wrapped)) from wrapped  # backend.worker.gpu_batch._raise_time_limit
        except SoftTimeLimitExceeded as again:
            assert blocked_in(again) == "store"
    # what the limit interrupted is not where it struck: a store error being handled by the science
    assert blocked_in(_raised_in("pipelines.calibration.l2.flow",
                                 context=_raised_in("backend.store", exc_type=OSError))) is None


def test_a_module_whose_import_was_cut_short_is_imported_again(tmp_path, monkeypatch):
    """A time limit inside an import, struck in the import machinery's clean-up, leaves the
    module in ``sys.modules`` half-initialised: every later ``from pkg import name`` of that
    process fails ("partially initialized module"; ``benchmarks/cluster.py``: 240 frames of one
    pool child failed so after a thawed freeze cut its first ``import sunpy``). Before each task
    such modules are forgotten, and the next import runs them again."""
    import importlib.util
    import sys

    from backend.worker.tasks import _forget_broken_imports

    pkg = tmp_path / "lstdp_cut_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .part import X\n")
    (pkg / "part.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.find_spec("lstdp_cut_pkg")
    spec._initializing = True  # what the cut import left: the package there, its names missing
    monkeypatch.setitem(sys.modules, "lstdp_cut_pkg", importlib.util.module_from_spec(spec))
    with pytest.raises(ImportError, match="partially initialized module"):
        exec("from lstdp_cut_pkg import X")
    assert _forget_broken_imports() == ["lstdp_cut_pkg"]
    from lstdp_cut_pkg import X

    assert X == 1 and _forget_broken_imports() == []
