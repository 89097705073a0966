"""Truthful overload (issue 24, point 3): the API's answers under load and faults say what is so.

* ``/health`` reports a dependency down only when its probe fails, never because other
  checks or requests are in flight;
* a slow query (a statement past its budget: here a table lock held by another connection,
  never load) is a 503 with ``Retry-After`` saying the query took too long, not "unreachable";
* ``Idempotency-Key`` on POST: a repeat gets the first answer, another request with the same
  key 422, a key in progress 409; a write whose request passed its deadline is not committed
  (a retry answered 503 has not happened);
* the database dropping during a request's rollback is a clean 503;
* ``lstdp serve`` closes connections that never finish their headers (``HEADER_TIMEOUT_S``).

No test depends on the machine's speed: what is slow is held slow (a lock, an event) until
the test has seen what it checks, and waits are generous bounds on a condition.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, func, select, text
from sqlalchemy.orm import Session

from tests.conftest import make_token

ROOT = Path(__file__).resolve().parent.parent


def _wait(check, what: str, timeout_s: float = 30.0) -> None:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.05)


# -- 1. /health: a probe in flight is not an outage -------------------------------------------


def test_health_checks_that_come_while_a_probe_is_in_flight_share_it(api_client, monkeypatch):
    """The first check's database probe is held (an event) until five more checks have come: on
    f32dd98 two probes at once were the limit and the others answered 503 "earlier checks still
    wait for an answer" with both servers fine. Now every check waits for the one probe: 200."""
    from backend import broker
    from backend.api import app as appmod

    release, arrived, probes = threading.Event(), [], []
    real = appmod._database_status

    def held_probe(bind):
        probes.append(1)
        assert release.wait(30)
        return real(bind)

    def timeout_s():
        arrived.append(1)
        return 25.0

    monkeypatch.setattr(appmod, "_database_status", held_probe)
    monkeypatch.setattr(appmod, "health_check_timeout_s", timeout_s)
    monkeypatch.setattr(broker, "broker_status", lambda *a: "ok")
    results: list = []
    first = threading.Thread(target=lambda: results.append(api_client.get("/api/v1/health")))
    first.start()
    _wait(lambda: probes, "the first probe")
    others = [threading.Thread(target=lambda: results.append(api_client.get("/api/v1/health"))) for _ in range(5)]
    for t in others:
        t.start()
    _wait(lambda: len(arrived) == 6, "six checks in progress")
    release.set()
    for t in (first, *others):
        t.join(60)
    assert [r.status_code for r in results] == [200] * 6, [r.text for r in results]
    assert len(probes) <= 2  # shared (a check that came after the first probe ended may start one)


# -- 2. a slow query is not an outage ---------------------------------------------------------


@pytest.fixture(scope="module")
def own_pg_url():
    """A PostgreSQL database of this module's own: its tests commit jobs, tokens and keys, which
    the worker's shared database (``tests/conftest.py: pg_url``, under the rolled-back
    ``db_session`` of other files) must not see (test_jobs counted a job of this module's)."""
    from backend.migrate import upgrade
    from tests.conftest import create_pg_database, drop_pg_database

    url = create_pg_database()
    upgrade(url)
    yield url
    drop_pg_database(url)


