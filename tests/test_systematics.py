"""Frame-wide systematics flagged (issue 27, item 5) and strict FITS units (item 8).

A 256 px WST frame whose header is 5 px off the Sun: the limb fit finds the true centre
4.9 px away, the chain refuses it (more than the 4.22 px of pointing error it believes at
256 px) and keeps the header's centre. The product must say so: ``QUALITY`` bit
``CENTRE_REFUSED``, ``CENTFAIL`` with the reason, ``CSYER1/2`` the pointing uncertainty (no
``CRDER``: nothing was measured); the product row's ``quality_flags``, the product and event
searches' ``systematics=`` filter and the pages show it. The same frame with a true header
flags nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import re
import uuid

import pytest
from astropy import units as u
from astropy.io import fits

from pipelines.calibration.l2.centre import pointing_uncertainty_px
from pipelines.calibration.l2.flow import calibrate_frame
from pipelines.calibration.l2.quality import SYSTEMATICS, FrameQuality, flag_frame, frame_quality
from pipelines.fitsio import read_image
from pipelines.simulation import simulate

N = 256


@pytest.fixture(scope="module")
def pointed(tmp_path_factory):
    """``{pointing error [px]: (L2Result, simulated frame)}`` for a 256 px WST frame, 5 px and 0 px off."""
    from validation.gates import load_masters

    out = {}
    for err in (5.0, 0.0):
        sim = simulate(tmp_path_factory.mktemp(f"p{err:g}"), channels=("WST",), naxis=N, noise=True, seed=3,
                       sdi_sequence=False, pointing_error_px=err)
        raw = read_image(sim.frames[0].raw_path)
        out[err] = (calibrate_frame(raw.data, raw.header, load_masters(sim.calibration_files)["WST"]), sim.frames[0])
    return out


def test_a_5_px_pointing_error_at_256_px_is_flagged_with_its_reason_and_error(pointed):
    l2, frame = pointed[5.0]
    h = l2.header
    assert pointing_uncertainty_px(N) == pytest.approx(4.222, abs=1e-3)
    assert frame_quality(h) == FrameQuality.CENTRE_REFUSED and h["QUALITY"] == 1
    assert h["FITCSTAT"] == "FAILED" and h["CTRSRC"] == "HEADER"
    assert h["CENTFAIL"] == f"fit {h['CTRSHIFT']:.2f} px off header, limit 4.22 px" and h["CTRSHIFT"] > 4.5
    # the refused fit was right: its centre is the true one, the header's 5 px off
    assert math.hypot(h["FITCRPX1"] - 1 - frame.crpix[0] + 1, h["FITCRPX2"] - frame.crpix[1]) < 0.5
    # the stated systematic error covers the header's actual error; no random error claimed
    scale = abs(float(h["CDELT1"]))
    true_err = math.hypot(frame.header_crpix[0] - frame.crpix[0], frame.header_crpix[1] - frame.crpix[1])
    assert true_err == pytest.approx(5.0, abs=1e-3)
    assert h["CSYER1"] == h["CSYER2"] == pytest.approx(h["CTRSHIFT"] * scale, rel=1e-2)
    assert h["CSYER1"] / scale >= 0.95 * true_err
    assert "CRDER1" not in h and "CRDER2" not in h
    assert any("CENTRE_REFUSED" in line for line in h["HISTORY"])


def test_a_true_header_flags_nothing(pointed):
    h = pointed[0.0][0].header
    assert h["QUALITY"] == 0 and frame_quality(h) == FrameQuality(0)
    assert not {"CENTFAIL", "STRYFAIL", "FLATPLAN"} & set(h)
    assert h["FITCSTAT"] == "OK" and h["CSYER1"] / abs(float(h["CDELT1"])) < 0.5 and "CRDER1" in h


def test_flag_frame_sets_bits_and_keeps_reasons_on_one_card():
    h = fits.Header()
    flag_frame(h, FrameQuality.STRAY_LIGHT_REFUSED, "model 40 % above the measured off-limb level " * 3)
    flag_frame(h, FrameQuality.FLAT_PLANE_STATED, "plane from a prior")
    assert h["QUALITY"] == 12 and frame_quality(h) == FrameQuality.STRAY_LIGHT_REFUSED | FrameQuality.FLAT_PLANE_STATED
    assert h["FLATPLAN"] == "plane from a prior" and h["STRYFAIL"].startswith("model 40 %")
    for card in h.cards:
        if card.keyword != "HISTORY":
            assert len(card.image) == 80 and card.comment  # one card each, with its comment
    fits.PrimaryHDU(header=h).verify("exception")
    with pytest.raises(ValueError):
        flag_frame(h, FrameQuality.CENTRE_REFUSED | FrameQuality.CENTRE_FAILED, "two at once")
    assert set(SYSTEMATICS) == {"centre_refused", "centre_failed", "stray_light_refused", "flat_plane_stated"}
    # the API's enum is the bits' names and "any"
    import typing

    from backend.api.params import Systematic

    assert typing.get_args(Systematic) == ("any", *SYSTEMATICS)


def test_a_flat_that_states_its_plane_flags_the_frame(tmp_path):
    from validation.gates import load_masters

    sim = simulate(tmp_path, channels=("WST",), naxis=64, noise=True, seed=3, sdi_sequence=False)
    raw = read_image(sim.frames[0].raw_path)
    cals = load_masters(sim.calibration_files)["WST"]
    cals["flat"].parameters["FLATPLSR"] = "STATED"
    cals["flat"].parameters["FLATPLWY"] = "symmetric disk prior"
    h = calibrate_frame(raw.data, raw.header, cals).header
    assert frame_quality(h) & FrameQuality.FLAT_PLANE_STATED
    assert h["FLATPLAN"].startswith("symmetric disk prior")


def test_every_channel_bunit_parses_as_strict_fits(tmp_path):
    """Item 8: each channel's product BUNIT (and its UNCERT's) is read by astropy's FITS unit
    parser with ``parse_strict='raise'``; SCI's is dimensionless and ``MSBVALUE`` converts it."""
    from validation.gates import load_masters

    from pipelines.fitsio import write_fits_atomic
    from pipelines.io import load_l2
    from pipelines.products import build_product_hdul
    from pipelines.units import header_unit, msb_definition

    sim = simulate(tmp_path, naxis=64, noise=True, seed=4, sdi_sequence=False)
    masters = load_masters(sim.calibration_files)
    seen = set()
    for f in sim.frames:
        if f.channel in seen:
            continue
        seen.add(f.channel)
        raw = read_image(f.raw_path)
        path = tmp_path / f"{f.channel}.fits"
        write_fits_atomic(build_product_hdul(calibrate_frame(raw.data, raw.header, masters[f.channel]), "test"), path)
        with fits.open(path) as hdul:
            for hdu in hdul[:2]:
                unit = u.Unit(hdu.header["BUNIT"], format="fits", parse_strict="raise")
                if f.channel.startswith("SCI"):
                    assert unit == u.dimensionless_unscaled
                    assert hdu.header["BUNITNAM"] == "MSB"
                else:
                    assert unit == u.erg / u.cm ** 2 / u.s / u.sr
            h = hdul[0].header
        if f.channel.startswith("SCI"):
            assert h["MSBVALUE"] == pytest.approx(msb_definition(f.channel).radiance, rel=1e-6)
            assert (1 * header_unit(h)).to_value("erg cm-2 s-1 sr-1") == pytest.approx(h["MSBVALUE"], rel=1e-6)
            assert (1 * load_l2(path).unit).to_value("erg cm-2 s-1 sr-1") == pytest.approx(h["MSBVALUE"], rel=1e-6)
    assert seen == {"SDI", "WST", "SCI-UV", "SCI-WL"}


