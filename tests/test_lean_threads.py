"""The lean events path runs at most ``LEAN_EVENTS_THREADS`` requests against the database at
once per API process (``backend.api.lean_events.lean_threads``; why: ``backend.settings.Settings``):
through the app, a third search or detail waits, holding no connection, until one of the first
two is done, and every one is answered."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
from pydantic import ValidationError

from backend.api import lean_events
from backend.db import API_POOL
from backend.settings import Settings


def test_default_is_the_cpus_plus_one_within_the_pool(settings_env, monkeypatch):
    for name in ("LEAN_EVENTS_THREADS", "LSTDP_LEAN_EVENTS_THREADS"):
        monkeypatch.delenv(name, raising=False)
    settings_env()
    for cpus, want in ((1, 2), (2, 3), (7, 8), (64, sum(API_POOL)), (None, 2)):
        monkeypatch.setattr(lean_events.os, "cpu_count", lambda cpus=cpus: cpus)
        assert lean_events.lean_threads() == want, cpus
    settings_env(LEAN_EVENTS_THREADS="4")
    assert lean_events.lean_threads() == 4
    settings_env(LEAN_EVENTS_THREADS="500")  # more than the pool's connections: each request holds one
    assert lean_events.lean_threads() == sum(API_POOL)
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("LEAN_EVENTS_THREADS", bad)
        with pytest.raises(ValidationError, match="LEAN_EVENTS_THREADS"):
            Settings()


@pytest.fixture(params=["session", pytest.param("pool", marks=pytest.mark.postgres),
                        pytest.param("signed-in", marks=pytest.mark.postgres)])
def lean_client(request, settings_env, monkeypatch):
    """``(client, headers)`` of the app on each of the lean path's ways to the database:
    ``session``, the request's own session (embedded SQLite); ``pool``, an anonymous read on a
    pooled PostgreSQL connection taken on the thread; ``signed-in``, a bearer token on
    PostgreSQL: the session's pooled connection, first for the token's lookup."""
    from fastapi.testclient import TestClient
    from sqlalchemy.orm import Session

    from backend import db as dbmod
    from backend.api.app import create_app
    from tests.conftest import auth_headers

    monkeypatch.setenv("LEAN_EVENTS_THREADS", "2")
    headers = {}
    if request.param == "session":
        settings_env()
    else:
        settings_env(DATABASE_URL=request.getfixturevalue("pg_url"))
        if request.param == "signed-in":
            with Session(dbmod.get_engine("api")) as s:
                headers = auth_headers(s, "lean-threads-tester")
                s.commit()
    app = create_app()
    assert lean_events._uses_pool(app) == (request.param != "session")
    with TestClient(app) as c:
        yield c, headers


def test_at_most_the_set_number_run_at_once_and_the_rest_wait(lean_client, monkeypatch):
    """Eight requests at once (four searches, four details, through the app): the first two
    to run hold their places (both inside at once, then until released half a second later);
    none of the six others may start before that, none of them holds a pooled connection
    meanwhile (on PostgreSQL), and all eight are answered 200."""
    from backend.db import get_engine

    client, headers = lean_client
    pooled = get_engine("api").dialect.name == "postgresql"
    both_in = threading.Barrier(2, timeout=30)  # passes only when two run at the same time
    release = threading.Event()
    lock = threading.Lock()
    state = {"running": 0, "most": 0, "started": 0, "checked_out": None}
    early = []

    def work(*_args, **_kw):
        with lock:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
            state["started"] += 1
            first_two = state["started"] <= 2
            if not first_two and not release.is_set():
                early.append(state["started"])
        try:
            if first_two:
                both_in.wait()
                release.wait(30)
            return b'{"stub": true}'
        finally:
            with lock:
                state["running"] -= 1

    def open_the_gate():
        if pooled:  # the two running hold theirs (signed-in: the session's), the six waiting none
            state["checked_out"] = get_engine("api").pool.checkedout()
        release.set()

    monkeypatch.setattr(lean_events, "_search_work", work)
    monkeypatch.setattr(lean_events, "_detail_work", work)
    paths = ["/api/v1/events?limit=5", "/api/v1/events/7"] * 4
    timer = threading.Timer(0.5, open_the_gate)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client.get, p, headers=headers) for p in paths]
        timer.start()
        answers = [f.result(timeout=60) for f in futures]
    timer.cancel()
    assert [(a.status_code, a.content) for a in answers] == [(200, b'{"stub": true}')] * 8
    assert early == [], f"requests {early} started while two held their places"
    assert state["most"] == 2, state
    if pooled:
        assert state["checked_out"] is not None and state["checked_out"] <= 2, state
