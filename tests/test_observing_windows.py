"""Where LST frames and events meet (backend.services.observing_windows) and the landing page's
links to those days (frontend/templates/_demo_windows.html); the flare detector's split of a
product series into observing runs (backend.services.detection.observing_runs)."""

from __future__ import annotations

import datetime as dt
import re
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

from backend.services.detection import RUN_GAP_S, observing_runs
from backend.services.event_search import EventFilters, search_events
from backend.services.observing_windows import observing_windows
from tests.test_api import make_event, make_frame

# days no other test uses: the windows are found by walking back from the newest frame
DAY_A = dt.datetime(1979, 3, 5, tzinfo=dt.UTC)
DAY_B = dt.datetime(1979, 3, 10, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


def _scene(session) -> None:
    """Day A: 3 SDI frames 05-07 UTC and a WST frame; 2 events overlapping it, 2 that do not.
    Day B: a frame and no event."""
    for k in range(3):
        make_frame(session, "SDI", DAY_A + (5 + k) * H)
    make_frame(session, "WST", DAY_A + 9 * H + dt.timedelta(minutes=30))
    make_frame(session, "SDI", DAY_B + 12 * H)
    make_event(session, "FL", DAY_A + 6 * H, DAY_A + 6.2 * H, DAY_A + 6.5 * H, source="goes_xrs")
    make_event(session, "CE", DAY_A - 1 * H, None, DAY_A + 1 * H, source="cdaw")  # starts the day before
    make_event(session, "FL", DAY_A + 25 * H, None, DAY_A + 26 * H, source="goes_xrs")  # next day
    make_event(session, "FL", DAY_A - 5 * H, None, DAY_A - 4 * H, source="goes_xrs")  # ends before day A


def _window(windows, day: dt.datetime):
    found = [w for w in windows if w.day == day.date()]
    return found[0] if found else None


@pytest.mark.postgres
def test_days_where_frames_and_events_meet(db_session):
    _scene(db_session)
    windows = observing_windows(db_session, limit=1000)
    a = _window(windows, DAY_A)
    assert a is not None
    assert a.frames == {"SDI": 3, "WST": 1}
    assert a.events == {"cdaw": 1, "goes_xrs": 1} and a.n_events == 2
    assert a.first_frame == DAY_A + 5 * H and a.last_frame == DAY_A + 9.5 * H
    assert (a.start, a.end) == (DAY_A, DAY_A + 24 * H)
    assert a.query == {"start": "1979-03-05T00:00", "end": "1979-03-06T00:00"}
    assert _window(windows, DAY_B) is None, "a day with frames and no event is no meeting window"
    quiet = _window(observing_windows(db_session, limit=1000, include_quiet=True), DAY_B)
    assert quiet is not None and quiet.frames == {"SDI": 1} and quiet.events == {}
    days = [w.day for w in windows]
    assert days == sorted(days, reverse=True), "newest first"


@pytest.mark.postgres
def test_window_count_is_what_the_events_list_shows(db_session):
    _scene(db_session)
    a = _window(observing_windows(db_session, limit=1000), DAY_A)
    res = search_events(db_session, EventFilters(start=a.start, end=a.end), limit=50)
    assert res.total == a.n_events == 2
    assert sorted(e.source for e in res.items) == ["cdaw", "goes_xrs"]


@pytest.mark.postgres
def test_limit_counts_meeting_days_only(db_session):
    _scene(db_session)
    for k in range(3):  # three earlier meeting days
        day = DAY_A - (10 + k) * 24 * H
        make_frame(db_session, "SCI-UV", day + 3 * H)
        make_event(db_session, "CE", day + 2 * H, None, day + 4 * H, source="cdaw")
    windows = observing_windows(db_session, limit=1000)
    ours = [w.day for w in windows if w.day <= DAY_A.date()]
    assert ours[:4] == [DAY_A.date()] + [(DAY_A - (10 + k) * 24 * H).date() for k in range(3)]
    assert len(observing_windows(db_session, limit=2)) == 2


@pytest.mark.postgres
def test_landing_page_links_each_window_to_its_day(api_client, db_session):
    _scene(db_session)
    body = api_client.get("/").text
    section = body[body.index('id="observing-windows"'):body.index("</section>", body.index('id="observing-windows"'))]
    item = re.search(r'<li data-day="1979-03-05">(.*?)</li>', section, re.S)
    assert item, section[:2000]
    href = re.search(r'href="([^"]+)"', item.group(1)).group(1).replace("&amp;", "&")
    q = parse_qs(urlsplit(href).query)
    assert q == {"start": ["1979-03-05T00:00"], "end": ["1979-03-06T00:00"]}
    text = re.sub(r"\s+", " ", item.group(1))
    assert "SDI 3 frames, WST 1 frame" in text and "(05:00–09:30 UTC)" in text
    assert "2 events: cdaw 1, goes_xrs 1" in text
    assert "1979-03-10 (SDI 1)" in section, "the quiet day is named apart, not linked"
    assert 'data-day="1979-03-10"' not in section
    listed = api_client.get(href).text
    count = re.sub(r"\s+", " ", re.search(r'id="event-count">(.*?)</p>', listed, re.S).group(1)).strip()
    assert count == "Events 1–2 of 2", count


def _rows(*hours: float):
    t0 = dt.datetime(2011, 6, 7, tzinfo=dt.UTC)
    return [(SimpleNamespace(id=k), SimpleNamespace(date_obs=t0 + dt.timedelta(hours=h))) for k, h in enumerate(hours)]


def test_observing_runs_split_at_long_gaps():
    rows = _rows(0, 0.1, 0.2, 7.0, 7.1, 1000.0)
    runs = observing_runs(rows)
    assert [[p.id for p, _ in r] for r in runs] == [[0, 1, 2], [3, 4], [5]]
    assert RUN_GAP_S == 6 * 3600.0
    assert len(observing_runs(_rows(0, 6.0, 12.0))) == 1, "a gap of exactly the limit keeps one run"
    assert observing_runs([]) == []
