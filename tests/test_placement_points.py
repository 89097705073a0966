"""Every point between placing a product's object and committing its row (issue 28).

A calibration places its FITS and quicklook in the product store (the local folder: renamed
into place; S3 on a real SeaweedFS, :mod:`tests.seaweed`: create-once uploads read back) and
then commits the row that names them. A dry run records every operation of one calibration
(file renames and fsyncs, object-store calls, database statements and COMMITs); then, for each
operation after the first object is placed up to the row's COMMIT, one calibration stops right
before it by:

* ``soft``: Celery's ``SoftTimeLimitExceeded`` (the handlers run: the claim goes back for another
  delivery, its start counted, and the writer removes what it placed; struck in the store's
  client, the lane pauses too; the next delivery writes the product);
* ``soft_give_up``: the same on the product's last delivery (``MAX_DELIVERIES=1``): it fails with
  a reason naming ``TASK_SOFT_TIME_LIMIT_S`` and ``MAX_DELIVERIES``;
* ``enospc``: ``OSError(ENOSPC)`` (a storage fault: the lane pauses, the frame waits, the
  writer removes what it placed; the lane tried again writes the product);
* ``kill`` / ``kill_give_up``: a kill (:class:`Killed`, a ``BaseException`` no handler of
  the worker catches: nothing after the point runs but the transaction's rollback, as when
  the database drops a dead client's connection). A redelivery by another worker then takes
  the dead claim over and writes the product, or, with ``MAX_DELIVERIES=1``, fails it with
  the give-up reason. Before the reconciler runs, ``fsck`` must see what the killed writer
  left (in the give-up case: the sweep is what removes it).

After each: a reconciler pass (:func:`backend.worker.reconcile.reconcile_once`, which sweeps
the write-ahead records of placed objects, :mod:`backend.worker.placements`), then exactly
one product row, ``written`` with its two objects and nothing else in the store, or ``failed``
with its reason and nothing in the store, and ``lstdp fsck`` clean (no orphan file, attempt
object or partial file). A pass at the lease's end leaves no record.
"""

from __future__ import annotations

import copy
import errno
import itertools
import os
import uuid

import pytest
from sqlalchemy import delete, event, select, update
from sqlalchemy.engine import Engine

from backend.models import Frame, LaneFault, PlacedObject, Product, ProductState
from tests.test_product_store import _fsck, _objects, database, s3, simulated  # noqa: F401 - fixtures

_prefixes = itertools.count()


class Killed(BaseException):
    """The process stops here: no ``except Exception`` of the worker sees it."""


@pytest.fixture
def store_env(request, database, settings_env, simulated):  # noqa: F811 - fixtures imported above
    """Settings of the store named by the ``store`` parameter (``local``: the embedded default;
    ``s3``: a fresh prefix of the test SeaweedFS), the simulated frames ingested and one product
    planned. Returns (settings, product id)."""
    from backend.db import session_scope
    from backend.services.ingest import ingest_path
    from backend.worker.processing import plan_product

    env = {"MAX_DELIVERIES": "100", "DATABASE_URL": database}
    if request.param == "s3":
        env.update(request.getfixturevalue("s3").env("lstdp-test", f"points{next(_prefixes)}-{uuid.uuid4().hex[:6]}"))
    settings = settings_env(**env)
    with session_scope() as s:
        for p in [c.path for c in simulated.calibration_files] + list(simulated.raw_files):
            assert ingest_path(s, p, settings, move=False).status in ("ingested", "calibration")
    with session_scope() as s:
        frame = s.scalars(select(Frame).order_by(Frame.id)).first()
        pid = plan_product(s, frame, pinned=None, options={}, job_id=None)[0].id
    return settings, pid


