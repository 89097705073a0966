"""The landing timeline's counts (issue 11 item 5) and the search filters of item 6 (PostgreSQL,
per-test rollback): counts per type and bin add up to the search's total, with and without
filters; NOAA region, associated event type, detector, calibration set and file; bad input 422."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select

from backend.models import CalibrationFile, CalibrationKind, Event, EventProduct, ProductCalibrationFile
from backend.services.event_histogram import BIN_WIDTHS_S, choose_bin_width, event_histogram
from backend.services.event_search import EventFilters, search_events
from tests.test_api import T0, MIN, assert_error, client, events, make_event, make_frame, make_product, settings  # noqa: F401

HOUR = dt.timedelta(hours=1)


def test_bin_width_follows_the_window():
    assert choose_bin_width(3600, 120) == 60  # an hour in minutes
    assert choose_bin_width(365 * 86400, 120) == 7 * 86400  # a year in weeks
    assert choose_bin_width(35 * 365 * 86400, 120) == 365 * 86400
    assert choose_bin_width(300 * 365 * 86400, 120) == 3 * 365 * 86400  # beyond: whole multiples of a year
    assert choose_bin_width(0, 1) == BIN_WIDTHS_S[0]
    with pytest.raises(ValueError):
        choose_bin_width(10, 0)


@pytest.fixture
def many(db_session):
    """300 flares (C and M), 120 CMEs and 30 active regions over 30 days, every 7th flare with a CME."""
    for k in range(300):
        t = T0 + k * 2 * HOUR + dt.timedelta(minutes=k % 50)
        fl = make_event(db_session, "FL", t, t + 5 * MIN, t + 20 * MIN, goes_class="M2.0" if k % 10 == 0 else "C3.0",
                        noaa_ar=13664 if k % 4 == 0 else 13697)
        if k % 7 == 0:
            ce = make_event(db_session, "CE", t + 10 * MIN, None, None, source="cdaw", position_angle=90.0)
            db_session.flush()
            from backend.models import EventAssociation

            db_session.add_all([EventAssociation(event_id=fl.id, other_event_id=ce.id, kind="flare_cme"),
                                EventAssociation(event_id=ce.id, other_event_id=fl.id, kind="cme_flare")])
    for k in range(120 - 43):
        make_event(db_session, "CE", T0 + k * 9 * HOUR, None, None, source="donki")
    for k in range(30):
        make_event(db_session, "AR", T0 + k * 24 * HOUR, None, T0 + (k + 1) * 24 * HOUR, source="noaa_srs",
                   noaa_ar=13664)
    db_session.flush()


def _exact(db_session, f: EventFilters) -> int:
    from backend.services.event_search import filter_conditions

    q = select(func.count()).select_from(Event.__table__)
    conds = filter_conditions(db_session, f)
    return int(db_session.scalar(q.where(*conds) if conds else q))


@pytest.mark.parametrize("filters", [
    EventFilters(),
    EventFilters(event_types=("FL",)),
    EventFilters(start=T0 + 5 * 24 * HOUR, end=T0 + 9 * 24 * HOUR),  # events under way at start: first bin
    EventFilters(event_types=("FL",), min_goes_flux=1e-5),
    EventFilters(noaa_ar=13664),
    EventFilters(associated_type="CE", event_types=("FL",)),
    EventFilters(sources=("donki", "cdaw"), start=T0 + 24 * HOUR),
])
def test_histogram_counts_add_up_to_the_search_total(db_session, many, filters):
    h = event_histogram(db_session, filters, bins=50)
    page = search_events(db_session, filters, limit=1)
    assert h.total == sum(sum(c) for c in h.counts.values()) == page.total == _exact(db_session, filters) > 0
    assert not page.total_is_estimate
    assert len(h.edges) == len(next(iter(h.counts.values()))) + 1 <= 51
    assert all((b - a).total_seconds() == h.bin_s for a, b in zip(h.edges, h.edges[1:]))


def test_histogram_bins_events_by_start_time(db_session):
    a = make_event(db_session, "FL", T0 + 5 * MIN, None, T0 + 6 * MIN)
    make_event(db_session, "FL", T0 + 65 * MIN, None, None)
    make_event(db_session, "CE", T0 + 66 * MIN, None, None, source="cdaw")
    make_event(db_session, "FL", T0 - 30 * MIN, None, T0 + 2 * MIN)  # under way at the window's start
    db_session.flush()
    h = event_histogram(db_session, EventFilters(start=T0, end=T0 + 2 * HOUR), bins=9)  # 9 edges: 8 + the end
    assert h.bin_s == 900 and h.edges[0] == T0 and h.edges[-1] == T0 + 2 * HOUR + 15 * MIN
    assert h.counts["FL"][:6] == [2, 0, 0, 0, 1, 0] and h.counts["CE"][4] == 1 and h.total == 4
    assert a.id


def test_histogram_api_and_figure(client, db_session, many):
    body = client.get("/api/v1/events/histogram", params={"type": "FL", "bins": 30}).json()
    assert body["total"] == 300 and sum(body["counts"]["FL"]) == 300 and len(body["edges"]) == len(body["counts"]["FL"]) + 1
    total = client.get("/api/v1/events", params={"type": "FL", "limit": 1}).json()["total"]
    assert total == body["total"]
    fig = client.get("/api/v1/events/histogram/figure").json()  # 450 events: each one drawn
    assert fig["layout"]["meta"]["mode"] == "events" and fig["layout"]["meta"]["total"] == 450
    for _ in range(120):
        make_event(db_session, "FL", T0 - dt.timedelta(days=3), None, None)
    db_session.flush()
    fig = client.get("/api/v1/events/histogram/figure").json()  # 570 > 500: counts per bin
    assert fig["layout"]["meta"] == {**fig["layout"]["meta"], "mode": "bins", "total": 570}
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert sum(sum(t["y"]) for t in bars) == 570
    assert all(len(cd) == 2 for t in bars for cd in t["customdata"])  # a click zooms into the bin
    zoomed = client.get("/api/v1/events/histogram/figure",
                        params={"start": "2024-05-14T16:00:00Z", "end": "2024-05-15T16:00:00Z"}).json()
    assert zoomed["layout"]["meta"]["mode"] == "events"  # drill-down
    assert_error(client.get("/api/v1/events/histogram", params={"bins": 0}), 422, "query.bins")
    assert_error(client.get("/api/v1/events/histogram", params={"bins": 5000}), 422, "query.bins")
    assert_error(client.get("/api/v1/events/histogram/figure", params={"type": "flare"}), 422, "unknown HEK event type")
    assert_error(client.get("/api/v1/events/histogram", params={"start": "2024-05-15", "end": "2024-05-14"}), 422,
                 "before start")


def test_filters_region_associated_type_detector(client, events):
    def ids(**params):
        body = client.get("/api/v1/events", params=params).json()
        return sorted(e["id"] for e in body["items"]), body["total"]

    e = events
    assert ids(noaa_ar=13664) == ([e["fl"].id], 1)
    assert ids(noaa_ar=3664) == ([e["fl"].id], 1)  # four digits, as SRS and HEK print it
    assert ids(type="FL", associated_type="CE") == ([e["fl"].id], 1)  # flares with a CME
    assert ids(associated_type="FL") == (sorted([e["ce"].id, e["wfl"].id, e["fl"].id]), 3)
    assert ids(frm_name="lstdp-prominence") == ([e["pr"].id], 1)
    # the cursor keeps working with the new filters
    first = client.get("/api/v1/events", params={"associated_type": "FL", "limit": 2}).json()
    nxt = client.get("/api/v1/events", params={"associated_type": "FL", "limit": 2, "cursor": first["next_cursor"]}).json()
    assert first["total"] == 3 and len(first["items"]) + len(nxt["items"]) == 3 and nxt["next_cursor"] is None
    assert_error(client.get("/api/v1/events", params={"associated_type": "XX"}), 422, "query.associated_type")
    assert_error(client.get("/api/v1/events", params={"noaa_ar": 0}), 422, "query.noaa_ar")
    assert_error(client.get("/api/v1/events", params={"noaa_ar": "AR12"}), 422, "query.noaa_ar")
    assert_error(client.get("/api/v1/events", params={"calibration_set": "dark"}), 422, "not a calibration set")
    assert_error(client.get("/api/v1/events", params={"calibration_file": -1}), 422, "query.calibration_file")


def test_filter_by_calibration_set_and_file(client, db_session, settings):
    f1 = make_frame(db_session, "SDI", T0)
    p1 = make_product(db_session, f1, None, version=1)
    p2 = make_product(db_session, f1, None, version=2)
    cal = CalibrationFile(channel_code="SDI", kind=CalibrationKind.dark, version=3, valid_from=T0 - HOUR,
                          path="/nonexistent/dark.fits", sha256="0" * 64)
    db_session.add(cal)
    db_session.flush()
    p1.calibration_key = f"dark:{cal.id}"
    db_session.add(ProductCalibrationFile(product_id=p1.id, calibration_file_id=cal.id))
    a = make_event(db_session, "FL", T0, None, None, source="detected", frm_name="lst-sdi-flare")
    b = make_event(db_session, "FL", T0, None, None, source="detected", frm_name="lst-sdi-flare")
    db_session.add_all([EventProduct(event_id=a.id, product_id=p1.id), EventProduct(event_id=b.id, product_id=p2.id)])
    db_session.flush()

    def ids(**params):
        return [e["id"] for e in client.get("/api/v1/events", params=params).json()["items"]]

    assert ids(calibration_set=f"dark:{cal.id}") == [a.id]
    assert_error(client.get("/api/v1/events", params={"calibration_set": "cal-v2"}), 422, "not a calibration set")
    assert ids(calibration_file=cal.id) == [a.id]
    assert ids(calibration_file=cal.id + 1000) == []
    h = client.get("/api/v1/events/histogram", params={"calibration_file": cal.id}).json()
    assert h["total"] == 1


@pytest.mark.parametrize("path", ["/api/v1/events/histogram", "/api/v1/events/histogram/figure", "/api/v1/coverage",
                                  "/api/v1/events"])
@pytest.mark.parametrize("query", ["start=0001-01-01", "end=9999-12-31", "start=0001-01-01&end=9999-12-31",
                                   "start=9999-12-31T00:00:00&end=9999-12-31T23:59:59"])
def test_extreme_times_are_answered_not_overflows(client, path, query):
    r = client.get(f"{path}?{query}")
    assert r.status_code == 200, r.text
    if path == "/api/v1/events/histogram":
        h = r.json()
        assert h["total"] == sum(sum(c) for c in h["counts"].values())


def test_unknown_calibration_kind_in_a_set_is_422(client):
    r = client.get("/api/v1/events", params={"calibration_set": "nope:3,flat:2"})
    assert r.status_code == 422 and "unknown calibration kind 'nope'" in r.json()["detail"]
    assert client.get("/api/v1/events", params={"calibration_set": "dark:3,flat:2"}).status_code == 200
