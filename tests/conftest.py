"""Shared fixtures.

* ``pg_url``/``pg_engine``: a fresh PostgreSQL database for the test session (server at
  127.0.0.1:5432, user postgres, trust auth; override with ``LSTDP_TEST_PG_ADMIN``),
  migrated with Alembic, dropped at the end.
* ``db_session``: a session on that database inside a transaction rolled back at the end
  of the test (handlers may ``commit()``: they release a SAVEPOINT only).
* ``sqlite_env``: embedded-mode settings in a temporary DATA_DIR (SQLite, migrated: a copy of
  a database migrated once per test run).
* ``SAMPLE``: the real solar files shipped with the project (``sample-data/real``).
* ``run_cache``/``simulated_dataset``: data built once per test run (shared by the xdist
  workers, under a file lock), read-only to the tests (checked by digest at the end of the
  session): ``simulate`` output per distinct set of parameters, imported catalogues.

``API_DEADLINE_S`` is 30 s for the suite unless the environment sets it: the API's 1.8 s
default (and the statement and broker timeouts derived from it) would turn a test machine
busy with other work into 503s in tests that are not about time; tests/test_timeouts.py
sets the default back where it measures it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("API_DEADLINE_S", "30")  # before any settings are read (module docstring)

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from backend import db as dbmod  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.settings import get_settings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample-data" / "real"
PG_ADMIN = os.environ.get("LSTDP_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def _xdist_worker_redis() -> str | None:
    """Under pytest-xdist (``make test`` runs the suite in worker processes), each worker gets a
    Redis server of its own (``redis-server`` on a free port, nothing kept on disk, stopped by
    PID when the worker ends): tests use fixed database numbers of the shared server (11-15)
    and flush them, which two workers must not do to each other. None outside xdist or where
    ``LSTDP_TEST_REDIS`` names a server."""
    import atexit
    import shutil
    import socket
    import subprocess
    import tempfile
    import time

    if not os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("LSTDP_TEST_REDIS"):
        return None
    import redis

    from backend.cli import _die_with_parent

    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(binary):
        return None
    folder = tempfile.mkdtemp(prefix=f"lstdp-redis-{os.environ['PYTEST_XDIST_WORKER']}-")
    # The port is free when asked and bound by redis-server a moment later: another process (or
    # another worker's server) can take it in between. So the server that answers must be this
    # one (its INFO's process_id), and a server that could not bind (it exits) is started again
    # on a new port.
    for attempt in range(5):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                 "no", "--dir", folder, "--logfile", os.path.join(folder, f"redis-{attempt}.log")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)  # also when the worker ends without atexit

        def _stop(proc=proc) -> None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            shutil.rmtree(folder, ignore_errors=True)

        atexit.register(_stop)
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a speed
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2) as client:
                    pid = client.info("server")["process_id"]
            except (redis.RedisError, OSError):
                time.sleep(0.1)
                continue
            if pid == proc.pid:
                return f"redis://127.0.0.1:{port}/15"
            break  # another server holds the port: ours cannot bind it
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    logs = "".join(p.read_text(errors="replace")[-400:] for p in sorted(Path(folder).glob("redis-*.log")))
    raise RuntimeError(f"the xdist worker's redis-server did not start on a port of its own: {logs}")


REDIS_URL = _xdist_worker_redis() or os.environ.get("LSTDP_TEST_REDIS", "redis://127.0.0.1:6379/15")


def _reuse_dependants_under_overrides() -> None:
    """Make FastAPI build each overridden dependency graph once per test process, not per request.

    Six places in the tests (``api_client`` among them) hand the app their rolled-back session
    through ``app.dependency_overrides``. While that dict is not empty, FastAPI's
    ``solve_dependencies`` (0.165) calls ``get_dependant`` for every sub-dependency of every
    request, overridden or not: the signature inspection and the pydantic adapters of each
    parameter, again and again (fastapi/fastapi#16342 and #14441, neither released). Measured: a
    third of the CPU of ``tests/test_lean_events_random.py``; four API test files (that one,
    ``test_api``, ``test_access_matrix``, ``test_lean_events``) 111 -> 78 CPU-s (2026-12-08).

    Only that request-time call is kept: it is the one call of ``get_dependant`` without
    ``own_oauth_scopes`` (route definition passes it, and builds as upstream does, so no
    ``Dependant`` is shared between routes or apps). ``get_dependant`` is a function of its
    keyword arguments alone (the callable, path, name, scopes, scope, concurrency), so its result
    is kept per distinct set of them: a changed override is another callable and another key;
    unhashable arguments are not kept. At most 4096 are kept, the least recently used dropped
    first: each test's override is a closure of its own session, which the dict would otherwise
    hold for the rest of the run. Production apps set no overrides and never import this file."""
    import collections

    import fastapi.dependencies.utils as fastapi_deps

    build = fastapi_deps.get_dependant
    if getattr(build, "_lstdp_kept", False):
        return
    kept: collections.OrderedDict = collections.OrderedDict()

    def get_dependant(**kwargs):
        if "own_oauth_scopes" in kwargs:  # route definition, or below a request-time build
            return build(**kwargs)
        try:
            key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()))
            hash(key)
        except TypeError:
            return build(**kwargs)
        # the app runs in TestClient's thread: a race only builds twice or drops an entry
        with contextlib.suppress(KeyError):
            kept.move_to_end(key)
            return kept[key]
        dependant = kept[key] = build(**kwargs)
        while len(kept) > 4096:
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                kept.popitem(last=False)
        return dependant

    get_dependant._lstdp_kept = True
    fastapi_deps.get_dependant = get_dependant


_reuse_dependants_under_overrides()


@pytest.fixture
def curves_read_unbudgeted(monkeypatch):
    """Lift the light curves' per-request product-read budget (``CURVES_READ_BUDGET_S``, 1 s at
    the default deadline, scaled with ``API_DEADLINE_S``) 60-fold, for tests that check what the
    curves hold: under CI's load the queries alone once used
    the whole second and no LST trace was drawn. The budget has its own test in
    ``tests/test_xray.py`` (``test_curves_of_long_and_reversed_events_and_the_read_budget``)."""
    from backend.services import event_curves

    monkeypatch.setattr(event_curves, "CURVES_READ_BUDGET_S", 60.0)


def require(condition: bool, reason: str) -> None:
    """Skip the test when the machine lacks what it needs (PostgreSQL server binaries, root,
    a second file system), with ``reason``; under CI (``CI`` set, as ``.ci/run`` runs) fail
    instead, so a test that CI was meant to run never passes by being skipped."""
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"needed under CI: {reason}")
    pytest.skip(reason)


def _pg_base() -> str:
    return PG_ADMIN.rsplit("/", 1)[0]


def create_pg_database(prefix: str = "lstdp_test") -> str:
    """Create an empty PostgreSQL database and return its URL."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return f"{_pg_base()}/{name}"


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def pg_url():
    url = create_pg_database()
    upgrade(url)
    yield url
    drop_pg_database(url)