class Ops:
    """Records the operations of a calibration, and stops it right before operation number
    ``at`` (1-based) with ``fault()``."""

    def __init__(self, at: int = 0, fault=None):
        self.at, self.fault, self.seen = at, fault, []
        self._undo = None

    def op(self, kind: str, detail: str = "", dbapi=None) -> None:
        self.seen.append((kind, detail))
        if len(self.seen) == self.at:
            raise self.fault(kind, dbapi)

    def install(self, mp: pytest.MonkeyPatch):
        import obstore as obs
        from sqlalchemy.engine.default import DefaultDialect

        for name in ("replace", "link", "fsync"):
            real = getattr(os, name)

            def wrapped(*a, _real=real, _name=name, **kw):
                self.op(f"os.{_name}", str(a[1]) if _name != "fsync" else "")
                return _real(*a, **kw)

            mp.setattr(os, name, wrapped)
        for name in ("put", "get", "head", "delete"):
            real = getattr(obs, name)

            def wrapped(*a, _real=real, _name=name, **kw):
                self.op(f"s3.{_name}", str(a[1]))
                return _real(*a, **kw)

            mp.setattr(obs, name, wrapped)

        def before(conn, cursor, statement, params, context, executemany):
            self.op("db", " ".join(statement.split()[:3]), conn.dialect.loaded_dbapi)

        real_commit = DefaultDialect.do_commit

        def do_commit(dialect, dbapi_connection):
            self.op("db", "COMMIT", dialect.loaded_dbapi)
            real_commit(dialect, dbapi_connection)

        mp.setattr(DefaultDialect, "do_commit", do_commit)
        event.listen(Engine, "before_cursor_execute", before)
        self._undo = lambda: event.remove(Engine, "before_cursor_execute", before)


def _holder(name: str, retry: int = 0) -> str:
    """A claim holder of a worker that is not this process (no heartbeat row: dead once it
    stops; a redelivery of another worker takes its claim over). ``retry``: the try number of
    task ``name`` (a later try retakes the claim of an earlier one)."""
    return f"host-{name}:1 worker={uuid.uuid4()} task={name} try={retry}"


#: How a delivery calibrates: ``task`` (``calibrate_product``, the CPU task) or ``batch``
#: (``calibrate_products_batch`` with the CPU executor, the path the GPU worker takes too)
DELIVERY = {"path": "task"}


def _deliver(settings, pid, holder, ops: Ops | None = None):
    """One delivery of the product's calibration; returns the exception that ended it, if any."""
    from backend.db import session_scope
    from celery.exceptions import SoftTimeLimitExceeded

    from backend.worker.gpu_batch import calibrate_products_batch, settle_after_time_limit
    from backend.worker.processing import calibrate_product
    from pipelines.calibration.l2.batch import BatchExecutor

    mp = pytest.MonkeyPatch()
    try:
        if ops is not None:
            ops.install(mp)
        with session_scope() as s:
            if DELIVERY["path"] == "batch":
                try:
                    calibrate_products_batch(s, [pid], settings, executor=BatchExecutor("numpy"), holder=holder,
                                             device="cpu")
                except SoftTimeLimitExceeded as exc:  # what the batch task does then (backend.worker.tasks._run_batch)
                    s.rollback()
                    settle_after_time_limit(s, settings, [pid], None, exc, holder=holder)
                    raise
            else:
                calibrate_product(s, pid, settings, holder=holder)
    except (Exception, Killed) as exc:  # noqa: BLE001 - the task's retry would handle it
        return exc
    finally:
        if ops is not None and ops._undo is not None:
            ops._undo()
        mp.undo()
    return None


def _reset(settings, pid):
    from backend.db import session_scope
    from backend.store import product_store

    store = product_store(settings)
    for key in _objects(settings):
        store.delete(key)
    with session_scope() as s:
        s.execute(update(Product).where(Product.id == pid).values(
            state=ProductState.planned, path=None, sha256=None, quicklook_path=None, error=None, attempts=0,
            claimed_at=None, claimed_by=None))
        s.execute(delete(LaneFault))
        s.execute(delete(PlacedObject))


def _row(pid):
    from backend.db import session_scope

    with session_scope() as s:
        p = s.get(Product, pid)
        return p.state, p.path, p.quicklook_path, p.error


def _reconcile(settings, now=None):
    from backend.db import session_scope
    from backend.worker.reconcile import reconcile_once

    with session_scope() as s:
        return reconcile_once(s, settings, now=now, flight=None)


def _names(settings, *refs):
    """Store keys of a row's refs (an object's URL, or a file's absolute path)."""
    from backend.store import product_store

    store = product_store(settings)
    return sorted(store.key_of(r) for r in refs if r)


