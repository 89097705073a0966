"""Shared fixtures.

* ``pg_url``/``pg_engine``: a fresh PostgreSQL database for the test session (server at
  127.0.0.1:5432, user postgres, trust auth; override with ``LSTDP_TEST_PG_ADMIN``),
  migrated with Alembic, dropped at the end.
* ``db_session``: a session on that database inside a transaction rolled back at the end
  of the test (handlers may ``commit()``: they release a SAVEPOINT only).
* ``sqlite_env``: embedded-mode settings in a temporary DATA_DIR (SQLite, migrated).
* ``SAMPLE``: the real solar files shipped with the project (``sample-data/real``).

``API_DEADLINE_S`` is 30 s for the suite unless the environment sets it: the API's 1.8 s
default (and the statement and broker timeouts derived from it) would turn a test machine
busy with other work into 503s in tests that are not about time; tests/test_timeouts.py
sets the default back where it measures it.
"""

from __future__ import annotations

import contextlib
import os
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
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(binary):
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp(prefix=f"lstdp-redis-{os.environ['PYTEST_XDIST_WORKER']}-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", folder, "--logfile", os.path.join(folder, "redis.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(_stop)
    deadline = time.monotonic() + 60  # a bound for a loaded machine, not a speed
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    return f"redis://127.0.0.1:{port}/15"
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the xdist worker's redis-server on port {port} did not answer; see {folder}/redis.log")


REDIS_URL = _xdist_worker_redis() or os.environ.get("LSTDP_TEST_REDIS", "redis://127.0.0.1:6379/15")


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


@pytest.fixture
def sqlite_env(settings_env):
    """Embedded-mode settings (SQLite in a temporary DATA_DIR), migrated."""
    s = settings_env()
    upgrade(s.sqlalchemy_url)
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


@pytest.fixture
def api_client(db_session, settings_env):
    """A TestClient of the app whose requests use ``db_session`` (rolled back after the test),
    with embedded-mode settings in a temporary DATA_DIR; 500s come back as responses."""
    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.api.deps import get_session

    settings_env()
    app = create_app()

    def _session():
        yield db_session

    app.dependency_overrides[get_session] = _session
    with TestClient(app, raise_server_exceptions=False) as c:
        authorize(c, db_session)  # user "tester", jobs:submit and jobs:cancel (tests of 401 drop it)
        yield c
