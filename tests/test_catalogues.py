"""Catalogue parsers on the real catalogue files of ``sample-data/real/events``.

Expected values are read off the files by eye (the rows are quoted in the comments) and,
for positions, recomputed here with sunpy directly (``get_earth`` at the exact time, no
interpolation), so a wrong column, sign, day or transform fails a test.
"""

from __future__ import annotations

import datetime as dt
import re

import astropy.units as u
import numpy as np
import pytest
from astropy.coordinates import SkyCoord
from astropy.time import Time

from pipelines.catalogues import (
    CATALOGUES,
    CatalogueError,
    full_noaa_number,
    parse_catalogue,
    parse_cdaw,
    parse_donki,
    parse_goes_xrs,
    parse_hek,
    parse_lst_wst,
    parse_noaa_srs,
)
from pipelines.catalogues.coords import direction_position_angle, heliographic_to_helioprojective
from pipelines.catalogues.goes_xrs import goes_class_flux
from tests.conftest import SAMPLE

EVENTS = SAMPLE / "events"
UTC = dt.UTC


def T(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s).replace(tzinfo=UTC)


def sunpy_hpc(lat: float, lon: float, when: dt.datetime) -> tuple[float, float]:
    """Helioprojective x/y [arcsec] of a photospheric point seen from Earth, straight sunpy."""
    from sunpy.coordinates import HeliographicStonyhurst, Helioprojective, get_earth
    from sunpy.sun import constants

    t = Time(when.replace(tzinfo=None), scale="utc")
    c = SkyCoord(lon * u.deg, lat * u.deg, constants.radius, frame=HeliographicStonyhurst, obstime=t)
    hpc = c.transform_to(Helioprojective(observer=get_earth(t), obstime=t))
    return hpc.Tx.to_value(u.arcsec), hpc.Ty.to_value(u.arcsec)


def by_key(result, key):
    hits = [e for e in result.events if e.source_key == key]
    assert len(hits) == 1, f"{key!r}: {len(hits)} events"
    return hits[0]


# -- shared parses (the GOES years take a few seconds) ----------------------------------------


@pytest.fixture(scope="module")
def goes():
    return {f.name: parse_goes_xrs(f) for f in sorted((EVENTS / "goes_xrs_reports").glob("*.txt"))}


@pytest.fixture(scope="module")
def cdaw():
    return parse_cdaw(EVENTS / "cdaw" / "cdaw_lasco_cme_univ_1996-2013.txt")


@pytest.fixture(scope="module")
def wst():
    return parse_lst_wst(EVENTS / "aso-s_lst_wst" / "jing2024_wst_whitelight_flares_table2.txt")


@pytest.fixture(scope="module")
def donki():
    return parse_donki(EVENTS / "donki" / "donki_cme_2010-04_2021-11.json")


# -- coordinates ------------------------------------------------------------------------------


def test_heliographic_to_helioprojective_matches_sunpy_with_exact_ephemeris():
    rng = np.random.default_rng(1)
    n = 200  # above the direct-ephemeris limit: the daily interpolation is used
    when = [T("1995-01-01") + dt.timedelta(hours=float(h)) for h in rng.uniform(0, 24 * 365 * 20, n)]
    lat, lon = rng.uniform(-60, 60, n), rng.uniform(-80, 80, n)
    from pipelines.catalogues.coords import as_time

    x, y, visible = heliographic_to_helioprojective(lat, lon, as_time(when))
    for i in range(0, n, 40):
        ex, ey = sunpy_hpc(lat[i], lon[i], when[i])
        assert x[i] == pytest.approx(ex, abs=0.02)
        assert y[i] == pytest.approx(ey, abs=0.02)
    assert visible.all()
    # behind the limb: projected near the limb, flagged not visible
    x2, _, vis2 = heliographic_to_helioprojective([0.0], [-95.0], as_time([T("2003-10-28T11:00")]))
    assert not vis2[0] and -990 < x2[0] < -900


