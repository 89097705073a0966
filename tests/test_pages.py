"""The events list pages of the browser, served on PostgreSQL: keyset pages (``after`` /
``before`` cursors), the flagged total, and page links that do not fit the filters.

The same pages in a real Chromium, on SQLite: ``tests/test_browser.py``.
"""

from __future__ import annotations

import datetime as dt
import html
import re

import pytest
from sqlalchemy import select

from backend.api.pages.events import event_list_page
from backend.models import Event
from backend.services import event_search
from backend.services.event_search import EventFilters, SearchError, encode_cursor
from tests.test_api import T0, make_event

pytestmark = pytest.mark.postgres

HOUR = dt.timedelta(hours=1)


def _add(session, n: int) -> None:
    """``n`` flares an hour apart before T0, the 5th to the 15th sharing one start time."""
    for k in range(n):
        start = T0 - (5 if 5 <= k <= 15 else k) * HOUR
        make_event(session, "FL" if k % 4 else "CE", start, None, start + 20 * dt.timedelta(minutes=1),
                   source="goes_xrs" if k % 4 else "cdaw")


def _order(session, event_type: str | None = None) -> list[int]:
    q = select(Event.id).order_by(Event.start_time.desc(), Event.id.desc())
    return list(session.scalars(q.where(Event.event_type == event_type) if event_type else q))


def test_cursor_pages_walk_the_whole_list_and_back(db_session):
    _add(db_session, 23)
    order = _order(db_session)
    f = EventFilters()
    pages = [event_list_page(db_session, f, size=4)]
    assert pages[0].first and pages[0].before is None and pages[0].total == 23
    while pages[-1].after:
        pages.append(event_list_page(db_session, f, after=pages[-1].after, size=4))
    assert [len(p.rows) for p in pages] == [4, 4, 4, 4, 4, 3]
    assert [r.id for p in pages for r in p.rows] == order  # through the tie of 11 events
    assert all(not p.first and p.before for p in pages[1:])
    # back from the oldest page: each "previous" gives the page before it again
    back = pages[-1]
    for expected in reversed(pages[:-1]):
        back = event_list_page(db_session, f, before=back.before, size=4)
        assert [r.id for r in back.rows] == [r.id for r in expected.rows]
    assert back.first and back.before is None


def test_previous_short_of_a_page_gives_the_full_newest_page(db_session):
    _add(db_session, 10)
    order = _order(db_session)
    # a page that starts three rows down (as after events were added above it): 3 newer rows only
    ref = db_session.get(Event, order[2])
    shifted = event_list_page(db_session, EventFilters(), size=4,
                              after=encode_cursor("-start_time", ref.start_time, ref.id,
                                                  EventFilters().fingerprint()))
    assert [r.id for r in shifted.rows] == order[3:7] and not shifted.first
    newest = event_list_page(db_session, EventFilters(), before=shifted.before, size=4)
    assert newest.first and [r.id for r in newest.rows] == order[:4]


def test_cursor_of_other_filters_or_order_is_refused(db_session):
    _add(db_session, 10)
    flares = EventFilters(event_types=("FL",))
    after = event_list_page(db_session, flares, size=3).after
    with pytest.raises(SearchError, match="other filters"):
        event_list_page(db_session, EventFilters(event_types=("CE",)), after=after)
    with pytest.raises(SearchError, match="sort"):
        event_list_page(db_session, flares, before=after)  # a "next" cursor used as "previous"
    with pytest.raises(SearchError, match="not both"):
        event_list_page(db_session, flares, after=after, before=after)


def _count_line(body: str) -> str:
    m = re.search(r'<p class="count" id="event-count"[^>]*>(.*?)</p>', body, re.S)
    return " ".join(html.unescape(m.group(1)).split())


def _hrefs(body: str) -> dict[str, str]:
    return {m.group(2): html.unescape(m.group(1))
            for m in re.finditer(r'<a href="([^"]+)"[^>]*id="(page-(?:next|prev|newest))"', body)}


def test_events_page_flags_an_estimated_total(api_client, db_session, monkeypatch):
    _add(db_session, 60)
    body = api_client.get("/").text
    assert _count_line(body) == "Events 1–50 of 60"
    monkeypatch.setattr(event_search, "EXACT_COUNT_LIMIT", 20)  # above 20 matches: the planner's estimate
    r = api_client.get("/")
    assert r.status_code == 200
    line = _count_line(r.text)
    assert re.fullmatch(r"Events 1–50 of about [\d,]+", line), line
    assert re.search(r'id="event-count" title="more than 20 match: the total is the database(&#39;|\')s estimate"', r.text)
    later = api_client.get(_hrefs(r.text)["page-next"])
    assert re.fullmatch(r"10 events starting .* back to .*, of about [\d,]+", _count_line(later.text))


def test_events_page_links_keep_exact_filters_and_report_bad_links(api_client, db_session):
    _add(db_session, 120)
    start = "2024-05-11T00:00:30"  # seconds must survive in the links (the cursor checks the filters)
    r = api_client.get("/", params={"type": "FL", "start": start, "hpc_x_min": ""})
    assert r.status_code == 200 and 'class="error"' not in r.text
    links = _hrefs(r.text)
    assert set(links) == {"page-next"}
    nxt = links["page-next"]
    assert "type=FL" in nxt and "start=2024-05-11T00%3A00%3A30" in nxt and "after=" in nxt
    assert "offset" not in nxt and "page=" not in nxt
    page2 = api_client.get(nxt)
    assert page2.status_code == 200 and 'class="error"' not in page2.text
    assert set(_hrefs(page2.text)) == {"page-prev", "page-newest"}
    ids = [int(i) for i in re.findall(r'data-event-id="(\d+)"', page2.text)]
    t_start = dt.datetime(2024, 5, 11, 0, 0, 30, tzinfo=dt.UTC)
    flares = [e for e in _order(db_session, "FL") if db_session.get(Event, e).end_time >= t_start]
    assert len(flares) == 66 and ids == flares[50:]
    # a damaged cursor and a cursor of other filters: a message and the newest page, never an error status
    for bad in (nxt.replace("after=", "after=x"), nxt.replace("type=FL", "type=CE")):
        r = api_client.get(bad)
        assert r.status_code == 200 and "page link not followed" in r.text
        assert "Events 1–" in _count_line(r.text)