def _placement_points(settings, pid) -> tuple[list[tuple[str, str]], list[int]]:
    """The operations of one calibration (the dry run, twice: the same list both times) and
    the 1-based numbers of those between placing the first object and the row's COMMIT: the
    operation right after the placement up to the COMMIT itself."""
    runs = []
    _reset(settings, pid)
    assert _deliver(settings, pid, _holder("warm-up")) is None  # masters loaded, caches filled
    for _ in range(2):
        _reset(settings, pid)
        ops = Ops()
        assert _deliver(settings, pid, _holder("dry"), ops) is None
        assert _row(pid)[0] == ProductState.written
        runs.append(ops.seen)
    assert [k for k, _ in runs[0]] == [k for k, _ in runs[1]], "the operations differ between two runs"
    seen = runs[0]
    placed = next(i for i, (k, d) in enumerate(seen, start=1)
                  if (k == "os.replace" and d.endswith(".fits") and "/.tmp/" not in d)
                  or (k == "s3.put" and d.endswith(".fits")))
    commit = max(i for i, (k, d) in enumerate(seen, start=1) if d == "COMMIT")
    return seen, list(range(placed + 1, commit + 1))


def _soft(kind, dbapi):
    from celery.exceptions import SoftTimeLimitExceeded

    return SoftTimeLimitExceeded("injected soft time limit")


def _enospc(kind, dbapi):
    """A full disk: ``OSError(ENOSPC)`` from a file or object-store step; from the database, its
    driver's own error (SQLite's "database or disk is full", PostgreSQL's DiskFull are both
    ``OperationalError``)."""
    if kind == "db":
        return dbapi.OperationalError("database or disk is full: [Errno 28] No space left on device (injected)")
    return OSError(errno.ENOSPC, "No space left on device (injected)")


FAULTS = {"soft": _soft, "soft_give_up": _soft, "enospc": _enospc, "kill_give_up": lambda *_: Killed(),
          "kill": lambda *_: Killed()}


def _case(settings, pid, at: int, expect_kind: str, variant: str) -> str:
    """Stop one calibration before operation ``at`` with fault ``variant``; settle as the
    platform would; check the end state. Returns the final state's name."""
    from backend.clock import db_now
    from backend.db import session_scope

    _reset(settings, pid)
    ops = Ops(at, FAULTS[variant])
    first = settings.model_copy(update={"max_deliveries": 1}) if variant == "soft_give_up" else settings
    exc = _deliver(first, pid, _holder(f"first-{variant}-{at}"), ops)
    assert len(ops.seen) >= at and ops.seen[at - 1][0] == expect_kind, (variant, at, ops.seen[at - 1:at])
    state = _row(pid)[0]
    if variant in ("kill", "kill_give_up"):
        assert isinstance(exc, Killed), (variant, at, exc)
        with session_scope() as s:
            assert s.scalar(select(PlacedObject.id).where(PlacedObject.product_id == pid)) is not None
        if variant == "kill_give_up":
            redo = settings.model_copy(update={"max_deliveries": 1})
            assert _deliver(redo, pid, _holder(f"redelivery-{at}")) is None
            assert _row(pid)[0] == ProductState.failed
            # what the killed writer placed is still there: only the sweep removes it
            left = _fsck(settings, checksums=False)
            assert not left.clean and {f.kind for f in left.problems} <= {"unwritten_file", "attempt_object"}, \
                left.lines()
        else:
            assert _deliver(settings, pid, _holder(f"redelivery-{at}")) is None
    elif variant == "soft":  # given back, this start counted; the next delivery writes it
        assert state == ProductState.planned, (variant, at, state, exc)
        with session_scope() as s:
            prod = s.get(Product, pid)
            assert (prod.attempts, prod.claimed_by, prod.error) == (1, None, None), (variant, at)
            fault = s.scalar(select(LaneFault.reason))  # struck in the store's client: the lane paused
            assert fault is None or "soft time limit" in fault, (variant, at, fault)
            s.execute(delete(LaneFault))
        assert _deliver(settings, pid, _holder(f"again-{at}")) is None
    elif variant == "soft_give_up":
        assert state == ProductState.failed, (variant, at, state, exc)
    elif variant == "enospc" and state == ProductState.failed:
        # the batch path fails a product whose write met a database error (not a storage fault)
        assert DELIVERY["path"] == "batch" and expect_kind == "db", (variant, at, state, exc)
    elif variant == "enospc" and expect_kind == "db":  # the database's disk: the task retries
        assert state == ProductState.writing and "No space left" in str(exc), (variant, at, state, exc)
        assert _deliver(settings, pid, _holder(f"first-{variant}-{at}", retry=1)) is None
    elif variant == "enospc":  # the store's: the lane paused, the frame waits; tried again, it is written
        assert state == ProductState.planned, (variant, at, state, exc)
        with session_scope() as s:
            assert "No space left on device" in s.scalar(select(LaneFault.reason))
            s.execute(delete(LaneFault))
        assert _deliver(settings, pid, _holder(f"again-{at}")) is None
    report = _reconcile(settings)
    state, path, ql, error = _row(pid)
    if state == ProductState.written:
        assert _objects(settings) == _names(settings, path, ql), (variant, at, _objects(settings))
    else:
        assert state == ProductState.failed and error, (variant, at, state, error)
        assert _objects(settings) == [], (variant, at, _objects(settings))
        # (the batch path's reason of a database error met in an autoflush is SQLAlchemy's first
        # line, "OperationalError: (raised as a result of Query-invoked autoflush ...": not checked)
        want = {"soft_give_up": "soft time limit of", "kill_give_up": "gave up after 1 deliveries", "enospc": ""}[variant]
        assert want in error, (variant, at, error)
        if variant == "soft_give_up":
            assert "(TASK_SOFT_TIME_LIMIT_S)" in error and "(MAX_DELIVERIES)" in error, (variant, at, error)
    fsck = _fsck(settings)
    assert fsck.clean and not [f for f in fsck.findings if f.kind != "in_progress"], (variant, at, fsck.lines())
    assert not [f for f in fsck.findings if "product" in (f.row or "")], (variant, at, fsck.lines())
    # at the lease's end the records of the attempts that moved on are gone too
    with session_scope() as s:
        later = db_now(s) + __import__("datetime").timedelta(seconds=settings.lease_s + 1)
    _reconcile(settings, now=later)
    with session_scope() as s:
        assert s.scalars(select(PlacedObject)).all() == [], (variant, at)
    assert report is not None
    return state.value


