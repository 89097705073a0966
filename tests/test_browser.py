"""The event browser in a real Chromium (Debian's, driven by Playwright).

A uvicorn server runs the app in a thread, on a free localhost port, against a temporary
SQLite database (embedded mode, ``sqlite_env``) filled with events, frames, products with
real FITS files and PNG quicklooks. Job submission goes to the real Celery app on the
``filesystem://`` broker in the temporary DATA_DIR; no worker runs, so the job stays
``queued``. Screenshots go to each test's ``tmp_path``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sqlalchemy import select

from backend.db import session_scope
from backend.models import Event, EventAssociation, EventProduct, Job, JobState
from tests.test_api import T0, make_event, make_frame, make_product, route_celery_to_this_data_dir

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MIN = dt.timedelta(minutes=1)
TIMEOUT_MS = 15_000


def boxes_in_one_layout(page, *locators) -> list[dict]:
    """``{x, y, width, height}`` [CSS px, viewport] of each locator's element, measured in one call.

    Two ``Locator.bounding_box`` calls run at two moments: a page whose content above still grows
    (a plot drawn late, a lazy image) can move between them, and an image and the marker drawn on
    it then disagree by the shift (a fresh-clone CI saw a marker 1416 image pixels off in y, exact
    in x). One ``getBoundingClientRect`` pass sees one layout.
    """
    handles = [loc.element_handle() for loc in locators]
    return page.evaluate("els => els.map(e => { const b = e.getBoundingClientRect(); "
                         "return {x: b.x, y: b.y, width: b.width, height: b.height}; })", handles)


@contextlib.contextmanager
def served_app():
    """The app served by uvicorn in a thread on a free localhost port; yields its base URL and
    stops the server on exit (fails the test if it does not start within 15 s)."""
    import uvicorn

    from backend.api.app import create_app

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fill(settings) -> SimpleNamespace:
    """Events, frames and written products of all four channels around a flare."""
    ids = SimpleNamespace()
    with session_scope() as s:
        fl = make_event(s, "FL", T0, T0 + 12 * MIN, T0 + 30 * MIN, goes_class="M1.2", hpc_x=-420.5, hpc_y=310.0,
                        noaa_ar=13664, frm_name="SWPC")
        ce = make_event(s, "CE", T0 + 20 * MIN, None, T0 + 200 * MIN, source="cdaw", position_angle=285.0,
                        angular_width=120.0, speed_km_s=950.0)
        c2 = make_event(s, "FL", T0 + dt.timedelta(days=1), T0 + dt.timedelta(days=1, minutes=4),
                        T0 + dt.timedelta(days=1, minutes=9), goes_class="C2.0")
        pr = make_event(s, "PR", T0 + 300 * MIN, source="detected", channels="SCI-UV", position_angle=80.0,
                        frm_name="lst-prominence-eruption", frm_version="0.1.0")
        s.add_all([EventAssociation(event_id=fl.id, other_event_id=ce.id, kind="flare_cme"),
                   EventAssociation(event_id=ce.id, other_event_id=fl.id, kind="cme_flare")])
        folder = settings.products
        sdi = []
        for i, minutes in enumerate((-10, 0, 10, 20, 40)):
            f = make_frame(s, "SDI", T0 + minutes * MIN)
            sdi.append(make_product(s, f, folder / "SDI", disk_value=100.0 + (30.0 if 0 <= minutes <= 30 else 0.0)))
            sdi[-1].params_hash = "0" * 64  # one calibration set (key and options), as one job makes
        others = {}
        for code in ("WST", "SCI-UV", "SCI-WL"):
            f = make_frame(s, code, T0 + 5 * MIN)
            others[code] = make_product(s, f, folder / code, disk_value=10.0, bunit="MSB" if code != "WST" else
                                        "erg cm-2 s-1 sr-1")
        s.add(EventProduct(event_id=fl.id, product_id=sdi[2].id))
        s.flush()
        ids.fl, ids.ce, ids.c2, ids.pr = fl.id, ce.id, c2.id, pr.id
        ids.sdi = [p.id for p in sdi]
        ids.others = {k: p.id for k, p in others.items()}
    return ids


@pytest.fixture
def live(sqlite_env, curves_read_unbudgeted):
    """The app served by uvicorn in a thread, on the temporary SQLite database (the curves'
    read budget lifted: the event page's test counts the LST points)."""
    ids = _fill(sqlite_env)
    route_celery_to_this_data_dir()  # POST /jobs sends to DATA_DIR/broker/in of this test
    with served_app() as url:
        yield SimpleNamespace(url=url, ids=ids, settings=sqlite_env)


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.js_errors = errors
    yield pg
    context.close()


def test_events_page_lists_filters_and_draws_timeline(live, page, tmp_path):
    page.goto(live.url + "/")
    page.wait_for_selector("#timeline.js-plotly-plot")
    rows = page.locator("#events-table tbody tr")
    assert rows.count() == 4
    assert page.locator("#event-count").inner_text().strip() == "Events 1–4 of 4"
    # the timeline is the API's figure: its title counts the events drawn
    page.wait_for_selector("#timeline .gtitle")
    assert page.locator("#timeline .gtitle").text_content() == "Event timeline: 4 events"
    assert page.locator("#timeline .bars .point").count() >= 3  # FL, FL, CE bars
    fl_row = page.locator(f"tr[data-event-id='{live.ids.fl}']")
    assert "GOES M1.2" in fl_row.inner_text() and "(-420″, 310″)" in fl_row.inner_text()
    assert "PA 285°" in page.locator(f"tr[data-event-id='{live.ids.ce}']").inner_text()
    page.screenshot(path=str(tmp_path / "events.png"), full_page=True)

    page.select_option("#filter-type", "FL")
    page.click("#event-filters button[type=submit]")
    page.wait_for_url(re.compile(r"type=FL"))
    page.wait_for_selector("#timeline.js-plotly-plot")
    types = page.locator("#events-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.eventType)")
    assert types == ["FL", "FL"]
    assert page.locator("#timeline .gtitle").text_content() == "Event timeline: 2 events"

    page.fill("#filter-start", "2024-05-15T00:00")
    page.click("#event-filters button[type=submit]")
    page.wait_for_selector("#timeline.js-plotly-plot")
    ids = page.locator("#events-table tbody tr").evaluate_all("rows => rows.map(r => Number(r.dataset.eventId))")
    assert ids == [live.ids.c2]
    page.screenshot(path=str(tmp_path / "events-filtered.png"), full_page=True)

    # a click on an event of the timeline opens its page (app.js handles plotly_click)
    page.locator("#timeline").evaluate(
        f"el => el.emit('plotly_click', {{points: [{{customdata: {live.ids.c2}}}]}})")
    page.wait_for_url(f"{live.url}/events/{live.ids.c2}")
    assert page.js_errors == []


def test_events_page_filters_by_class_position_angle_and_box(live, page, tmp_path):
    def listed(query: str) -> list[int]:
        page.goto(f"{live.url}/?{query}")
        return page.locator("#events-table tbody tr").evaluate_all("rows => rows.map(r => Number(r.dataset.eventId))")

    assert listed("min_goes_class=M1") == [live.ids.fl]
    assert listed("min_goes_class=C1") == [live.ids.c2, live.ids.fl]  # newest first
    assert listed("pa_min=250&pa_max=300") == [live.ids.ce]
    assert sorted(listed("pa_min=270&pa_max=90")) == sorted([live.ids.ce, live.ids.pr])  # wraps through north
    assert listed("hpc_x_min=-500&hpc_x_max=-400&hpc_y_min=300&hpc_y_max=320") == [live.ids.fl]
    # the form keeps the values, and the timeline draws the same selection
    assert page.locator("#filter-x-min").input_value() == "-500"
    page.wait_for_selector("#timeline .gtitle")
    assert page.locator("#timeline .gtitle").text_content() == "Event timeline: 1 event"
    assert "format=csv" in page.locator("#event-export a").first.get_attribute("href")
    # a bad value is reported, not a server error
    listed("min_goes_class=Q7")
    assert "not a GOES class" in page.locator(".error").inner_text()
    # a detected event shows its detector name and version
    page.goto(f"{live.url}/events/{live.ids.pr}")
    assert page.locator("#event-frm").inner_text() == "lst-prominence-eruption 0.1.0"
    assert "Detector (FRM)" in page.locator("#event-fields").inner_text()
    assert page.locator("#event-voevent").get_attribute("href") == f"/api/v1/events/{live.ids.pr}/voevent"
    assert page.js_errors == []


def _add_many_events(n: int = 130) -> None:
    """``n`` more events an hour apart before T0, every third a CDAW CME, the others GOES
    flares; two runs of 16 share one start time, across the page boundaries (50, 100)."""
    with session_scope() as s:
        for k in range(n):
            hours = 41 if 40 <= k <= 55 else 91 if 90 <= k <= 105 else k + 1
            if k % 3 == 0:
                make_event(s, "CE", T0 - dt.timedelta(hours=hours), None, T0 - dt.timedelta(hours=hours - 2),
                           source="cdaw", position_angle=float(k % 360), speed_km_s=400.0 + k)
            else:
                make_event(s, "FL", T0 - dt.timedelta(hours=hours), None, T0 - dt.timedelta(hours=hours) + 20 * MIN,
                           goes_class="C1.0")


def _newest_first(event_type: str | None = None) -> list[int]:
    """Ids of the stored events, newest start first, the higher id first on a tie (the list's order)."""
    q = select(Event.id).order_by(Event.start_time.desc(), Event.id.desc())
    if event_type:
        q = q.where(Event.event_type == event_type)
    with session_scope() as s:
        return list(s.scalars(q))


def _listed(page) -> list[int]:
    return page.locator("#events-table tbody tr").evaluate_all("rows => rows.map(r => Number(r.dataset.eventId))")


def _click_and_load(page, selector: str) -> str:
    """Click a link and wait until the next page has loaded; its URL."""
    before = page.url
    page.click(selector)
    page.wait_for_url(lambda url: url != before)
    return page.url


def test_events_list_pages_by_cursor_forward_and_back(live, page, tmp_path):
    _add_many_events()
    order = _newest_first()
    assert len(order) == 134
    page.goto(live.url + "/")
    assert _listed(page) == order[:50]
    assert page.locator("#event-count").inner_text().strip() == "Events 1–50 of 134"
    assert page.locator("#page-prev").count() == 0 and page.locator("#page-newest").count() == 0

    url2 = _click_and_load(page, "#page-next")
    assert "after=" in url2
    assert _listed(page) == order[50:100]  # through the tie of 16 events at the boundary
    assert page.locator("#event-count").inner_text().strip().endswith(", of 134")
    url3 = _click_and_load(page, "#page-next")
    assert _listed(page) == order[100:]
    assert page.locator("#page-next").count() == 0  # the oldest page
    page.screenshot(path=str(tmp_path / "events-page3.png"), full_page=True)

    back = _click_and_load(page, "#page-prev")
    assert "before=" in back
    assert _listed(page) == order[50:100]
    _click_and_load(page, "#page-prev")
    assert _listed(page) == order[:50]
    assert page.locator("#event-count").inner_text().strip() == "Events 1–50 of 134"
    assert page.locator("#page-prev").count() == 0
    # keyset links only: no offset or page number is ever issued
    for url in (url2, url3, back):
        assert "offset" not in url and "page=" not in url, url
    assert page.js_errors == []


def test_event_filter_survives_paging(live, page, tmp_path):
    _add_many_events()
    flares = _newest_first("FL")
    assert len(flares) == 88
    page.goto(live.url + "/")
    page.select_option("#filter-type", "FL")
    page.fill("#filter-source", "goes_xrs")
    page.click("#event-filters button[type=submit]")
    page.wait_for_url(re.compile(r"type=FL"))
    assert _listed(page) == flares[:50]
    assert page.locator("#event-count").inner_text().strip() == "Events 1–50 of 88"

    url = _click_and_load(page, "#page-next")
    assert "type=FL" in url and "source=goes_xrs" in url and "after=" in url
    assert _listed(page) == flares[50:]
    types = page.locator("#events-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.eventType)")
    assert set(types) == {"FL"}
    # the form and the timeline keep the filter on the later page
    assert page.locator("#filter-type").input_value() == "FL"
    assert page.locator("#filter-source").input_value() == "goes_xrs"
    assert "type=FL" in page.locator("#timeline").get_attribute("data-timeline-url")
    assert page.locator(".error").count() == 0

    url = _click_and_load(page, "#page-prev")
    assert "type=FL" in url and "before=" in url
    assert _listed(page) == flares[:50]

    # a page link of the flares used with another filter is reported, and the newest CMEs shown
    next_href = page.locator("#page-next").get_attribute("href")
    page.goto(live.url + next_href.replace("type=FL", "type=CE").replace("source=goes_xrs", "source=cdaw"))
    assert "made with other filters" in page.locator(".error").inner_text()
    assert _listed(page) == _newest_first("CE")[:50]
    assert page.js_errors == []


def test_event_page_shows_details_links_quicklooks_and_lightcurve(live, page, tmp_path):
    page.goto(f"{live.url}/events/{live.ids.fl}")
    fields = page.locator("#event-fields").inner_text()
    for text in ("FL (Flare)", "2024-05-14 16:00:00 UTC", "2024-05-14 16:12:00 UTC", "2024-05-14 16:30:00 UTC",
                 "M1.2", "-420.5″, 310.0″", "13664", "goes_xrs", "SWPC", "30.0 min"):
        assert text in fields, text
    assert page.locator("#associated-events a").inner_text() == f"CE (Coronal mass ejection) #{live.ids.ce}"
    # quicklooks of all four channels within +-1 h, served by the API and decoded by the browser
    page.wait_for_load_state("networkidle")
    imgs = page.locator(".gallery img")
    assert imgs.count() == 5 + 3
    # lazy images load once scrolled to (the page has the curves, movie and context images above them)
    for i in range(imgs.count()):
        imgs.nth(i).scroll_into_view_if_needed()
    page.wait_for_function("() => [...document.querySelectorAll('.gallery img')].every(i => i.complete)",
                           timeout=TIMEOUT_MS)
    widths = imgs.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert all(w > 0 for w in widths), widths
    assert [h.inner_text() for h in page.locator("h3").all()] == ["SDI", "WST", "SCI-UV", "SCI-WL"]
    page.wait_for_selector("#curves-figure.js-plotly-plot")
    assert page.locator("#curves-figure .scatterlayer .trace").nth(1).locator(".point").count() == 5  # disk curve
    assert page.locator("#curves-figure .gtitle").text_content() == f"FL #{live.ids.fl}: LST SDI and GOES XRS"
    page.screenshot(path=str(tmp_path / "event.png"), full_page=True)

    page.click("#associated-events a")
    page.wait_for_url(f"{live.url}/events/{live.ids.ce}")
    fields = page.locator("#event-fields").inner_text()
    assert "285° (CCW from solar north)" in fields and "120°" in fields and "950 km/s" in fields
    assert page.locator("#associated-events a").inner_text() == f"FL (Flare) #{live.ids.fl}"

    page.goto(f"{live.url}/events/{live.ids.c2}")
    page.wait_for_selector("#curves-figure.js-plotly-plot")
    assert "No written SDI L2 products in this window" in page.locator("#curves-figure").inner_text()
    resp = page.goto(f"{live.url}/events/999999")
    assert resp.status == 404 and "no event with id 999999" in page.locator("main").inner_text()
    assert [e for e in page.js_errors if "404" not in e] == []


def test_products_gallery_shows_all_four_channels(live, page, tmp_path):
    page.goto(live.url + "/products")
    page.wait_for_load_state("networkidle")
    for code in ("SDI", "WST", "SCI-UV", "SCI-WL"):
        imgs = page.locator(f"#channel-{code} .gallery img")
        assert imgs.count() >= 1, code
        assert imgs.first.evaluate("i => i.naturalWidth") > 0, code
    assert page.locator("#channel-SDI .gallery img").count() == 5
    page.screenshot(path=str(tmp_path / "products.png"), full_page=True)
    assert page.js_errors == []


def test_job_form_submits_and_follows_the_job(live, page, tmp_path):
    from tests.conftest import make_token

    page.goto(live.url + "/jobs/new")
    with session_scope() as s:  # submitting needs jobs:submit: sign in with a token (a session cookie)
        token = make_token(s, "tester", ("jobs:submit",))
    page.wait_for_selector("#signin[data-signed-in='false'] #signin-token")
    page.fill("#signin-token", token)
    page.click("#signin-submit")
    page.wait_for_selector("#signin[data-signed-in='true']")
    # the form is prefilled with the DATE-OBS span of the frames (whole seconds, UTC text)
    assert page.input_value("#job-start") == "2024-05-14T15:50:00Z"
    page.uncheck("input[name=channels][value=WST]")
    page.uncheck("input[name=channels][value=SCI-WL]")

    page.fill("#job-end", "2024-05-14T10:00")  # before the start: the API's message is shown
    page.click("#job-submit")
    page.wait_for_selector("#job-form-error:not([hidden])")
    assert "end is before start" in page.locator("#job-form-error").inner_text()

    page.fill("#job-end", "2024-05-14T17:00")
    page.click("#job-submit")
    bar = page.wait_for_selector("#job-follow .job-status progress.job-progress")
    job_id = bar.get_attribute("data-job-id")
    assert re.fullmatch(r"[0-9a-f-]{36}", job_id)
    assert page.locator("#job-follow .job-id").inner_text() == job_id
    assert page.locator("#job-follow .job-state").inner_text() == "queued"
    assert page.locator("#job-form-error").is_hidden()
    page.screenshot(path=str(tmp_path / "job-new.png"), full_page=True)

    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job.state == JobState.queued
        assert job.parameters["channels"] == ["SCI-UV", "SDI"]
        assert job.parameters["start"].startswith("2024-05-14T15:50:00")
    messages = [p.read_text() for p in (live.settings.broker_dir / "in").glob("*") if p.is_file()]
    assert any(job_id in m for m in messages)

    # the job page follows it too, and the progress bar moves when the job does
    page.goto(f"{live.url}/jobs/{job_id}")
    assert page.locator(".job-state").inner_text() == "queued"
    with session_scope() as s:
        job = s.get(Job, job_id)
        job.state, job.total, job.done, job.failed = JobState.failed, 4, 2, 2
        job.error = "2 of 4 products failed: SDI frame 7: no flat valid at DATE-OBS"
    page.wait_for_selector(".job-state.state-failed")
    assert page.locator("progress.job-progress").evaluate("p => p.value") == 1.0
    assert "no flat valid at DATE-OBS" in page.locator(".job-error").inner_text()
    page.screenshot(path=str(tmp_path / "job.png"), full_page=True)
    assert [e for e in page.js_errors if "422" not in e] == []