def test_position_angle_of_cone_axis():
    t = Time(["2010-06-21T00:00"] * 4)
    pa, sep = direction_position_angle([0, 0, 60, -20], [-90, 90, 0, 0], t)
    # east limb 90, west limb 270 (CCW from north), north 0; B0 ~ +1.6 deg in June
    assert pa[0] == pytest.approx(90, abs=2.0) and pa[1] == pytest.approx(270, abs=2.0)
    assert pa[2] == pytest.approx(0, abs=1e-6) or pa[2] == pytest.approx(360, abs=1e-6)
    assert pa[3] == pytest.approx(180, abs=1e-6)
    assert sep[0] == pytest.approx(90, abs=2) and sep[3] == pytest.approx(20 + 1.6, abs=0.5)


def test_full_noaa_number():
    assert full_noaa_number(3664, T("2024-05-10")) == 13664
    assert full_noaa_number(1, T("2002-06-24")) == 10001
    assert full_noaa_number(9997, T("2002-06-24")) == 9997  # an old region still on the disk
    assert full_noaa_number(7938, T("1996-01-06")) == 7938
    assert full_noaa_number(12673, T("2017-09-06")) == 12673
    assert full_noaa_number(0, T("1996-01-06")) is None


# -- LST/WST white-light flares (Jing et al. 2024, Table 2) -------------------------------------


def test_wst_table_has_its_39_flares(wst):
    assert (wst.rows_in, len(wst.events), wst.refused) == (39, 39, [])
    assert {e.event_type for e in wst.events} == {"FL"} and {e.channels for e in wst.events} == {"WST"}
    assert len({e.source_key for e in wst.events}) == 39
    assert min(e.start_time for e in wst.events) == T("2022-11-07T00:07")
    assert max(e.start_time for e in wst.events) == T("2023-05-20T14:52")
    assert sum(e.goes_class.startswith("X") for e in wst.events) == 6


def test_wst_first_row(wst):
    # 07.11.2022 N12E56 M5.2 00:11 00:05 00:07 00:07 00:13 6.0 16.9 9.94 404±20 (5.33±0.09)×1026
    e = by_key(wst, "2022-11-07T00:07/N12E56")
    assert (e.start_time, e.peak_time, e.end_time) == (T("2022-11-07T00:07"), T("2022-11-07T00:07"),
                                                       T("2022-11-07T00:13"))
    assert e.goes_class == "M5.2" and (e.hgs_lat, e.hgs_lon) == (12.0, -56.0)
    assert (e.peak_value, e.peak_unit) == (16.9, "%")
    a = e.attributes
    assert a["goes_peak_time"] == T("2022-11-07T00:11") and a["hxr_peak_time"] == T("2022-11-07T00:05")
    assert (a["duration_min"], a["rm_percent"]) == (6.0, 9.94)
    assert (a["area_arcsec2"], a["area_err_arcsec2"]) == (404.0, 20.0)
    assert a["energy_erg"] == pytest.approx(5.33e26) and a["energy_err_erg"] == pytest.approx(0.09e26)
    ex, ey = sunpy_hpc(12, -56, T("2022-11-07T00:07"))
    assert (e.hpc_x, e.hpc_y) == (pytest.approx(ex, abs=0.05), pytest.approx(ey, abs=0.05))
    assert e.hpc_x < -700 and e.hpc_y > 0  # north-east


def test_wst_flattened_superscripts_missing_hxr_and_upper_limits(wst):
    # 09.01.2023 N24E79 X1.9 18:50 - 18:46 18:50 19:02 16 101 31.9 (2.62±0.33)×103 (1.91±0.03) ×1030
    e = by_key(wst, "2023-01-09T18:46/N24E79")
    assert e.attributes["area_arcsec2"] == pytest.approx(2620.0)
    assert e.attributes["area_err_arcsec2"] == pytest.approx(330.0)
    assert e.attributes["energy_erg"] == pytest.approx(1.91e30)
    assert e.attributes["hxr_peak_time"] is None and e.peak_value == 101.0
    # 30.12.2022 N20E07 ... <2.0 (one WST frame only)
    e = by_key(wst, "2022-12-30T19:36/N20E07")
    assert e.attributes["duration_min"] == 2.0 and e.attributes["duration_is_upper_limit"] is True
    assert "duration_is_upper_limit" not in by_key(wst, "2022-11-07T00:07/N12E56").attributes


