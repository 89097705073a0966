"""The landing page's "Where LST frames and events meet" in a real Chromium (Debian's, Playwright).

Reuses the browser, server and page fixtures of ``tests/test_browser.py`` (frames and events
around T0 = 2024-05-14 16:00 UTC) and adds a day with frames and no event. Screenshots go
to each test's ``tmp_path``.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest

from backend.db import session_scope
from tests.test_api import T0, make_frame
from tests.test_browser import browser, live, page  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser

QUIET_DAY = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)


def test_landing_page_links_the_days_where_frames_and_events_meet(live, page, tmp_path):  # noqa: F811
    with session_scope() as s:
        make_frame(s, "WST", QUIET_DAY)  # frames, no event that day
    page.goto(live.url + "/")
    section = page.locator("#observing-windows")
    section.wait_for()
    items = section.locator("li[data-day]")
    assert items.count() == 1
    item = items.first
    assert item.get_attribute("data-day") == T0.date().isoformat()
    text = re.sub(r"\s+", " ", item.inner_text())
    # _fill: 5 SDI frames 15:50-16:40 and one frame of each other channel at 16:05
    assert "SCI-UV 1 frame, SCI-WL 1 frame, SDI 5 frames, WST 1 frame" in text, text
    assert "(15:50–16:40 UTC)" in text, text
    n = int(re.search(r"(\d+) events?:", text).group(1))
    assert n == 3 and "cdaw 1" in text and "detected 1" in text and "goes_xrs 1" in text, text
    quiet = page.locator("#observing-windows-quiet")
    assert "2024-05-01 (WST 1)" in re.sub(r"\s+", " ", quiet.inner_text())
    assert section.locator("a[href*='2024-05-01']").count() == 0, "a quiet day is not linked"
    page.screenshot(path=str(tmp_path / "landing-windows.png"), full_page=True)

    item.locator("a.observing-window").click()
    page.wait_for_url(re.compile(r"start=2024-05-14T00%3A00&end=2024-05-15T00%3A00"))
    assert page.locator("#event-count").inner_text().strip() == f"Events 1–{n} of {n}"
    assert page.locator("#filter-start").input_value().startswith("2024-05-14T00:00")
    assert page.locator("#filter-end").input_value().startswith("2024-05-15T00:00")
    page.screenshot(path=str(tmp_path / "window-events.png"), full_page=True)
    assert not page.js_errors, page.js_errors
    print(f"screenshots: {tmp_path}")
