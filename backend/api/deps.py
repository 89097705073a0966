"""FastAPI dependencies (``Annotated`` style, as the FastAPI full-stack template)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import Depends, HTTPException
from sqlalchemy.orm import Session

from backend.db import get_sessionmaker
from backend.settings import Settings, get_settings

log = logging.getLogger(__name__)


async def get_session() -> AsyncIterator[Session]:
    """One session per request on the API's engine (short timeouts, :func:`backend.db.db_timeouts`);
    committed by the handler that writes, closed after.

    ``async``: making the session does no I/O (the connection is checked out by its first
    statement, in the handler's worker thread), so FastAPI runs this on the event loop instead of
    handing it to a worker thread twice per request (enter and exit; measured in
    benchmarks/reports/events_api.md and events_api_load.md). Closing it runs on the event loop only when that cannot
    talk to the database (:func:`_ends_locally`); otherwise (a transaction is open: a write, a
    read outside autocommit) in a worker thread, so a database that does not answer never blocks
    the event loop.
    """
    session = get_sessionmaker("api")()
    try:
        yield session
    except BaseException as exc:
        try:
            await _end(session, session.rollback)
        except Exception as lost:  # the database dropped during the rollback: a clean 503, not a reset
            log.error("the rollback after %s failed: %s: %s", type(exc).__name__, type(lost).__name__, lost)
            from backend.faults import public_reason

            raise HTTPException(503, detail="the database connection was lost while the request's changes were "
                                            f"undone ({public_reason(lost)}); nothing was written; try again later",
                                headers={"Retry-After": "2"}) from lost
        raise
    finally:
        try:
            await _end(session, session.close)
        except Exception as lost:  # noqa: BLE001 - the answer is decided; the pool drops the connection
            log.warning("closing the request's session failed: %s: %s", type(lost).__name__, lost)


async def _end(session: Session, step) -> None:
    """Run ``step`` (``session.rollback`` or ``session.close``) even when the request was
    cancelled (a client gone, a deadline): shielded from cancellation, on the event loop when it
    sends nothing to the database, else in a worker thread with a limiter of its own (as
    FastAPI's ``contextmanager_in_threadpool`` does for sync dependencies: the default thread
    limiter may be full of requests waiting for a pooled connection that this close would return,
    a deadlock)."""
    with anyio.CancelScope(shield=True):
        if _ends_locally(session):
            step()
        else:
            await _in_thread(step)


async def _in_thread(step) -> None:
    """``step()`` in a worker thread of its own limiter (one thread, made per call)."""
    await anyio.to_thread.run_sync(step, limiter=anyio.CapacityLimiter(1))


def _ends_locally(session: Session) -> bool:
    """Whether rolling back and closing ``session`` sends nothing to the database: it holds no
    connection, or only psycopg connections in autocommit with no transaction open on the server
    (:func:`backend.db.autocommit_reads`; psycopg's ``rollback`` then returns at once, and
    SQLAlchemy's reset of the isolation level when the connection goes back to the pool is
    client-side)."""
    if not session.in_transaction():
        return True
    tx = session.get_transaction()
    conns = getattr(tx, "_connections", None)
    if not conns:
        return False
    import psycopg

    for conn, *_rest in conns.values():
        dbapi = getattr(getattr(conn, "connection", None), "dbapi_connection", None)
        if not isinstance(dbapi, psycopg.Connection) or not dbapi.autocommit \
                or dbapi.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False
    return True


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