def test_wst_row_with_end_before_peak_is_kept_and_flagged(wst):
    # 16.12.2022 S21W64 M3.5 02:01 - 01:40 01:54 01:48 8.0 (as published)
    e = by_key(wst, "2022-12-16T01:40/S21W64")
    assert (e.start_time, e.peak_time, e.end_time) == (T("2022-12-16T01:40"), T("2022-12-16T01:54"),
                                                       T("2022-12-16T01:48"))
    assert e.flags == ["end_before_peak"]
    assert [x.source_key for x in wst.events if x.flags] == ["2022-12-16T01:40/S21W64"]


# -- GOES XRS reports -------------------------------------------------------------------------


def test_goes_every_row_is_stored_or_refused_with_a_reason(goes):
    assert len(goes) == 25
    for name, r in goes.items():
        text = (EVENTS / "goes_xrs_reports" / name).read_bytes().decode("ascii", "replace")
        rows = [ln for ln in text.splitlines() if re.match(r"^\d{11}", ln)]
        assert r.rows_in == len(rows) == len(r.events) + len(r.refused), name
        assert all(why for _, why in r.refused)
    assert sum(r.rows_in for r in goes.values()) == 47399
    assert sum(len(r.events) for r in goes.values()) == 47100
    refused = [why for r in goes.values() for _, why in r.refused]
    assert len(refused) == 299
    assert sum("verbatim" in w for w in refused) == 296  # repeated blocks of 2005/2006 and single lines
    assert sum(w.startswith("same event as") for w in refused) == 3


def test_goes_mixed_line_lengths_of_2003(goes):
    r = goes["goes-xrs-report_2003.txt"]
    text = (EVENTS / "goes_xrs_reports" / "goes-xrs-report_2003.txt").read_text("ascii", "replace")
    lengths = {len(ln.rstrip("\r\n")) for ln in text.splitlines() if ln[:1].isdigit()}
    assert lengths == {79, 85, 86, 90, 120}
    assert r.rows_in == 2394 and len(r.events) == 2394 and not r.refused
    # 31777031028  0951 1124 1110 S16E084B  X172  GOES 1.8E00  10486  (the Halloween X17)
    e = by_key(r, "2003-10-28T0951/1124/1110/X17.2")
    assert (e.start_time, e.peak_time, e.end_time) == (T("2003-10-28T09:51"), T("2003-10-28T11:10"),
                                                       T("2003-10-28T11:24"))
    assert e.goes_class == "X17.2" and e.peak_value == pytest.approx(1.72e-3) and e.peak_unit == "W m-2"
    assert (e.hgs_lat, e.hgs_lon, e.noaa_ar) == (-16.0, -8.0, 10486)
    assert e.attributes["integrated_flux_J_m2"] == 1.8 and e.attributes["optical_importance"] == "4B"
    ex, ey = sunpy_hpc(-16, -8, T("2003-10-28T11:10"))
    assert (e.hpc_x, e.hpc_y) == (pytest.approx(ex, abs=0.05), pytest.approx(ey, abs=0.05))
    # 31777031104  1929 2006 1950 S19W833B  X280: the largest class in the list
    e = by_key(r, "2003-11-04T1929/2006/1950/X28.0")
    assert e.goes_class == "X28.0" and e.peak_value == pytest.approx(2.8e-3) and e.hgs_lon == 83.0