@pytest.mark.slow  # ~40-80 s each: ten-odd points, five faults, a calibration and a reconciler pass each
@pytest.mark.parametrize(("store_env", "database"), [
    ("local", "sqlite"),  # the embedded default
    ("s3", "sqlite"),
    pytest.param("s3", "postgres", marks=pytest.mark.postgres),  # row locks (FOR UPDATE SKIP LOCKED)
], indirect=True)
def test_a_stop_at_every_point_between_placing_and_committing_leaves_one_outcome_and_no_orphan(store_env):
    import pipelines.calibration as calibration

    settings, pid = store_env
    real, computed = calibration.calibrate_frame, []

    def memo(*args, **kw):  # the science once; the faults are in the store and the database
        if not computed:
            computed.append(real(*args, **kw))
        return copy.deepcopy(computed[0])

    mp = pytest.MonkeyPatch()
    mp.setattr(calibration, "calibrate_frame", memo)
    try:
        seen, points = _placement_points(settings, pid)
        kinds = {seen[i - 1][0] for i in points}
        # the points cover the store's steps after the first placement and the row's statements and COMMIT
        assert "db" in kinds and (kinds & {"os.replace", "os.fsync", "s3.put", "s3.get"}), seen
        outcomes = {}
        for at in points:
            for variant in FAULTS:
                outcomes[(at, variant)] = _case(settings, pid, at, seen[at - 1][0], variant)
    finally:
        mp.undo()
    assert {v for (_, f), v in outcomes.items() if f == "soft"} == {"written"}, outcomes
    assert {v for (_, f), v in outcomes.items() if f == "soft_give_up"} == {"failed"}, outcomes
    assert {v for (_, f), v in outcomes.items() if f == "kill"} == {"written"}, outcomes
    assert {v for (_, f), v in outcomes.items() if f == "enospc"} == (
        {"written"} if DELIVERY["path"] == "task" else {"written", "failed"}), outcomes
    assert {v for (_, f), v in outcomes.items() if f == "kill_give_up"} == {"failed"}, outcomes


@pytest.mark.slow
@pytest.mark.parametrize(("store_env", "database"), [("local", "sqlite")], indirect=True)
def test_the_batch_path_stopped_at_every_point_leaves_one_outcome_and_no_orphan(store_env, monkeypatch):
    """The same through ``calibrate_products_batch`` (the CPU batch; the GPU worker's batch
    writes through the same :func:`backend.worker.processing.write_product`)."""
    monkeypatch.setitem(DELIVERY, "path", "batch")
    test_a_stop_at_every_point_between_placing_and_committing_leaves_one_outcome_and_no_orphan(store_env)
