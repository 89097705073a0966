"""Coverage (issue 11 item 4): what catalogue files say they cover, recorded at import on the
real sample catalogues (PostgreSQL, per-test rollback); channel coverage and its gap reasons;
``GET /api/v1/coverage`` and the ``coverage`` field of ``GET /api/v1/events``."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

from backend.models import CatalogueCoverage, ProductState
from backend.services.coverage import GAP_CADENCES, ChannelProvider, coverage_report, window_coverage
from backend.services.events import import_catalogue
from pipelines.catalogues import CatalogueError
from pipelines.catalogues.coverage import file_coverage
from tests.conftest import SAMPLE
from tests.test_api import assert_error, client, make_event, make_frame, make_product, settings  # noqa: F401

EVENTS = SAMPLE / "events"
UTC = dt.UTC


def T(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s).replace(tzinfo=UTC)


def test_each_real_catalogue_file_says_what_it_covers():
    goes = file_coverage("goes_xrs", EVENTS / "goes_xrs_reports" / "goes-xrs-report_2014.txt")
    assert (goes.start, goes.end, goes.complete) == (T("2014-01-01"), T("2015-01-01"), True)
    cdaw = file_coverage("cdaw", EVENTS / "cdaw" / "cdaw_lasco_cme_univ_1996-2013.txt")
    assert (cdaw.start, cdaw.end) == (T("1996-01-01"), T("2014-01-01"))  # its period, not its first CME (01-11)
    hek = file_coverage("hek", EVENTS / "hek" / "hek-events_2024-05-10.json")
    assert (hek.start, hek.end, hek.complete) == (T("2024-05-10"), T("2024-05-11"), True)
    donki = file_coverage("donki", EVENTS / "donki" / "donki_cme_2010-04_2021-11.json")
    assert (donki.start, donki.end) == (T("2010-04-01"), T("2021-12-01"))  # last CME 2021-11-01, month to its end
    srs = file_coverage("noaa_srs", EVENTS / "noaa_srs" / "20150101SRS.txt")
    assert (srs.start, srs.end) == (T("2015-01-01"), T("2015-01-02"))
    wst = file_coverage("lst_wst", EVENTS / "aso-s_lst_wst" / "jing2024_wst_whitelight_flares_table2.txt")
    assert not wst.complete and "selection" in wst.basis
    stix = file_coverage("stix", EVENTS / "stix" / "STIX_flarelist_w_locations_20210214_20230430_version1.csv")
    assert (stix.start, stix.end, stix.complete) == (T("2021-02-14"), T("2023-05-01"), True)  # last day included


def test_a_goes_report_whose_rows_disagree_with_its_name_is_refused(tmp_path):
    f = tmp_path / "goes-xrs-report_2013.txt"
    f.write_text((EVENTS / "goes_xrs_reports" / "goes-xrs-report_2014.txt").read_text(encoding="latin-1"))
    with pytest.raises(CatalogueError, match="rows are of 2014 but the name says 2013"):
        file_coverage("goes_xrs", f)


def test_hek_overmax_makes_the_window_incomplete(tmp_path):
    f = tmp_path / "hek-events_2024-05-09_2024-05-10.json"
    f.write_text('{"result": [], "association": [], "overmax": true}')
    c = file_coverage("hek", f)
    assert (c.start, c.end, c.complete) == (T("2024-05-09"), T("2024-05-11"), False) and "overmax" in c.basis


#: Parsed catalogues of :func:`imported`, by (source, file contents): the four tests that import
#: the same files parse them once (~5 s a time); what is stored and recorded is done each time.
_PARSED: dict = {}


def _parse_once(source, path):
    import hashlib

    from pipelines.catalogues import catalogue_files, parse_catalogue

    key = (source, tuple((Path(f).name, hashlib.sha256(Path(f).read_bytes()).hexdigest())
                         for f in catalogue_files(source, path)))
    if key not in _PARSED:
        _PARSED[key] = parse_catalogue(source, path)
    return _PARSED[key]


@pytest.fixture
def imported(db_session, tmp_path, monkeypatch):
    """The real CDAW list, the real GOES reports of 2013 and 2014, HEK, DONKI, SRS, WST imported."""
    import backend.services.events as events_service

    monkeypatch.setattr(events_service, "parse_catalogue", _parse_once)
    root = tmp_path / "events"
    (root / "goes_xrs_reports").mkdir(parents=True)
    for y in (2013, 2014):
        shutil.copy(EVENTS / "goes_xrs_reports" / f"goes-xrs-report_{y}.txt", root / "goes_xrs_reports")
    for folder in ("cdaw", "hek", "donki", "noaa_srs", "aso-s_lst_wst"):
        shutil.copytree(EVENTS / folder, root / folder)
    src = {"goes_xrs": "goes_xrs_reports", "cdaw": "cdaw", "hek": "hek", "donki": "donki", "noaa_srs": "noaa_srs",
           "lst_wst": "aso-s_lst_wst"}
    for source, folder in src.items():
        import_catalogue(db_session, source, root / folder)
    db_session.flush()
    return root


def test_import_records_coverage_once_per_file(db_session, imported):
    rows = db_session.query(CatalogueCoverage).filter_by(source="goes_xrs").order_by(CatalogueCoverage.file).all()
    assert [(r.file, r.covers_start, r.covers_end) for r in rows] == [
        ("goes-xrs-report_2013.txt", T("2013-01-01"), T("2014-01-01")),
        ("goes-xrs-report_2014.txt", T("2014-01-01"), T("2015-01-01"))]
    import_catalogue(db_session, "goes_xrs", imported / "goes_xrs_reports")  # a re-import updates, adds no row
    assert db_session.query(CatalogueCoverage).filter_by(source="goes_xrs").count() == 2


def test_2016_window_is_not_covered_by_cdaw_nor_goes(db_session, imported):
    w = window_coverage(db_session, None, T("2016-01-01"), T("2016-12-31"))
    assert w["cdaw"].status == "none" and w["cdaw"].message == "CDAW: no coverage after 2013-12-31"
    assert w["goes_xrs"].message == "GOES XRS: no coverage after 2014-12-31"
    assert w["donki"].status == "covered"
    assert w["lst_wst"].message == "LST/WST flare list: no coverage before 2022-11-07"
    assert w["detected"].status == "none"
    # a window across the end: partial, saying where it ends
    w = window_coverage(db_session, ["cdaw"], T("2013-06-01"), T("2014-06-01"))
    assert list(w) == ["cdaw"] and w["cdaw"].status == "partial"
    assert w["cdaw"].message == "CDAW: covered 2013-06-01 to 2013-12-31 only; no coverage after 2013-12-31"
    # the WST table is a selection: never "covered"
    assert window_coverage(db_session, ["lst_wst"], T("2023-01-01"), T("2023-01-31"))["lst_wst"].status == "selection"


def test_coverage_report_spans_and_gap_reasons(db_session, imported):
    rep = {c.name: c for c in coverage_report(db_session, T("2012-01-01"), T("2017-01-01"))}
    assert [(s.start, s.end) for s in rep["cdaw"].spans] == [(T("2012-01-01"), T("2014-01-01"))]
    assert [(g.start, g.end, g.reason) for g in rep["cdaw"].gaps] == [
        (T("2014-01-01"), T("2017-01-01"), "catalogue ends 2013-12-31")]
    assert [(s.start, s.end) for s in rep["goes_xrs"].spans] == [(T("2013-01-01"), T("2015-01-01"))]  # merged
    assert rep["goes_xrs"].gaps[0].reason == "catalogue begins 2013-01-01"
    assert {g.reason for g in rep["noaa_srs"].gaps} == {"no catalogue file covers this", "catalogue ends 2015-09-06"}
    assert rep["SDI"].spans == [] and rep["SDI"].gaps[0].reason == "no frames"


def test_channel_coverage_breaks_at_five_cadences_and_names_failed_products(db_session, settings):
    t0 = T("2023-01-31T06:00:00")
    cad = dt.timedelta(seconds=60)
    minutes = [0, 1, 2, 3, 10, 11, 12]  # a 7-min break (> 5 SDI cadences) at 3 -> 10
    for m in minutes:
        make_product(db_session, make_frame(db_session, "SDI", t0 + m * cad), None)
    bad = make_product(db_session, make_frame(db_session, "SDI", t0 + 6 * cad), None, state=ProductState.failed)
    bad.error = "flat field: no master valid at DATE-OBS"
    make_frame(db_session, "SDI", t0 + 7 * cad)  # a frame never calibrated
    db_session.flush()
    c = ChannelProvider("SDI").coverage(db_session, t0 - 30 * cad, t0 + 30 * cad, settings)
    assert GAP_CADENCES * 60 == 300
    assert [(s.start, s.end) for s in c.spans] == [(t0, t0 + 3 * cad + dt.timedelta(seconds=1)),
                                                   (t0 + 10 * cad, t0 + 12 * cad + dt.timedelta(seconds=1))]
    reasons = [g.reason for g in c.gaps]
    assert reasons[0] == "no frames" and reasons[-1] == "no frames"
    assert reasons[1] == "1 failed product (flat field: no master valid at DATE-OBS); 1 frame not calibrated"


def test_coverage_api_and_events_coverage_field(client, db_session, imported):
    body = client.get("/api/v1/coverage", params={"start": "2016-01-01T00:00:00Z", "end": "2016-12-31T00:00:00Z"}).json()
    by = {s["name"]: s for s in body["sources"]}
    assert {"detected", "cdaw", "goes_xrs", "SDI", "WST", "SCI-UV", "SCI-WL"} <= set(by)
    assert by["cdaw"]["spans"] == [] and by["cdaw"]["gaps"][0]["reason"] == "catalogue ends 2013-12-31"
    full = {s["name"]: s for s in client.get("/api/v1/coverage", params={"name": ["cdaw", "goes_xrs"]}).json()["sources"]}
    assert list(full) == ["cdaw", "goes_xrs"]
    assert full["cdaw"]["spans"][-1]["end"] == "2014-01-01T00:00:00Z"
    assert full["goes_xrs"]["spans"][-1]["end"] == "2015-01-01T00:00:00Z"  # the reports end with 2014

    ev = client.get("/api/v1/events", params={"start": "2016-01-01T00:00:00Z", "end": "2016-12-31T00:00:00Z"}).json()
    assert ev["coverage"]["cdaw"] == {"status": "none", "message": "CDAW: no coverage after 2013-12-31", "spans": []}
    assert ev["coverage"]["donki"]["status"] == "covered" and ev["total"] > 0
    only = client.get("/api/v1/events", params={"source": "cdaw", "start": "2016-01-01T00:00:00Z"}).json()
    assert only["total"] == 0 and list(only["coverage"]) == ["cdaw"]  # 0 events AND no coverage: both said

    assert_error(client.get("/api/v1/coverage", params={"start": "yesterday"}), 422, "query.start")
    assert_error(client.get("/api/v1/coverage", params={"name": "lasco"}), 422, "no coverage of 'lasco'")
    assert_error(client.get("/api/v1/coverage", params={"start": "2016-02-01", "end": "2016-01-01"}), 422, "before start")


def test_quarantined_files_are_a_reason_of_a_channel_gap(db_session, settings):
    """A rejected file whose header still says its channel and DATE-OBS (kept by ingest's
    quarantine with its reason) is named in the gap it falls in."""
    import numpy as np
    from astropy.io import fits

    from backend.services.ingest import quarantine

    t0 = T("2023-01-31T06:00:00")
    make_product(db_session, make_frame(db_session, "WST", t0), None)
    make_product(db_session, make_frame(db_session, "WST", t0 + dt.timedelta(hours=1)), None)
    src = settings.root / "incoming" / "lst_wst_20230131T063000.fits"
    src.parent.mkdir(parents=True, exist_ok=True)
    h = fits.Header({"TELESCOP": "ASO-S", "INSTRUME": "LST", "DETECTOR": "WST", "DATE-OBS": "2023-01-31T06:30:00"})
    fits.PrimaryHDU(np.zeros((4, 4), dtype=np.float32), header=h).writeto(src)
    quarantine(src, "frame too small: 4x4 (smallest LST frame side 32)", settings, move=True)
    c = ChannelProvider("WST").coverage(db_session, t0 - dt.timedelta(hours=1), t0 + dt.timedelta(hours=2), settings)
    (between,) = [g for g in c.gaps if g.start > t0 and g.end <= t0 + dt.timedelta(hours=1)]
    assert between.reason == "no frames; 1 quarantined file (frame too small: 4x4 (smallest LST frame side 32))"
    assert [g.reason for g in c.gaps if g is not between] == ["no frames", "no frames"]
    # a second one, earlier in the gap, quarantined later: the gap quotes the earliest, whatever
    # order the quarantine folder is listed in
    early = settings.root / "incoming" / "lst_wst_20230131T061500.fits"
    fits.PrimaryHDU(np.zeros((4, 4), dtype=np.float32), header=fits.Header({**h, "DATE-OBS": "2023-01-31T06:15:00"})
                    ).writeto(early)
    quarantine(early, "frame too small: 4x4 (the earlier one)", settings, move=True)
    listed = Path.rglob
    for order in (lambda paths: paths, reversed):  # the folder listed either way
        with pytest.MonkeyPatch.context() as m:
            m.setattr(Path, "rglob", lambda self, pattern, order=order: iter(order(sorted(listed(self, pattern)))))
            c = ChannelProvider("WST").coverage(db_session, t0 - dt.timedelta(hours=1), t0 + dt.timedelta(hours=2),
                                                settings)
        (between,) = [g for g in c.gaps if g.start > t0 and g.end <= t0 + dt.timedelta(hours=1)]
        assert between.reason == "no frames; 2 quarantined files (frame too small: 4x4 (the earlier one))"


def test_a_file_that_contradicts_itself_is_imported_with_no_span(db_session, tmp_path):
    folder = tmp_path / "goes_xrs_reports"
    folder.mkdir()
    (folder / "goes-xrs-report_2013.txt").write_text(
        (EVENTS / "goes_xrs_reports" / "goes-xrs-report_2014.txt").read_text(encoding="latin-1"))
    assert import_catalogue(db_session, "goes_xrs", folder).stored > 0
    (row,) = db_session.query(CatalogueCoverage).filter_by(source="goes_xrs").all()
    assert row.covers_start is None and row.basis.startswith("no span: goes-xrs-report_2013.txt: rows are of 2014")
    w = window_coverage(db_session, ["goes_xrs"], T("2014-01-01"), T("2014-02-01"))
    assert w["goes_xrs"].status == "unknown" and w["goes_xrs"].message == "GOES XRS: its files state no span"


def test_goes_xrs_time_series_coverage_is_the_ingested_files(db_session, settings):
    """The XRS light curves are a coverage source of their own: the 2011-06-07 GOES-15 file
    covers its day's samples, a 2016 window is a gap that says no series was ingested."""
    from backend.services.coverage import XRayProvider
    from backend.services.xray import ingest_xray_file

    p = XRayProvider()
    empty = p.coverage(db_session, T("2016-01-01"), T("2016-02-01"))
    assert empty.spans == [] and [g.reason for g in empty.gaps] == ["no XRS series ingested"]
    ingest_xray_file(db_session, SAMPLE / "xray-timeseries" / "go1520110607.fits", settings)
    day = p.coverage(db_session, T("2011-06-07"), T("2011-06-08"))
    assert len(day.spans) == 1 and "GOES-15" in day.basis
    assert day.spans[0].start < T("2011-06-07") + dt.timedelta(hours=6) < day.spans[0].end
    later = p.coverage(db_session, T("2016-01-01"), T("2016-02-01"))
    assert later.spans == [] and later.gaps[0].reason == "no XRS series ingested for this time"
    assert "goes_xrs_timeseries" in {s.name for s in coverage_report(db_session, T("2011-06-07"), T("2011-06-08"))}


