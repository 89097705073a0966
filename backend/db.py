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

Timeouts (PostgreSQL; :class:`DbTimeouts`, one set per role: ``api``, ``worker``, ``migrations``):

* ``connect_timeout`` (psycopg, client side): opening a connection, authentication included,
  gives up after it; it holds for a frozen server too (the TCP connect succeeds through the
  kernel's backlog, then nothing answers).
* ``statement_timeout`` and ``idle_in_transaction_session_timeout``: set by the server, so
  they stop a slow statement or free the locks of a client that went quiet, but they do
  nothing for a frozen server. The API's request deadline covers that case
  (:class:`backend.api.app.DeadlineMiddleware`).
* TCP keepalives (idle 30 s, then every 10 s, 3 probes) and ``tcp_user_timeout`` (30 s):
  a connection to a host that crashed or fell off the network is closed by the kernel
  within about a minute, and the thread waiting on it gets an error, instead of waiting
  for hours (Linux's defaults: keepalives after 2 h, retransmissions for about 15 min).
  They cannot help against a frozen server process: its kernel still acknowledges.
  Values are choices, not measurements.
* ``pool_timeout``: how long a checkout waits for a free pooled connection; in the API it
  is the deadline, so threads stuck on a frozen server (at most ``pool_size +
  max_overflow`` = 15) cannot queue others for the default 30 s.

Parameters already in ``DATABASE_URL`` (``?connect_timeout=10``, a ``statement_timeout`` in
its ``options`` or in ``PGOPTIONS``) win over these.

Pools: ``pool_pre_ping`` is kept on PostgreSQL. It costs one round trip per checkout
(0.1-0.3 ms per API call, measured in benchmarks/reports/events_api.md) and turns a connection
that the server or a firewall dropped into a reconnect instead of a failed request. The lean
events path skips it (:func:`checkout_without_ping`) and repeats its read on a pinged
connection when the first one was lost: the same guarantee without the round trip.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from backend.settings import Settings, get_settings

__all__ = ["make_engine", "get_engine", "get_sessionmaker", "session_scope", "autocommit_reads", "SCHEMA_MISSING",
           "is_schema_missing", "DbTimeouts", "db_timeouts", "Role", "API_IDLE_IN_TRANSACTION_S",
           "checkout_without_ping"]

#: What the user is told when the database has no tables yet (a fresh DATA_DIR).
SCHEMA_MISSING = "the database has no LST schema yet; run `lstdp db upgrade`"


#: Who opens the connections: the API (short timeouts), the workers and the CLI, migrations.
Role = Literal["api", "worker", "migrations"]

#: The API's ``idle_in_transaction_session_timeout`` [s]. A request holds a transaction only
#: while it talks to the database (jobs are sent to the broker after their commit), so one
#: idle for 10 s (a choice: five deadlines) belongs to a frozen or lost API process.
API_IDLE_IN_TRANSACTION_S = 10.0

#: SQLAlchemy's default ``pool_timeout`` [s], kept for the workers and migrations.
DEFAULT_POOL_TIMEOUT_S = 30.0

#: TCP keepalive and retransmission limits of PostgreSQL connections (libpq parameters;
#: ``tcp_user_timeout`` in ms). Choices: a dead peer is noticed within about a minute.
TCP_OPTIONS = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3,
               "tcp_user_timeout": 30_000}


@dataclass(frozen=True)
class DbTimeouts:
    """The timeouts of one engine's PostgreSQL connections (0: none).

    Attributes
    ----------
    connect_s : int
        psycopg ``connect_timeout`` [s]: whole seconds, at least 2 (psycopg's minimum).
    statement_s : float
        ``statement_timeout`` [s].
    idle_in_transaction_s : float
        ``idle_in_transaction_session_timeout`` [s].
    pool_s : float
        SQLAlchemy ``pool_timeout``: wait for a free pooled connection [s].
    """

    connect_s: int = 5
    statement_s: float = 0.0
    idle_in_transaction_s: float = 0.0
    pool_s: float = DEFAULT_POOL_TIMEOUT_S

    def set_statements(self, given: str = "") -> list[str]:
        """The ``SET`` statements that apply the server-side timeouts (milliseconds), less
        those that ``given`` (the connection's startup ``options``) already sets."""
        values = {"statement_timeout": self.statement_s,
                  "idle_in_transaction_session_timeout": self.idle_in_transaction_s}
        return [f"SET {name} = {_ms(v)}" for name, v in values.items() if name not in given]


def _ms(seconds: float) -> int:
    return int(math.ceil(seconds * 1000)) if seconds > 0 else 0


def db_timeouts(settings: Settings, role: Role = "worker") -> DbTimeouts:
    """The timeouts of ``role``'s connections, from ``settings`` (see :mod:`backend.settings`).

    * ``api``: statements get ``API_STATEMENT_TIMEOUT_S`` (two thirds of the deadline unless
      set: a slow query is cancelled, and answered as such, before the deadline), pool
      checkouts ``API_DEADLINE_S``, connecting its value rounded up (at least psycopg's 2 s),
      idle transactions :data:`API_IDLE_IN_TRANSACTION_S`. Without a deadline
      (``API_DEADLINE_S=0``) the workers' values.
    * ``worker`` (also the CLI): ``DB_CONNECT_TIMEOUT_S``, ``DB_STATEMENT_TIMEOUT_S``,
      ``DB_IDLE_IN_TRANSACTION_TIMEOUT_S`` (default the lease), the pool's default 30 s.
    * ``migrations``: no statement or idle limit (an index build may take minutes).
    """
    worker = DbTimeouts(connect_s=settings.db_connect_timeout_s, statement_s=settings.db_statement_timeout_s,
                        idle_in_transaction_s=settings.idle_in_transaction_timeout_s)
    if role == "migrations":
        return DbTimeouts(connect_s=settings.db_connect_timeout_s)
    if role == "api" and settings.api_deadline_s > 0:
        deadline = settings.api_deadline_s
        return DbTimeouts(connect_s=max(2, math.ceil(deadline)), statement_s=settings.api_statement_s,
                          idle_in_transaction_s=API_IDLE_IN_TRANSACTION_S, pool_s=deadline)
    return worker

#: PostgreSQL pool of the API's engine: ``(pool_size, max_overflow)``. The same 15 connections
#: at most as the other roles, all kept open: under 16 concurrent requests the default 5 + 10
#: overflow closed an overflow connection at each check-in and opened a new one (TCP, auth, the
#: SET statements, a backend fork) for a later request: 316-407 new connections in 17 s of the
#: load test (benchmarks/reports/events_api_load.md), 15 with this pool.
API_POOL = (15, 0)
#: The other roles' pool (Celery workers, CLI): 5 kept, 10 more when busy.
DEFAULT_POOL = (5, 10)


def make_engine(url: str, timeouts: DbTimeouts | None = None, pool: tuple[int, int] = DEFAULT_POOL,
                sqlite_statement_s: float = 0.0) -> Engine:
    """Create an engine for ``url`` with the pragmas and timeouts this project needs.

    Parameters
    ----------
    url : str
        SQLAlchemy URL (SQLite or PostgreSQL through psycopg).
    timeouts : DbTimeouts, optional
        PostgreSQL only; default the workers' (:func:`db_timeouts` of the process settings).
        SQLite keeps its 30 s busy timeout.
    pool : (int, int)
        PostgreSQL only: SQLAlchemy ``pool_size`` and ``max_overflow`` (:data:`DEFAULT_POOL`;
        the API's: :data:`API_POOL`).
    sqlite_statement_s : float
        SQLite only: a statement running longer than this is interrupted (``sqlite3``'s
        progress handler; it raises ``OperationalError: interrupted``) [s]; 0 for none (the
        default). The API's engine gets ``API_STATEMENT_TIMEOUT_S``.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        if sqlite_statement_s > 0:
            _interrupt_slow_sqlite(engine, sqlite_statement_s)
        return engine
    t = timeouts if timeouts is not None else db_timeouts(get_settings(), "worker")
    query = make_url(url).query
    connect_args = {k: v for k, v in {"connect_timeout": t.connect_s, **TCP_OPTIONS}.items() if k not in query}
    engine = create_engine(url, pool_pre_ping=True, pool_size=pool[0], max_overflow=pool[1], pool_timeout=t.pool_s,
                           connect_args=connect_args)
    _skippable_ping(engine)
    options = query.get("options", "")
    options = " ".join(options) if isinstance(options, tuple) else options
    statements = ["SET plan_cache_mode = force_custom_plan",
                  *t.set_statements(f"{options} {os.environ.get('PGOPTIONS', '')}")]

    @event.listens_for(engine, "connect")
    def _session_settings(dbapi_conn, _record):
        # Every statement is planned with its parameter values (see the module docstring),
        # and the role's server-side timeouts apply. A SET on the new connection, outside a
        # transaction (a rolled-back SET is undone), rather than the startup ``options``:
        # those would replace any ``options`` given in DATABASE_URL, and some poolers
        # (PgBouncer) refuse them.
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        try:
            with dbapi_conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
        finally:
            dbapi_conn.autocommit = autocommit

    return engine


#: Set in the thread that checks a connection out with :func:`checkout_without_ping`.
_NO_PING = threading.local()


def _skippable_ping(engine: Engine) -> None:
    """Let :func:`checkout_without_ping` skip the pool's pre-ping of ``engine`` (its dialect's
    ``do_ping``, wrapped on this engine's own dialect); every other checkout pings as before."""
    ping = engine.dialect.do_ping

    def do_ping(dbapi_connection) -> bool:
        if getattr(_NO_PING, "on", False):
            return True
        return ping(dbapi_connection)

    engine.dialect.do_ping = do_ping  # type: ignore[method-assign]


def checkout_without_ping(engine: Engine):
    """A raw pooled connection of ``engine`` (``engine.raw_connection()``) checked out without
    the pool's pre-ping round trip (about 0.05 ms of the API's CPU and one PostgreSQL statement
    per request).

    Only for a caller that repeats its work on a connection checked out the ordinary way
    (pinged) when the first one turns out to be lost (``broken`` or ``closed`` after an
    ``OperationalError``): reads, as the lean events path
    (:mod:`backend.api.lean_events`) does, so a connection the server or a firewall dropped is
    still a reconnect, not a failed request."""
    _NO_PING.on = True
    try:
        return engine.raw_connection()
    finally:
        _NO_PING.on = False


def _interrupt_slow_sqlite(engine: Engine, budget_s: float) -> None:
    """Interrupt ``engine``'s SQLite statements that run longer than ``budget_s``: each
    statement sets its end time on its connection, a progress handler (every 1000 virtual
    machine instructions) aborts it once past (``sqlite3.OperationalError: interrupted``).
    A wait for SQLite's write lock (``busy_timeout``) is not interrupted."""
    import time

    @event.listens_for(engine, "connect")
    def _install(dbapi_conn, record):
        record.info["statement_ends"] = math.inf
        dbapi_conn.set_progress_handler(lambda: int(time.monotonic() > record.info["statement_ends"]), 1000)

    @event.listens_for(engine, "before_cursor_execute")
    def _start(conn, _cursor, _statement, _params, _context, _many):
        conn.connection.info["statement_ends"] = time.monotonic() + budget_s

    @event.listens_for(engine, "after_cursor_execute")
    def _end(conn, _cursor, _statement, _params, _context, _many):
        conn.connection.info["statement_ends"] = math.inf


#: The engines and session factories made so far, one per role (:func:`get_engine`).
_ENGINES: dict[str, Engine] = {}
_SESSIONMAKERS: dict[str, sessionmaker[Session]] = {}


def get_engine(role: Role = "worker") -> Engine:
    """The process-wide engine of ``role`` for ``Settings.sqlalchemy_url``: the API's requests
    use ``"api"`` (short timeouts, :func:`db_timeouts`), everything else ``"worker"``."""
    engine = _ENGINES.get(role)
    if engine is None:
        s = get_settings()
        engine = _ENGINES.setdefault(role, make_engine(
            s.sqlalchemy_url, db_timeouts(s, role), API_POOL if role == "api" else DEFAULT_POOL,
            sqlite_statement_s=s.api_statement_s if role == "api" and s.api_deadline_s > 0 else 0.0))
    return engine


def get_sessionmaker(role: Role = "worker") -> sessionmaker[Session]:
    """The process-wide session factory on :func:`get_engine` of ``role`` (objects stay usable
    after commit)."""
    maker = _SESSIONMAKERS.get(role)
    if maker is None:
        maker = _SESSIONMAKERS.setdefault(role, sessionmaker(bind=get_engine(role), expire_on_commit=False))
    return maker


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
    replaces a killed one talks to PostgreSQL through its parent's socket. Every role's
    engine (:func:`get_engine`) is dropped.
    """
    for engine in list(_ENGINES.values()):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=forget_connections_after_fork)


def reset_caches() -> None:
    """Forget the cached engines and sessionmakers of every role (after settings change, in tests)."""
    engines = list(_ENGINES.values())
    _ENGINES.clear()
    _SESSIONMAKERS.clear()
    for engine in engines:
        engine.dispose()


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
