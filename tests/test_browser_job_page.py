"""The job page as users meet it (issue 25 points 1 and 5, the job page's half), in a real
Chromium (Debian's, driven by Playwright) against the live server of tests/test_browser.py
(uvicorn in a thread, temporary SQLite database, the ``filesystem://`` broker; no worker).

* Cancel and Retry clicked on the page: the page's own script sends them with the session
  cookie, so they must pass the cookie's CSRF rule (application/json); a queued job ends
  ``cancelled``; a failed job's failed frames, and only those, are planned and sent again.
* Buttons that do not apply are not visible (computed visibility: ``is_visible``, which a
  ``display`` rule beating the ``hidden`` attribute defeats).
* The page follows a job to its end state without a reload: queue box gone, products
  written with their files, finish time, counts that agree with the products.

The work a worker would do (claim, write the row, settle) is done here with the same
functions the worker uses (``claim_product``, ``count_item``), between the page's reads.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from backend.broker import InFlight
from backend.db import session_scope
from backend.models import CalibrationKind, ItemOutcome, Job, JobItem, JobState, Product, ProductState
from backend.services.job_plan import count_item
from backend.state import claim_product, move_product
from backend.worker.processing import plan_job
from tests.test_api import T0, make_calibration, make_frame
from tests.test_browser import browser, live, page  # noqa: F401 - fixtures
from tests.test_browser_signin import new_token, sign_in

pytestmark = pytest.mark.browser

DAY = dt.timedelta(days=2)  # this file's frames: two days after the live fixture's, no product of theirs


def _job(owner: str, n: int, *, publishes: bool = False, options: dict | None = None, plan: bool = True) -> tuple[str, list[int]]:
    """A job of ``owner`` over ``n`` new SDI frames (with the calibrations SDI needs), planned
    as the worker plans it (``plan_job``: running, one planned product per frame) unless
    ``plan`` is false (queued). Returns its id and its product ids in DATE-OBS order."""
    with session_scope() as s:
        for kind in (CalibrationKind.dark, CalibrationKind.flat, CalibrationKind.radiometric):
            make_calibration(s, "SDI", kind, 1)
        frames = [make_frame(s, "SDI", T0 + DAY + dt.timedelta(minutes=5 * i)) for i in range(n)]
        job = Job(owner=owner, kind="calibrate", state=JobState.queued, publishes=publishes, lane="cpu",
                  parameters={"channels": ["SDI"], "start": frames[0].date_obs.isoformat(),
                              "end": frames[-1].date_obs.isoformat(), "options": options or {},
                              "pinned_calibrations": {}})
        s.add(job)
        s.flush()
        job_id = job.id
    if not plan:
        return job_id, []
    with session_scope() as s:
        todo = plan_job(s, job_id)
    assert len(todo) == n
    return job_id, todo


@contextlib.contextmanager
def reloading(page, timeout_ms: float = 30_000):
    """The block's click makes the page show a message, then reload itself (job_actions.js, 600 ms
    after the API's answer). On exit the new document has loaded. Yields an object whose
    ``message()`` is the message the old document showed and ``answer()`` the API's answer to
    the page's own request, ``(status, JSON body)``.

    A check made between the click and the reload raced it (once in a full run: the old page's
    status poll already read ``cancelled``, so ``wait_for_selector`` matched the old document and
    the Retry button was looked for while the new one loaded). Here both are kept in
    ``sessionStorage``, which survives the reload: the message by a MutationObserver the moment it
    is shown, the answer by the old document's ``fetch`` (the page's request goes to the server as
    the page sends it, cookie and all; its body is read from a clone before the page gets it). The
    old document carries a mark that the new one lacks."""
    page.evaluate(r"""() => {
        window.__lstdpOldDocument = true;
        sessionStorage.removeItem("lstdpActionMessage");
        sessionStorage.removeItem("lstdpActionAnswer");
        const m = document.querySelector("#job-actions .job-action-message");
        new MutationObserver(() => {
            if (!m.hidden) sessionStorage.setItem("lstdpActionMessage", m.textContent);
        }).observe(m, {attributes: true, childList: true, characterData: true, subtree: true});
        const send = window.fetch;
        window.fetch = async function (...args) {
            const resp = await send.apply(this, args);
            if (/\/api\/v1\/jobs\/[^/]+\/(cancel|retry)$/.test(new URL(resp.url).pathname)) {
                const body = await resp.clone().text();
                sessionStorage.setItem("lstdpActionAnswer", JSON.stringify([resp.status, body]));
            }
            return resp;
        };
    }""")

    def answer() -> tuple[int, object] | None:
        got = page.evaluate('() => sessionStorage.getItem("lstdpActionAnswer")')
        if got is None:
            return None
        status, body = json.loads(got)
        return status, json.loads(body)

    yield SimpleNamespace(message=lambda: page.evaluate('() => sessionStorage.getItem("lstdpActionMessage")'),
                          answer=answer)
    page.wait_for_function("() => window.__lstdpOldDocument === undefined", timeout=timeout_ms)
    page.wait_for_load_state("load")


def _settle(job_id: str, pid: int, error: str | None = None) -> None:
    """A worker's calibration of product ``pid``: claim, write the row (or fail it), settle."""
    with session_scope() as s:
        assert claim_product(s, pid, lease_s=600, max_deliveries=3).status == "claimed"
    with session_scope() as s:
        prod = s.get(Product, pid)
        if error:
            move_product(prod, ProductState.failed, error)
        else:
            prod.path, prod.sha256 = f"/store/sdi/{pid}.fits", f"{pid:064x}"
            move_product(prod, ProductState.written)
        s.flush()
        count_item(s, job_id, pid)