def test_goes_flare_crossing_midnight(goes):
    # 31777090109  2358 0005 0003   B 40   GOES 7.6E-05 11010
    e = by_key(goes["goes-xrs-report_2009.txt"], "2009-01-09T2358/0005/0003/B4.0")
    assert e.start_time == T("2009-01-09T23:58")
    assert e.peak_time == T("2009-01-10T00:03") and e.end_time == T("2009-01-10T00:05")
    assert set(e.flags) == {"end_next_day", "peak_next_day"}
    assert e.noaa_ar == 11010 and e.hpc_x is None
    # before 1997 the day after is written as hours 24-47: 31777900127  2347 2409 2359  M 10
    e = by_key(goes["goes-xrs-report_1990.txt"], "1990-01-27T2347/2409/2359/M1.0")
    assert e.end_time == T("1990-01-28T00:09") and e.peak_time == T("1990-01-27T23:59")


def test_goes_quirks(goes):
    # February 1994 lists start/max/end: 31777940201  1505 1508 1512  B 16
    e = by_key(goes["goes-xrs-report_1994.txt"], "1994-02-01T1505/1512/1508/B1.6")
    assert (e.peak_time, e.end_time) == (T("1994-02-01T15:08"), T("1994-02-01T15:12"))
    assert "end_max_columns_swapped" in e.flags
    swapped = [x for x in goes["goes-xrs-report_1994.txt"].events if "end_max_columns_swapped" in x.flags]
    assert {x.start_time.month for x in swapped} == {2, 7}
    assert all(x.peak_time <= x.end_time for x in swapped if x.peak_time and x.end_time)
    # a row without X-ray class is kept: 31777990802  1823 1836 1830   GOES 2.0E-03
    e = by_key(goes["goes-xrs-report_1999.txt"], "1999-08-02T1823/1836/1830/-")
    assert e.goes_class is None and e.peak_value is None and "no_xray_class" in e.flags
    assert e.attributes["integrated_flux_J_m2"] == 2.0e-3
    # record code typo 33777 (25 rows of 1991, one of 1992): kept and flagged
    assert sum("record_code_33777" in x.flags for x in goes["goes-xrs-report_1991.txt"].events) == 25
    assert sum("record_code_33777" in x.flags for r in goes.values() for x in r.events) == 26
    # locations beyond 90 deg (N16E91 style) are projected near the limb; those on the far
    # hemisphere (B0 decides, at high latitude E92 can still be visible) are flagged
    located = [x for r in goes.values() for x in r.events if x.hgs_lon is not None]
    beyond = [x for x in located if abs(x.hgs_lon) > 90]
    behind = [x for x in located if "behind_limb" in x.flags]
    assert len(beyond) == 24 and len(behind) == 323
    assert all(850 < np.hypot(x.hpc_x, x.hpc_y) < 1000 for x in beyond + behind)
    assert all(abs(x.hgs_lon) >= 80 for x in behind)


def test_goes_two_reports_of_one_flare_keep_the_one_with_a_location(goes):
    r = goes["goes-xrs-report_2000.txt"]
    e = by_key(r, "2000-03-09T1833/1841/1838/C2.9")
    assert e.attributes["location"] == "S19E54" and e.noaa_ar == 8906
    assert ("goes-xrs-report_2000.txt:450",
            "same event as goes-xrs-report_2000.txt:451 (source key '2000-03-09T1833/1841/1838/C2.9'); "
            "that row was kept") in r.refused


def test_goes_class_flux():
    assert goes_class_flux("M5.2") == pytest.approx(5.2e-5)
    assert goes_class_flux("X28") == pytest.approx(2.8e-3)
    assert goes_class_flux("A0.6") == pytest.approx(6e-9)
    with pytest.raises(ValueError):
        goes_class_flux("Q1.0")


# -- CDAW LASCO CMEs --------------------------------------------------------------------------


