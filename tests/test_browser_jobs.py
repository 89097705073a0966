"""The job form, the job page, the bulk downloads and the layout of the forms, in a real
Chromium (Debian's, driven by Playwright), against the live server of tests/test_browser.py
(uvicorn in a thread, temporary SQLite database with events, frames and products with real
FITS files). Screenshots go to each test's ``tmp_path``.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile

import pytest

from backend.db import session_scope
from backend.models import CalibrationKind, ItemOutcome, Job, JobItem, JobState, Product
from tests.conftest import require
from tests.test_api import make_calibration
from tests.test_browser import browser, live, page  # noqa: F401 - fixtures
from tests.test_browser_signin import new_token, sign_in

pytestmark = pytest.mark.browser

ALL_FRAMES = 8  # tests/test_browser.py _fill: 5 SDI frames, one of each other channel


def test_job_form_submits_with_its_defaults_on_first_load(live, page, tmp_path):
    with session_scope() as s:
        make_calibration(s, "SDI", CalibrationKind.flat, 4)
        make_calibration(s, "WST", CalibrationKind.flat, 4)
    page.goto(live.url + "/jobs/new")
    sign_in(page, new_token("tester"))  # submitting needs a token with jobs:submit
    assert page.input_value("#job-start") == "2024-05-14T15:50:00Z"
    assert page.input_value("#job-end") == "2024-05-14T16:40:00Z"
    assert page.evaluate("document.getElementById('job-form').checkValidity()")
    # the estimate is asked as soon as the page is drawn, and again as the fields change
    page.wait_for_selector("#job-estimate[data-frames]")
    assert page.locator("#job-estimate").inner_text() == (
        "This job would recalibrate 8 frames (SDI 5, WST 1, SCI-UV 1, SCI-WL 1); 8 of them already have a product.")
    # the options with their defaults and units, the pinned versions from the registry
    assert page.locator("#opt-psf_iterations").input_value() == "30"
    assert page.locator("#opt-psf_iterations").get_attribute("max") == "500"
    assert page.locator("#opt-interpolation_order").input_value() == "3"
    assert not page.locator("#opt-remove_cosmic_rays").is_checked()
    assert page.locator("#opt-rotate_north_up").is_checked()
    assert "[DN]" in page.locator("label:has(#opt-saturation_dn)").inner_text()
    assert page.locator("#pin-flat option").all_inner_texts()[1].startswith("v4 · SDI, WST · from 2024-04-14")
    page.screenshot(path=str(tmp_path / "job-new-defaults.png"), full_page=True)

    page.click("#job-submit")  # nothing changed: the defaults are a valid job
    bar = page.wait_for_selector("#job-follow .job-status progress.job-progress")
    job_id = bar.get_attribute("data-job-id")
    assert page.locator("#job-form-error").is_hidden()
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.queued and job.owner == "tester"  # the token's user
        assert job.parameters["channels"] == ["SCI-UV", "SCI-WL", "SDI", "WST"]
        assert job.parameters["start"] == "2024-05-14T15:50:00Z" and job.parameters["end"] == "2024-05-14T16:40:00Z"
        from pipelines.calibration.l2.options import CalibrationOptions

        assert job.parameters["options"] == CalibrationOptions().model_dump(mode="json")
        assert job.parameters["pinned_calibrations"] == {}
    page.screenshot(path=str(tmp_path / "job-new-submitted.png"), full_page=True)

    # changed fields: the estimate follows, the options and pins go with the job
    page.uncheck("input[name=channels][value=SDI]")
    page.wait_for_function("document.getElementById('job-estimate').dataset.frames === '3'")
    page.fill("#job-end", "2024-05-14 10:00")
    page.wait_for_selector("#job-estimate.error")
    assert "before" in page.locator("#job-estimate").inner_text()
    page.fill("#job-end", "2024-05-14T16:05:00")  # no offset: UTC
    page.wait_for_function("document.getElementById('job-estimate').dataset.frames === '3'")
    page.check("#opt-remove_cosmic_rays")
    page.fill("#opt-interpolation_order", "1")
    page.select_option("#pin-flat", "4")
    page.uncheck("input[name=channels][value=SCI-UV]")
    page.uncheck("input[name=channels][value=SCI-WL]")
    page.uncheck("input[name=channels][value=WST]")  # flat v4 is SDI's and WST's: no channel has it now
    assert page.locator("#pin-flat option[value='4']").is_disabled() and page.input_value("#pin-flat") == ""
    page.check("input[name=channels][value=WST]")
    assert page.locator("#pin-flat option[value='4']").is_enabled()
    page.select_option("#pin-flat", "4")
    page.click("#job-submit")
    page.wait_for_function("document.querySelectorAll('#job-follow .job-status').length === 2")
    second = page.locator("#job-follow .job-status").first.get_attribute("data-job-id")
    with session_scope() as s:
        job = s.get(Job, second)
        assert job.parameters["channels"] == ["WST"] and job.parameters["end"] == "2024-05-14T16:05:00Z"
        assert job.parameters["options"]["remove_cosmic_rays"] is True
        assert job.parameters["options"]["interpolation_order"] == 1
        assert job.parameters["pinned_calibrations"] == {"flat": 4}
    assert [e for e in page.js_errors if "422" not in e] == []


def test_job_page_lists_its_options_and_exactly_its_products(live, page, tmp_path):
    with session_scope() as s:
        # a platform job (publishes): public, so the anonymous browser may open its page
        job = Job(owner="system", publishes=True, kind="calibrate", state=JobState.succeeded, total=2, done=2,
                  parameters={"channels": ["SDI"], "start": "2024-05-14T15:50:00Z", "end": "2024-05-14T16:00:00Z",
                              "pinned_calibrations": {"dark": 2},
                              "options": {"remove_cosmic_rays": True, "interpolation_order": 1}})
        s.add(job)
        s.flush()
        mine = [s.get(Product, pid) for pid in live.ids.sdi[:2]]
        s.add_all([JobItem(job_id=job.id, frame_id=p.frame_id, product_id=p.id, outcome=ItemOutcome.done)
                   for p in mine])
        job_id, mine_ids = job.id, sorted(p.id for p in mine)
    page.goto(f"{live.url}/jobs/{job_id}")
    opts = {li.get_attribute("data-option"): li.inner_text() for li in page.locator("#job-options li").all()}
    cosmics, order = opts["remove_cosmic_rays"], opts["interpolation_order"]
    assert cosmics.startswith("Remove cosmic rays: on") and "(default off)" in cosmics
    assert order.startswith("Interpolation order: 1") and "(default 3)" in order
    assert opts["psf_iterations"].startswith("PSF iterations: 30") and "(default)" in opts["psf_iterations"]
    assert "saturation_dn" in opts and "DN" in opts["saturation_dn"]
    assert "dark v2" in page.locator("dl.fields").inner_text()
    rows = page.locator("#job-products-table tbody tr").evaluate_all("rs => rs.map(r => Number(r.dataset.productId))")
    assert sorted(rows) == mine_ids
    page.screenshot(path=str(tmp_path / "job-page.png"), full_page=True)
    # its links give exactly those products: the API list and the archive
    api = page.request.get(live.url + page.locator("#job-products-api").get_attribute("href")).json()
    assert sorted(i["id"] for i in api["items"]) == mine_ids and api["total"] == 2
    tar = page.request.get(live.url + page.locator("#job-products-archive").get_attribute("href")).body()
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        man = json.load(t.extractfile("MANIFEST.json"))
        assert sorted(r["product_id"] for r in man["products"]) == mine_ids
        for r in man["products"]:
            assert hashlib.sha256(t.extractfile(r["name"]).read()).hexdigest() == r["sha256"]
    assert page.js_errors == []


def test_bulk_download_buttons_on_the_products_and_event_pages(live, page, tmp_path):
    page.goto(live.url + "/products")
    assert page.locator("#bulk-archive").is_visible() and page.locator("#bulk-script").is_visible()
    page.wait_for_selector("#bulk-count[data-total]")
    assert page.locator("#bulk-count").inner_text() == "8 products match."
    page.select_option("#bulk-channel", "SDI")
    page.wait_for_function("document.getElementById('bulk-count').dataset.total === '5'")
    page.fill("#bulk-start", "2024-05-14T15:55")  # no offset: UTC
    page.wait_for_function("document.getElementById('bulk-count').dataset.total === '4'")
    page.screenshot(path=str(tmp_path / "products-download.png"), full_page=True)
    with page.expect_download() as dl:
        page.click("#bulk-archive")
    data = open(dl.value.path(), "rb").read()
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        man = json.load(t.extractfile("MANIFEST.json"))
        names = [m.name for m in t.getmembers() if m.name.endswith(".fits")]
    assert man["query"] == {"channel": "SDI", "start": "2024-05-14T15:55:00+00:00", "state": "written"}
    assert len(names) == 4 and sorted(r["product_id"] for r in man["products"]) == sorted(live.ids.sdi[1:])
    with page.expect_download() as dl:
        page.click("#bulk-script")
    script = open(dl.value.path()).read()
    assert len(re.findall(r"^fetch ", script, re.M)) == 4

    page.goto(f"{live.url}/events/{live.ids.fl}")
    for sel in ("#event-archive", "#event-archive-gz", "#event-archive-zip", "#event-script", "#event-archive-linked"):
        assert page.locator(sel).is_visible(), sel
    page.locator("#event-download").screenshot(path=str(tmp_path / "event-download.png"))
    with page.expect_download() as dl:
        page.click("#event-archive")
    with tarfile.open(dl.value.path()) as t:
        man = json.load(t.extractfile("MANIFEST.json"))
    # FL 16:00-16:30 +-30 min: the five SDI frames and the three others (16:05)
    assert man["files"] == ALL_FRAMES and man["missing"] == 0
    assert page.js_errors == []


def test_download_script_fetches_and_checks_every_file(live, tmp_path):
    require(shutil.which("curl") is not None or shutil.which("wget") is not None, "needs curl or wget")
    require(shutil.which("sha256sum") is not None, "needs sha256sum (GNU coreutils)")
    import urllib.request

    script = urllib.request.urlopen(live.url + "/api/v1/products/download.sh?channel=SDI").read().decode()
    (tmp_path / "download.sh").write_text(script)
    r = subprocess.run(["sh", "download.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": OK") == 5
    fits = sorted(p.name for p in (tmp_path / "SDI").glob("*.fits"))
    assert len(fits) == 5
    # a damaged file is caught by the script's check
    damaged = tmp_path / "SDI" / fits[0]
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    r = subprocess.run(["sha256sum", "-c", "--quiet", "-"], cwd=tmp_path, capture_output=True, text=True,
                       input=script.split("<<'SHA256SUMS'\n")[1].split("\nSHA256SUMS")[0] + "\n")
    assert r.returncode != 0 and fits[0] in r.stdout


#: Labels whose text is not next to their field: text more than 14 px above the field, below
#: it, or on its line but far to its side (a label wrapped away from its input).
_LABEL_CHECK = """() => {
  const bad = [];
  for (const label of document.querySelectorAll('main form label')) {
    const control = label.querySelector('input, select, textarea');
    if (!control || control.offsetParent === null) continue;
    const walker = document.createTreeWalker(label, NodeFilter.SHOW_TEXT);
    let text = null;
    while (walker.nextNode()) { if (walker.currentNode.textContent.trim()) { text = walker.currentNode; break; } }
    if (!text) continue;
    const range = document.createRange(); range.selectNodeContents(text);
    const t = range.getClientRects()[0], c = control.getBoundingClientRect();
    if (!t) continue;
    const above = t.bottom <= c.top + 2 && c.top - t.bottom <= 14 && t.left < c.right && t.right > c.left - 4;
    const beside = Math.abs((t.top + t.bottom) / 2 - (c.top + c.bottom) / 2) <= 12 &&
                   (Math.abs(t.left - c.right) <= 24 || Math.abs(c.left - t.right) <= 24);
    if (!above && !beside) bad.push(text.textContent.trim() + ' @ ' + JSON.stringify([t.left, t.top, c.left, c.top]));
  }
  return bad;
}"""


@pytest.mark.parametrize("width", [1280, 800])
def test_forms_keep_labels_with_their_fields(live, browser, tmp_path, width):  # noqa: F811
    context = browser.new_context(viewport={"width": width, "height": 900})
    pg = context.new_page()
    try:
        for name, url in (("job-new", "/jobs/new"), ("products", "/products"), ("events", "/")):
            assert pg.goto(live.url + url).status == 200, name
            pg.wait_for_load_state("networkidle")
            pg.screenshot(path=str(tmp_path / f"{name}-{width}.png"), full_page=True)
            assert pg.evaluate(_LABEL_CHECK) == [], (name, width)
            overflow = pg.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 0, (name, width, overflow)  # no sideways scrolling
    finally:
        context.close()