def _broker_products(live) -> set[int]:
    flight = InFlight()
    for p in (live.settings.broker_dir / "in").glob("*"):
        if p.is_file():
            flight.add_message(p.read_bytes())
    return flight.products


def test_cancel_on_the_page_ends_a_queued_job_cancelled(live, page, tmp_path):
    job_id, _ = _job("tester", 2, plan=False)
    page.goto(f"{live.url}/jobs")  # signed in first: another user's job is a 404
    sign_in(page, new_token("tester"))
    page.goto(f"{live.url}/jobs/{job_id}")
    cancel, retry = page.locator("#job-actions .job-cancel"), page.locator("#job-actions .job-retry")
    assert cancel.is_visible() and not retry.is_visible(), "a queued job can be cancelled, not retried"
    page.screenshot(path=str(tmp_path / "job-queued.png"), full_page=True)

    with reloading(page) as seen:
        with page.expect_response(re.compile(rf"/api/v1/jobs/{job_id}/cancel$")) as answer:
            cancel.click()
        assert answer.value.status == 200
    status, body = seen.answer()
    assert status == 200 and body["state"] == "cancelled", (status, body)
    shown = seen.message()
    assert (body["total"], body["cancelled"]) == (0, 0), body  # queued: never planned, no frame counted
    assert shown == "Cancelled before it was planned: none of its frames will be calibrated.", shown
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.cancelled and job.cancelled_by == "tester" and job.finished_at is not None

    # the page has reloaded: the job reads cancelled, Cancel is gone and Retry offered
    assert page.locator(".job-status").get_attribute("data-state") == "cancelled"
    assert page.locator(".job-state").inner_text() == "cancelled"
    assert not page.locator("#job-actions .job-cancel").is_visible()
    assert page.locator("#job-actions .job-retry").is_visible()
    page.screenshot(path=str(tmp_path / "job-cancelled.png"), full_page=True)
    assert page.js_errors == []


