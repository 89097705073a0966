"""Defects reported on public trackers (sunpy, astropy) that could reach this platform's
catalogue importers, each turned into a test of our parsers. Each test names its thread; the
thread's URL is in the comment above it. Inputs are the real sample catalogues or small
files written here in the catalogues' own formats.
"""

from __future__ import annotations

import datetime as dt
import json
import warnings

import pytest

from pipelines.catalogues import parse_hek, parse_noaa_srs
from pipelines.catalogues.goes_xrs import goes_class_flux
from pipelines.catalogues.records import goes_flux_or_none
from pipelines.errors import CatalogueWarning
from tests.conftest import SAMPLE

HEK_FILE = SAMPLE / "events" / "hek" / "hek-events_2024-05-10.json"
UTC = dt.UTC


def T(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s).replace(tzinfo=UTC)


def hek_doc() -> dict:
    return json.loads(HEK_FILE.read_text(encoding="utf-8"))


def write_hek(tmp_path, doc, raw: bytes | None = None):
    p = tmp_path / "hek.json"
    p.write_bytes(raw if raw is not None else json.dumps(doc).encode("utf-8"))
    return p


# https://github.com/sunpy/sunpy/pull/4088 (fixes sunpy issue 4087): the HEK client failed
# in json.load on a response that was not valid UTF-8; sunpy now decodes with errors replaced.
def test_sunpy_4088_hek_response_not_utf8_is_read(tmp_path):
    doc = hek_doc()
    for e in doc["result"]:
        if e["frm_name"] == "SWPC":
            e["comment"] = "MARKER"
    raw = json.dumps(doc, ensure_ascii=False).encode("utf-8").replace(b"MARKER", b"Temp 10\xb0 C")  # Latin-1 degree
    p = write_hek(tmp_path, doc, raw)
    with pytest.warns(CatalogueWarning, match="not valid UTF-8"):
        r = parse_hek(p)
    assert (r.rows_in, len(r.events)) == (5, 5)
    swpc = next(e for e in r.events if e.frm_name == "SWPC")
    assert swpc.attributes["comment"] == "Temp 10° C"


# https://github.com/sunpy/sunpy/pull/7035: SRS files of the 1990s are in upper case
# (':ISSUED:', 'BXO', 'BETA'); sunpy's reader failed on them and cast the classes to title
# case; the same PR notes a spurious '99999' line at the end of some files.
def test_sunpy_7035_upper_case_srs_and_trailing_99999(tmp_path):
    p = tmp_path / "19961208SRS.txt"
    p.write_text(
        ":PRODUCT: 19961208SRS.TXT\n:ISSUED: 1996 DEC 08 0030 UTC\n"
        "# PREPARED JOINTLY BY THE U.S. DEPT. OF COMMERCE, NOAA,\n"
        "JOINT USAF/NOAA SOLAR REGION SUMMARY\n"
        "SRS NUMBER 343 ISSUED AT 0030Z ON 08 DEC 1996\n"
        "I.  REGIONS WITH SUNSPOTS.  LOCATIONS VALID AT 07/2400Z\n"
        "NMBR LOCATION  LO  AREA  Z   LL   NN MAG TYPE\n"
        "8003 S30E23   354  0010 BXO  04   04 BETA\n"
        "IA. H-ALPHA PLAGES WITHOUT SPOTS.  LOCATIONS VALID AT 07/2400Z DEC\n"
        "NMBR  LOCATION  LO\nNONE\n"
        "II. REGIONS DUE TO RETURN 08 DEC TO 10 DEC\nNMBR LAT    LO\n7997 N05    242\n99999\n",
        encoding="ascii",
    )
    r = parse_noaa_srs(p)
    assert (r.rows_in, len(r.events), len(r.refused)) == (2, 1, 1)
    (ar,) = r.events
    assert (ar.noaa_ar, ar.hgs_lat, ar.hgs_lon, ar.start_time) == (8003, -30.0, -23.0, T("1996-12-08T00:00"))
    assert (ar.attributes["mcintosh_class"], ar.attributes["mag_type"]) == ("Bxo", "Beta")


