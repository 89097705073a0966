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


@pytest.fixture(params=["session", "pool"])
def lean_client(request, settings_env, monkeypatch):
    """A client of the app on each of the lean path's two ways to the database: ``session``,
    the request's own session (embedded SQLite, as a signed-in caller's or a test's), and
    ``pool``, an anonymous read on a pooled PostgreSQL connection taken on the thread."""
    from fastapi.testclient import TestClient

    from backend.api.app import create_app

    monkeypatch.setenv("LEAN_EVENTS_THREADS", "2")
    if request.param == "pool":
        settings_env(DATABASE_URL=request.getfixturevalue("pg_url"))
    else:
        settings_env()
    app = create_app()
    assert lean_events._uses_pool(app) == (request.param == "pool")
    with TestClient(app) as c:
        yield c


def test_at_most_the_set_number_run_at_once_and_the_rest_wait(lean_client, monkeypatch):
    """Eight requests at once (four searches, four details, through the app): the first two
    to run hold their places (both inside at once, then until released half a second later);
    none of the six others may start before that, and all eight are answered 200."""
    both_in = threading.Barrier(2, timeout=30)  # passes only when two run at the same time
    release = threading.Event()
    lock = threading.Lock()
    state = {"running": 0, "most": 0, "started": 0}
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

    monkeypatch.setattr(lean_events, "_search_work", work)
    monkeypatch.setattr(lean_events, "_detail_work", work)
    paths = ["/api/v1/events?limit=5", "/api/v1/events/7"] * 4
    timer = threading.Timer(0.5, release.set)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(lean_client.get, p) for p in paths]
        timer.start()
        answers = [f.result(timeout=60) for f in futures]
    timer.cancel()
    assert [(a.status_code, a.content) for a in answers] == [(200, b'{"stub": true}')] * 8
    assert early == [], f"requests {early} started while two held their places"
    assert state["most"] == 2, state