def test_cdaw_counts_and_halos(cdaw):
    assert (cdaw.rows_in, len(cdaw.events), cdaw.refused) == (22375, 22375, [])
    assert {e.event_type for e in cdaw.events} == {"CE"}
    halos = [e for e in cdaw.events if e.attributes.get("halo")]
    assert len(halos) == 588
    assert all(e.position_angle is None and e.angular_width == 360.0 for e in halos)
    assert all(e.position_angle is not None for e in cdaw.events if not e.attributes.get("halo"))
    assert sum(e.speed_km_s is None for e in cdaw.events) == 108  # '----' linear speed


def test_cdaw_known_rows(cdaw):
    # 1996/01/11 00:14:36 267 18 499 571 426 0 -64.3* ------- ------- 272 Only C3
    e = by_key(cdaw, "1996-01-11T00:14:36/MPA272")
    assert e.start_time == T("1996-01-11T00:14:36") and e.peak_time is None and e.end_time is None
    assert (e.position_angle, e.angular_width, e.speed_km_s) == (267.0, 18.0, 499.0)
    assert e.attributes["acceleration_m_s2"] == -64.3 and e.attributes["acceleration_uncertain"] is True
    assert e.attributes["mass_g"] is None and e.channels == "LASCO-C3"
    # 2003/10/28 11:30:05 Halo 360 2459 2686 2229 2268 -105.2* ------- ------- 15
    e = by_key(cdaw, "2003-10-28T11:30:05/MPA15")
    assert e.position_angle is None and e.angular_width == 360 and e.speed_km_s == 2459.0
    assert e.attributes["speed_2nd_order_initial_km_s"] == 2686.0 and e.description.startswith("Halo CME")
    # 1996/03/18 02:45:52 94 22 ---- ---- ---- ---- ------ ------- ------- 92 Very Poor Event; Only C2; Unable ...
    e = by_key(cdaw, "1996-03-18T02:45:52/MPA92")
    assert e.speed_km_s is None and e.attributes["acceleration_m_s2"] is None
    assert e.attributes["quality"] == "very poor" and e.channels == "LASCO-C2"
    assert "Unable to measure" in e.attributes["remarks"]
    # 1996/01/26 09:16:19 90 27 262 ... 3.0e+14 1.0e+29 (mass and energy, not uncertain)
    e = by_key(cdaw, "1996-01-26T09:16:19/MPA90")
    assert e.attributes["mass_g"] == 3.0e14 and e.attributes["kinetic_energy_erg"] == 1.0e29
    assert "mass_uncertain" not in e.attributes


def test_cdaw_shared_first_appearance_times_are_distinct_events(cdaw):
    same = [e for e in cdaw.events if e.start_time == T("1997-02-08T18:30:05")]
    assert sorted(e.position_angle for e in same) == [289.0, 325.0]


# -- HEK --------------------------------------------------------------------------------------


def test_hek_events_of_mixed_types():
    r = parse_hek(EVENTS / "hek" / "hek-events_2024-05-10.json")
    assert (r.rows_in, len(r.events), r.refused) == (5, 5, [])
    assert sorted(e.event_type for e in r.events) == ["CE", "CH", "FL", "FL", "FL"]
    swpc = by_key(r, "ivo://helio-informatics.org/FL_SWPC_20240510_065326_20240510001000")
    assert swpc.goes_class == "M1.3" and swpc.noaa_ar == 13664 and swpc.frm_name == "SWPC"
    assert swpc.hpc_x is None and swpc.hgs_lat is None and "noposition" in swpc.flags
    assert (swpc.start_time, swpc.peak_time, swpc.end_time) == (T("2024-05-10T00:10"), T("2024-05-10T00:13"),
                                                                T("2024-05-10T00:22"))
    ssw = by_key(r, "ivo://helio-informatics.org/FL_SSWLatestEvents_gev_20240510_0010")
    assert ssw.goes_class == "M1.5" and ssw.noaa_ar == 13664 and ssw.attributes["ar_noaanum_as_reported"] == 3664
    assert (ssw.hpc_x, ssw.hpc_y, ssw.hgs_lat, ssw.hgs_lon) == (519.409032, -316.552788, -22.0, 36.0)
    fd = [e for e in r.events if e.frm_name == "Flare Detective - Trigger Module"][0]
    assert fd.frm_version == "0.51" and fd.channels == "AIA 131"
    assert (fd.peak_value, fd.peak_unit) == (pytest.approx(135.545, abs=1e-3), "DN/sec/pixel")
    cme = [e for e in r.events if e.event_type == "CE"][0]
    assert (cme.position_angle, cme.angular_width, cme.speed_km_s) == (273.0, 92.0, 679.0)
    assert cme.frm_name.startswith("CACTus") and cme.channels == "LASCO C2,C3"
    assert "hpc_geom" not in cme.attributes