@pytest.fixture(scope="session")
def pg_engine(pg_url):
    engine = dbmod.make_engine(pg_url)
    yield engine
    engine.dispose()


@contextlib.contextmanager
def rolled_back_session(engine):
    """A session on ``engine`` inside a transaction rolled back at the end (handlers may
    ``commit()``: they release a SAVEPOINT only)."""
    conn = engine.connect()
    trans = conn.begin()
    session = Session(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
    try:
        yield session
    finally:
        session.close()
        trans.rollback()
        conn.close()


@pytest.fixture
def db_session(pg_engine):
    with rolled_back_session(pg_engine) as session:
        yield session


@pytest.fixture
def settings_env(monkeypatch, tmp_path):
    """Point the settings at a temporary DATA_DIR; returns a function to apply overrides."""

    def apply(**env: str):
        for k in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATA_DIR"):
            monkeypatch.delenv(k, raising=False)
            monkeypatch.delenv(f"LSTDP_{k}", raising=False)
        monkeypatch.setenv("DATA_DIR", str(tmp_path / "var"))
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        get_settings.cache_clear()
        dbmod.reset_caches()
        s = get_settings()
        s.ensure_dirs()
        return s

    yield apply
    get_settings.cache_clear()
    dbmod.reset_caches()


def _migrate_sqlite(folder: Path) -> None:
    """``folder/lstdp.sqlite3``: a new SQLite database upgraded to the head revision
    (:func:`backend.migrate.upgrade`: the schema and the channel rows)."""
    upgrade(f"sqlite:///{folder / 'lstdp.sqlite3'}")
    assert not (folder / "lstdp.sqlite3-wal").exists()  # all in the file: a copy is the database


def _sqlite_path(settings) -> Path:
    assert settings.sqlalchemy_url.startswith("sqlite:///"), settings.sqlalchemy_url
    return Path(settings.sqlalchemy_url.removeprefix("sqlite:///"))


def filled_sqlite(run_cache, name: str, fill) -> Path:
    """A SQLite database built once per test run (:class:`RunCache` ``name``; read-only: serve
    a copy, :func:`use_sqlite_copy`): migrated, then ``fill(session)`` run on it and committed
    (``fill`` gets a ``sqlalchemy.orm.Session``; its asserts run at the build). Returns the
    file's path."""
    from sqlalchemy.orm import Session

    def build(folder: Path) -> None:
        db = folder / "lstdp.sqlite3"
        shutil.copyfile(run_cache.get("sqlite-migrated", _migrate_sqlite) / "lstdp.sqlite3", db)
        engine = dbmod.make_engine(f"sqlite:///{db}")
        try:
            with Session(engine) as session:
                fill(session)
                session.commit()
        finally:
            engine.dispose()  # the last connection checkpoints the WAL into the database file
        assert not (folder / "lstdp.sqlite3-wal").exists()

    return run_cache.get(name, build) / "lstdp.sqlite3"


def use_sqlite_copy(settings, database: Path) -> None:
    """Make the SQLite database of ``settings`` (embedded mode) a copy of ``database``; the
    cached engines are disposed first, so none keeps the file it replaces open."""
    target = _sqlite_path(settings)
    dbmod.reset_caches()
    for extra in ("-wal", "-shm"):
        target.with_name(target.name + extra).unlink(missing_ok=True)
    shutil.copyfile(database, target)


@pytest.fixture
def sqlite_env(settings_env, run_cache):
    """Embedded-mode settings (SQLite in a temporary DATA_DIR), migrated: a copy of the database
    that ``upgrade`` made once for the test run (:func:`_migrate_sqlite`; the same schema and
    rows, without Alembic's 0.5-0.7 s per test)."""
    s = settings_env()
    shutil.copyfile(run_cache.get("sqlite-migrated", _migrate_sqlite) / "lstdp.sqlite3", _sqlite_path(s))
    return s


def make_token(session, user: str = "tester", scopes=("jobs:submit", "jobs:cancel"), **kw) -> str:
    """A new API token of ``user`` with ``scopes`` (flushed in ``session``; committed by the caller
    where another connection must see it)."""
    from backend.auth import create_token

    _row, token = create_token(session, user, list(scopes), **kw)
    session.flush()
    return token


def make_session_cookie(session, token: str, *, lifetime_s: float = 3600.0) -> str:
    """The value of a session cookie signed in with ``token`` (a ``sessions`` row, flushed in
    ``session``; committed by the caller where another connection must see it), as
    ``POST /api/v1/session`` makes it."""
    from backend.auth import authenticate, create_session

    principal = authenticate(session, token)
    _row, sid = create_session(session, principal.token_id, lifetime_s=lifetime_s)
    session.flush()
    return sid


def auth_headers(session, user: str = "tester", scopes=("jobs:submit", "jobs:cancel"), **kw) -> dict[str, str]:
    """``{"Authorization": "Bearer <new token>"}`` of ``user`` with ``scopes``."""
    return {"Authorization": f"Bearer {make_token(session, user, scopes, **kw)}"}


def authorize(client, session, user: str = "tester", scopes=("jobs:submit", "jobs:cancel")):
    """Give TestClient ``client`` a token of ``user`` for every request (returns the client)."""
    client.headers.update(auth_headers(session, user, scopes))
    return client


_SHARED_APPS: dict = {}


@contextlib.contextmanager
def shared_app():
    """The app for a function-scoped TestClient: one ``create_app()`` per test process (and
    ``LEAN_EVENTS`` value, read when the app is made), handed out with no dependency override
    and a middleware stack that Starlette builds anew on its first request (fresh middleware
    instances); the overrides are cleared again on exit.

    ``create_app()`` analyses every route's parameters (about 0.25 CPU-seconds): one per test
    was some 800 calls and 6 % of the suite's CPU (``scripts/suite_profile.py``). Settings are
    read per request, so one app serves tests with different settings. Tests about the app's
    construction itself, and servers on a port, still call ``create_app()``.
    """
    from backend.api.app import create_app

    key = os.environ.get("LEAN_EVENTS", "1")
    app = _SHARED_APPS.get(key)
    if app is None:
        app = _SHARED_APPS[key] = create_app()
    if getattr(app, "_lstdp_in_use", False):
        raise RuntimeError("shared_app() is in use already: one per test (a second would clear the first's overrides)")
    shape = (len(app.router.routes), len(app.user_middleware), dict(app.exception_handlers))
    app._lstdp_in_use = True
    app.dependency_overrides.clear()
    app.middleware_stack = None
    try:
        yield app
    finally:
        app._lstdp_in_use = False
        app.dependency_overrides.clear()
        app.middleware_stack = None
    # a test that changed the app would change it for the tests after it: make it use create_app()
    assert (len(app.router.routes), len(app.user_middleware), dict(app.exception_handlers)) == shape, (
        "a test changed the shared app (routes, middleware or exception handlers): use create_app()")


@pytest.fixture
def api_client(db_session, settings_env):
    """A TestClient of the app whose requests use ``db_session`` (rolled back after the test),
    with embedded-mode settings in a temporary DATA_DIR; 500s come back as responses."""
    from fastapi.testclient import TestClient

    from backend.api.deps import get_session

    settings_env()

    def _session():
        yield db_session

    with shared_app() as app:
        app.dependency_overrides[get_session] = _session
        with TestClient(app, raise_server_exceptions=False) as c:
            authorize(c, db_session)  # user "tester", jobs:submit and jobs:cancel (tests of 401 drop it)
            yield c


# -- data built once per test run (simulated datasets, imported catalogues), read-only ------------


def run_shared_tmp(tmp_path_factory) -> Path:
    """A temporary folder of this test run that every pytest-xdist worker of the run sees (the
    parent of the workers' own base temporary folders, ``.../pytest-N/``); the session's base
    temporary folder outside xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _tree_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, by path relative to it."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class RunCache:
    """Folders built once per test run and shared, read-only, by every test and xdist worker
    of the run: :meth:`get` takes an exclusive ``fcntl.flock`` on ``root/<name>.lock``, so the
    other workers wait for the one that builds and then read what it wrote.

    ``root/<name>/data/`` holds what ``build`` wrote, ``root/<name>/digests.json`` the SHA-256
    of each of its files (written last: a folder without it is an interrupted build, made
    again). The data are read-only to the tests (the suite runs as root, so file modes would
    not stop a write): :meth:`verify` compares every file used in this process with its digest
    and raises ``AssertionError`` naming the files a test changed, added or removed. A test
    that must write works on a copy."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.used: dict[str, Path] = {}

    def get(self, name: str, build) -> Path:
        """``root/<name>/data``, made by ``build(folder)`` (``folder`` created empty; a callable
        that writes into it) the first time any process of the run asks for ``name``."""
        folder = self.root / name
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not (folder / "digests.json").exists():
                    shutil.rmtree(folder, ignore_errors=True)
                    (folder / "data").mkdir(parents=True)
                    build(folder / "data")
                    (folder / "digests.json").write_text(json.dumps(_tree_digests(folder / "data")))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        self.used[name] = folder
        return folder / "data"

    def verify(self) -> None:
        """Raise ``AssertionError`` if a file of a folder used in this process differs from what
        was built (changed, added or removed)."""
        bad = []
        for folder in self.used.values():
            want = json.loads((folder / "digests.json").read_text())
            have = _tree_digests(folder / "data")
            bad += [str(folder / "data" / name) for name in sorted(set(want) | set(have))
                    if want.get(name) != have.get(name)]
        assert not bad, f"tests wrote into data shared by the test run (read-only; use a copy): {bad}"


@pytest.fixture(scope="session")
def run_cache(tmp_path_factory):
    """The test run's :class:`RunCache` (in :func:`run_shared_tmp`), checked unchanged at the
    end of the session."""
    cache = RunCache(run_shared_tmp(tmp_path_factory) / "lstdp-run-cache")
    yield cache
    cache.verify()


def _simulation_params(params: dict) -> dict:
    """``simulate``'s keyword arguments ``params`` with its defaults filled in (two calls that
    differ only in spelling out a default share a dataset), as JSON values (tuples as lists)."""
    import inspect

    from pipelines.simulation import simulate

    bound = inspect.signature(simulate).bind(None, **params)
    bound.apply_defaults()
    args = dict(bound.arguments)
    del args["out_dir"]
    return json.loads(json.dumps(args, sort_keys=True, default=str))


@pytest.fixture(scope="session")
def simulated_dataset(run_cache):
    """``simulated_dataset(**params)``: the :class:`~pipelines.simulation.results.SimulationResult`
    of ``pipelines.simulation.simulate(out_dir, **params)``, simulated once per test run for
    each distinct ``params`` (:class:`RunCache`; ``out_dir``, ``result.out_dir``, is shared and
    read-only: copy it to write)."""

    def get(**params):
        import pickle

        from pipelines.simulation import simulate

        args = _simulation_params(params)
        key = "sim-" + hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]

        def build(folder: Path) -> None:
            result = simulate(folder / "sim", **params)
            (folder / "params.json").write_text(json.dumps(args, sort_keys=True))
            (folder / "result.pickle").write_bytes(pickle.dumps(result))

        return pickle.loads((run_cache.get(key, build) / "result.pickle").read_bytes())

    return get


