"""The API's per-request dependencies: where the session is made and closed (event loop or a
worker thread), the anonymous principal without a thread, the API engine's pool (PostgreSQL)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session
from starlette.requests import Request

from backend import db as dbmod
from backend.api import deps


def test_session_ends_locally_only_without_an_open_transaction(pg_engine):
    fresh = Session(pg_engine)
    assert deps._ends_locally(fresh)  # no connection checked out
    fresh.close()

    read = Session(pg_engine)
    try:
        dbmod.autocommit_reads(read)
        assert read.execute(text("SELECT 1")).scalar() == 1
        assert read.in_transaction() and deps._ends_locally(read)  # autocommit, idle on the server
    finally:
        read.close()

    tx = Session(pg_engine)
    try:
        tx.execute(text("SELECT 1"))  # a transaction open on the server (psycopg's BEGIN)
        assert not deps._ends_locally(tx)
    finally:
        tx.close()


def _drive(gen_fn, use, monkeypatch) -> list:
    """Run the async generator dependency ``gen_fn`` around ``use(session)``; returns the names
    of the functions it handed to a worker thread."""
    handed: list[str] = []
    real = deps._in_thread

    async def spy(func):
        handed.append(getattr(func, "__name__", repr(func)))
        return await real(func)

    monkeypatch.setattr(deps, "_in_thread", spy)

    async def main():
        agen = gen_fn()
        session = await agen.__anext__()
        use(session)
        with pytest.raises(StopAsyncIteration):
            await agen.__anext__()
        return session

    session = asyncio.run(main())
    assert not session.in_transaction()  # closed: the connection went back to the pool
    return handed


def test_get_session_closes_a_read_on_the_event_loop_and_a_transaction_in_a_thread(
        pg_url, settings_env, monkeypatch):
    settings_env(DATABASE_URL=pg_url)
    engine = dbmod.get_engine("api")

    def read(session):
        dbmod.autocommit_reads(session)
        assert session.execute(text("SELECT 1")).scalar() == 1

    assert _drive(deps.get_session, read, monkeypatch) == []
    assert engine.pool.checkedout() == 0

    def in_transaction(session):
        session.execute(text("SELECT 1"))

    assert _drive(deps.get_session, in_transaction, monkeypatch) == ["close"]
    assert engine.pool.checkedout() == 0


def test_api_pool_keeps_its_connections(pg_url, settings_env):
    settings_env(DATABASE_URL=pg_url)
    api, worker = dbmod.get_engine("api").pool, dbmod.get_engine("worker").pool
    assert (api.size(), api._max_overflow) == dbmod.API_POOL == (15, 0)
    assert (worker.size(), worker._max_overflow) == dbmod.DEFAULT_POOL == (5, 10)


def test_anonymous_principal_needs_no_thread_nor_database(monkeypatch):
    import starlette.concurrency

    from backend.api.deps import current_principal

    def refuse(*_a, **_k):
        raise AssertionError("an anonymous request handed work to a worker thread")

    monkeypatch.setattr(starlette.concurrency, "run_in_threadpool", refuse)
    request = Request({"type": "http", "method": "GET", "path": "/api/v1/events", "headers": [],
                       "query_string": b""})

    class NoDatabase:
        def __getattr__(self, name):
            raise AssertionError(f"an anonymous request used the session ({name})")

    assert asyncio.run(current_principal(request, NoDatabase(), None, None)) is None


def test_a_cancelled_request_still_closes_its_session(pg_url, settings_env):
    """A client gone or a deadline cancels the request's task: the close that returns the
    connection is shielded (without the shield, the worker-thread hand-off is cancelled at once
    and the connection stays checked out, in its transaction)."""
    import anyio

    settings_env(DATABASE_URL=pg_url)
    engine = dbmod.get_engine("api")
    session = dbmod.get_sessionmaker("api")()
    session.execute(text("SELECT 1"))  # a transaction open on the server: closed in a thread
    assert engine.pool.checkedout() == 1

    async def main():
        with anyio.CancelScope() as scope:
            scope.cancel()
            await deps._end(session, session.close)

    anyio.run(main)
    assert not session.in_transaction()
    assert engine.pool.checkedout() == 0