# https://github.com/sunpy/sunpy/issues/7126: in the SRS of 1996-12-09 the first row of
# section II is glued to its column titles ('NMBR LAT    LO7997 N05   242'); sunpy's reader
# made extra columns of it. Here the row must be read (and refused as section II), not
# dropped with the title line.
def test_sunpy_7126_row_glued_to_column_titles_is_counted(tmp_path):
    p = tmp_path / "19961209SRS.txt"
    p.write_text(
        ":PRODUCT: 19961209SRS.TXT\n:ISSUED: 1996 DEC 09 0030 UTC\n"
        "I.  REGIONS WITH SUNSPOTS.  LOCATIONS VALID AT 08/2400Z\n"
        "NMBR LOCATION  LO  AREA  Z   LL   NN MAG TYPE\n"
        "8003 S30E10   354  0010 BXO  04   04 BETA\n"
        "IA. H-ALPHA PLAGES WITHOUT SPOTS.  LOCATIONS VALID AT 08/2400Z DEC\n"
        "NMBR  LOCATION  LO\nNONE\n"
        "II. REGIONS DUE TO RETURN 09 DEC TO 11 DEC\n"
        "NMBR LAT    LO7997 N05    242\n",
        encoding="ascii",
    )
    r = parse_noaa_srs(p)
    assert r.rows_in == 2 and len(r.events) == 1
    (rid, why), = r.refused
    assert rid.endswith(":10") and why.startswith("section II")


# https://github.com/sunpy/sunpy/pull/1597: flare classes are case-insensitive ('m1.5' is
# M1.5, as sunpy's flareclass_to_flux reads it).
def test_sunpy_1597_lower_case_goes_class(tmp_path):
    assert goes_class_flux("m1.5") == pytest.approx(1.5e-5)
    doc = hek_doc()
    ssw = next(e for e in doc["result"] if e["frm_name"] == "SSW Latest Events")
    ssw["fl_goescls"] = "m1.5"
    r = parse_hek(write_hek(tmp_path, doc))
    ev = next(e for e in r.events if e.frm_name == "SSW Latest Events")
    assert ev.goes_class == "M1.5" and goes_flux_or_none(ev.goes_class) == pytest.approx(1.5e-5)


# https://github.com/sunpy/sunpy/pull/6260 (issue 6259): GOES XRS values of -9999 are fill,
# not flux (sunpy replaces them with NaN and exposes the quality flags). A HEK flare whose
# fl_peakflux is the fill must not be stored as a peak of -9999.
def test_sunpy_6260_goes_fill_value_is_not_a_flux(tmp_path):
    doc = hek_doc()
    swpc = next(e for e in doc["result"] if e["frm_name"] == "SWPC")
    swpc.update(fl_peakflux=-9999, fl_peakfluxunit="W/m^2")
    r = parse_hek(write_hek(tmp_path, doc))
    ev = next(e for e in r.events if e.frm_name == "SWPC")
    assert (ev.peak_value, ev.peak_unit) == (None, None)
    assert "peak_flux_fill:-9999" in ev.flags and ev.goes_class == "M1.3"


# https://github.com/astropy/astropy/issues/9837: ISO 8601's end-of-day midnight '24:00:00'
# is not read by astropy Time nor Python's datetime. A HEK time written so is 00:00 of the
# next day, not a refused row.
def test_astropy_9837_iso_midnight_24_00(tmp_path):
    doc = hek_doc()
    ch = next(e for e in doc["result"] if e["event_type"] == "CH")
    ch["event_endtime"] = "2024-05-09T24:00:00"
    r = parse_hek(write_hek(tmp_path, doc))
    assert r.refused == []
    ev = next(e for e in r.events if e.event_type == "CH")
    assert ev.end_time == T("2024-05-10T00:00")


# https://github.com/sunpy/sunpy/pull/7627 (comment in sunpy issue 5006): converting HEK
# results failed when some time values were empty or missing, met on the AR 13664 search
# of 2024-05-10..12. Empty and missing peak/end times are None; the region is 13664.
def test_sunpy_7627_hek_empty_or_missing_times(tmp_path):
    doc = hek_doc()
    ar = {
        "event_type": "AR", "kb_archivid": "ivo://helio-informatics.org/AR_SWPC_20240510_13664",
        "frm_name": "NOAA SWPC Observer", "event_starttime": "2024-05-10T00:00:00", "event_peaktime": "",
        "ar_noaanum": 13664, "hpc_x": 520.0, "hpc_y": -300.0, "hgs_x": 33.0, "hgs_y": -17.0,
    }
    doc["result"].append(ar)
    doc["result"].append(dict(ar, kb_archivid=ar["kb_archivid"] + "_b", event_endtime=None, ar_noaanum=3664))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = parse_hek(write_hek(tmp_path, doc))
    ars = [e for e in r.events if e.event_type == "AR"]
    assert len(ars) == 2 and r.refused == []
    assert all(e.peak_time is None and e.end_time is None for e in ars)
    assert [e.noaa_ar for e in ars] == [13664, 13664]