def test_retry_on_the_page_sends_exactly_the_failed_frames_again(live, page, tmp_path):
    job_id, products = _job("tester", 5)
    done, failed = products[:3], products[3:]
    for pid in done:
        _settle(job_id, pid)
    for pid in failed:
        _settle(job_id, pid, "flat v1: not a FITS file")
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert (job.state, job.done, job.failed) == (JobState.failed, 3, 2)
        before = {p.id: (p.state, p.path, p.updated_at) for p in s.scalars(select(Product).where(Product.id.in_(done)))}
    sent_before = _broker_products(live)

    page.goto(f"{live.url}/jobs")  # signed in first: another user's job is a 404
    sign_in(page, new_token("tester"))
    page.goto(f"{live.url}/jobs/{job_id}")
    cancel, retry = page.locator("#job-actions .job-cancel"), page.locator("#job-actions .job-retry")
    assert retry.is_visible() and not cancel.is_visible(), "an ended job cannot be cancelled"
    page.screenshot(path=str(tmp_path / "job-failed.png"), full_page=True)

    with reloading(page) as seen:
        with page.expect_response(re.compile(rf"/api/v1/jobs/{job_id}/retry$")) as answer:
            retry.click()
        assert answer.value.status == 202
    status, body = seen.answer()
    assert status == 202, (status, body)
    assert seen.message() == "Retry 1 sent: the job runs its failed frames again."
    assert (body["state"], body["retries"], body["done"], body["failed"], body["total"]) == ("running", 1, 3, 0, 5)
    # exactly the failed frames: their products planned again and sent, the done ones untouched
    with session_scope() as s:
        items = {i.product_id: i.outcome for i in s.scalars(select(JobItem).where(JobItem.job_id == job_id))}
        assert items == {**{p: ItemOutcome.done for p in done}, **{p: ItemOutcome.pending for p in failed}}
        assert {p.id: p.state for p in s.scalars(select(Product).where(Product.id.in_(failed)))} == \
            {p: ProductState.planned for p in failed}
        assert {p.id: (p.state, p.path, p.updated_at) for p in s.scalars(
            select(Product).where(Product.id.in_(done)))} == before
    assert _broker_products(live) - sent_before == set(failed)

    # the page has reloaded: running, Cancel offered, Retry gone
    assert page.locator(".job-status").get_attribute("data-state") == "running"
    assert page.locator("#job-actions .job-cancel").is_visible()
    assert not page.locator("#job-actions .job-retry").is_visible()
    assert "Retried 1 time(s)." in page.locator("#job-actions").inner_text()

    # the worker runs them: the page follows the job to succeeded
    for pid in failed:
        _settle(job_id, pid)
    page.wait_for_selector(".job-status[data-state='succeeded']")
    page.wait_for_function("(document.getElementById('job-product-states') || {}).textContent === '5 written'")
    assert page.locator(".job-counts").inner_text() == "5 done · 0 failed · 0 skipped · 5 frames"
    assert page.locator("#job-product-states").inner_text() == "5 written"
    assert not page.locator("#job-actions .job-cancel").is_visible()
    assert not page.locator("#job-actions .job-retry").is_visible()
    page.screenshot(path=str(tmp_path / "job-retried.png"), full_page=True)
    assert page.js_errors == []


