"""The database's clock: the one time every host of the platform agrees on.

Claims, leases, heartbeats and the reconciler's "how long ago" all compare times written by
different hosts. A host's own clock may be off by hours (issue 28: a worker 2 h behind had
live claims taken back and wrote ``updated_at < created_at``), so these times come from the
database server, never from the process: :func:`db_now` reads it, and :func:`db_clock_default`
is the column default (insert and update) that reads it at flush.

PostgreSQL: ``clock_timestamp()`` (the wall time when the statement runs; ``now()`` would be the
start of the transaction, stale in a transaction held through a calibration). SQLite (embedded
mode: one host, the database is a file of this host): ``strftime('%Y-%m-%d %H:%M:%f', 'now')``
(SQLite's ``CURRENT_TIMESTAMP`` has whole seconds only), the time of the C library, which
``faketime`` changes as it changes Python's.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import text

__all__ = ["db_now", "db_now_sql", "db_clock_default"]


def db_now_sql(dialect_name: str) -> str:
    """The SQL expression of the server's current time for ``dialect_name``
    (``postgresql`` or ``sqlite``)."""
    if dialect_name == "postgresql":
        return "clock_timestamp()"
    if dialect_name == "sqlite":
        return "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    return "CURRENT_TIMESTAMP"


def _as_utc(value) -> dt.datetime:
    if isinstance(value, str):  # SQLite: text in UTC
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def db_now(bind) -> dt.datetime:
    """The database server's current time, timezone-aware UTC.

    Parameters
    ----------
    bind : Session, Connection or Engine
        Where to ask (a Session asks on its current connection, in its transaction).

    Raises
    ------
    sqlalchemy.exc.OperationalError
        If the database cannot be reached (the caller's database fault handling applies).
    """
    dialect = bind.get_bind().dialect.name if hasattr(bind, "get_bind") else bind.dialect.name
    q = text(f"SELECT {db_now_sql(dialect)}")
    if hasattr(bind, "no_autoflush"):  # a Session: asking flushes nothing half-built
        with bind.no_autoflush:
            return _as_utc(bind.execute(q).scalar_one())
    if hasattr(bind, "execute"):
        return _as_utc(bind.execute(q).scalar_one())
    with bind.connect() as conn:  # an Engine
        return _as_utc(conn.execute(q).scalar_one())


def db_clock_default(context) -> dt.datetime:
    """Column default and ``onupdate`` (SQLAlchemy context-sensitive default): the database's
    time, read on the connection of the INSERT or UPDATE (one ``SELECT`` per row written)."""
    return db_now(context.connection)