def test_stix_period_in_a_file_name_is_checked(tmp_path):
    bad = tmp_path / "STIX_flarelist_w_locations_20211399_20230430_version1.csv"
    bad.write_text("x\n")
    with pytest.raises(CatalogueError, match="not two dates"):
        file_coverage("stix", bad)
    rev = tmp_path / "STIX_flarelist_w_locations_20230430_20210214_version1.csv"
    rev.write_text("x\n")
    with pytest.raises(CatalogueError, match="before it starts"):
        file_coverage("stix", rev)
    none = file_coverage("stix", tmp_path / "stix_flares.csv")
    assert none.start is None and not none.complete


def test_detected_coverage_of_an_event_search_is_an_extent_not_a_covered_span(db_session, tmp_path):
    """Products on two days 15 months apart: the search's note names the first and last and
    points at the gaps; it never claims the months between are covered."""
    for t in (T("2023-01-31T03:00"), T("2024-05-10T12:00")):
        make_product(db_session, make_frame(db_session, "SDI", t), tmp_path)
    w = window_coverage(db_session, ["detected"], T("2023-01-01"), T("2024-12-31"))["detected"]
    assert w.status == "partial" and "first 2023-01-31" in w.message and "gaps between" in w.message
    assert all(not s.complete for s in w.spans)


