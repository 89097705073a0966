"""Database engine and sessions (SQLAlchemy 2).

SQLite (embedded mode) gets WAL journaling, foreign keys and a busy timeout so the API
process and the worker process can share one file.

PostgreSQL connections are opened with ``plan_cache_mode=force_custom_plan``. psycopg prepares
a statement on the server after its fifth execution on a connection (``prepare_threshold``,
default 5), and PostgreSQL may then switch a prepared statement to a generic plan, made without
the parameter values (after five custom plans, when its estimated cost is not higher). The
event search relies on the planner seeing its time bounds (a backward index scan that stops at
the page end): with a generic plan, the year-of-CMEs page of benchmarks/events_api.py went from
1.5 ms to 16-35 ms (a bitmap scan of 26,801 index entries and a sort). Custom plans cost a
planning per execution (about 0.1 ms for these statements); preparing still saves the parsing.
Until reads ran in autocommit (:func:`autocommit_reads`) the ``ROLLBACK`` that ends every
request made psycopg drop its prepared statements, which hid this.

Pools: ``pool_pre_ping`` is kept on PostgreSQL. It costs one round trip per checkout
(0.1-0.3 ms per API call, measured in benchmarks/reports/events_api.md) and turns a connection
that the server or a firewall dropped into a reconnect instead of a failed request.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import os
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from backend.settings import get_settings

__all__ = ["make_engine", "get_engine", "get_sessionmaker", "session_scope", "autocommit_reads", "SCHEMA_MISSING",
           "is_schema_missing"]

#: What the user is told when the database has no tables yet (a fresh DATA_DIR).
SCHEMA_MISSING = "the database has no LST schema yet; run `lstdp db upgrade`"


def make_engine(url: str) -> Engine:
    """Create an engine for ``url`` with the pragmas this project needs."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)

    @event.listens_for(engine, "connect")
    def _custom_plans(dbapi_conn, _record):
        # Every statement is planned with its parameter values (see the module docstring).
        # A SET on the new connection, outside a transaction (a rolled-back SET is undone),
        # rather than the startup ``options``: those would replace any ``options`` given in
        # DATABASE_URL, and some poolers (PgBouncer) refuse them.
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        try:
            with dbapi_conn.cursor() as cur:
                cur.execute("SET plan_cache_mode = force_custom_plan")
        finally:
            dbapi_conn.autocommit = autocommit

    return engine


@lru_cache
def get_engine() -> Engine:
    """The process-wide engine for ``Settings.sqlalchemy_url``."""
    return make_engine(get_settings().sqlalchemy_url)


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    """The process-wide session factory on :func:`get_engine` (objects stay usable after commit)."""
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session that commits on success and rolls back on any exception."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def autocommit_reads(session: Session) -> Session:
    """Let a session that only reads run its statements in autocommit, on PostgreSQL.

    A read at PostgreSQL's default isolation, READ COMMITTED, takes a new snapshot for every
    statement inside a transaction too, so autocommit sees the same data; it saves the
    ``BEGIN`` that psycopg sends before the first statement and the ``ROLLBACK`` when the
    connection goes back to the pool (two round trips; the event search's statements took
    0.1-0.3 ms less in autocommit than in a transaction, BEGIN included, in
    benchmarks/reports/events_api.md). The connection is checked out now, with the isolation
    level as an execution option; SQLAlchemy restores the engine's level when it returns to
    the pool. Prepared statements then outlive the request (psycopg drops them at a
    ``ROLLBACK``): see the module docstring for why plans stay custom.

    Left as it is: a session bound to a connection (the tests' sessions inside a rolled-back
    transaction), a session already in a transaction, SQLite. Never for a session that
    writes (each statement would commit on its own).

    Returns
    -------
    sqlalchemy.orm.Session
        ``session``.
    """
    bind = session.get_bind()
    if isinstance(bind, Engine) and bind.dialect.name == "postgresql" and not session.in_transaction():
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    return session


def forget_connections_after_fork() -> None:
    """In a freshly forked child: drop the pooled connections inherited from the parent
    without closing them (they are the parent's sockets; ``dispose(close=False)``, SQLAlchemy's
    "using connection pools with multiprocessing" recipe), so the child opens its own.

    Registered with :func:`os.register_at_fork` (every fork of this process) and called by
    the Celery worker's ``worker_process_init`` signal. Without it, a pool child that
    replaces a killed one talks to PostgreSQL through its parent's socket.
    """
    if get_engine.cache_info().currsize:
        get_engine().dispose(close=False)


os.register_at_fork(after_in_child=forget_connections_after_fork)


def reset_caches() -> None:
    """Forget the cached engine and sessionmaker (after settings change, in tests)."""
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_engine.cache_clear()
    get_sessionmaker.cache_clear()


def is_schema_missing(exc: BaseException) -> bool:
    """Whether a database error means the tables do not exist (SQLite ``no such table``,
    PostgreSQL ``UndefinedTable``): the schema was never created, not a fault to retry."""
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    text = str(orig).splitlines()[0].lower() if str(orig) else ""
    return ("no such table" in text or type(orig).__name__ == "UndefinedTable"
            or (text.startswith("relation ") and "does not exist" in text)
            # SQLite in a DATA_DIR that does not exist yet: `lstdp db upgrade` creates both
            or (type(orig).__name__ == "OperationalError" and "unable to open database file" in text))
