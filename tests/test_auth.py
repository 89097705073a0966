"""Tokens, scopes, the session cookie and its CSRF checks, token management, the CLI, and that
a token never appears in logs, job parameters, error messages or database rows (issue 12).

On real PostgreSQL (per-test rollback, ``api_client``); the CLI on an embedded SQLite database.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from sqlalchemy import select

from backend.auth import SESSION_COOKIE, hash_token, revoke_token
from backend.models import ApiToken, Base, BrowserSession, Job, utcnow
from tests.conftest import auth_headers, make_session_cookie, make_token

pytestmark = pytest.mark.postgres

JOB = {"channels": ["WST"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-14T01:00:00Z"}


@pytest.fixture
def anon(api_client):
    """The test client without its token (anonymous, or the session cookie only)."""
    from tests.test_api import route_celery_to_this_data_dir

    route_celery_to_this_data_dir()
    api_client.headers.pop("Authorization", None)
    return api_client


def test_no_token_is_401_naming_the_scope(anon):
    r = anon.post("/api/v1/jobs", json=JOB)
    assert r.status_code == 401 and "scope 'jobs:submit'" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    assert anon.get("/api/v1/jobs").status_code == 200  # reads need none


def test_token_without_the_scope_is_403(anon, db_session):
    r = anon.post("/api/v1/jobs", json=JOB, headers=auth_headers(db_session, "bob", ["jobs:cancel"]))
    assert r.status_code == 403
    assert "of user 'bob' lacks scope 'jobs:submit' (it has: jobs:cancel)" in r.json()["detail"]


def test_revoked_and_expired_tokens_are_401(anon, db_session):
    token = make_token(db_session, "carol", ["jobs:submit"])
    row = db_session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
    revoke_token(db_session, row.id)
    r = anon.post("/api/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401 and f"API token {row.id} ({row.prefix}...) was revoked" in r.json()["detail"]
    old = make_token(db_session, "carol", ["jobs:submit"], expires_in_days=1, now=utcnow() - dt.timedelta(days=2))
    r = anon.post("/api/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {old}"})
    assert r.status_code == 401 and "was expired" in r.json()["detail"]
    r = anon.get("/api/v1/events", headers={"Authorization": f"Bearer {old}"})  # never silently anonymous
    assert r.status_code == 401


@pytest.mark.parametrize("header", ["Token abc", "Bearer", "Basic dXNlcjpwYXNz", "lst_" + "a" * 43, "Bearer  "])
def test_malformed_authorization_header_is_401(anon, header):
    r = anon.post("/api/v1/jobs", json=JOB, headers={"Authorization": header})
    assert r.status_code == 401, (header, r.text)
    assert "Bearer" in r.json()["detail"] or "not known" in r.json()["detail"]


def test_cookie_sign_in_submits_and_signs_out(anon, db_session):
    token = make_token(db_session, "dora", ["jobs:submit"], expires_in_days=2)
    r = anon.post("/api/v1/session", json={"token": token})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["signed_in"] and body["user"] == "dora" and body["scopes"] == ["jobs:submit"]
    assert token not in r.text and body["expires_at"]
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/" in cookie and "Secure" not in cookie  # http here
    max_age = int(cookie.split("Max-Age=")[1].split(";")[0])
    assert 2 * 86400 - 60 <= max_age <= 2 * 86400  # not past the token's expiry
    sid = anon.cookies[SESSION_COOKIE]
    assert token not in cookie and sid != token and hash_token(token) not in cookie  # a session id, not the token
    row = db_session.scalar(select(BrowserSession).where(BrowserSession.session_hash == hash_token(sid)))
    assert row is not None and row.user == "dora" and row.revoked_at is None
    assert anon.get("/api/v1/session").json()["user"] == "dora"
    r = anon.post("/api/v1/jobs", json=JOB)  # the cookie alone
    assert r.status_code == 202 and r.json()["owner"] == "dora"
    r = anon.post("/api/v1/jobs", json=JOB, headers={"Origin": "http://testserver"})
    assert r.status_code == 202
    r = anon.delete("/api/v1/session")
    assert r.status_code == 204 and "Max-Age=0" in r.headers["set-cookie"]
    anon.cookies.clear()
    assert anon.get("/api/v1/session").json() == {**anon.get("/api/v1/session").json(), "signed_in": False}
    assert anon.post("/api/v1/jobs", json=JOB).status_code == 401
    # signing out ended the session server-side: the old cookie value, replayed, is refused
    db_session.refresh(row)
    assert row.revoked_at is not None
    anon.cookies.set(SESSION_COOKIE, sid)
    r = anon.post("/api/v1/jobs", json=JOB)
    assert r.status_code == 401 and "signed out" in r.json()["detail"] and "Max-Age=0" in r.headers["set-cookie"]
    anon.cookies.set(SESSION_COOKIE, sid)
    assert anon.get("/api/v1/session").json()["signed_in"] is False
    # the token is not a session: a cookie holding it authenticates nothing
    anon.cookies.set(SESSION_COOKIE, token)
    r = anon.post("/api/v1/jobs", json=JOB)
    assert r.status_code == 401 and "session is not known" in r.json()["detail"]
    anon.cookies.clear()
    assert anon.post("/api/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {token}"}).status_code == 202


def test_sessions_expire_and_end_with_their_token(anon, db_session, monkeypatch):
    from backend.settings import get_settings

    monkeypatch.setenv("SESSION_LIFETIME_S", "3600")
    get_settings.cache_clear()
    token = make_token(db_session, "dirk", ["jobs:submit"], expires_in_days=None)
    r = anon.post("/api/v1/session", json={"token": token})
    assert r.status_code == 200 and "Max-Age=3600" in r.headers["set-cookie"]  # SESSION_LIFETIME_S
    sid = anon.cookies[SESSION_COOKIE]
    row = db_session.scalar(select(BrowserSession).where(BrowserSession.session_hash == hash_token(sid)))
    assert 3590 <= (row.expires_at - row.created_at).total_seconds() <= 3600
    assert anon.post("/api/v1/jobs", json=JOB).status_code == 202
    row.expires_at = utcnow() - dt.timedelta(seconds=1)  # past its lifetime
    db_session.flush()
    r = anon.post("/api/v1/jobs", json=JOB)
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    # a second session of the same token ends when the token is revoked
    anon.cookies.set(SESSION_COOKIE, make_session_cookie(db_session, token))
    assert anon.post("/api/v1/jobs", json=JOB).status_code == 202
    revoke_token(db_session, row.token_id)
    r = anon.post("/api/v1/jobs", json=JOB)
    assert r.status_code == 401 and "token revoked" in r.json()["detail"]
    ended = db_session.scalars(select(BrowserSession.revoked_at).where(BrowserSession.token_id == row.token_id)).all()
    assert len(ended) == 2 and all(t is not None for t in ended)  # revoke_token ended both rows too


def test_cookie_over_https_is_secure(api_client, db_session):
    from fastapi.testclient import TestClient

    token = make_token(db_session, "erin", ["jobs:submit"], expires_in_days=None)
    with TestClient(api_client.app, base_url="https://testserver") as c:
        r = c.post("/api/v1/session", json={"token": token})
        assert r.status_code == 200 and "Secure" in r.headers["set-cookie"]
        assert "Max-Age=604800" in r.headers["set-cookie"]  # a token that never expires: SESSION_LIFETIME_S


def test_csrf_refusals_of_cookie_writes(anon, db_session):
    token = make_token(db_session, "fred", ["jobs:submit"])
    anon.cookies.set(SESSION_COOKIE, make_session_cookie(db_session, token))
    n = len(db_session.scalars(select(Job.id)).all())
    import json

    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = anon.post("/api/v1/jobs", content=json.dumps(JOB), headers={"Content-Type": ctype})
        assert r.status_code == 403 and "application/json" in r.json()["detail"] and "CSRF" in r.json()["detail"]
    for origin in ("http://evil.example", "null", "http://testserver.evil.example"):
        r = anon.post("/api/v1/jobs", json=JOB, headers={"Origin": origin})
        assert r.status_code == 403 and "must come from this site" in r.json()["detail"], origin
    assert len(db_session.scalars(select(Job.id)).all()) == n
    # a bearer token is never sent by a browser on its own: no CSRF check applies
    anon.cookies.clear()
    r = anon.post("/api/v1/jobs", json=JOB, headers={"Origin": "http://evil.example",
                                                       "Authorization": f"Bearer {token}"})
    assert r.status_code == 202
    # sign-in from another site's page (login CSRF) sets no cookie
    r = anon.post("/api/v1/session", json={"token": token}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


def test_a_dead_cookie_is_401_and_cleared(anon, db_session):
    token = make_token(db_session, "gus", ["jobs:submit"])
    anon.cookies.set(SESSION_COOKIE, make_session_cookie(db_session, token))
    revoke_token(db_session, db_session.scalar(select(ApiToken.id).where(ApiToken.user == "gus")))
    r = anon.post("/api/v1/jobs", json=JOB)
    assert r.status_code == 401 and "sign in again" in r.json()["detail"]
    assert "Max-Age=0" in r.headers["set-cookie"]
    assert anon.get("/api/v1/session").json()["signed_in"] is False


def test_token_management_api(anon, db_session):
    admin = auth_headers(db_session, "root", ["admin"])
    hers = make_token(db_session, "hana", ["jobs:submit"])
    his = make_token(db_session, "ivan", ["jobs:submit"])
    h_hana = {"Authorization": f"Bearer {hers}"}
    assert anon.get("/api/v1/tokens").status_code == 401
    mine = anon.get("/api/v1/tokens", headers=h_hana).json()
    assert {t["user"] for t in mine["items"]} == {"hana"} and mine["items"][0]["prefix"] == hers[:10]
    assert hers not in str(mine) and {"prefix", "scopes", "state", "expires_at", "last_used_at"} <= set(mine["items"][0])
    assert anon.get("/api/v1/tokens", params={"user": "ivan"}, headers=h_hana).status_code == 403
    every = anon.get("/api/v1/tokens", headers=admin).json()
    assert {"hana", "ivan", "root"} <= {t["user"] for t in every["items"]}
    assert hers not in str(every) and his not in str(every)

    assert anon.post("/api/v1/tokens", json={"user": "jo"}, headers=h_hana).status_code == 403
    r = anon.post("/api/v1/tokens", json={"user": "jo", "scopes": ["jobs:submit"], "expires_in_days": 7},
                  headers=admin)
    assert r.status_code == 201 and r.json()["token"].startswith("lst_") and r.json()["state"] == "active"
    made = r.json()["token"]
    assert anon.post("/api/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {made}"}).json()["owner"] == "jo"
    r = anon.post("/api/v1/tokens", json={"user": "jo", "scopes": ["root"]}, headers=admin)
    assert r.status_code == 422 and "unknown scope" in r.json()["detail"]

    ivan_id = db_session.scalar(select(ApiToken.id).where(ApiToken.user == "ivan"))
    hana_id = db_session.scalar(select(ApiToken.id).where(ApiToken.user == "hana"))
    r = anon.delete(f"/api/v1/tokens/{ivan_id}", headers=h_hana)
    assert r.status_code == 404 and "ivan" not in r.text  # another user's token: unknown (never 403)
    assert anon.delete("/api/v1/tokens/999999", headers=admin).status_code == 404
    assert anon.delete(f"/api/v1/tokens/{ivan_id}", headers=admin).json()["state"] == "revoked"
    r = anon.delete(f"/api/v1/tokens/{hana_id}", headers=h_hana)  # one's own
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    assert anon.get("/api/v1/tokens", headers=h_hana).status_code == 401


def test_openapi_documents_the_security(anon):
    spec = anon.get("/api/v1/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["APIToken"]["type"] == "http" and schemes["APIToken"]["scheme"] == "bearer"
    assert schemes["SessionCookie"] == {**schemes["SessionCookie"], "type": "apiKey", "in": "cookie",
                                        "name": SESSION_COOKIE}
    anonymous_writes = {("post", "/api/v1/movies"), ("post", "/api/v1/session"), ("delete", "/api/v1/session")}
    writes = 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method in ("post", "put", "patch", "delete") and (method, path) not in anonymous_writes:
                writes += 1
                assert {"APIToken": []} in op.get("security", []), (method, path)
                assert {} not in op["security"], (method, path)
                assert {"401", "403"} <= set(op["responses"]), (method, path)
            elif method == "get" and path != "/api/v1/tokens":
                assert not op.get("security") or {} in op["security"], (method, path)  # reads need none
    assert writes >= 3


def test_token_cli_create_list_revoke(sqlite_env, capsys):
    from backend.auth import authenticate
    from backend.cli import main
    from backend.db import session_scope

    assert main(["token", "create", "--user", "kim", "--scope", "jobs:submit", "--expires-days", "5"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert out == token + "\n" and token.startswith("lst_") and token not in err and "shown this once" in err
    assert main(["token", "list"]) == 0
    listing = capsys.readouterr().out
    assert "kim" in listing and token[:10] + "..." in listing and token not in listing
    with session_scope() as s:
        tid = authenticate(s, token).token_id
    assert main(["token", "revoke", str(tid)]) == 0
    assert f"token {tid} of kim revoked" in capsys.readouterr().out
    with session_scope() as s, pytest.raises(Exception) as exc:
        authenticate(s, token)
    assert exc.value.status_code == 401


def test_a_token_never_appears_in_logs_parameters_errors_or_rows(anon, db_session, caplog):
    from uvicorn.logging import AccessFormatter

    caplog.set_level(logging.DEBUG)
    token = make_token(db_session, "lena", ["jobs:submit"])
    bearer = {"Authorization": f"Bearer {token}"}
    bodies = []
    r = anon.post("/api/v1/jobs", json={**JOB, "options": {"device": "cpu"}}, headers=bearer)
    assert r.status_code == 202
    job = db_session.get(Job, r.json()["id"])
    bodies += [r.text, anon.post("/api/v1/jobs", json={**JOB, "channels": [token]}, headers=bearer).text,
               anon.post("/api/v1/jobs", json={**JOB, "owner": token}, headers=bearer).text,
               anon.get(f"/api/v1/jobs/{token}").text,
               anon.post("/api/v1/session", content=b'{"token": "' + token.encode() + b'",}',
                         headers={"Content-Type": "application/json"}).text,
               anon.post("/api/v1/session", json={"token": token + "x" * 200}).text]
    revoke_token(db_session, job and db_session.scalar(select(ApiToken.id).where(ApiToken.user == "lena")))
    bodies.append(anon.post("/api/v1/jobs", json=JOB, headers=bearer).text)
    for body in bodies:
        assert token not in body and token[4:] not in body, body
    assert token not in repr(job.parameters)
    # uvicorn's access log (the request line, query string included) and every other record
    access = AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s')
    rec = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                            ("127.0.0.1:5000", "GET", f"/api/v1/events?token={token}", "1.1", 200), None)
    logging.getLogger("uvicorn.access").handle(rec)
    lines = [access.format(r) if r.name == "uvicorn.access" else logging.Formatter().format(r)
             for r in caplog.records
             # httpx's "HTTP Request: GET http://testserver/..." is the test client's own line
             # (the caller's side, which chose to put the token in the URL), not the server's
             if not r.name.startswith("httpx")]
    assert any("lst_***" in line for line in lines)
    for line in lines:
        assert token not in line, line
    # database rows: only the token's hash, in api_tokens
    db_session.flush()
    for table in Base.metadata.sorted_tables:
        for row in db_session.execute(select(table)).all():
            text = repr(tuple(row))
            assert token not in text, table.name
            if table.name != "api_tokens":
                assert hash_token(token) not in text, table.name


def test_serve_trusts_forwarded_proto_from_the_configured_proxies_only(api_client, db_session, monkeypatch):
    """Issue 24: ``lstdp serve`` passes ``FORWARDED_ALLOW_IPS`` to uvicorn: behind a trusted
    TLS proxy (``X-Forwarded-Proto: https``) the trailing-slash redirect is https:// and the
    session cookie is Secure; the same headers from another address change nothing. Runs
    uvicorn's own ProxyHeadersMiddleware in-process, configured as ``cmd_serve`` configures it.
    (``LSTDP_`` spelling: uvicorn itself also reads a bare ``FORWARDED_ALLOW_IPS``.)"""
    import argparse

    import uvicorn
    from fastapi.testclient import TestClient

    from backend.cli import cmd_serve
    from backend.settings import get_settings

    monkeypatch.setenv("LSTDP_FORWARDED_ALLOW_IPS", "10.0.0.5,192.168.7.0/24")
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    get_settings.cache_clear()
    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw, app=app))
    assert cmd_serve(argparse.Namespace(host=None, port=None)) == 0
    assert seen["forwarded_allow_ips"] == "10.0.0.5,192.168.7.0/24" and seen["proxy_headers"] is True
    options = {k: v for k, v in seen.items() if k in ("proxy_headers", "forwarded_allow_ips")}
    config = uvicorn.Config(app=api_client.app, log_config=None, **options)
    config.load()
    proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    token = make_token(db_session, "pia", ["jobs:submit"])
    for client, trusted in [(("10.0.0.5", 40000), True), (("192.168.7.20", 40000), True),
                            (("10.0.0.6", 40000), False), (("203.0.113.50", 40000), False)]:
        with TestClient(config.loaded_app, client=client, follow_redirects=False) as c:
            r = c.get("/api/v1/events/", headers=proxied)
            assert r.status_code == 307, r.text
            scheme = "https" if trusted else "http"
            assert r.headers["location"].startswith(f"{scheme}://testserver/api/v1/events"), (client, r.headers)
            r = c.post("/api/v1/session", json={"token": token}, headers=proxied)
            assert r.status_code == 200, r.text
            assert ("Secure" in r.headers["set-cookie"]) is trusted, (client, r.headers["set-cookie"])