def test_sdi_run_of_2011_06_07_is_one_run_at_its_own_six_minute_cadence(db_session, settings):
    """Issue 25: the demo's SDI series of the XRS day (25 frames every 6 min from 05:20,
    ``pipelines.simulation.series.XRS_DAY``) was 25 one-second spans and 24 "no frames" gaps
    when a gap was five *nominal* SDI cadences (5 min); it is one run at 6 min."""
    from pipelines.simulation.series import XRS_DAY

    t0 = T(XRS_DAY["first_frame"])
    step = dt.timedelta(seconds=XRS_DAY["cadence_s"])
    times = [t0 + k * step for k in range(XRS_DAY["n_frames"])]
    for t in times:
        make_product(db_session, make_frame(db_session, "SDI", t), None)
    db_session.flush()
    day0, day1 = T("2011-06-07T00:00:00"), T("2011-06-08T00:00:00")
    c = ChannelProvider("SDI").coverage(db_session, day0, day1, settings)
    assert [(s.start, s.end) for s in c.spans] == [(times[0], times[-1] + dt.timedelta(seconds=1))]
    assert c.spans[0].note == "run of 25 frames every 360 s"
    assert [(g.start, g.end, g.reason) for g in c.gaps] == [
        (day0, times[0], "no frames"), (times[-1] + dt.timedelta(seconds=1), day1, "no frames")]