def test_hek_associations():
    r = parse_hek(EVENTS / "hek" / "hek-events_2024-05-10.json")
    base = "ivo://helio-informatics.org/CH_SPoCA_20240516_"
    assert [(a.kind, a.key, a.other_key) for a in r.associations] == [
        ("is_followed_by", base + "143017_20240509T204241_0", base + "143156_20240510T004241_0"),
        ("is_followed_by", base + "143156_20240510T004241_0", base + "143508_20240510T054241_0"),
    ]
    assert r.associations[0].attributes["strength"] == 1.0
    ch = [e for e in r.events if e.event_type == "CH"][0]
    assert len(ch.attributes["hek_associations"]) == 2  # the middle of the chain


# -- DONKI ------------------------------------------------------------------------------------


def test_donki_counts_and_analysis_choice(donki):
    assert (donki.rows_in, len(donki.events), donki.refused) == (3402, 3402, [])
    how = [e.attributes["analysis_choice"] for e in donki.events]
    assert how.count("most_accurate") == 3273 and how.count("no_analysis") == 69
    assert how.count("none_marked_most_accurate") == 40 and how.count("most_accurate_of_several") == 20
    assert all(e.speed_km_s is None and e.position_angle is None
               for e in donki.events if e.attributes["analysis_choice"] == "no_analysis")


def test_donki_known_cmes(donki):
    # 2010-04-03T09:54Z, S20E05; most accurate analysis lat 7 lon 8 halfAngle 26 speed 620
    e = by_key(donki, "2010-04-03T09:54:00-CME-001")
    assert e.start_time == T("2010-04-03T09:54") and (e.hgs_lat, e.hgs_lon) == (-20.0, -5.0)
    assert (e.speed_km_s, e.angular_width) == (620.0, 52.0)
    assert e.attributes["analysis"]["isMostAccurate"] is True
    pa, sep = direction_position_angle([7.0], [8.0], Time(["2010-04-03T09:54"]))
    assert e.position_angle == pytest.approx(pa[0], abs=0.01) and 300 < e.position_angle < 360  # north-west
    assert "direction_near_sun_earth_line" in e.flags  # 15.6 deg from the Sun-Earth line
    # 2017-09-10 X8.2 CME: S09W91 AR 12673, most accurate lat -12 lon 85 halfAngle 54 speed 2650
    e = by_key(donki, "2017-09-10T16:09:00-CME-001")
    assert (e.speed_km_s, e.angular_width, e.noaa_ar) == (2650.0, 108.0, 12673)
    assert 255 < e.position_angle < 270  # just south of west
    assert "behind_limb" in e.flags
    # two analyses marked most accurate: the higher level of data (2) wins
    e = by_key(donki, "2010-08-01T08:20:00-CME-001")
    assert (e.speed_km_s, e.angular_width) == (1300.0, 76.0)
    assert e.attributes["analysis_choice"] == "most_accurate_of_several"


# -- NOAA SRS ---------------------------------------------------------------------------------


def test_srs_rows_and_section_ii_refused():
    r = parse_catalogue("noaa_srs", EVENTS / "noaa_srs")
    assert (r.rows_in, len(r.events), len(r.refused)) == (88, 74, 14)
    assert all("section II" in why for _, why in r.refused)
    assert {e.event_type for e in r.events} == {"AR"}


