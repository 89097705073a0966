"""The pages of issue 25, point 6, and what they stand on, through the app on PostgreSQL:
``/events``, the product search (``/products/search``) with the products API's and the bulk
download's calibration-set and level filters, the saved-searches page with
``PATCH /saved-searches/{id}``, the events list following the timeline's zoom, and the pure
helpers that keep figure labels and badges readable.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import tarfile

from backend.models import CalibrationSet, SavedSearch, SavedSearchNotification
from tests.conftest import auth_headers
from tests.test_api import T0, client, make_event, make_frame, make_product, settings  # noqa: F401 - fixtures

MIN = dt.timedelta(minutes=1)


def _set(db, sid: int, channel: str = "SDI", public: bool = True, owner: str | None = None) -> CalibrationSet:
    row = CalibrationSet(id=sid, channel_code=channel, calibration_key=f"key-{sid}", params_hash=f"h{sid}", options={},
                         pinned={}, files=[], software_version="t", public=public, owner=owner,
                         epoch_start=T0 - dt.timedelta(days=1))
    db.add(row)
    db.flush()
    return row


def _products(db, settings, n: int = 3, set_id: int | None = None, channel: str = "SDI", level: str = "L2",
              start: dt.datetime = T0):
    out = []
    for i in range(n):
        p = make_product(db, make_frame(db, channel, start + i * MIN), settings.products / channel)
        p.calibration_set_id, p.level = set_id, level
        out.append(p)
    db.flush()
    return out


def test_products_api_and_bulk_download_filter_by_calibration_set_and_level(client, db_session, settings):
    _set(db_session, 8101), _set(db_session, 8102)
    a = _products(db_session, settings, 3, 8101)
    b = _products(db_session, settings, 2, 8102, start=T0 + dt.timedelta(hours=1))
    c = _products(db_session, settings, 1, 8101, level="L1", start=T0 + dt.timedelta(hours=2))
    got = client.get("/api/v1/products", params={"calibration_set": 8101}).json()
    assert sorted(i["id"] for i in got["items"]) == sorted(p.id for p in a + c)
    got = client.get("/api/v1/products", params={"calibration_set": 8101, "level": "L2"}).json()
    assert sorted(i["id"] for i in got["items"]) == sorted(p.id for p in a)
    assert client.get("/api/v1/products", params={"level": "L1"}).json()["total"] == 1
    bad = client.get("/api/v1/products", params={"level": "2; drop"})
    assert bad.status_code == 422 and "level" in bad.text
    tar = client.get("/api/v1/products/archive", params={"calibration_set": 8102})
    assert tar.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(tar.content)) as t:
        manifest = json.loads(t.extractfile("MANIFEST.json").read())
    assert sorted(m["product_id"] for m in manifest["products"]) == sorted(p.id for p in b)
    script = client.get("/api/v1/products/download.sh", params={"calibration_set": 8101, "level": "L1"}).text
    assert f"/api/v1/products/{c[0].id}/fits" in script and f"/api/v1/products/{a[0].id}/fits" not in script


def _ids_on(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'<tr data-product-id="(\d+)"', html)]


def test_product_search_page_filters_pages_and_links_the_bulk_download(client, db_session, settings):
    from backend.api.pages import products as product_search_page

    _set(db_session, 8201), _set(db_session, 8202, channel="WST")
    sdi = _products(db_session, settings, 4, 8201)
    wst = _products(db_session, settings, 2, 8202, channel="WST")
    html = client.get("/products/search", params={"channel": "SDI", "calibration_set": "8201", "level": "L2"}).text
    assert _ids_on(html) == [p.id for p in sdi]  # DATE-OBS order
    assert "Products 1–4 of 4" in html
    archive = re.search(r'id="ps-archive" href="([^"]+)"', html).group(1).replace("&amp;", "&")
    assert "calibration_set=8201" in archive and "level=L2" in archive and "channel=SDI" in archive
    with tarfile.open(fileobj=io.BytesIO(client.get(archive).content)) as t:
        assert sorted(m["product_id"] for m in json.loads(t.extractfile("MANIFEST.json").read())["products"]) == \
            sorted(p.id for p in sdi)
    assert _ids_on(client.get("/products/search", params={"channel": "WST"}).text) == [p.id for p in wst]
    # paging: a page of 2
    old = product_search_page.PAGE_SIZE
    product_search_page.PAGE_SIZE = 2
    try:
        first = client.get("/products/search", params={"calibration_set": "8201"}).text
        second = client.get("/products/search", params={"calibration_set": "8201", "page": 2}).text
    finally:
        product_search_page.PAGE_SIZE = old
    assert _ids_on(first) == [p.id for p in sdi[:2]] and _ids_on(second) == [p.id for p in sdi[2:]]
    assert 'id="ps-next"' in first and "page=2" in first and 'id="ps-prev"' in second
    # bad values are said on the page, not a 4xx/5xx
    bad = client.get("/products/search", params={"channel": "EUV", "calibration_set": "x", "level": "2",
                                                  "start": "yesterday"})
    assert bad.status_code == 200
    for word in ("unknown LST channel", "is not a set id", "is not a product level", "start"):
        assert word in bad.text


def test_a_private_sets_products_are_searched_by_their_owner_only(client, db_session, settings):
    _set(db_session, 8301, public=False, owner="alice")
    mine = _products(db_session, settings, 2, 8301)
    alice = auth_headers(db_session, "alice")
    assert _ids_on(client.get("/products/search", params={"calibration_set": "8301"}, headers=alice).text) == \
        [p.id for p in mine]
    other = client.get("/products/search", params={"calibration_set": "8301"}, headers=auth_headers(db_session, "bob"))
    assert other.status_code == 200 and _ids_on(other.text) == []


def test_events_serves_the_event_list_with_its_own_links(client, db_session):
    evs = [make_event(db_session, "FL", T0 + i * dt.timedelta(hours=1), goes_class="C1.0") for i in range(3)]
    root, events = client.get("/"), client.get("/events", params={"type": "FL"})
    assert root.status_code == events.status_code == 200
    listed = [int(x) for x in re.findall(r'<tr data-event-id="(\d+)"', events.text)]
    assert listed == [e.id for e in reversed(evs)]
    assert 'action="/events"' in events.text and 'action="/"' in root.text
    assert 'href="/events"' in root.text  # the nav
    assert 'href="/saved-searches?kind=events&amp;query=type%3DFL"' in events.text


def test_events_list_follows_the_timeline_zoom(client, db_session):
    evs = [make_event(db_session, "FL", T0 + i * dt.timedelta(hours=1), goes_class="C1.0") for i in range(6)]
    q = {"type": "FL", "tl_start": (T0 + 90 * MIN).isoformat(), "tl_end": (T0 + 270 * MIN).isoformat()}
    html = client.get("/events", params=q).text
    listed = [int(x) for x in re.findall(r'<tr data-event-id="(\d+)"', html)]
    assert listed == [evs[4].id, evs[3].id, evs[2].id]  # 02:00, 03:00, 04:00 in the view, newest first
    assert "in the timeline&#39;s view" in html or "in the timeline's view" in html
    # the export follows the view too; a zoom outside the search, or a bad one, leaves the search
    export = re.search(r'id="event-export">.*?href="([^"]+)"', html, re.S).group(1).replace("&amp;", "&")
    assert "start=" in export and "end=" in export
    empty = client.get("/events", params={**q, "tl_start": "2000-01-01T00:00", "tl_end": "2000-01-02T00:00"}).text
    assert len(re.findall(r'<tr data-event-id=', empty)) == 0  # a view with no event of the search
    window = {"start": (T0 - 60 * MIN).isoformat(), "end": (T0 + 420 * MIN).isoformat()}
    outside = client.get("/events", params={**q, **window, "tl_start": "2000-01-01T00:00",
                                            "tl_end": "2000-01-02T00:00"}).text
    assert len(re.findall(r'<tr data-event-id=', outside)) == 6  # a view outside the search's window: the search
    bad = client.get("/events", params={**q, "tl_start": "soon"}).text
    assert len(re.findall(r'<tr data-event-id=', bad)) == 6 and "timeline zoom not applied" in bad


def test_events_list_pages_within_the_zoom(client, db_session, monkeypatch):
    from backend.api.pages import events as pages

    monkeypatch.setattr(pages, "PAGE_SIZE", 2)
    evs = [make_event(db_session, "FL", T0 + i * dt.timedelta(hours=1), goes_class="C1.0") for i in range(6)]
    q = {"type": "FL", "tl_start": (T0 + 30 * MIN).isoformat(), "tl_end": (T0 + 330 * MIN).isoformat()}
    first = client.get("/events", params=q).text
    nxt = re.search(r'id="page-next"', first) and re.search(r'href="([^"]+)" rel="next"', first).group(1)
    assert nxt and "tl_start=" in nxt
    second = client.get(nxt.replace("&amp;", "&")).text
    assert "page link not followed" not in second
    listed = [int(x) for x in re.findall(r'<tr data-event-id="(\d+)"', first + second)]
    assert listed == [evs[5].id, evs[4].id, evs[3].id, evs[2].id]


def test_saved_search_is_renamed_and_its_query_changed(client, db_session):
    created = client.post("/api/v1/saved-searches", json={"name": "wide CMEs", "kind": "events",
                                                           "query": "type=CE&min_angular_width=60"})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    db_session.add(SavedSearchNotification(saved_search_id=sid, item_kind="event", item_id=1, summary={}))
    db_session.flush()
    renamed = client.patch(f"/api/v1/saved-searches/{sid}", json={"name": "very wide CMEs"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "very wide CMEs"
    assert renamed.json()["query"]["min_angular_width"] == 60.0 or renamed.json()["query"]["min_angular_width"] == "60"
    e = make_event(db_session, "CE", T0, source="cdaw", angular_width=120.0)
    changed = client.patch(f"/api/v1/saved-searches/{sid}", json={"query": {"type": "CE", "min_angular_width": 90}})
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert float(body["query"]["min_angular_width"]) == 90.0 and body["cursor"] >= e.id  # told from now on
    assert client.get(f"/api/v1/saved-searches/{sid}/notifications").json()["total"] == 1  # kept
    bad = client.patch(f"/api/v1/saved-searches/{sid}", json={"query": "min_angular_width=wide"})
    assert bad.status_code == 422 and "min_angular_width" in bad.text
    assert client.patch(f"/api/v1/saved-searches/{sid}", json={}).status_code == 422
    other = client.patch(f"/api/v1/saved-searches/{sid}", json={"name": "mine now"},
                         headers=auth_headers(db_session, "bob"))
    assert other.status_code == 404
    assert db_session.get(SavedSearch, sid).name == "very wide CMEs"


def test_saved_product_search_takes_calibration_set_and_level(client, db_session, settings):
    _set(db_session, 8401)
    created = client.post("/api/v1/saved-searches", json={"name": "set 8401", "kind": "products",
                                                           "query": {"calibration_set": 8401, "level": "L2"}})
    assert created.status_code == 201, created.text
    assert created.json()["query"] == {"calibration_set": "8401", "level": "L2"}
    from backend.services import saved_searches

    row = db_session.get(SavedSearch, created.json()["id"])
    _products(db_session, settings, 1, None)  # another set: not told
    mine = _products(db_session, settings, 2, 8401)
    _products(db_session, settings, 1, 8401, level="L1")
    assert saved_searches.evaluate(db_session, row) == 2
    told = client.get(f"/api/v1/saved-searches/{row.id}/notifications").json()["items"]
    assert sorted(n["item_id"] for n in told) == sorted(p.id for p in mine)
    bad = client.post("/api/v1/saved-searches", json={"name": "x", "kind": "products", "query": {"level": "two"}})
    assert bad.status_code == 422 and "level" in bad.text


def test_saved_searches_page_shows_the_viewers_own_only(client, db_session):
    client.post("/api/v1/saved-searches", json={"name": "tester's flares", "kind": "events", "query": "type=FL"})
    bob = auth_headers(db_session, "bob")
    client.post("/api/v1/saved-searches", json={"name": "bob's CMEs", "kind": "events", "query": "type=CE"}, headers=bob)
    mine = client.get("/saved-searches").text
    assert "tester&#39;s flares" in mine and "bob&#39;s CMEs" not in mine
    assert 'href="/events?type=FL"' in mine
    anonymous = client.get("/saved-searches", headers={"Authorization": ""}).text
    assert "flares" not in anonymous and "CMEs" not in anonymous and 'id="saved-anonymous"' in anonymous
    prefilled = client.get("/saved-searches", params={"kind": "products", "query": "channel=SDI"}).text
    assert 'value="channel=SDI"' in prefilled and '<option value="products" selected>' in prefilled


def test_badge_ink_has_the_higher_contrast():
    from backend.api.pages.templating import _luminance, badge_ink
    from backend.render.figures import EVENT_COLOURS

    def contrast(a, b):
        la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
        return (la + 0.05) / (lb + 0.05)

    assert badge_ink("#D55E00") == "#000000" and badge_ink("#0072B2") == "#ffffff"
    for colour in (*EVENT_COLOURS.values(), "#666666"):
        assert contrast(colour, badge_ink(colour)) >= 4.5, colour  # WCAG 2.2 SC 1.4.3, small text


def test_close_or_coincident_event_marks_go_on_separate_rows():
    import plotly.graph_objects as go
    from types import SimpleNamespace

    from backend.render.figures import MARK_ROW_PX, add_event_marks

    window = (T0, T0 + dt.timedelta(hours=2))
    spread = SimpleNamespace(start_time=T0 + 10 * MIN, peak_time=T0 + 60 * MIN, end_time=T0 + 110 * MIN)
    fig = go.Figure()
    assert add_event_marks(fig, spread, window) == 1
    assert [a.yshift for a in fig.layout.annotations] == [0, 0, 0]
    close = SimpleNamespace(start_time=T0 + 10 * MIN, peak_time=T0 + 12 * MIN, end_time=T0 + 14 * MIN)
    fig = go.Figure()
    assert add_event_marks(fig, close, window) == 3
    assert [a.yshift for a in fig.layout.annotations] == [0, MARK_ROW_PX, 2 * MARK_ROW_PX]
    same = SimpleNamespace(start_time=T0 + 10 * MIN, peak_time=T0 + 10 * MIN, end_time=T0 + 100 * MIN)
    fig = go.Figure()
    assert add_event_marks(fig, same, window) == 2
    assert [a.yshift for a in fig.layout.annotations] == [0, MARK_ROW_PX, 0]
    assert [s.name for s in fig.layout.shapes] == ["start", "peak", "end"]
