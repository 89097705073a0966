"""STIX flares in a real Chromium (Debian's, Playwright): the event page of a STIX flare linked
with its LST/WST white-light flare, and the events list of the demo's WST frame day.

Reuses the browser, server and page fixtures of ``tests/test_browser.py``; imports the real
STIX list and LST/WST table into the test's SQLite database. Screenshots go to each test's
``tmp_path``.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import select

from backend.db import session_scope
from backend.models import Event
from backend.services.events import associate_events, import_catalogue
from tests.test_api import make_frame
from tests.test_browser import browser, live, page  # noqa: F401  (fixtures)
from tests.test_stix import STIX_FILE, WST_FILE

pytestmark = pytest.mark.browser


def _import() -> dict[str, int]:
    with session_scope() as s:
        import_catalogue(s, "stix", STIX_FILE)
        import_catalogue(s, "lst_wst", WST_FILE)
        associate_events(s, start=dt.datetime(2022, 11, 1, tzinfo=dt.UTC), end=dt.datetime(2023, 5, 31, tzinfo=dt.UTC))
        make_frame(s, "WST", dt.datetime(2023, 1, 31, 3, 39, 23, tzinfo=dt.UTC))

        def key(src, k):
            return s.scalars(select(Event.id).where(Event.source == src, Event.source_key == k)).one()

        return {"stix": key("stix", "2301102246"), "wst": key("lst_wst", "2023-01-10T22:46/N22E62"),
                "hidden": key("stix", "2304271119")}


def test_stix_flare_page_and_the_wst_frame_day(live, page, tmp_path):  # noqa: F811
    ids = _import()
    page.goto(f"{live.url}/events/{ids['stix']}")
    fields = re.sub(r"\s+", " ", page.locator("#event-fields").inner_text())
    for text in ("FL (Flare)", "stix", "STIX flare list (Hayes et al.)", "2023-01-10 22:40:19 UTC",
                 "counts 4-10 keV"):
        assert text in fields, (text, fields)
    assert re.search(r"-798\.\d″, 389\.\d″", fields), fields
    assert page.locator(f"#associated-events a[href$='/events/{ids['wst']}']").count() == 1
    page.screenshot(path=str(tmp_path / "stix-event.png"), full_page=True)

    page.goto(f"{live.url}/events/{ids['hidden']}")
    assert page.locator("#associated-events").count() == 0  # behind the limb for Earth: no link
    page.locator("details summary").first.click()
    body = page.locator("main").inner_text()
    assert "not_visible_from_earth" in body and "goes_class_note" in body
    page.screenshot(path=str(tmp_path / "stix-hidden-event.png"), full_page=True)

    page.goto(f"{live.url}/?start=2023-01-31T00:00&end=2023-02-01T00:00")
    assert page.locator("#event-count").inner_text().strip() == "Events 1–3 of 3"
    assert page.locator("#events-table tbody tr, table tbody tr").count() == 3
    page.wait_for_selector("#timeline .gtitle")
    assert page.locator("#timeline .gtitle").text_content() == "Event timeline: 3 events"
    assert "Solar Orbiter/STIX" in page.locator("main").inner_text()
    page.screenshot(path=str(tmp_path / "stix-2023-01-31.png"), full_page=True)
    assert not page.js_errors, page.js_errors
    print(f"screenshots: {tmp_path}")
