"""Exports validate and say what users need (issue 25.7): VOEvent against the IVOA 2.0
schema, VOTable through astropy's validator with observatory/instrument/channel and ISO
times, the STIX list's GOES level as a level, the light curves' uncertainty.

The VOEvent schema is the IVOA file vendored in ``tests/schemas`` (its README names the
source and licence), read with ``lxml``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import warnings
from pathlib import Path

import numpy as np
import pytest
from lxml import etree

from backend.models import EventAssociation
from tests.test_api import MIN, T0, client, make_event, make_frame, make_product, settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.postgres

SCHEMAS = Path(__file__).resolve().parent / "schemas"
VOE = "{http://www.ivoa.net/xml/VOEvent/v2.0}"


@pytest.fixture(scope="module")
def voevent_schema() -> etree.XMLSchema:
    return etree.XMLSchema(etree.parse(str(SCHEMAS / "VOEvent-v2.0.xsd")))


@pytest.fixture
def varied_events(db_session):
    """Events of every kind of position and source: helioprojective (a detection linked with a
    GOES flare), heliographic only (a STIX flare hidden from Earth, with the list's GOES
    level), none (a NOAA region without a location), a CDAW CME with XML-special text."""
    det = make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN, source="detected", channels="SDI",
                     hpc_x=305.0, hpc_y=-95.0, frm_name="lst-sdi-flare", frm_version="1.0.0",
                     peak_value=2.5e-3, peak_unit="erg / (s cm2 sr)")
    goes = make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN, source="goes_xrs", goes_class="M1.0",
                      goes_flux=1.0e-5, hpc_x=310.0, hpc_y=-90.0)
    stix = make_event(db_session, "FL", T0, T0 + 6 * MIN, T0 + 8 * MIN, source="stix", channels="4-10 keV",
                      hgs_lon=120.0, hgs_lat=15.0, peak_value=3.0e4, peak_unit="counts 4-10 keV",
                      attributes={"goes_xrs_class_at_flare_time": "B7.4",
                                  "goes_xrs_flux_at_flare_time_w_m2": 7.4e-7,
                                  "goes_class_note": "GOES XRS 0.1-0.8 nm level at the flare time"})
    region = make_event(db_session, "AR", T0, None, None, source="noaa_srs", noaa_ar=13664)
    cme = make_event(db_session, "CE", T0, None, T0 + 60 * MIN, source="cdaw", channels="LASCO-C2,LASCO-C3",
                     position_angle=270.0, angular_width=360.0, speed_km_s=1500.0,
                     description="Halo CME <all> & \"fast\"")
    hek = make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 9 * MIN, source="hek", channels="AIA 131",
                     hpc_x=-500.0, hpc_y=200.0,
                     attributes={"obs_observatory": "SDO", "obs_instrument": "AIA", "obs_channelid": "131"})
    donki = make_event(db_session, "CE", T0, None, None, source="donki", channels="LASCO-C2,COR2-A",
                       attributes={"instruments": ["SOHO: LASCO/C2", "STEREO A: SECCHI/COR2"]})
    db_session.add_all([EventAssociation(event_id=det.id, other_event_id=goes.id, kind="same_flare"),
                        EventAssociation(event_id=goes.id, other_event_id=det.id, kind="same_flare")])
    db_session.flush()
    return {"detected": det, "goes_xrs": goes, "stix": stix, "noaa_srs": region, "cdaw": cme, "hek": hek,
            "donki": donki}


#: (obs_observatory, obs_instrument, obs_channelid) of each event of ``varied_events``
OBSERVED = {
    "detected": ("ASO-S", "LST", "SDI"),
    "goes_xrs": ("GOES", "XRS", None),
    "stix": ("Solar Orbiter", "STIX", "4-10 keV"),
    "noaa_srs": ("NOAA SWPC", "SRS", None),
    "cdaw": ("SOHO", "LASCO", "LASCO-C2,LASCO-C3"),
    "hek": ("SDO", "AIA", "131"),
    "donki": ("SOHO,STEREO A", "LASCO,SECCHI", "C2,COR2"),
}


# -- VOEvent ---------------------------------------------------------------------------------


def test_voevent_of_every_kind_of_event_validates_against_the_ivoa_2_0_schema(client, varied_events,
                                                                               voevent_schema):
    for name, e in varied_events.items():
        r = client.get(f"/api/v1/events/{e.id}/voevent")
        assert r.status_code == 200, (name, r.text)
        doc = etree.fromstring(r.content)
        ok = voevent_schema.validate(doc)
        assert ok, (name, [f"{x.line}: {x.message}" for x in voevent_schema.error_log])


def test_voevent_position_is_the_events_direction_from_the_earth_in_icrs(client, varied_events):
    from astropy.coordinates import get_sun
    from astropy.time import Time

    det = etree.fromstring(client.get(f"/api/v1/events/{varied_events['detected'].id}/voevent").content)
    ac = det.find("WhereWhen/ObsDataLocation/ObservationLocation/AstroCoords")
    assert ac.get("coord_system_id") == "UTC-ICRS-GEO"
    pos = ac.find("Position2D")
    assert pos.get("unit") == "deg" and pos.findtext("Name1") == "RA" and pos.findtext("Name2") == "Dec"
    ra, dec = float(pos.findtext("Value2/C1")), float(pos.findtext("Value2/C2"))
    sun = get_sun(Time(T0 + 5 * MIN))  # geocentric apparent (GCRS): within aberration (~20") of the geometric
    sep = np.hypot((ra - sun.ra.deg) * np.cos(np.radians(dec)), dec - sun.dec.deg) * 3600
    assert 250 < sep < 370, sep  # 305", -95" from disk centre: 319" from the Sun's centre (+- aberration)
    params = {p.get("name"): p.get("value") for p in det.iter("Param")}
    assert float(params["hpc_x"]) == 305.0 and float(params["hpc_y"]) == -95.0  # HEK's names keep the solar frame
    stix = etree.fromstring(client.get(f"/api/v1/events/{varied_events['stix'].id}/voevent").content)
    assert stix.find(".//Position2D/Value2/C1") is not None  # heliographic only: a direction all the same
    region = etree.fromstring(client.get(f"/api/v1/events/{varied_events['noaa_srs'].id}/voevent").content)
    assert region.find(".//Position2D") is None  # no position: none invented


# -- CSV and VOTable -------------------------------------------------------------------------


def test_csv_names_observatory_instrument_channel_and_the_stix_goes_level(client, varied_events):
    r = client.get("/api/v1/events", params={"format": "csv", "limit": 50})
    assert r.status_code == 200
    rows = {int(row["id"]): row for row in csv.DictReader(io.StringIO(r.text))}
    for name, e in varied_events.items():
        row = rows[e.id]
        got = (row["obs_observatory"] or None, row["obs_instrument"] or None, row["obs_channelid"] or None)
        assert got == OBSERVED[name], (name, got)
    stix, goes = rows[varied_events["stix"].id], rows[varied_events["goes_xrs"].id]
    assert stix["goes_level"] == "B7.4" and float(stix["goes_level_flux"]) == pytest.approx(7.4e-7)
    assert stix["goes_class"] == "" and stix["goes_flux"] == ""  # a level at the flare time, not a GOES class
    assert goes["goes_class"] == "M1.0" and goes["goes_level"] == ""


def test_votable_passes_astropys_validator_with_iso_times_and_the_observation_columns(client, varied_events):
    from astropy.io.votable import parse, validate

    r = client.get("/api/v1/events", params={"format": "votable", "limit": 50})
    assert r.status_code == 200
    report = io.StringIO()
    assert validate(io.BytesIO(r.content), output=report, xmllint=False), report.getvalue()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no VOTable warning either
        vot = parse(io.BytesIO(r.content))
    table = vot.get_first_table()
    (timesys,) = vot.resources[0].time_systems
    assert timesys.timescale == "UTC"
    for f in table.fields:
        if f.name in ("start_time", "peak_time", "end_time"):
            assert (f.datatype, f.arraysize, f.xtype, f.ref) == ("char", "*", "timestamp", timesys.ID), f.name
    t = table.to_table()
    by_id = {int(row["id"]): row for row in t}
    start = by_id[varied_events["detected"].id]["start_time"]
    start = start.decode() if isinstance(start, bytes) else str(start)
    assert start == T0.strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, e in varied_events.items():
        row = by_id[e.id]
        got = tuple(None if np.ma.is_masked(row[c]) or str(row[c]) == "" else str(row[c])  # VOTable: null = ""
                    for c in ("obs_observatory", "obs_instrument", "obs_channelid"))
        assert got == OBSERVED[name], (name, got)
    assert str(by_id[varied_events["stix"].id]["goes_level"]) == "B7.4"
    assert str(t["goes_level_flux"].unit) == "W / m2"


def test_light_rows_carry_the_attributes_on_sqlite_too(sqlite_env):
    """The embedded default (SQLite) reads the same attributes into light rows as PostgreSQL."""
    from backend.db import session_scope
    from backend.services.event_formats import events_csv
    from backend.services.event_search import EventFilters, search_events

    with session_scope() as s:
        make_event(s, "FL", T0, T0 + 5 * MIN, None, source="stix",
                   attributes={"goes_xrs_class_at_flare_time": "C2.0", "goes_xrs_flux_at_flare_time_w_m2": 2e-6})
        make_event(s, "CE", T0, None, None, source="donki", attributes={"instruments": ["SOHO: LASCO/C3"]})
        s.commit()
        page = search_events(s, EventFilters(), light=True)
        rows = list(csv.DictReader(io.StringIO(events_csv(page.items))))
    by_source = {r["source"]: r for r in rows}
    assert by_source["stix"]["goes_level"] == "C2.0" and by_source["stix"]["obs_instrument"] == "STIX"
    assert (by_source["donki"]["obs_observatory"], by_source["donki"]["obs_instrument"],
            by_source["donki"]["obs_channelid"]) == ("SOHO", "LASCO", "C3")


# -- light curves with their uncertainty ------------------------------------------------------


def _with_uncert(path: Path, sigma: float) -> None:
    """Add an ``UNCERT`` image (``sigma`` everywhere) to a product file, as the writer places it."""
    from astropy.io import fits

    with fits.open(path) as h:
        hdus = [fits.PrimaryHDU(h[0].data, h[0].header),
                fits.ImageHDU(np.full(h[0].data.shape, sigma, np.float32), name="UNCERT"),
                *[x.copy() for x in h[1:]]]
    fits.HDUList(hdus).writeto(path, checksum=True, overwrite=True)


def test_light_curves_csv_fits_and_json_carry_the_uncertainty(client, db_session, tmp_path, curves_read_unbudgeted):
    from astropy.io import fits
    from astropy.table import Table

    from backend.services import products as products_service

    e = make_event(db_session, "FL", T0, T0 + 5 * MIN, T0 + 10 * MIN, hpc_x=0.0, hpc_y=0.0)
    sigmas = (2.0, 4.0, None)  # the last product predates UNCERT
    prods = []
    for k, (value, sigma) in enumerate(zip((100.0, 140.0, 120.0), sigmas)):
        p = make_product(db_session, make_frame(db_session, "SDI", T0 + 5 * k * MIN), tmp_path, disk_value=value)
        p.params_hash = "one-set"  # one calibration set: the curves draw all three
        if sigma is not None:
            _with_uncert(Path(p.path), sigma)
        prods.append(p)
    db_session.flush()
    n_disk = [products_service.disk_integrated_mean(p.path).n_pixels for p in prods]
    n_roi = [products_service.region_mean(p.path, 0.0, 0.0, products_service.ROI_HALF_WIDTH).n_pixels for p in prods]
    want_disk = [None if s is None else s / np.sqrt(n) for s, n in zip(sigmas, n_disk)]
    want_roi = [None if s is None else s / np.sqrt(n) for s, n in zip(sigmas, n_roi)]

    body = client.get(f"/api/v1/events/{e.id}/curves").json()
    assert body["disk"] == pytest.approx([100.0, 140.0, 120.0])
    assert body["disk_sigma"][:2] == pytest.approx(want_disk[:2], rel=1e-6) and body["disk_sigma"][2] is None
    assert body["roi_sigma"][:2] == pytest.approx(want_roi[:2], rel=1e-6) and body["roi_sigma"][2] is None

    lc = client.get(f"/api/v1/events/{e.id}/lightcurve", params={"region": "disk"}).json()
    assert lc["values"] == pytest.approx([100.0, 140.0, 120.0])
    assert lc["uncertainties"][:2] == pytest.approx(want_disk[:2], rel=1e-6) and lc["uncertainties"][2] is None

    text = client.get(f"/api/v1/events/{e.id}/curves", params={"format": "csv"}).text
    rows = list(csv.DictReader(line for line in io.StringIO(text) if not line.startswith("#")))
    disk = [r for r in rows if r["curve"] == "lst_disk"]
    assert [r["uncertainty"] for r in disk][2] == ""
    assert [float(r["uncertainty"]) for r in disk[:2]] == pytest.approx(want_disk[:2], rel=1e-2)
    roi = [r for r in rows if r["curve"] == "lst_roi"]
    assert [float(r["uncertainty"]) for r in roi[:2]] == pytest.approx(want_roi[:2], rel=1e-2)

    r = client.get(f"/api/v1/events/{e.id}/curves", params={"format": "fits"})
    with fits.open(io.BytesIO(r.content), checksum=True) as h:
        lst = Table.read(h["LST"], mask_invalid=False)
    assert str(lst["DISK_ERR"].unit) == str(lst["DISK_MEAN"].unit) == "erg / (s sr cm2)"
    assert list(lst["DISK_ERR"][:2]) == pytest.approx(want_disk[:2], rel=1e-6) and np.isnan(lst["DISK_ERR"][2])
    assert list(lst["ROI_ERR"][:2]) == pytest.approx(want_roi[:2], rel=1e-6)
    out = tmp_path / "curves.fits"
    out.write_bytes(r.content)
    assert_fitsverify_clean(out)


def assert_fitsverify_clean(path: Path) -> None:
    """HEASARC's fitsverify finds no error and no warning in ``path``."""
    import shutil
    import subprocess

    from tests.conftest import require

    exe = shutil.which("fitsverify")
    require(exe is not None, "Debian's fitsverify is not installed (scripts/ensure-services.sh installs it)")
    run = subprocess.run([exe, str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


# -- the STIX list's GOES level in the pages ---------------------------------------------------


def test_stix_rows_show_their_goes_level_as_a_level_in_the_pages(client, varied_events):
    stix, goes = varied_events["stix"], varied_events["goes_xrs"]
    page = client.get(f"/events/{stix.id}")
    assert page.status_code == 200
    assert 'id="goes-level">B7.4 (GOES XRS' in page.text and "not a GOES flare class" in page.text
    assert "<dt>GOES class</dt>" not in page.text
    listing = client.get("/", params={"start": "2024-05-14T00:00", "end": "2024-05-15T00:00"})
    assert listing.status_code == 200
    assert "GOES level B7.4" in listing.text and "GOES M1.0" in listing.text
    assert "GOES level" not in client.get(f"/events/{goes.id}").text
