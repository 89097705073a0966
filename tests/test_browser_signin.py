"""The sign-in box of the job pages in a real Chromium (Debian's, driven by Playwright), against
the live server of tests/test_browser.py (uvicorn in a thread, temporary SQLite database, the
filesystem broker; no worker runs, so a submitted job stays ``queued``).

A token made in the test is pasted once; the session cookie it starts (a random session id,
HttpOnly, so no page script can read it) carries the job submission; the job's owner is the token's user.
Screenshots go to each test's ``tmp_path``.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from backend.auth import SESSION_COOKIE, hash_token
from backend.db import session_scope
from backend.models import BrowserSession, Job, JobState
from tests.conftest import make_token
from tests.test_browser import browser, live, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser


def new_token(user: str = "tester", scopes=("jobs:submit", "jobs:cancel"), **kw) -> str:
    """A token of ``user`` committed in the live server's database."""
    with session_scope() as s:
        return make_token(s, user, scopes, **kw)


def sign_in(page, token: str) -> None:
    """Paste ``token`` in the sign-in box of the page shown and wait for "Signed in as"."""
    page.wait_for_selector("#signin[data-signed-in='false'] #signin-token")
    page.fill("#signin-token", token)
    page.click("#signin-submit")
    page.wait_for_selector("#signin[data-signed-in='true']")


def test_sign_in_submit_a_job_and_sign_out(live, page, tmp_path):
    page.goto(live.url + "/jobs/new")
    page.wait_for_selector("#signin[data-signed-in='false']")
    assert page.locator("#signin-form").is_visible() and page.locator("#signin-state").is_hidden()
    page.wait_for_selector("#job-estimate[data-frames]")

    # not signed in: the API's 401 message, and nothing stored
    page.click("#job-submit")
    page.wait_for_selector("#job-form-error:not([hidden])")
    assert page.locator("#job-form-error").inner_text() == (
        "this needs an API token with scope 'jobs:submit' (Authorization: Bearer <token>; "
        "make one with `lstdp token create`)")
    with session_scope() as s:
        assert s.query(Job).count() == 0
    page.screenshot(path=str(tmp_path / "signin-needed.png"), full_page=True)

    # a token that is not known: the API's message in the box, still signed out
    page.fill("#signin-token", "lst_" + "x" * 43)
    page.click("#signin-submit")
    page.wait_for_selector("#signin-error:not([hidden])")
    assert "the API token is not known" in page.locator("#signin-error").inner_text()
    assert page.locator("#signin").get_attribute("data-signed-in") == "false"

    token = new_token("alice", ["jobs:submit"], expires_in_days=2)
    sign_in(page, token)
    assert page.locator("#signin-error").is_hidden() and page.locator("#signin-form").is_hidden()
    assert page.locator("#signin-state").inner_text().startswith("Signed in as alice (jobs:submit)")
    assert "token expires" in page.locator("#signin-expiry").inner_text()
    assert page.input_value("#signin-token") == ""  # the page keeps no copy
    cookie = next(c for c in page.context.cookies() if c["name"] == SESSION_COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] != token  # a session id
    with session_scope() as s:
        signed_in = s.scalar(select(BrowserSession).where(BrowserSession.session_hash == hash_token(cookie["value"])))
        assert signed_in is not None and signed_in.user == "alice" and signed_in.revoked_at is None
    assert 0 < cookie["expires"] - __import__("time").time() <= 2 * 86400 + 5  # not past the token's expiry
    assert page.evaluate("document.cookie") == ""  # HttpOnly: invisible to scripts
    page.screenshot(path=str(tmp_path / "signed-in.png"), full_page=True)

    page.click("#job-submit")
    bar = page.wait_for_selector("#job-follow .job-status progress.job-progress")
    job_id = bar.get_attribute("data-job-id")
    page.wait_for_selector("#job-follow .job-status .job-state.state-queued")
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.queued and job.owner == "alice"
        assert token not in repr(job.parameters)
    page.screenshot(path=str(tmp_path / "signed-in-queued.png"), full_page=True)

    # the jobs page knows the session too, and lists the job with its owner
    page.goto(live.url + "/jobs")
    page.wait_for_selector("#signin[data-signed-in='true']")
    assert "Signed in as alice" in page.locator("#signin-state").inner_text()
    row = page.locator("#job-list tbody tr", has=page.locator(f"a[href='/jobs/{job_id}']"))
    assert "queued" in row.inner_text() and "alice" in row.inner_text()
    page.screenshot(path=str(tmp_path / "jobs-signed-in.png"), full_page=True)

    page.click("#signout")
    page.wait_for_selector("#signin[data-signed-in='false']")
    assert page.locator("#signin-form").is_visible() and page.locator("#signin-state").is_hidden()
    assert SESSION_COOKIE not in {c["name"] for c in page.context.cookies()}
    with session_scope() as s:  # signed out server-side: the old cookie value is dead
        assert s.get(BrowserSession, signed_in.id).revoked_at is not None
    page.goto(live.url + "/jobs/new")
    page.wait_for_selector("#signin[data-signed-in='false']")
    page.wait_for_selector("#job-estimate[data-frames]")
    page.click("#job-submit")
    page.wait_for_selector("#job-form-error:not([hidden])")
    assert "scope 'jobs:submit'" in page.locator("#job-form-error").inner_text()
    assert [e for e in page.js_errors if "401" not in e] == []


def test_a_token_without_the_scope_shows_the_403_and_a_revoked_one_signs_out(live, page, tmp_path):
    from backend.auth import revoke_token
    from backend.models import ApiToken

    page.goto(live.url + "/jobs/new")
    sign_in(page, new_token("bob", ["jobs:cancel"]))
    assert page.locator("#signin-state").inner_text().startswith("Signed in as bob (jobs:cancel)")
    page.wait_for_selector("#job-estimate[data-frames]")
    page.click("#job-submit")
    page.wait_for_selector("#job-form-error:not([hidden])")
    assert "of user 'bob' lacks scope 'jobs:submit'" in page.locator("#job-form-error").inner_text()
    page.screenshot(path=str(tmp_path / "signin-403.png"), full_page=True)

    with session_scope() as s:
        revoke_token(s, s.query(ApiToken).filter_by(user="bob").one().id)
    page.reload()  # the box asks again: a revoked token is no session, and its cookie is dropped
    page.wait_for_selector("#signin[data-signed-in='false']")
    assert SESSION_COOKIE not in {c["name"] for c in page.context.cookies()}
    assert [e for e in page.js_errors if "403" not in e] == []