@pytest.fixture
def pg_api(settings_env, own_pg_url, monkeypatch):
    """``pg_api(**env)``: a TestClient of a fresh app on the session's PostgreSQL database (real
    engine, committed rows), with a token of a new user (jobs:submit, jobs:cancel)."""
    clients = []

    def make(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
        settings_env(DATABASE_URL=own_pg_url)
        from backend.api.app import create_app

        client = TestClient(create_app(), raise_server_exceptions=False)
        engine = create_engine(own_pg_url)
        with Session(engine) as s:
            client.user = f"ov-{uuid.uuid4().hex[:8]}"
            client.headers["Authorization"] = f"Bearer {make_token(s, client.user)}"
            s.commit()
        engine.dispose()
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def _plain(url: str) -> str:
    return url.replace("+psycopg", "")


#: The statement budget of the slow-query tests [s]. PostgreSQL's ``statement_timeout`` counts a
#: statement's wall time, waiting for a CPU included, so every query that must succeed there (the
#: token's, the searches after the lock) must stay under it: 0.2 s was missed by a loaded machine
#: (CI: four xdist workers on two cores). 3 s is far beyond an ordinary query, and the one held by
#: the lock is still cancelled at it, long before the 20 s deadline (whose 503 says otherwise).
BUDGET_S = 3.0
DEADLINE_S = 20.0


def _timed_get(client, url: str, **kw):
    t0 = time.monotonic()
    r = client.get(url, **kw)
    return r, time.monotonic() - t0


def _assert_cancelled_at_the_budget(r, took: float) -> None:
    """A 503 (504) with Retry-After saying the query took too long and naming the budget; not
    before the budget (the statement ran that long), and answered before the deadline (the
    statement timeout cancelled it, not the deadline: its 503 says something else)."""
    assert r.status_code in (503, 504), r.text
    assert int(r.headers["Retry-After"]) > 0
    detail = r.json()["detail"]
    assert "query took too long" in detail and "/api/v1/events" in detail and "on events" in detail, detail
    assert f"budget of {BUDGET_S:g} s" in detail, detail
    assert "unavailable" not in detail and "unreachable" not in detail
    assert BUDGET_S <= took < DEADLINE_S, took


def test_a_query_past_its_budget_is_a_503_that_says_so_with_retry_after(pg_api, own_pg_url):
    """A lock held by another connection keeps the event search waiting; its statement budget
    (:data:`BUDGET_S`, 3 s, within a 20 s deadline) cancels it: 503 with Retry-After, "the
    database query took too long", the route and the query named; not "database unavailable".
    On f32dd98 the budget was the deadline and the 503 had no Retry-After and said "statement
    timeout"."""
    c = pg_api(API_DEADLINE_S=DEADLINE_S, API_STATEMENT_TIMEOUT_S=BUDGET_S)
    with psycopg.connect(_plain(own_pg_url)) as locker:
        locker.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        r, took = _timed_get(c, "/api/v1/events")
        locker.rollback()
    _assert_cancelled_at_the_budget(r, took)
    assert c.get("/api/v1/events").status_code == 200  # lock gone: answers again


def test_a_query_past_its_budget_on_the_lean_pooled_path(pg_api, own_pg_url):
    """The same for an anonymous search, which the lean events path reads on a pooled connection
    without a session (backend/api/lean_events.py): the same 503, and the connection, whose
    statement was only cancelled, serves the next request."""
    c = pg_api(API_DEADLINE_S=DEADLINE_S, API_STATEMENT_TIMEOUT_S=BUDGET_S)
    c.headers.pop("Authorization")
    assert c.get("/api/v1/events").status_code == 200
    with psycopg.connect(_plain(own_pg_url)) as locker:
        locker.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        r = _timed_get(c, "/api/v1/events", params={"type": "FL"})
        d = _timed_get(c, "/api/v1/events/1")
        locker.rollback()
    for resp, took in (r, d):
        _assert_cancelled_at_the_budget(resp, took)
    assert c.get("/api/v1/events", params={"type": "FL"}).status_code == 200
    assert c.get("/api/v1/events/1").status_code == 404


def test_slow_query_and_unreachable_are_told_apart():
    """The driver's errors: psycopg QueryCanceled (statement_timeout) and SQLite's interrupt are
    slow queries; an OperationalError on connect is not."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from backend.api.app import is_slow_query

    assert is_slow_query(OperationalError("SELECT 1", {}, psycopg.errors.QueryCanceled("canceling statement")))
    assert is_slow_query(OperationalError("SELECT 1", {}, sqlite3.OperationalError("interrupted")))
    assert not is_slow_query(OperationalError("connect", {}, psycopg.OperationalError("connection refused")))


def test_sqlite_statements_of_the_api_are_interrupted_at_their_budget(tmp_path):
    from backend.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}", sqlite_statement_s=0.2)
    slow = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
            "SELECT count(*) FROM n")  # endless: only the interrupt stops it
    from sqlalchemy.exc import OperationalError

    from backend.api.app import is_slow_query

    with engine.connect() as conn, pytest.raises(OperationalError) as info:
        conn.execute(text(slow))
    assert is_slow_query(info.value)
    engine.dispose()


# -- 3. idempotent writes ----------------------------------------------------------------------


SAVED = {"name": "flares", "kind": "events", "query": "type=FL"}


def test_idempotency_key_replays_the_first_answer_and_refuses_another_request(pg_api, own_pg_url):
    c = pg_api(API_DEADLINE_S=20)
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = c.post("/api/v1/saved-searches", json=SAVED, headers=key)
    assert first.status_code == 201, first.text
    again = c.post("/api/v1/saved-searches", json=SAVED, headers=key)
    assert (again.status_code, again.json()) == (201, first.json())
    assert again.headers["Idempotent-Replayed"] == "true"
    listed = c.get("/api/v1/saved-searches").json()
    assert sum(1 for s in listed["items"] if s["name"] == "flares") == 1  # written once
    other = c.post("/api/v1/saved-searches", json={**SAVED, "name": "cmes"}, headers=key)
    assert other.status_code == 422 and "another request" in other.json()["detail"], other.text
    # the key is the client's: another user's same key is a new request
    engine = create_engine(own_pg_url)
    with Session(engine) as s:
        token = make_token(s, f"ov-{uuid.uuid4().hex[:8]}")
        s.commit()
    engine.dispose()
    theirs = c.post("/api/v1/saved-searches", json=SAVED, headers={**key, "Authorization": f"Bearer {token}"})
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
    spec = c.get("/api/v1/openapi.json").json()
    params = spec["paths"]["/api/v1/jobs"]["post"]["parameters"]
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in params)


def test_a_key_whose_first_request_is_in_progress_is_409(pg_api, own_pg_url, monkeypatch):
    """The first request is held (an event) inside its route: a repeat with its key is 409;
    once the first has answered, the repeat gets its answer."""
    from backend.services import saved_searches

    c = pg_api(API_DEADLINE_S=20)
    real, entered, release = saved_searches.create_saved_search, threading.Event(), threading.Event()

    def held(*a, **kw):
        entered.set()
        assert release.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(saved_searches, "create_saved_search", held)
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    out = []
    t = threading.Thread(target=lambda: out.append(c.post("/api/v1/saved-searches", json=SAVED, headers=key)))
    t.start()
    assert entered.wait(30)
    busy = c.post("/api/v1/saved-searches", json=SAVED, headers=key)
    release.set()
    t.join(60)
    assert busy.status_code == 409 and "in progress" in busy.json()["detail"], busy.text
    assert out[0].status_code == 201, out[0].text
    assert c.post("/api/v1/saved-searches", json=SAVED, headers=key).json() == out[0].json()


def test_a_retry_whose_deadline_passed_before_its_commit_did_not_happen(pg_api, own_pg_url, monkeypatch):
    """POST /jobs/{id}/retry is held (an event) before its work until the test has its answer:
    503 at the deadline. Released, the route goes on, but its commit is refused, so the job
    was not retried. On f32dd98 the retry ran anyway."""
    from backend.models import Job, JobState
    from backend.services import job_control

    c = pg_api(API_DEADLINE_S=1, API_STATEMENT_TIMEOUT_S=30)
    job_id = str(uuid.uuid4())
    engine = create_engine(own_pg_url)
    with Session(engine) as s:
        s.add(Job(id=job_id, owner=c.user, state=JobState.failed, error="a frame failed",
                  parameters={"channels": ["SDI"], "start": "1990-01-01T00:00:00+00:00",
                              "end": "1990-01-02T00:00:00+00:00"}))
        s.commit()
    real, release, ended = job_control.retry_job, threading.Event(), threading.Event()

    def held(*a, **kw):
        assert release.wait(60)
        try:
            return real(*a, **kw)
        finally:
            ended.set()

    monkeypatch.setattr(job_control, "retry_job", held)
    r = c.post(f"/api/v1/jobs/{job_id}/retry")
    release.set()
    assert r.status_code == 503, r.text
    assert ended.wait(60)  # retry_job commits (or is refused its commit) before it returns
    with Session(engine) as s:
        job = s.get(Job, job_id)
        retries, state = job.retries, job.state
    engine.dispose()
    assert (retries, state) == (0, JobState.failed), "a retry answered 503 ran anyway"
    assert r.headers.get("Retry-After") and "wrote nothing" in r.json()["detail"], r.text


# -- 4. the database drops during the rollback -------------------------------------------------


def test_the_database_dropping_during_the_rollback_is_a_clean_503(pg_api, own_pg_url, monkeypatch):
    """A route fails after a statement; the request's connection is terminated as its rollback
    starts: a 503 JSON answer that says the connection was lost, never a 500 or a reset."""
    from backend.db import get_engine
    from backend.services import jobs as jobs_service

    c = pg_api(API_DEADLINE_S=20)

    def kill(conn):
        pid = conn.connection.dbapi_connection.info.backend_pid
        with psycopg.connect(_plain(own_pg_url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def failing_get_job(session, job_id, *_principal):
        session.execute(text("SELECT 1"))
        event.listen(get_engine("api"), "rollback", kill, once=True)
        raise LookupError("a bug after a statement")

    monkeypatch.setattr(jobs_service, "get_job", failing_get_job)
    r = c.get("/api/v1/jobs/abc")
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text
    assert "connection was lost" in r.json()["detail"] and r.headers.get("Retry-After")


# -- 5. connections that never finish their headers --------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_lstdp_serve_closes_connections_that_never_finish_their_headers(tmp_path):
    """``lstdp serve`` with ``HEADER_TIMEOUT_S=1``: connections that send half a request header,
    or nothing, are answered 408 and closed (waited for up to 30 s each: a bound, not a
    speed); a complete request is answered. On f32dd98 they stayed open."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DATA_DIR": str(tmp_path), "HEADER_TIMEOUT_S": "1",
           "API_DEADLINE_S": "0"}  # no request deadline: the slow body below is bounded by nothing else
    proc = subprocess.Popen([sys.executable, "-m", "backend.cli", "serve", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    socks: list[socket.socket] = []
    try:
        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        _wait(up, "lstdp serve", 60)
        for i in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            if i % 2:
                s.sendall(b"GET /api/v1/channels HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        ok = socket.create_connection(("127.0.0.1", port), timeout=30)
        ok.sendall(b"GET /static/style.css HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert ok.recv(100).startswith(b"HTTP/1.1 200"), "a complete request is answered"
        ok.close()
        for s in socks:
            got = b""
            while True:
                chunk = s.recv(4096)  # raises socket.timeout after 30 s if the server keeps it open
                if not chunk:
                    break
                got += chunk
            assert got.startswith(b"HTTP/1.1 408"), got
        # a request pipelined behind an answered one, its headers complete and its body sent
        # slowly (8 bytes every 0.5 s, 3.5 s in all): its body is not bounded by the header
        # timer; it is answered (the route's own answer), never 408
        body = b'{"token": "lst_' + b"a" * 40 + b'"}'
        slow = socket.create_connection(("127.0.0.1", port), timeout=30)
        socks.append(slow)
        slow.sendall(b"GET /static/style.css HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST /api/v1/session HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:5])
        for i in range(5, len(body), 8):
            time.sleep(0.5)
            slow.sendall(body[i:i + 8])
        got = b""
        while True:
            chunk = slow.recv(65536)
            if not chunk:
                break
            got += chunk
        statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", got)
        assert len(statuses) == 2 and statuses[0] == b"200" and statuses[1] != b"408", got[-600:]
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(30)


def test_a_replayed_answer_never_holds_the_secret_of_the_first(pg_api, own_pg_url):
    """``POST /api/v1/tokens`` answers a new token once: the idempotency store keeps its answer
    without it (tokens are stored hashed everywhere else), and the replay says so; the repeat
    makes no second token."""
    from backend.models import ApiToken, IdempotencyKey

    c = pg_api(API_DEADLINE_S=20)
    engine = create_engine(own_pg_url)
    with Session(engine) as s:
        c.headers["Authorization"] = f"Bearer {make_token(s, 'ov-admin', scopes=('admin',))}"
        s.commit()
    key = f"k-{uuid.uuid4()}"
    user = f"ov-{uuid.uuid4().hex[:8]}"
    first = c.post("/api/v1/tokens", json={"user": user}, headers={"Idempotency-Key": key})
    assert first.status_code == 201 and first.json()["token"].startswith("lst_"), first.text
    again = c.post("/api/v1/tokens", json={"user": user}, headers={"Idempotency-Key": key})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["token"] is None and "not kept" in again.json()["replay_note"]
    assert again.json()["id"] == first.json()["id"]
    with Session(engine) as s:
        stored = s.scalars(select(IdempotencyKey.body).where(IdempotencyKey.key == key)).one()
        assert first.json()["token"].encode() not in stored and b"lst_sc" not in stored.replace(b"lst_" + first.json()["prefix"][4:].encode(), b"")
        assert s.scalar(select(func.count()).select_from(ApiToken).where(ApiToken.user == user)) == 1
    engine.dispose()


def test_a_gzip_answer_is_kept_plain_and_without_its_webhook_secret(pg_api, own_pg_url):
    """A saved search with a webhook answers its ``whsec_`` secret once; an answer over 1 kB is
    gzip-compressed inside the idempotency middleware. What is kept is the plain JSON without
    the secret (no ``content-encoding``), and the replay (asked without gzip) is that JSON."""
    import gzip

    from backend.models import IdempotencyKey

    c = pg_api(API_DEADLINE_S=20)
    key = f"k-{uuid.uuid4()}"
    body = {**SAVED, "name": "n" * 100, "webhook_url": "https://example.com/" + "p" * 300}
    first = c.post("/api/v1/saved-searches", json=body, headers={"Idempotency-Key": key, "Accept-Encoding": "gzip"})
    assert first.status_code == 201 and first.headers.get("content-encoding") == "gzip", first.headers
    secret = first.json()["webhook"]["secret"]
    assert secret.startswith("whsec_")
    engine = create_engine(own_pg_url)
    with Session(engine) as s:
        row = s.scalars(select(IdempotencyKey).where(IdempotencyKey.key == key)).one()
        assert "content-encoding" not in row.headers and row.body[:2] != b"\x1f\x8b"
        assert row.body.startswith(b"{") and secret.encode() not in row.body
    engine.dispose()
    again = c.post("/api/v1/saved-searches", json=body,
                   headers={"Idempotency-Key": key, "Accept-Encoding": "identity"})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.headers.get("content-encoding") in (None, "identity")
    assert again.json()["webhook"]["secret"] is None and again.json()["id"] == first.json()["id"]


def test_no_replay_to_a_revoked_token_or_a_signed_out_cookie_and_sign_in_is_never_keyed(pg_api, own_pg_url):
    """A stored answer is read again only by a credential that still authenticates: after the
    token is revoked, or the session signed out, the same keyed POST is 401 (the route's own
    answer), never the stored 201. Signing in with a key twice sets a cookie both times."""
    from backend.auth import revoke_token

    c = pg_api(API_DEADLINE_S=20)
    engine = create_engine(own_pg_url)
    with Session(engine) as s:
        token = make_token(s, f"ov-{uuid.uuid4().hex[:8]}")
        s.commit()
    bearer = {"Authorization": f"Bearer {token}"}
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = c.post("/api/v1/saved-searches", json=SAVED, headers={**bearer, **key})
    assert first.status_code == 201, first.text
    with Session(engine) as s:
        revoke_token(s, _token_id(s, token))
        s.commit()
    again = c.post("/api/v1/saved-searches", json=SAVED, headers={**bearer, **key})
    assert again.status_code == 401 and "Idempotent-Replayed" not in again.headers, again.text
    # the cookie: sign in twice with the same key (both set a cookie), post, sign out, replay
    with Session(engine) as s:
        token2 = make_token(s, f"ov-{uuid.uuid4().hex[:8]}")
        s.commit()
    engine.dispose()
    browser = TestClient(c.app, raise_server_exceptions=False)
    sign_key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    for _ in range(2):
        browser.cookies.clear()
        r = browser.post("/api/v1/session", json={"token": token2}, headers=sign_key)
        assert r.status_code == 200 and "lstdp_session=" in r.headers.get("set-cookie", ""), r.headers
    cookie = browser.cookies.get("lstdp_session")
    key2 = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    assert browser.post("/api/v1/saved-searches", json=SAVED, headers=key2).status_code == 201
    assert browser.delete("/api/v1/session").status_code == 204
    browser.cookies.set("lstdp_session", cookie)
    replay = browser.post("/api/v1/saved-searches", json=SAVED, headers=key2)
    assert replay.status_code == 401 and "Idempotent-Replayed" not in replay.headers, replay.text


def _token_id(session, token: str) -> int:
    from backend.auth import hash_token
    from backend.models import ApiToken

    return session.scalar(select(ApiToken.id).where(ApiToken.token_hash == hash_token(token)))