# -- the order of the files under pytest-xdist (``make test``: ``-n 4 --dist loadfile``) ----------

#: Packages run as one xdist work unit, all their files in one worker one after another, for
#: their conftest's costly fixtures: tests/client's ``scope="package"`` live platform (~11 s),
#: which pytest tears down whenever a worker leaves the package, so one unit per file built it
#: once per file; tests/faults' ``scope="session"`` private PostgreSQL server and template
#: database, built by every worker that runs one of its files (split into file units on
#: 2026-12-06, the run took 18:08 instead of 17:11 with three workers: its files then ran
#: side by side, each waiting on its own servers).
XDIST_PACKAGE_UNITS = ("tests/client/", "tests/faults/")


def xdist_work_unit(nodeid: str) -> str:
    """The xdist work unit of test ``nodeid``: its file, or its package for
    :data:`XDIST_PACKAGE_UNITS`."""
    for package in XDIST_PACKAGE_UNITS:
        if nodeid.startswith(package):
            return package.rstrip("/")
    return nodeid.split("::", 1)[0]


def file_tier(items) -> int:
    """When a file's tests start under xdist (lower first: the longest work is started first,
    the short files fill the end of the run): 0 the validation campaigns (``validation``
    marker, or ``test_blind_*.py``), 1 files with ``slow``, ``browser`` or ``faults`` tests, 2 the rest."""
    if any(i.get_closest_marker("validation") or Path(str(i.path)).name.startswith("test_blind_") for i in items):
        return 0
    if any(i.get_closest_marker("slow") or i.get_closest_marker("browser") or i.get_closest_marker("faults")
           for i in items):
        return 1
    return 2


