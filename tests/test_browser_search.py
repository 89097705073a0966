"""The events page's search in a real Chromium (issue 11 items 4-6): per-source coverage of
the window, the landing timeline of all matching events (bars add up to the total, zooming
drills down to the events), filters and the timeline's zoom kept in the URL, UTC text fields.

The app runs as in ``tests/test_browser.py`` (uvicorn in a thread, SQLite in a temporary
DATA_DIR) with the real CDAW list and the real GOES XRS reports of 2013 and 2014 imported
(about 26,000 events). Screenshots go to each test's ``tmp_path``.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from backend.services.events import import_catalogue
from tests.conftest import SAMPLE, filled_sqlite, use_sqlite_copy
from tests.test_browser import served_app, browser, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

EVENTS = SAMPLE / "events"


def _import_catalogues(session) -> None:
    """The real CDAW list, the GOES XRS reports of 2013 and 2014 and the DONKI sample, imported
    once per test run (``filled_sqlite``); each test serves a copy of that database."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        goes = Path(tmp) / "goes_xrs_reports"
        goes.mkdir()
        for y in (2013, 2014):
            shutil.copy(EVENTS / "goes_xrs_reports" / f"goes-xrs-report_{y}.txt", goes)
        import_catalogue(session, "cdaw", EVENTS / "cdaw")
        import_catalogue(session, "goes_xrs", goes)
        import_catalogue(session, "donki", EVENTS / "donki")


@pytest.fixture
def live(sqlite_env, run_cache):
    """The app served on this test's own copy of the catalogue database (:func:`_import_catalogues`)."""
    use_sqlite_copy(sqlite_env, filled_sqlite(run_cache, "browser-search-catalogues", _import_catalogues))
    with served_app() as url:
        yield SimpleNamespace(url=url)


def _drawn(page, mode: str | None = None) -> None:
    sel = "#timeline[data-state=drawn]" + (f"[data-mode={mode}]" if mode else "")
    page.wait_for_selector(sel)


def _bar_sum(page) -> int:
    return page.locator("#timeline").evaluate(
        "el => el.data.filter(t => t.type === 'bar').reduce((n, t) => n + t.y.reduce((a, b) => a + b, 0), 0)")


def _total(page) -> int:
    text = page.locator("#event-count").inner_text()
    return int(re.search(r"of ([\d,]+)", text).group(1).replace(",", ""))


def test_a_2016_window_says_which_catalogues_do_not_cover_it(live, page, tmp_path):
    page.goto(f"{live.url}/?start=2016-01-01T00:00&end=2016-12-31T23:59")
    cdaw = page.locator("#event-coverage li[data-source=cdaw]")
    assert cdaw.inner_text() == "CDAW: no coverage after 2013-12-31" and cdaw.get_attribute("data-status") == "none"
    assert page.locator("#event-coverage li[data-source=goes_xrs]").inner_text() == "GOES XRS: no coverage after 2014-12-31"
    assert page.locator("#event-coverage li[data-source=donki]").get_attribute("data-status") == "covered"
    _drawn(page)
    page.screenshot(path=str(tmp_path / "events-2016-coverage.png"), full_page=True)
    # only CDAW asked: "0 events" and "no coverage" are both said, differently
    page.goto(f"{live.url}/?source=cdaw&start=2016-01-01T00:00&end=2016-12-31T23:59")
    assert page.locator("#event-count").inner_text().strip() == "No events match these filters"
    assert page.locator("#event-coverage li").all_inner_texts() == ["CDAW: no coverage after 2013-12-31"]
    # the coverage page: CDAW ends 2013-12-31, the GOES reports with 2014
    page.goto(f"{live.url}/coverage")
    assert "catalogue ends" not in page.locator("tr[data-name=cdaw] .coverage-gaps").inner_text()
    assert page.locator("tr[data-name=cdaw] .coverage-spans").inner_text().strip() == "1996-01-01 00:00 → 2014-01-01 00:00"
    assert page.locator("tr[data-name=goes_xrs] .coverage-spans").inner_text().strip() == "2013-01-01 00:00 → 2015-01-01 00:00"
    page.goto(f"{live.url}/coverage?start=2016-01-01T00:00&end=2016-12-31T00:00")
    assert "catalogue ends 2013-12-31" in page.locator("tr[data-name=cdaw] .coverage-gaps").inner_text()
    page.screenshot(path=str(tmp_path / "coverage-2016.png"), full_page=True)
    assert page.js_errors == []


