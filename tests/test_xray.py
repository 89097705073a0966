"""GOES XRS: the reader (layouts, quality flags and fills as gaps, the leap second, the old FITS),
ingest (idempotent, broken files quarantined), the API (422s, CSV, coverage), the event curves
(one figure on one UTC axis, gaps as None, start/peak/end lines; CSV and FITS downloads read back
with astropy) and the stored reason of event associations."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits
from astropy.table import Table
from astropy.time import Time
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from backend.api.deps import get_session
from backend.models import CalibrationKind, EventAssociation, XRaySample, XRaySeries
from backend.services import xray as xray_service
from pipelines.timeseries.goes_xrs import XRSReadError, read_goes_xrs
from pipelines.utc import as_utc
from tests.conftest import SAMPLE, shared_app
from tests.test_api import make_calibration, make_event, make_frame, make_product, write_product_fits

XRS = SAMPLE / "xray-timeseries"
FITS_2011 = XRS / "go1520110607.fits"
LEAP = XRS / "goes_13_leap_second.nc"
G13_2017 = XRS / "sci_gxrs-l2-irrad_g13_d20170901_truncated.nc"
G16_AVG = XRS / "sci_xrsf-l2-avg1m_g16_d20210101_truncated.nc"
G17_1S = XRS / "sci_xrsf-l2-flx1s_g17_d20201016_truncated.nc"
MIN = dt.timedelta(minutes=1)
UTC = dt.UTC


# -- reader ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, satellite, layout, n, cadence", [
    ("go1520110607.fits", "GOES-15", "sdac-fits", 42177, 2.047),
    ("goes_13_leap_second.nc", "GOES-13", "goes13-15-irrad", 100, 2.047),
    ("sci_gxrs-l2-irrad_g13_d20170901_truncated.nc", "GOES-13", "goes13-15-irrad", 601, 2.047),
    ("sci_gxrs-l2-irrad_g15_d20131028_truncated.nc", "GOES-15", "goes13-15-irrad", 601, 2.047),
    ("sci_xrsf-l2-avg1m_g15_d20190102_truncated.nc", "GOES-15", "goes13-15-avg1m", 51, 60.0),
    ("sci_xrsf-l2-avg1m_g16_d20210101_truncated.nc", "GOES-16", "goes-r-avg1m", 100, 60.0),
    ("sci_xrsf-l2-flx1s_g17_d20201016_truncated.nc", "GOES-17", "goes-r-flx1s", 51, 1.0),
])
def test_reads_every_layout(name, satellite, layout, n, cadence):
    s = read_goes_xrs(XRS / name)
    assert (s.satellite, s.layout, len(s)) == (satellite, layout, n)
    assert s.cadence_s == pytest.approx(cadence, abs=0.01)
    assert np.all(np.diff(s.unix_tai) > 0)  # strictly increasing: no duplicate, no reordering
    for flux in (s.xrsa, s.xrsb):
        good = flux[np.isfinite(flux)]
        assert good.size and np.all(good > 0) and np.all(good < 1e-2)  # W m-2, never a fill or a negative
    assert np.nanmedian(s.xrsb) > np.nanmedian(s.xrsa)  # 1-8 A above 0.5-4 A for a thermal spectrum


def test_the_2011_fits_holds_the_m2_flare():
    """The SDAC FITS of 2011-06-07 (sunpy's reading: TIME from DATE-OBS): the M2.5 flare peaks near 06:41 UTC."""
    s = read_goes_xrs(FITS_2011)
    i = int(np.nanargmax(s.xrsb))
    assert 2.4e-5 <= s.xrsb[i] < 2.6e-5  # M2.5
    assert s.time[i].isot.startswith("2011-06-07T06:4")
    assert s.time[0].isot == "2011-06-06T23:59:59.962"  # TSTART -0.038 s before the day


def test_leap_second_kept_not_rounded():
    """2015-06-30 23:59:60 UTC: sunpy rounds the sample into 23:59:59.999; the reader keeps it at
    23:59:60.965 and the spacing in TAI stays the 2.048-s cadence (no shifted or duplicate sample)."""
    import sunpy.timeseries

    s = read_goes_xrs(LEAP)
    assert s.time[-1].isot == "2015-06-30T23:59:60.965"
    assert s.leap_second_samples == 1
    steps = np.diff(s.unix_tai)
    assert steps.min() > 2.04 and steps.max() < 2.06, steps  # a rounded sample would leave a ~1.08 s step
    assert any("leap second" in n for n in s.notes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ts = sunpy.timeseries.TimeSeries(str(LEAP), source="XRS")
    assert ts.time[-1].isot.startswith("2015-06-30T23:59:59.999")  # what the reader corrects
    # values are sunpy's, in the same order
    df = ts.to_dataframe()
    np.testing.assert_array_equal(s.xrsb, df["xrsb"].to_numpy())


def _patch_netcdf(src, dst, **changes):
    import h5netcdf

    shutil.copy(src, dst)
    with h5netcdf.File(dst, "r+") as f:
        for name, items in changes.items():
            v = f.variables[name]
            data = np.asarray(v[:])
            for i, value in items:
                data[i] = value
            v[:] = data
    return dst


def test_quality_flags_and_fills_are_gaps_goes_r_1s(tmp_path):
    """GOES-R 1-s fluxes: good_data is flag 0 (mask 65535): any other flag, a flag fill, a -9999
    flux and a non-positive flux are gaps; the other samples keep their values."""
    ref = read_goes_xrs(G17_1S)
    f = _patch_netcdf(G17_1S, tmp_path / "g17.nc",
                      xrsb_flags=[(10, 2)],            # particle_spike
                      xrsa_flags=[(11, 65535)],        # flag missing (fill)
                      xrsb_flux=[(12, -9999.0)],       # fill value
                      xrsa_flux=[(13, 0.0), (14, -1e-9)])  # not a measurable irradiance
    s = read_goes_xrs(f)
    assert np.isnan(s.xrsb[10]) and np.isnan(s.xrsa[11]) and np.isnan(s.xrsb[12])
    assert np.isnan(s.xrsa[13]) and np.isnan(s.xrsa[14])
    assert s.xrsb_quality[10] == 2 and s.xrsa_quality[11] == 65535
    untouched = [i for i in range(len(s)) if i not in (10, 11, 12, 13, 14)]
    np.testing.assert_allclose(s.xrsb[untouched], ref.xrsb[untouched])
    assert np.isfinite(s.xrsa[10]) and np.isfinite(s.xrsb[11])  # a flag of one channel gaps that channel only


def test_one_minute_averages_follow_the_files_good_data_mask(tmp_path):
    """GOES-16 1-min averages: flag 4 (e_contam_significant) is good data (the file: "good_data is
    independent of electron contamination flags"); 2 (bad_data) and 1 (eclipse) are gaps."""
    ref = read_goes_xrs(G16_AVG)
    assert np.all(ref.xrsa_quality[:20] == 4) and np.all(np.isfinite(ref.xrsa[:20]))
    s = read_goes_xrs(_patch_netcdf(G16_AVG, tmp_path / "g16.nc", xrsa_flag=[(0, 2), (1, 1), (2, 6)]))
    assert np.isnan(s.xrsa[:3]).all()
    assert s.xrsa[3] == ref.xrsa[3]


def test_negative_goes13_a_channel_samples_are_gaps():
    s = read_goes_xrs(G13_2017)
    import h5netcdf

    with h5netcdf.File(G13_2017, "r") as f:
        raw = np.asarray(f["a_flux"][:], dtype=np.float64)
    assert (raw <= 0).sum() == 262
    np.testing.assert_array_equal(np.isnan(s.xrsa), raw <= 0)


def test_old_fits_fill_values_are_gaps(tmp_path):
    f = tmp_path / "go15.fits"
    shutil.copy(FITS_2011, f)
    with fits.open(f, mode="update") as h:
        flux = h["FLUXES"].data["FLUX"]
        flux[0][5, 0] = -99999.0  # "Flux value of -99999.0 means no data" (FLUXES header)
        flux[0][6, 1] = -2e-9
    ref, s = read_goes_xrs(FITS_2011), read_goes_xrs(f)
    assert np.isnan(s.xrsb[5]) and np.isnan(s.xrsa[6])
    assert s.xrsa[5] == ref.xrsa[5] and s.xrsb[6] == ref.xrsb[6]
    assert np.isfinite(s.xrsb).sum() == len(s) - 1


def test_broken_files_are_refused(tmp_path):
    cut = tmp_path / "cut.nc"
    cut.write_bytes(G17_1S.read_bytes()[:3000])
    with pytest.raises(XRSReadError, match="sunpy cannot read it"):
        read_goes_xrs(cut)
    with pytest.raises(XRSReadError, match="sunpy cannot read it as GOES XRS"):  # a real FITS, not GOES XRS
        read_goes_xrs(SAMPLE / "lyman-alpha" / "lyra_20120101-000000_lev2_std.fits")
    txt = tmp_path / "notes.fits"
    txt.write_text("not a file of fluxes\n")
    with pytest.raises(XRSReadError, match="neither a netCDF-4"):
        read_goes_xrs(txt)


# -- ingest, window, coverage (PostgreSQL) -----------------------------------------------------


@pytest.fixture
def settings(settings_env):
    return settings_env()


def test_ingest_is_idempotent_and_keeps_the_leap_second(db_session, settings):
    a = xray_service.ingest_xray_file(db_session, LEAP, settings)
    assert a.status == "ingested" and a.n_samples == 100
    b = xray_service.ingest_xray_file(db_session, LEAP, settings)
    assert b.status == "duplicate" and b.series_id == a.series_id
    n = db_session.scalar(select(func.count()).select_from(XRaySample).where(XRaySample.series_id == a.series_id))
    assert n == 100
    row = db_session.get(XRaySeries, a.series_id)
    assert (row.satellite, row.n_gaps_xrsa, row.n_gaps_xrsb) == ("GOES-13", 13, 0)
    # the series ends inside the leap second: its span stays on 2015-06-30 (datetime has no :60)
    assert as_utc(row.end_time) == dt.datetime(2015, 6, 30, 23, 59, 59, 999999, tzinfo=UTC)
    win = xray_service.xray_window(db_session, dt.datetime(2015, 6, 30, 23, 59, 50, tzinfo=UTC),
                                   dt.datetime(2015, 7, 1, 0, 0, 5, tzinfo=UTC))
    (s,) = win.series
    assert s.times_iso[-1] == "2015-06-30T23:59:60.965Z"
    assert s.times_iso[-2] == "2015-06-30T23:59:58.915Z"
    assert len(set(s.t_tai)) == len(s.t_tai) == 6  # 23:59:50.7 .. 23:59:60.965, 2.05 s apart


def test_broken_file_is_quarantined_with_its_reason(db_session, settings, tmp_path):
    cut = tmp_path / "sci_xrsf-l2-flx1s_g17_d20201016_cut.nc"
    cut.write_bytes(G17_1S.read_bytes()[:3000])
    o = xray_service.ingest_xray_file(db_session, cut, settings)
    assert o.status == "rejected" and "sunpy cannot read it as GOES XRS" in o.reason
    q = settings.quarantine / "xray"
    kept = list(q.glob("*_sci_xrsf-l2-flx1s_g17_d20201016_cut.nc"))
    assert len(kept) == 1 and cut.exists()  # a copy kept, the source left where it was
    assert "sunpy cannot read it" in kept[0].with_name(kept[0].name + ".reason").read_text()
    assert db_session.scalar(select(func.count()).select_from(XRaySeries)) == 0


def test_coverage_per_satellite(db_session, settings, tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    for f in (FITS_2011, G13_2017, XRS / "sci_gxrs-l2-irrad_g15_d20131028_truncated.nc"):
        shutil.copy(f, folder / f.name)
    (folder / "README.txt").write_text("not read")
    out = xray_service.import_xray_dir(db_session, folder, settings)
    assert [o.status for o in out] == ["ingested"] * 3
    cov = xray_service.xray_coverage(db_session)
    assert [(s, a.date().isoformat(), b.date().isoformat()) for s, a, b in cov] == [
        ("GOES-13", "2017-09-01", "2017-09-01"),
        ("GOES-15", "2011-06-06", "2011-06-07"),
        ("GOES-15", "2013-10-28", "2013-10-28"),
    ]


# -- API ----------------------------------------------------------------------------------------


@pytest.fixture
def client(db_session, settings):
    def _session():
        yield db_session

    with shared_app() as app:  # one app per test process (tests/conftest.py)
        app.dependency_overrides[get_session] = _session
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c


@pytest.mark.parametrize("query, needle", [
    ("start=2017-09-01T01:00&end=2017-09-01T00:00", "must be after start"),
    ("start=2017-09-01T00:00&end=2017-09-05T00:00", "longer than the 2 days"),
    ("start=2017-09-01T00:00&end=2017-09-01T01:00&satellite=SOHO", "not a GOES satellite"),
    ("end=2017-09-01T01:00", "start"),
    ("start=yesterday&end=2017-09-01T01:00", "start"),
    ("start=2017-09-01T00:00&end=2017-09-01T01:00&format=xml", "format"),
])
def test_bad_windows_are_422(client, query, needle):
    r = client.get(f"/api/v1/xray?{query}")
    assert r.status_code == 422, r.text
    assert needle in r.text


def test_xray_json_and_csv_with_gaps(client, db_session, settings):
    xray_service.ingest_xray_file(db_session, G13_2017, settings)
    r = client.get("/api/v1/xray?start=2017-09-01T00:00:00Z&end=2017-09-01T00:05:00Z&satellite=g13")
    assert r.status_code == 200, r.text
    body = r.json()
    (s,) = body["series"]
    assert s["series"]["satellite"] == "GOES-13" and s["series"]["original_name"] == G13_2017.name
    assert s["series"]["cadence_s"] == pytest.approx(2.047, abs=0.01)
    ref = read_goes_xrs(G13_2017)
    n = len(s["times"])
    assert 140 < n < 150
    assert [v is None for v in s["xrsa"]] == list(np.isnan(ref.xrsa[:n]))  # negative A samples: null
    assert s["xrsb"][0] == pytest.approx(ref.xrsb[0], rel=1e-6)
    c = client.get("/api/v1/xray?start=2017-09-01T00:00:00Z&end=2017-09-01T00:05:00Z&format=csv")
    assert c.status_code == 200 and c.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(line for line in io.StringIO(c.text) if not line.startswith("#")))
    assert len(rows) == n
    assert [r["xrsa_w_m2"] == "" for r in rows] == [v is None for v in s["xrsa"]]
    assert rows[0]["satellite"] == "GOES-13" and float(rows[0]["xrsb_w_m2"]) == pytest.approx(ref.xrsb[0], rel=1e-5)
    assert client.get("/api/v1/xray?start=2030-01-01T00:00Z&end=2030-01-01T01:00Z").json()["series"] == []
    cov = client.get("/api/v1/xray/coverage").json()["items"]
    assert cov == [{"satellite": "GOES-13", "start": "2017-09-01T00:00:00.631000Z",
                    "end": "2017-09-01T00:20:29.421000Z"}]


# -- the event's curves --------------------------------------------------------------------------

FLARE = dict(start=dt.datetime(2011, 6, 7, 6, 16, tzinfo=UTC), peak=dt.datetime(2011, 6, 7, 6, 41, tzinfo=UTC),
             end=dt.datetime(2011, 6, 7, 6, 59, tzinfo=UTC))


def make_flare_day(s, folder):
    """The M2.5 flare of 2011-06-07 with SDI products every 10 min of one calibration set, one
    product of another set, and one frame whose product is all masked (a gap)."""
    fl = make_event(s, "FL", FLARE["start"], FLARE["peak"], FLARE["end"], goes_class="M2.5", hpc_x=-650.0,
                    hpc_y=-350.0, noaa_ar=11226)
    dark, flat = make_calibration(s, "SDI", CalibrationKind.dark, 3), make_calibration(s, "SDI", CalibrationKind.flat, 2)
    key = f"dark:{dark.id},flat:{flat.id}"
    prods = []
    for i, minutes in enumerate(range(0, 100, 10)):
        f = make_frame(s, "SDI", FLARE["start"] - 20 * MIN + minutes * MIN)
        p = make_product(s, f, folder, disk_value=100.0 + (40.0 if 20 <= minutes <= 60 else 0.0))
        p.calibration_key, p.params_hash = key, "a" * 64
        prods.append(p)
    other = make_product(s, prods[3].frame, folder, version=2)  # a newer version, another set
    other.calibration_key, other.params_hash = f"dark:{dark.id}", "b" * 64
    # a product with no usable pixel (every pixel NaN): a gap in both curves
    blank = np.full((64, 64), np.nan, dtype=np.float32)
    write_product_fits(Path(prods[5].path), blank, np.zeros((64, 64), np.uint8), prods[5].frame.date_obs)
    s.flush()
    return fl, prods, other, (dark, flat)


@pytest.fixture
def flare_day(db_session, settings, curves_read_unbudgeted):
    """The flare day's products and XRS file, the curves' read budget lifted
    (:func:`tests.conftest.curves_read_unbudgeted`): these tests check what the curves hold."""
    fl, prods, other, cals = make_flare_day(db_session, settings.products / "SDI")
    assert xray_service.ingest_xray_file(db_session, FITS_2011, settings).status == "ingested"
    return fl, prods, other, cals


def test_curves_figure_one_axis_gaps_and_marks(client, flare_day):
    fl, prods, other, (dark, flat) = flare_day
    r = client.get(f"/api/v1/events/{fl.id}/curves/figure")
    assert r.status_code == 200, r.text
    fig = r.json()
    lay = fig["layout"]
    assert lay["xaxis"].get("matches") == "x2" or lay["xaxis2"].get("matches") == "x"  # one shared time axis
    assert lay["yaxis2"]["type"] == "log"
    names = [t["name"] for t in fig["data"]]
    assert names[0].startswith("LST SDI ROI (-650\u2033, -350\u2033)") and names[1] == "LST SDI disk"
    assert names[2:] == ["GOES 1-8 \u00c5 (GOES-15)", "GOES 0.5-4 \u00c5 (GOES-15)"]
    roi, disk, xrsb, xrsa = fig["data"]
    assert roi["xaxis"] == "x" and xrsb["xaxis"] == "x2" and xrsb["yaxis"] == "y2"
    # one calibration set: the 10 frames of set (dark, flat), not the other product of frame 3
    assert len(disk["y"]) == 10
    assert disk["y"][5] is None and roi["y"][5] is None  # the all-masked product is a gap
    assert disk["y"][3] == pytest.approx(140.0) and disk["y"][0] == pytest.approx(100.0)
    assert not disk.get("connectgaps")
    cal = [a["text"] for a in lay["annotations"] if a.get("name") == "calibration"][0]
    assert f"dark #{dark.id} v3" in cal and f"flat #{flat.id} v2" in cal
    marks = {s["name"]: s for s in lay["shapes"] if s.get("name") in ("start", "peak", "end")}
    assert set(marks) == {"start", "peak", "end"}
    assert marks["peak"]["x0"].startswith("2011-06-07T06:41:00") and marks["peak"]["yref"] == "paper"
    assert {s["name"] for s in lay["shapes"]} >= {"class-A", "class-B", "class-C", "class-M", "class-X"}
    # the XRS peak in this window is the M2.5 flare
    peak = max(v for v in xrsb["y"] if v is not None)
    assert 2.4e-5 < peak < 2.6e-5


def test_curves_figure_says_when_no_xrs_series_covers_the_window(client, db_session, settings):
    e = make_event(db_session, "FL", dt.datetime(2024, 5, 14, 16, tzinfo=UTC), dt.datetime(2024, 5, 14, 16, 12, tzinfo=UTC),
                   dt.datetime(2024, 5, 14, 16, 30, tzinfo=UTC), goes_class="M1.2")
    xray_service.ingest_xray_file(db_session, G13_2017, settings)
    fig = client.get(f"/api/v1/events/{e.id}/curves/figure").json()
    texts = {a.get("name"): a["text"] for a in fig["layout"]["annotations"]}
    assert texts["no-xrs"].startswith("No GOES XRS series stored for this window")
    assert "GOES-13 2017-09-01 00:00" in texts["no-xrs"]
    assert texts["no-lst"] == "No written SDI L2 products in this window"
    assert fig["data"] == []


def test_missing_samples_break_the_line():
    from backend.render.event_figures import with_gaps

    t0 = dt.datetime(2020, 1, 1, tzinfo=UTC)
    times = [t0 + dt.timedelta(seconds=2 * i) for i in range(5)] + [t0 + dt.timedelta(seconds=60)]
    x, y, _ = with_gaps(times, [1.0, 2.0, None, 4.0, 5.0, 6.0], 3.0)
    assert y == [1.0, 2.0, None, 4.0, 5.0, None, 6.0]
    assert x[5] == t0 + dt.timedelta(seconds=34)


def test_curves_csv_and_fits_read_back(client, flare_day):
    fl, prods, other, (dark, flat) = flare_day
    r = client.get(f"/api/v1/events/{fl.id}/curves?format=fits")
    assert r.status_code == 200 and r.headers["content-type"] == "application/fits"
    with fits.open(io.BytesIO(r.content), checksum=True) as h:
        hdr = h[0].header
        assert hdr["EVENT_ID"] == fl.id and hdr["EVTYPE"] == "FL"
        assert hdr["CALIDS"] == f"{dark.id}v3,{flat.id}v2"
        assert hdr["DATE-OBS"] == "2011-06-07T05:56:00.000" and hdr["DATE-END"] == "2011-06-07T07:26:00.000"
        assert hdr["XRS_SAT"] == "GOES-15"
        lst = Table.read(h["LST"], mask_invalid=False, astropy_native=True)  # NaN stays a gap
        xr = Table.read(h["GOES_XRS"], mask_invalid=False, astropy_native=True)
    assert len(lst) == 10 and str(lst["DISK_MEAN"].unit) == "erg / (s sr cm2)"
    assert list(lst["PRODUCT_ID"]) == [p.id for p in prods]
    assert np.isnan(lst["DISK_MEAN"][5]) and lst["DISK_MEAN"][3] == pytest.approx(140.0)
    assert isinstance(lst["TIME"], Time) and lst["TIME"][0].isot == "2011-06-07T05:56:00.000"
    assert str(xr["XRSB"].unit) == "W / m2" and isinstance(xr["TIME"], Time)
    assert 2.4e-5 < np.nanmax(xr["XRSB"]) < 2.6e-5
    # the XRS table spans the window (event start - 30 min .. end + 30 min), not only the LST samples
    assert hdr["WINSTART"] == "2011-06-07T05:46:00.000Z" and hdr["WINEND"] == "2011-06-07T07:29:00.000Z"
    assert 0 <= (xr["TIME"][0] - Time("2011-06-07T05:46:00", scale="utc")).to_value("s") < 2.1
    assert 0 <= (Time("2011-06-07T07:29:00", scale="utc") - xr["TIME"][-1]).to_value("s") < 2.1
    c = client.get(f"/api/v1/events/{fl.id}/curves?format=csv")
    assert c.status_code == 200
    comments = [line for line in c.text.splitlines() if line.startswith("#")]
    assert any(f"dark #{dark.id} v3" in line for line in comments)
    rows = list(csv.DictReader(line for line in io.StringIO(c.text) if not line.startswith("#")))
    disk = [r for r in rows if r["curve"] == "lst_disk"]
    assert len(disk) == 10 and disk[5]["value"] == "" and float(disk[3]["value"]) == pytest.approx(140.0)
    assert sum(r["curve"] == "goes_xrsb" for r in rows) == len(xr)
    j = client.get(f"/api/v1/events/{fl.id}/curves").json()
    assert j["calibration"]["files"] == [{"kind": "dark", "id": dark.id, "version": 3},
                                        {"kind": "flat", "id": flat.id, "version": 2}]
    assert client.get(f"/api/v1/events/{fl.id}/curves?format=png").status_code == 422
    assert client.get(f"/api/v1/events/{fl.id}/curves?channel=XYZ").status_code == 422
    assert client.get("/api/v1/events/99999999/curves").status_code == 404


# -- association reasons ---------------------------------------------------------------------------


def test_association_reason_is_stored_and_served(client, db_session):
    from backend.services.events import associate_events

    t = FLARE["start"]
    g = make_event(db_session, "FL", t, t + 25 * MIN, t + 43 * MIN, goes_class="M2.5", noaa_ar=11226,
                   hpc_x=-650.0, hpc_y=-350.0)
    h = make_event(db_session, "FL", t + MIN, t + 27 * MIN, t + 45 * MIN, source="hek", frm_name="SSW Latest Events",
                   noaa_ar=11226, hpc_x=-626.0, hpc_y=-318.0)
    c = make_event(db_session, "CE", t + 40 * MIN, source="cdaw", position_angle=125.0, angular_width=60.0)
    old = make_event(db_session, "FL", t + 2 * MIN, t + 26 * MIN, t + 44 * MIN, source="donki", noaa_ar=11226)
    db_session.add_all([EventAssociation(event_id=g.id, other_event_id=old.id, kind="same_flare"),
                        EventAssociation(event_id=old.id, other_event_id=g.id, kind="same_flare")])
    db_session.flush()
    associate_events(db_session, start=t, end=t + dt.timedelta(hours=2))
    rows = {(a.event_id, a.other_event_id): a for a in db_session.scalars(
        select(EventAssociation).where(EventAssociation.event_id.in_([g.id, h.id, c.id, old.id])))}
    reason = rows[(g.id, h.id)].reason
    assert reason == ("same flare in GOES and HEK (SSW Latest Events): peaks 2 min apart, both NOAA AR 11226, "
                      "40\u2033 apart")
    assert rows[(h.id, g.id)].reason == reason  # one reason, stored with both directions
    cme = rows[(g.id, c.id)]
    assert cme.kind == "flare_cme"
    assert cme.reason.startswith("CDAW (LASCO) CME first seen +40 min from the GOES flare start, flare position angle")
    assert "flare position angle 118\u00b0, CME 125\u00b0 \u00b1 30\u00b0" in cme.reason  # SE flare: atan2(650, -350)
    assert rows[(g.id, old.id)].reason.startswith("same flare in GOES and DONKI")  # an older link got its reason
    body = client.get(f"/api/v1/events/{g.id}").json()
    by_id = {a["event"]["id"]: a for a in body["associated"]}
    assert by_id[h.id]["reason"] == reason and by_id[c.id]["kind"] == "flare_cme"


def test_event_page_lists_reasons_and_the_data_of_the_window(client, flare_day, db_session):
    fl, prods, other, cals = flare_day
    h = make_event(db_session, "FL", FLARE["start"] + MIN, FLARE["peak"] + MIN, FLARE["end"], source="hek",
                   frm_name="SWPC", noaa_ar=11226)
    from backend.services.events import associate_events

    associate_events(db_session, start=FLARE["start"], end=FLARE["end"])
    html = client.get(f"/events/{fl.id}").text
    assert "same flare in GOES and HEK (SWPC): peaks 60 s apart, both NOAA AR 11226" in html
    assert "SDI</b>: 10 frames, 10 L2 products (newest version of each frame)" in html
    assert "no frame or product is linked to it explicitly" in html
    assert f"/api/v1/events/{fl.id}/curves?format=fits" in html and 'id="curves-figure"' in html


def test_figure_breaks_lines_at_skipped_frames_and_xrs_gaps():
    """A skipped LST frame (a step of 2 cadences) and an XRS gap (null) or missing XRS samples
    break the lines; nothing is bridged."""
    from types import SimpleNamespace

    from backend.render.event_figures import event_curves_figure
    from backend.services.event_curves import CalibrationSetUsed, EventCurves
    from backend.services.xray import XRaySeriesSamples

    t0 = FLARE["start"]
    ev = SimpleNamespace(id=7, event_type="FL", start_time=t0, peak_time=FLARE["peak"], end_time=FLARE["end"])
    times = [t0 + k * 10 * MIN for k in (0, 1, 2, 4, 5)]  # the frame at +30 min is missing
    tai = [float(Time(t0 + dt.timedelta(seconds=2 * k)).unix_tai) for k in (0, 1, 2, 3, 10, 11)]  # 4..9 missing
    series = SimpleNamespace(satellite="GOES-15", original_name="x.nc", cadence_s=2.0, id=1)
    xr = XRaySeriesSamples(series=series, t_tai=tai, xrsa=[1e-8] * 6, xrsb=[1e-6, None, 1e-6, 1e-6, 1e-6, 1e-6],
                           xrsa_quality=[0] * 6, xrsb_quality=[0, 2, 0, 0, 0, 0])
    c = EventCurves(event=ev, channel="SDI", start=t0 - 30 * MIN, end=FLARE["end"] + 30 * MIN, unit="erg cm-2 s-1 sr-1",
                    calibration=CalibrationSetUsed(key="dark:1", params_hash="c" * 64, files=[("dark", 1, 4)]),
                    lst_times=times, disk=[1.0, 2.0, 3.0, 4.0, 5.0], product_ids=[1, 2, 3, 4, 5], xray=xr)
    fig = event_curves_figure(c).to_plotly_json()
    disk = fig["data"][0]
    assert list(disk["y"]) == [1.0, 2.0, 3.0, None, 4.0, 5.0]  # broken where +30 min is missing
    xrsb = fig["data"][1]
    assert list(xrsb["y"]) == [1e-6, None, 1e-6, 1e-6, None, 1e-6, 1e-6]  # the flagged sample, then the hole
    assert "dark #1 v4" in [a for a in fig["layout"]["annotations"] if a.get("name") == "calibration"][0]["text"]


def test_utc_times_of_tai_seconds_are_astropys_isot_to_the_digit():
    """``tai_to_utc_iso`` and ``tai_to_datetime`` (erfa's fields, formatted here) give what
    astropy's ``Time(..., format="unix_tai").utc.isot`` writes, rounding and leap second
    included: every 0.0997 s through the 2016-12-31 leap second, values that round up to the
    next second, and random times 1975-2030."""
    from backend.services.xray import tai_to_datetime, tai_to_utc_iso

    leap = float(Time("2016-12-31T23:59:60.5", scale="utc").unix_tai)
    rng = np.random.default_rng(5)
    ts = ([leap + k * 0.0997 for k in range(-30, 31)] + [leap + 0.4999999, leap - 0.5000004, 1e9 + 0.9999996, 1e9 + 0.9994996]
          + rng.uniform(float(Time("1975-01-01").unix_tai), float(Time("2030-01-01").unix_tai), 2000).tolist())
    iso3 = Time(np.asarray(ts), format="unix_tai").utc
    iso3.precision = 3
    assert tai_to_utc_iso(ts) == [s + "Z" for s in iso3.isot]
    iso6 = Time(np.asarray(ts), format="unix_tai").utc
    iso6.precision = 6
    want = [dt.datetime.fromisoformat(s[:17] + "59.999999" if s[17:19] == "60" else s).replace(tzinfo=dt.UTC)
            for s in iso6.isot]
    assert tai_to_datetime(ts) == want
    assert sum(s[17:19] == "60" for s in iso3.isot) >= 10  # the leap second is in it


def test_the_figure_route_writes_the_same_bytes_as_plotly_with_validation():
    """The route's lean writer (sample lists set after plotly's checks) gives exactly
    ``Figure.to_json()``: with every trace (ROI, disk, both XRS curves, gaps, None, notes) and
    with none (no product, no series)."""
    from types import SimpleNamespace

    from backend.render.event_figures import event_curves_figure, event_curves_figure_json
    from backend.services.event_curves import CalibrationSetUsed, EventCurves
    from backend.services.xray import XRaySeriesSamples

    t0 = FLARE["start"]
    ev = SimpleNamespace(id=7, event_type="FL", start_time=t0, peak_time=FLARE["peak"], end_time=FLARE["end"])
    times = [t0 + k * 10 * MIN for k in (0, 1, 2, 4, 5)]
    tai = [float(Time(t0 + dt.timedelta(seconds=2 * k)).unix_tai) for k in (0, 1, 2, 3, 10, 11)]
    series = SimpleNamespace(satellite="GOES-15", original_name="x.nc", cadence_s=2.0, id=1)
    xr = XRaySeriesSamples(series=series, t_tai=tai, xrsa=[1e-8, 2e-8, None, 3e-8, 1e-8, 1e-8],
                           xrsb=[1e-6, None, 1.5e-6, 1e-6, 2.25e-6, 1e-6])
    full = EventCurves(event=ev, channel="SDI", start=t0 - 30 * MIN, end=FLARE["end"] + 30 * MIN, unit="erg cm-2 s-1 sr-1",
                       calibration=CalibrationSetUsed(key="dark:1", params_hash="c" * 64, files=[("dark", 1, 4)]),
                       lst_times=times, disk=[1.0, 2.0, None, 4.0, 5.5], roi=[3.0, 1e-3, 2.0, None, 7.0],
                       roi_box=(-420.5, 310.0, 60.0), product_ids=[1, 2, 3, 4, 5], xray=xr, xray_others=["GOES-13"])
    full.notes = ["a note under the plot", "and a second"]
    empty = EventCurves(event=ev, channel="WST", start=t0 - 30 * MIN, end=FLARE["end"] + 30 * MIN, unit="",
                        xray_coverage=[("GOES-15", t0 - dt.timedelta(days=3), t0 - dt.timedelta(days=2))])
    # NumPy scalars, as a service could hand them over: plotly's checks make Python numbers of them
    numpy_values = EventCurves(event=ev, channel="SDI", start=full.start, end=full.end, unit="DN s-1",
                               lst_times=times, disk=[np.float32(0.1), np.float64(2.5), None, np.float32(np.nan), 1.0],
                               product_ids=[1, 2, 3, 4, 5],
                               xray=XRaySeriesSamples(series=series, t_tai=tai, xrsa=[np.float32(1e-8)] * 6,
                                                      xrsb=[np.float64(1e-6)] * 6))
    for c in (full, empty, numpy_values):
        assert event_curves_figure_json(c) == event_curves_figure(c).to_json()
    body = json.loads(event_curves_figure_json(full))
    assert [len(t["x"]) for t in body["data"]] == [6, 6, 7, 7]  # the samples are in it, with the breaks


def test_curves_of_long_and_reversed_events_and_the_read_budget(client, db_session, flare_day, monkeypatch):
    """A 12-day event gets a 2-day window centred on its peak, an end before the start is said,
    never a 5xx; products not read within the budget are listed, and a reload (cached) reads them."""
    from backend.services import event_curves as ec

    fl, prods, other, cals = flare_day
    long = make_event(db_session, "AR", FLARE["start"] - dt.timedelta(days=6), FLARE["peak"],
                      FLARE["start"] + dt.timedelta(days=6), source="hek")
    back = make_event(db_session, "FL", FLARE["start"], None, FLARE["start"] - dt.timedelta(hours=3), goes_class="C1.0")
    for e in (long, back):
        for path in ("/curves/figure", "/curves", "/curves?format=csv"):
            r = client.get(f"/api/v1/events/{e.id}{path}")
            assert r.status_code == 200, (e.event_type, path, r.text)
    body = client.get(f"/api/v1/events/{long.id}/curves").json()
    assert any("lasts 12.0 days" in n for n in body["notes"])
    w0, w1 = (dt.datetime.fromisoformat(body[k]) for k in ("window_start", "window_end"))
    assert w1 - w0 == ec.MAX_CURVES_WINDOW and w0 < FLARE["peak"] < w1
    assert body["xray"] is not None and len(body["times"]) == 10
    assert any("before its start" in n for n in client.get(f"/api/v1/events/{back.id}/curves").json()["notes"])
    # a budget spent at once: nothing read, each product listed; the figure says so
    from backend.services import products as ps

    ps._disk_mean_cached.cache_clear()
    ps._region_mean_cached.cache_clear()
    ps._DISK_KEYS.clear()
    ps._REGION_KEYS.clear()
    real_budget = ec.read_budget_s
    monkeypatch.setattr(ec, "read_budget_s", lambda: -1.0)
    starved = client.get(f"/api/v1/events/{fl.id}/curves").json()
    assert starved["times"] == [] and len(starved["skipped"]) == 10
    assert {s["reason"] for s in starved["skipped"]} == {"not measured within this request's time budget"}
    fig = client.get(f"/api/v1/events/{fl.id}/curves/figure").json()
    assert any("10 of 10 products not measured yet" in a["text"] for a in fig["layout"]["annotations"])
    monkeypatch.setattr(ec, "read_budget_s", lambda: 30.0)
    assert len(client.get(f"/api/v1/events/{fl.id}/curves").json()["times"]) == 10
    monkeypatch.setattr(ec, "read_budget_s", lambda: -1.0)  # now cached: read with no budget left
    again = client.get(f"/api/v1/events/{fl.id}/curves").json()
    assert len(again["times"]) == 10 and again["skipped"] == []
    # the request's budget is read_budget_s(): with no deadline, a constant that would starve the
    # read (CURVES_READ_BUDGET_S < 0) does not limit it
    from backend.settings import get_settings

    ps._disk_mean_cached.cache_clear()
    ps._region_mean_cached.cache_clear()
    ps._DISK_KEYS.clear()
    ps._REGION_KEYS.clear()
    with monkeypatch.context() as m:
        m.setattr(ec, "read_budget_s", real_budget)
        m.setattr(ec, "CURVES_READ_BUDGET_S", -1.0)
        m.setenv("API_DEADLINE_S", "0")
        get_settings.cache_clear()
        try:
            unlimited = client.get(f"/api/v1/events/{fl.id}/curves").json()
        finally:
            get_settings.cache_clear()
    get_settings.cache_clear()
    assert len(unlimited["times"]) == 10 and unlimited["skipped"] == [], unlimited["skipped"]


@pytest.mark.parametrize(("deadline", "budget"), [("1.8", 1.0), ("20", 20 / 1.8), ("0", math.inf)])
def test_the_curves_read_budget_follows_the_api_deadline(monkeypatch, deadline, budget):
    """1 s of reading at the default 1.8 s deadline, scaled with a deployment's own, none without
    one: a server given a long deadline (the suite's 30 s, a slow host) reads every product."""
    from backend.services import event_curves as ec
    from backend.settings import get_settings

    with monkeypatch.context() as m:
        m.setenv("API_DEADLINE_S", deadline)
        get_settings.cache_clear()
        try:
            assert ec.read_budget_s() == pytest.approx(budget)
        finally:
            get_settings.cache_clear()
    get_settings.cache_clear()