def test_the_job_page_follows_a_job_to_its_end_state(live, page, tmp_path):
    job_id, products = _job("system", 4, publishes=True)  # a platform job: public, seen anonymously
    page.goto(f"{live.url}/jobs/{job_id}")
    page.wait_for_selector(".job-status[data-state='running']")
    assert page.locator("#job-queue").is_visible(), "a running job shows its place in the queue"
    assert page.locator("#job-finished").inner_text() == "—"
    states = page.locator("#job-products-table tbody tr td:nth-child(5)")
    assert states.all_inner_texts() == ["planned"] * 4
    page.screenshot(path=str(tmp_path / "job-running.png"), full_page=True)

    _settle(job_id, products[0])
    page.wait_for_function("document.querySelector('.job-counts').textContent.startsWith('1 done')")
    for pid in products[1:]:
        _settle(job_id, pid)
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.succeeded
        finished = job.finished_at.strftime("%Y-%m-%d %H:%M:%S")

    # the end state, without a reload: the queue box gone, the finish time, every product
    # written with its file, and counts that agree with the products
    page.wait_for_selector(".job-status[data-state='succeeded']")
    page.wait_for_function("!document.getElementById('job-queue') && "
                           "document.getElementById('job-finished').textContent.trim() !== '—'")
    assert page.locator("#job-queue").count() == 0
    assert page.locator("#job-finished").inner_text() == f"{finished} UTC"
    assert states.all_inner_texts() == ["written"] * 4
    links = page.locator("#job-products-table tbody tr td:nth-child(6) a")
    assert links.all_inner_texts() == ["FITS"] * 4
    assert page.locator(".job-counts").inner_text() == "4 done · 0 failed · 0 skipped · 4 frames"
    assert page.locator("#job-product-states").inner_text() == "4 written"
    assert page.locator(".job-state").inner_text() == "succeeded"
    assert not page.locator("#job-actions .job-cancel").is_visible(), "an ended job offers no Cancel"
    assert not page.locator("#job-actions .job-retry").is_visible(), "nor Retry: nothing failed"
    assert not page.locator("#job-actions").is_visible(), "no empty card where the buttons were"
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1, "no reload"
    page.screenshot(path=str(tmp_path / "job-succeeded.png"), full_page=True)
    assert page.js_errors == []


def test_a_public_job_with_private_products_says_so_anonymously(live, page):
    # an admin's job (publishes) with non-default options: its set is the admin's until promoted
    job_id, products = _job("admin", 2, publishes=True, options={"remove_cosmic_rays": True})
    for pid in products:
        _settle(job_id, pid)
    page.goto(f"{live.url}/jobs/{job_id}")
    assert page.locator(".job-state").inner_text() == "succeeded"
    assert page.locator("#job-no-products").count() == 0, "not 'No product yet' for a job that wrote two"
    note = page.locator("#job-private-products").inner_text()
    assert note.startswith("2 products of this job are in a calibration set private to admin")
    sign_in(page, new_token("admin", scopes=("admin",)))
    page.reload()
    rows = page.locator("#job-products-table tbody tr").evaluate_all("rs => rs.map(r => Number(r.dataset.productId))")
    assert sorted(rows) == sorted(products) and page.locator("#job-private-products").count() == 0
    assert page.js_errors == []


def test_a_detection_that_settles_after_the_job_shows_without_a_reload(live, page):
    """A reviewer's case: the detections a job queues when it ends settle after it, when the
    job's own stream has ended; the page showed "queued" until reloaded. The page now fetches
    them again while any is queued, so a refusal's reason appears by itself."""
    from backend.models import FollowUpState, JobFollowUp

    job_id, products = _job("system", 3, publishes=True)
    for pid in products:
        _settle(job_id, pid)
    with session_scope() as s:
        assert s.get(Job, job_id).state == JobState.succeeded
        ups = s.scalars(select(JobFollowUp).where(JobFollowUp.job_id == job_id)).all()
        assert ups, "an SDI job queues the flare detection when it ends"
        for up in ups:
            up.state = FollowUpState.queued
    page.goto(f"{live.url}/jobs/{job_id}")
    page.wait_for_selector("#job-detections-live[data-pending='true'] dd[data-state='queued']")
    reason = "the SDI series has 3 frames; the detector needs at least 8"
    with session_scope() as s:
        for up in s.scalars(select(JobFollowUp).where(JobFollowUp.job_id == job_id)):
            up.state, up.error = FollowUpState.refused, reason
    page.wait_for_selector("#job-detections-live[data-pending='false'] dd[data-state='refused']", timeout=60_000)
    assert reason in page.locator("#job-detections").inner_text()
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1, "no reload"
    assert page.js_errors == []