def test_timeline_bars_add_up_to_the_total_and_zoom_drills_down_to_events(live, page, tmp_path):
    page.goto(live.url + "/")
    _drawn(page, "bins")
    total = _total(page)
    assert total > 20_000 and _bar_sum(page) == total == int(page.locator("#timeline").get_attribute("data-total"))
    page.screenshot(path=str(tmp_path / "timeline-all.png"), full_page=True)
    # with a filter the bars follow it
    page.goto(live.url + "/?type=CE&start=2012-01-01T00:00&end=2013-12-31T00:00")
    _drawn(page, "bins")
    assert _bar_sum(page) == _total(page) > 500
    # zoom (as a drag does) to two days: the server sends the events themselves
    page.locator("#timeline").evaluate(
        "el => Plotly.relayout(el, {'xaxis.range[0]': '2013-05-01 00:00:00', 'xaxis.range[1]': '2013-05-03 00:00:00'})")
    _drawn(page, "events")
    assert "tl_start=2013-05-01T00" in page.url and "tl_end=2013-05-03T00" in page.url
    n = int(page.locator("#timeline").get_attribute("data-total"))
    assert 0 < n <= 500
    markers = page.locator("#timeline .scatterlayer .point")
    assert markers.count() == n
    page.screenshot(path=str(tmp_path / "timeline-drilled-down.png"), full_page=True)
    # a click on a marker opens that event
    event_id = page.locator("#timeline").evaluate("el => el.data.find(t => t.type === 'scatter').customdata[0]")
    page.locator("#timeline").evaluate(
        f"el => el.emit('plotly_click', {{points: [{{customdata: {event_id}}}]}})")
    page.wait_for_url(f"{live.url}/events/{event_id}")
    assert page.js_errors == []


def test_filters_and_zoom_survive_a_reload_and_bad_utc_times_are_explained(live, page, tmp_path):
    q = "type=FL&min_goes_class=M1&start=2013-01-01T00:00&end=2014-12-31T00:00"
    page.goto(f"{live.url}/?{q}")
    _drawn(page)
    before = [r for r in page.locator("#events-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.eventId)")]
    page.locator("#timeline").evaluate(
        "el => Plotly.relayout(el, {'xaxis.range[0]': '2014-01-01 00:00:00', 'xaxis.range[1]': '2014-03-01 00:00:00'})")
    page.wait_for_url(re.compile(r"tl_start="))
    _drawn(page)
    zoomed_total = int(page.locator("#timeline").get_attribute("data-total"))
    # the list follows the view (issue 25): only events starting in Jan-Feb 2014, newest first
    page.wait_for_selector("#event-list[data-zoom-start^='2014-01-01T00']")
    rows = page.locator("#events-table tbody tr")
    zoomed = rows.evaluate_all("rs => rs.map(r => r.dataset.eventId)")
    starts = rows.evaluate_all("rs => rs.map(r => r.cells[2].textContent.trim())")
    assert zoomed and zoomed != before and all("2014-01-01" <= t < "2014-03-01" for t in starts)
    page.reload()
    _drawn(page)
    assert page.locator("#filter-type").input_value() == "FL"
    assert page.locator("#filter-min-class").input_value() == "M1"
    assert page.locator("#filter-start").input_value() == "2013-01-01T00:00"
    assert page.locator("#events-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.eventId)") == zoomed
    assert int(page.locator("#timeline").get_attribute("data-total")) == zoomed_total  # the same view
    rng = page.locator("#timeline").evaluate("el => el.layout.xaxis.range.map(String)")
    assert rng[0].startswith("2014-01-01") and rng[1].startswith("2014-03-01")
    assert not page.locator("#timeline-reset").is_hidden()
    assert "tl_start=2014-01-01T00" in page.locator("#page-next").get_attribute("href")  # paging keeps the view
    page.screenshot(path=str(tmp_path / "reloaded.png"), full_page=True)
    # the date fields are UTC text: a local-looking value is explained, the form not sent
    assert page.locator("#filter-start").get_attribute("type") == "text"
    assert "UTC" in page.locator("label:has(#filter-start)").inner_text()
    page.fill("#filter-start", "05/10/2024 6pm")
    url = page.url
    page.click("#event-filters button[type=submit]")
    assert "is not a UTC date and time" in page.locator(".utc-error").inner_text()
    assert page.url == url
    page.screenshot(path=str(tmp_path / "bad-utc.png"), full_page=True)
    # and a bad value that reaches the server (a shared URL) is a note, not an error page
    page.goto(f"{live.url}/?start=2013-13-01&noaa_ar=x12")
    alerts = " ".join(page.locator("p.error").all_inner_texts())
    assert "is not a date and time" in alerts and "NOAA region" in alerts
    assert page.js_errors == []