def test_observing_runs_follow_each_runs_own_cadence():
    """A 1-min run, a pause, a 6-min run, two frames an hour apart: the 6-min run is not
    shredded by the 1-min run's cadence, the pause is a break, two frames are not a run."""
    from backend.services.coverage import observing_runs

    t0 = T("2011-06-07T00:00:00")
    m = dt.timedelta(minutes=1)
    fast = [t0 + k * m for k in range(30)]  # 00:00-00:29 every minute
    slow = [t0 + 36 * m + k * 6 * m for k in range(10)]  # 00:36-01:30 every 6 min (6-min step after the fast run)
    pause = [t0 + 3 * 60 * m + k * m for k in range(5)]  # 03:00-03:04 after a 90-min pause
    lone = [t0 + 10 * 60 * m, t0 + 11 * 60 * m]  # two frames an hour apart
    times = fast + slow + pause + lone
    runs = observing_runs(times)
    assert [(times[a], times[b]) for a, b in runs] == [(fast[0], fast[-1]), (slow[0], slow[-1]),
                                                        (pause[0], pause[-1])]
    # a frame or two dropped from a run is no break; the run's own spacing, not a nominal one
    hourly = [t0 + k * 60 * m for k in range(13) if k not in (4, 8, 9)]
    assert observing_runs(hourly) == [(0, len(hourly) - 1)]
    assert observing_runs(lone) == [] and observing_runs([]) == []