def test_srs_known_regions():
    r = parse_noaa_srs(EVENTS / "noaa_srs" / "20150101SRS.txt")
    # 2246 N19W56 108 0070 Hsx 01 01 Alpha, locations valid at 31/2400Z
    e = by_key(r, "2015-01-01/12246")
    assert (e.start_time, e.end_time) == (T("2015-01-01T00:00"), T("2015-01-02T00:00"))
    assert (e.hgs_lat, e.hgs_lon, e.noaa_ar) == (19.0, 56.0, 12246)
    a = e.attributes
    assert (a["area_msh"], a["mcintosh_class"], a["mag_type"], a["carrington_longitude_deg"]) == (70, "Hsx", "Alpha", 108)
    ex, ey = sunpy_hpc(19, 56, T("2015-01-01T00:00"))
    assert (e.hpc_x, e.hpc_y) == (pytest.approx(ex, abs=0.05), pytest.approx(ey, abs=0.05))
    r = parse_noaa_srs(EVENTS / "noaa_srs" / "20020624SRS.txt")
    assert by_key(r, "2002-06-24/10001").hgs_lat == 21.0  # printed 0001 after region 10000
    assert by_key(r, "2002-06-24/9997").attributes["section"] == "IA"  # an old region, not 19997


def test_srs_agrees_with_sunpy_reader():
    """Latitude, longitude and section of every region agree with sunpy's own SRS reader."""
    from sunpy.io.special.srs import read_srs

    for f in sorted((EVENTS / "noaa_srs").glob("*SRS.txt")):
        ours = {(e.attributes["section"], e.noaa_ar % 10000, e.hgs_lat, e.hgs_lon) for e in parse_noaa_srs(f).events}
        t = read_srs(f)
        theirs = {(str(row["ID"]), int(row["Number"]) % 10000, float(row["Latitude"].to_value(u.deg)),
                   float(row["Longitude"].to_value(u.deg)))
                  for row in t if str(row["ID"]) in ("I", "IA")}
        assert ours == theirs, f.name


# -- registry ---------------------------------------------------------------------------------


def test_parse_catalogue_finds_every_catalogue_in_the_events_folder():
    assert set(CATALOGUES) == {"lst_wst", "goes_xrs", "cdaw", "hek", "donki", "noaa_srs", "stix"}
    r = parse_catalogue("lst_wst", EVENTS)
    assert len(r.events) == 39
    with pytest.raises(KeyError):
        parse_catalogue("cactus", EVENTS)
    with pytest.raises(CatalogueError):
        parse_catalogue("hek", EVENTS / "no-such-folder")


def test_unreadable_files_raise_catalogue_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(CatalogueError):
        parse_hek(bad)
    with pytest.raises(CatalogueError):
        parse_donki(bad)
    srs = tmp_path / "20200101SRS.txt"
    srs.write_text("I.  Regions with Sunspots.\n1234 N10E10 100 0010 Axx 01 01 Alpha\n")
    with pytest.raises(CatalogueError, match="Issued"):
        parse_noaa_srs(srs)


def test_malformed_rows_are_refused_with_a_reason(tmp_path):
    f = tmp_path / "goes-xrs-report_2001.txt"
    f.write_text(
        "31777010101  0809 0836 0819                                C 49    GOES 1.0E-03\r\n"
        "31777011341  0809 0836 0819                                C 49    GOES\r\n"     # month 13
        "31777010102  08x9 0836 0819                                C 49    GOES\r\n"     # bad start
        "garbage\r\n\x1a"
    )
    r = parse_goes_xrs(f)
    assert (r.rows_in, len(r.events)) == (4, 1)
    reasons = dict(r.refused)
    assert "invalid date" in reasons[f"{f.name}:2"] and "start time" in reasons[f"{f.name}:3"]
    assert "YYMMDD" in reasons[f"{f.name}:4"]