@pytest.mark.postgres
def test_the_flag_is_stored_searched_and_shown(pointed, api_client, db_session, tmp_path):
    """The writer stores QUALITY on the product row; ``systematics=`` finds the flagged product
    and the event detected on it, not the clean ones; a bad value is a 422; the product and
    event pages say it."""
    from backend.settings import get_settings
    from backend.models import Event, EventProduct, Frame, Product, ProductState
    from backend.worker.processing import write_product

    settings = get_settings()
    t0 = dt.datetime(2031, 3, 4, 5, 6, tzinfo=dt.UTC)
    prods, events = {}, {}
    for k, (err, (l2, _)) in enumerate(sorted(pointed.items())):
        key = uuid.uuid4().hex
        fr = Frame(channel_code="WST", date_obs=t0 + dt.timedelta(minutes=k), exposure_s=1.0, level="L1",
                   naxis1=N, naxis2=N, path=f"/nonexistent/{key}.fits", original_name=f"{key[:8]}.fits",
                   sha256=hashlib.sha256(key.encode()).hexdigest(), size_bytes=1, header={})
        db_session.add(fr)
        db_session.flush()
        p = Product(frame_id=fr.id, level="L2", version=1, calibration_key="k", params_hash=key, parameters={},
                    software_version="test", state=ProductState.writing)
        db_session.add(p)
        db_session.flush()
        assert write_product(db_session, settings, p, l2)
        ev = Event(event_type="FL", source="detected", source_key=key, start_time=fr.date_obs,
                   attributes={}, channels="WST")
        db_session.add(ev)
        db_session.flush()
        db_session.add(EventProduct(event_id=ev.id, product_id=p.id))
        db_session.flush()
        prods[err], events[err] = p, ev
    assert prods[5.0].quality_flags == int(FrameQuality.CENTRE_REFUSED) and prods[0.0].quality_flags == 0
    assert prods[5.0].header["CENTFAIL"] == pointed[5.0][0].header["CENTFAIL"]

    span = {"start": (t0 - dt.timedelta(hours=1)).isoformat(), "end": (t0 + dt.timedelta(hours=1)).isoformat()}
    for name in ("centre_refused", "any"):
        r = api_client.get("/api/v1/products", params={**span, "systematics": name})
        assert r.status_code == 200, r.text
        assert [p["id"] for p in r.json()["items"]] == [prods[5.0].id]
        assert r.json()["items"][0]["systematics"] == ["centre_refused"]
        r = api_client.get("/api/v1/events", params={**span, "systematics": name})
        assert r.status_code == 200, r.text
        assert [e["id"] for e in r.json()["items"]] == [events[5.0].id]
    for name in ("centre_failed", "stray_light_refused"):
        assert api_client.get("/api/v1/products", params={**span, "systematics": name}).json()["items"] == []
        assert api_client.get("/api/v1/events", params={**span, "systematics": name}).json()["items"] == []
    r = api_client.get("/api/v1/products", params={**span})
    assert {p["id"] for p in r.json()["items"]} == {prods[5.0].id, prods[0.0].id}
    for path in ("/api/v1/products", "/api/v1/events"):
        r = api_client.get(path, params={"systematics": "centre"})
        assert r.status_code == 422 and "systematics" in r.text
    assert api_client.get(f"/api/v1/products/{prods[5.0].id}").json()["quality_flags"] == 1
    # the bulk download takes the product filters, this one included
    sh = api_client.get("/api/v1/products/download.sh", params={**span, "systematics": "centre_refused"})
    assert sh.status_code == 200 and f"_f{prods[5.0].frame_id}_" in sh.text and f"_f{prods[0.0].frame_id}_" not in sh.text

    # a saved search takes the same filter (and is told of the flagged ones only)
    from backend.services import saved_searches
    from backend.services.event_search import search_events

    for kind in ("products", "events"):
        q = saved_searches.normalise_query(kind, {**span, "systematics": "centre_refused"})
        assert q["systematics"] == "centre_refused"
        with pytest.raises(saved_searches.SavedSearchError, match="systematics"):
            saved_searches.normalise_query(kind, {"systematics": "centre"})
    found = db_session.scalars(saved_searches._product_query(
        saved_searches.normalise_query("products", {**span, "systematics": "any"}))).all()
    assert [p.id for p in found] == [prods[5.0].id]
    filters = saved_searches._event_filters(saved_searches.normalise_query("events", {**span, "systematics": "any"}))
    assert [e.id for e in search_events(db_session, filters).items] == [events[5.0].id]

    page = api_client.get(f"/products/{prods[5.0].id}/view")
    assert page.status_code == 200
    assert "CENTRE_REFUSED" in page.text and pointed[5.0][0].header["CENTFAIL"] in page.text
    assert "CENTRE_REFUSED" not in api_client.get(f"/products/{prods[0.0].id}/view").text
    page = api_client.get(f"/events/{events[5.0].id}")
    assert page.status_code == 200 and "CENTRE_REFUSED" in page.text
    # the product search page takes it too (a select field), and its archive link carries it
    page = api_client.get("/products/search", params={**span, "systematics": "centre_refused"})
    assert page.status_code == 200
    assert [int(x) for x in re.findall(r'<tr data-product-id="(\d+)"', page.text)] == [prods[5.0].id]
    assert "systematics=centre_refused" in re.search(r'id="ps-archive" href="([^"]+)"', page.text).group(1)
    assert '<option value="centre_refused" selected>' in page.text
    unfiltered = api_client.get("/products/search", params=span).text
    assert {int(x) for x in re.findall(r'<tr data-product-id="(\d+)"', unfiltered)} == {prods[5.0].id, prods[0.0].id}
    bad = api_client.get("/products/search", params={**span, "systematics": "centre"})
    assert bad.status_code == 200 and "systematics: &#39;centre&#39; is not one of" in bad.text
    assert "CENTRE_REFUSED" not in api_client.get(f"/events/{events[0.0].id}").text