def _xdist_ordering() -> bool:
    """Order the work units (this conftest's scheduler and collection order) unless
    ``LSTDP_TEST_ORDER=xdist`` asks for pytest-xdist's own order (to compare the two)."""
    return os.environ.get("LSTDP_TEST_ORDER", "tiers") != "xdist"


@pytest.hookimpl(trylast=True)  # after the hooks that add markers (tests/validation's ``validation``)
def pytest_collection_modifyitems(config, items):
    """Under xdist, collect the work units (:func:`xdist_work_unit`) by :func:`file_tier`, then
    more tests first (xdist's own order), the tests of a unit kept together in their order: the
    scheduler below hands the units out in this order. Outside xdist the order is untouched."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not _xdist_ordering():
        return
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(xdist_work_unit(item.nodeid), []).append(item)
    ordered = sorted(units.values(), key=lambda unit: (file_tier(unit), -len(unit)))  # stable
    items[:] = [item for unit in ordered for item in unit]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with :data:`XDIST_PACKAGE_UNITS` as single units, handed out in the
    collection order of :func:`pytest_collection_modifyitems` (not re-sorted by size)."""
    if config.getoption("dist") != "loadfile" or not _xdist_ordering():
        return None
    from xdist.scheduler import LoadFileScheduling

    class TieredLoadFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_work_unit(nodeid)

    config.option.loadscopereorder = False  # the collection order is the order wanted
    return TieredLoadFileScheduling(config, log)
