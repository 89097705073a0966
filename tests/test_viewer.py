"""The image viewer's API (``/api/v1/products/{id}/region.png``, ``dq.png``, ``wcs``, ``pixel``,
``overlays``), the viewer page and the event page's context images, on real PostgreSQL.

The products are SDI frames of the simulator's EIT-based series (2004-03-01, hourly, with
the injected flare at helioprojective (-400", -350")), calibrated by the real chain
(:func:`pipelines.calibration.l2.flow.calibrate_frame`) and written by the real writer
(:func:`pipelines.products.build_product_hdul`, :func:`pipelines.fitsio.write_fits_atomic`):
their WCS and observer keywords are what the pipeline makes. Expected values are computed
here independently: astropy's WCS and percentiles, sunpy's map, and
:func:`sunpy.physics.differential_rotation.solar_rotate_coordinate` for the rotated flare.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import math
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from backend.models import Event, Frame, Product, ProductState
from pipelines.calibration.l2.steps import DQ

pytestmark = pytest.mark.postgres

#: Side of the simulated frames [pixel]: 2304"/256 = 9" a pixel (SDI's field binned 18x).
N_SIM = 256
#: Frames of the 13-frame series stored: before the flare's start (02:00), at its peak
#: (05:00) and at its end (09:00).
FRAMES = (2, 5, 9)
#: A pixel flagged COSMIC_RAY in the stored peak product (row, column).
CR_PIXEL = (100, 60)


@dataclass
class SimulatedSDI:
    flare: object  # pipelines.simulation.results.InjectedFlare
    frames: list  # (SimulatedFrame, L2Result) for FRAMES


@pytest.fixture(scope="module")
def simulated_sdi(tmp_path_factory) -> SimulatedSDI:
    return simulate_sdi(tmp_path_factory.mktemp("viewer_sim"))


def simulate_sdi(out: Path, naxis: int = N_SIM) -> SimulatedSDI:
    """The SDI series simulated (noise off) and FRAMES calibrated by the real chain."""
    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from pipelines.fitsio import read_image
    from pipelines.simulation import simulate

    res = simulate(out, channels=("SDI",), naxis=naxis, noise=False, seed=3, sdi_sequence=True)
    cals = {c.kind: load_calibration_master(c.path) for c in res.calibration_files}
    for i, c in enumerate(cals.values()):
        c.id = 100 + i
    frames = []
    for k in FRAMES:
        f = res.frames[k]
        raw = read_image(f.raw_path)
        l2 = calibrate_frame(raw.data, raw.header, cals)
        if k == 5:
            l2.dq[CR_PIXEL] |= np.uint8(DQ.COSMIC_RAY)
        frames.append((f, l2))
    return SimulatedSDI(flare=res.flare, frames=frames)


def store_product(session, store: Path, sim_frame, l2) -> Product:
    """Frame and product rows for one calibrated frame, its FITS written by the real writer
    (and its quicklook PNG) into the product store."""
    from astropy.time import Time

    from pipelines.fitsio import write_fits_atomic
    from pipelines.products import build_product_hdul, write_quicklook_png

    date_obs = Time(l2.header["DATE-OBS"], scale="utc").to_datetime(timezone=dt.UTC)
    key = uuid.uuid4().hex
    ny, nx = l2.data.shape
    frame = Frame(channel_code="SDI", date_obs=date_obs, exposure_s=1.0, level="L1", naxis1=nx, naxis2=ny,
                  path=str(sim_frame.raw_path), original_name=Path(sim_frame.raw_path).name,
                  sha256=hashlib.sha256(key.encode()).hexdigest(), size_bytes=nx * ny * 2,
                  header={"DATE-OBS": date_obs.isoformat()})
    session.add(frame)
    session.flush()
    stem = f"lst_sdi_l2_{date_obs:%Y%m%dT%H%M%S}_f{frame.id}_v1"
    path = store / "SDI" / f"{stem}.fits"
    path.parent.mkdir(parents=True, exist_ok=True)
    sha = write_fits_atomic(build_product_hdul(l2, software_version="test"), path)
    ql = write_quicklook_png(l2.data, l2.dq, path.with_suffix(".png"), "SDI")
    p = Product(frame_id=frame.id, level="L2", version=1, calibration_key="cal-v1", params_hash=key,
                parameters={}, software_version="test", state=ProductState.written, header={"BUNIT": l2.header["BUNIT"]},
                stats={}, path=str(path), sha256=sha, quicklook_path=str(ql))
    session.add(p)
    session.flush()
    return p


def add_flare(session, flare, **kw) -> Event:
    """The injected flare as a GOES-like catalogue event (position at its peak, as seen from Earth)."""
    from astropy.time import Time

    def t(iso):
        return Time(iso, scale="utc").to_datetime(timezone=dt.UTC)

    e = Event(event_type="FL", source=kw.pop("source", "goes_xrs"), source_key=uuid.uuid4().hex,
              start_time=t(flare.start), peak_time=t(flare.peak), end_time=t(flare.end),
              hpc_x=kw.pop("hpc_x", flare.hpc_x), hpc_y=kw.pop("hpc_y", flare.hpc_y),
              goes_class=kw.pop("goes_class", "M2.5"), attributes={}, **kw)
    session.add(e)
    session.flush()
    return e


def expected_rotated(fits_path: Path, hpc_x: float, hpc_y: float, event_time: dt.datetime):
    """Where a flare seen from Earth at ``event_time`` lies on the product at ``fits_path``:
    sunpy's ``solar_rotate_coordinate`` to the product's DATE-OBS and observer, then the
    product's WCS (astropy, on the FITS header). Returns (Tx, Ty [arcsec], x, y [pixel])."""
    import astropy.units as u
    import sunpy.map
    from astropy.coordinates import SkyCoord
    from astropy.io import fits
    from astropy.wcs import WCS
    from sunpy.coordinates import Helioprojective
    from sunpy.physics.differential_rotation import solar_rotate_coordinate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = sunpy.map.Map(str(fits_path), hdus=0)
        c = SkyCoord(hpc_x * u.arcsec, hpc_y * u.arcsec,
                     frame=Helioprojective(obstime=event_time, observer="earth"))
        rot = solar_rotate_coordinate(c, observer=m.observer_coordinate)  # to the map's reference date
        tx, ty = rot.Tx.to_value("arcsec"), rot.Ty.to_value("arcsec")
        w = WCS(fits.getheader(fits_path, 0))
        x, y = w.world_to_pixel_values(tx / 3600.0, ty / 3600.0)
    return float(tx), float(ty), float(x), float(y)


def decode_png(content: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(content)).convert("RGBA"))


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def stored(api_client, db_session, simulated_sdi):
    from backend.settings import get_settings

    store = get_settings().products
    prods = [store_product(db_session, store, f, l2) for f, l2 in simulated_sdi.frames]
    flare = add_flare(db_session, simulated_sdi.flare)
    return api_client, db_session, prods, flare


# -- region PNG -----------------------------------------------------------------------------


def test_region_png_is_block_averaged_with_whole_image_percentile_limits(stored):
    from astropy.visualization import AsymmetricPercentileInterval

    from pipelines.products import read_product

    client, _, prods, _ = stored
    p = prods[1]
    data, dq, _ = read_product(p.path, dtype=np.float64)
    good = np.isfinite(data) & (dq == 0)
    lo, hi = AsymmetricPercentileInterval(2.0, 98.0).get_limits(data[good])

    r = client.get(f"/api/v1/products/{p.id}/region.png", params=dict(size=64, stretch="linear", pmin=2, pmax=98,
                                                                       cmap="gray"))
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.headers["X-Region"] == f"0,{N_SIM},0,{N_SIM}" and r.headers["X-Decimation"] == "4"
    vmin, vmax = (float(v) for v in r.headers["X-Display-Limits"].split(","))
    assert vmin == pytest.approx(lo, rel=1e-5) and vmax == pytest.approx(hi, rel=1e-5)
    img = decode_png(r.content)
    assert img.shape == (64, 64, 4)
    # PNG row 0 is the top of the image (FITS row N-1); each PNG pixel a 4x4 block mean
    for prow, pcol in ((10, 20), (32, 32), (50, 12)):
        block = data[(63 - prow) * 4:(64 - prow) * 4, pcol * 4:(pcol + 1) * 4]
        expected = np.clip((np.nanmean(block) - lo) / (hi - lo), 0, 1) * 255
        assert abs(int(img[prow, pcol, 0]) - expected) <= 1.5, (prow, pcol, img[prow, pcol], expected)  # 255 colours

    # a zoomed region at full resolution: the same pixel has the same colour in two regions
    # (the limits are those of the whole image, not of the tile)
    a = client.get(f"/api/v1/products/{p.id}/region.png", params=dict(x0=40, x1=104, y0=60, y1=124, size=256))
    b = client.get(f"/api/v1/products/{p.id}/region.png", params=dict(x0=80, x1=200, y0=100, y1=220, size=256))
    assert a.headers["X-Decimation"] == "1" and a.headers["X-Region"] == "40,104,60,124"
    ia, ib = decode_png(a.content), decode_png(b.content)
    assert ia.shape == (64, 64, 4) and ib.shape == (120, 120, 4)
    x, y = 90, 110  # in both
    assert (ia[123 - y, x - 40] == ib[219 - y, x - 80]).all()
    # the log and asinh stretches are astropy's: a pixel's grey level follows LogStretch
    from astropy.visualization import ImageNormalize, LogStretch

    c = client.get(f"/api/v1/products/{p.id}/region.png", params=dict(x0=40, x1=104, y0=60, y1=124, size=256,
                                                                       stretch="log", pmin=2, pmax=98, cmap="gray"))
    norm = ImageNormalize(vmin=lo, vmax=hi, stretch=LogStretch(), clip=True)
    assert abs(int(decode_png(c.content)[123 - y, x - 40, 0]) - float(norm(data[y, x])) * 255) <= 1.5


def test_dq_layer_marks_the_selected_bits_only(stored):
    client, _, prods, _ = stored
    p = prods[1]
    y, x = CR_PIXEL
    r = client.get(f"/api/v1/products/{p.id}/dq.png", params=dict(x0=x - 8, x1=x + 8, y0=y - 8, y1=y + 8,
                                                                   bits="COSMIC_RAY"))
    assert r.status_code == 200 and r.headers["X-Decimation"] == "1"
    img = decode_png(r.content)
    assert img.shape == (16, 16, 4)
    flagged = np.argwhere(img[..., 3] > 0)
    assert flagged.tolist() == [[15 - 8, 8]]  # the cosmic-ray pixel only, in its colour
    assert tuple(img[7, 8]) == (0, 255, 0, 220)
    # zoomed out, the block holding it stays flagged (OR of the bits)
    full = decode_png(client.get(f"/api/v1/products/{p.id}/dq.png", params=dict(size=32, bits="64")).content)
    assert full[31 - y // 8, x // 8, 3] > 0
    assert client.get(f"/api/v1/products/{p.id}/dq.png", params=dict(bits="SATURATED,HOT")).status_code == 422


# -- WCS, pixel -----------------------------------------------------------------------------


def test_wcs_description_matches_astropy_and_sunpy(stored):
    import astropy.units as u
    import sunpy.map
    from astropy.coordinates import SkyCoord
    from astropy.wcs import WCS
    from sunpy.coordinates import HeliographicStonyhurst

    client, _, prods, _ = stored
    p = prods[0]
    d = client.get(f"/api/v1/products/{p.id}/wcs").json()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = sunpy.map.Map(p.path, hdus=0)
        w = WCS(m.fits_header)
    assert d["shape"] == [N_SIM, N_SIM] and d["channel"] == "SDI" and d["bunit"] == "erg cm-2 s-1 sr-1"
    assert d["date_obs"].startswith("2004-03-01T02:00")
    assert d["rsun_arcsec"] == pytest.approx(m.rsun_obs.to_value("arcsec"))
    assert d["observer"]["lat_deg"] == pytest.approx(m.observer_coordinate.lat.to_value("deg"))
    # the pixel edges of the image from the WCS
    def arcsec(deg):  # wcslib gives longitudes in 0..360 deg
        return ((np.asarray(deg) + 180.0) % 360.0 - 180.0) * 3600.0

    (tx0, tx1), (ty0, ty1) = (arcsec(v) for v in w.pixel_to_world_values([-0.5, N_SIM - 0.5], [-0.5, N_SIM - 0.5]))
    assert d["extent"]["tx"] == pytest.approx([tx0, tx1], abs=0.2) and d["extent"]["ty"] == pytest.approx([ty0, ty1], abs=0.2)
    a = d["affine"]
    tx, ty = (float(arcsec(v)) for v in w.pixel_to_world_values(200.0, 30.0))
    assert a["tx0"] + a["m11"] * 200 + a["m12"] * 30 == pytest.approx(tx, abs=0.2)
    assert a["ty0"] + a["m21"] * 200 + a["m22"] * 30 == pytest.approx(ty, abs=0.2)
    # limb: a closed ring at Rsun
    r = np.hypot(d["limb"]["x"], d["limb"]["y"])
    assert np.allclose(r, d["rsun_arcsec"], rtol=2e-3) and d["limb"]["x"][0] == d["limb"]["x"][-1]
    # grid: every 15 deg; each drawn point is on the visible disk and on its latitude
    assert sorted(g["value"] for g in d["grid"]["lat"]) == [-75, -60, -45, -30, -15, 0, 15, 30, 45, 60, 75]
    lons = sorted(g["value"] for g in d["grid"]["lon"])
    assert 0 in lons and all(v % 15 == 0 for v in lons) and len(lons) >= 12
    eq = next(g for g in d["grid"]["lat"] if g["value"] == 0)
    pts = [(x, y) for x, y in zip(eq["x"], eq["y"]) if x is not None]
    assert len(pts) > 30 and all(math.hypot(x, y) <= d["rsun_arcsec"] * 1.001 for x, y in pts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = SkyCoord([x for x, _ in pts] * u.arcsec, [y for _, y in pts] * u.arcsec,
                        frame=m.coordinate_frame).transform_to(HeliographicStonyhurst(obstime=m.date))
    assert np.nanmax(np.abs(back.lat.to_value("deg"))) < 0.05
    # the far side is not drawn: the equator spans at most the visible half of the longitudes
    assert np.nanmax(np.abs(back.lon.wrap_at(180 * u.deg).to_value("deg"))) <= 91


def test_pixel_readout_gives_value_dq_and_coordinates(stored):
    import astropy.units as u
    import sunpy.map
    from astropy.coordinates import SkyCoord
    from sunpy.coordinates import HeliographicStonyhurst

    from pipelines.products import read_product

    client, _, prods, _ = stored
    p = prods[1]
    data, dq, _ = read_product(p.path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = sunpy.map.Map(p.path, hdus=0)
        px, py = m.wcs.world_to_pixel(SkyCoord(-400 * u.arcsec, -350 * u.arcsec, frame=m.coordinate_frame))
    body = client.get(f"/api/v1/products/{p.id}/pixel", params=dict(tx=-400, ty=-350)).json()
    assert (body["x"], body["y"]) == (round(float(px)), round(float(py)))
    assert body["value"] == pytest.approx(float(data[body["y"], body["x"]])) and body["bunit"] == "erg cm-2 s-1 sr-1"
    assert body["on_disk"] and body["dq"] == int(dq[body["y"], body["x"]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = m.pixel_to_world(body["x"] * u.pix, body["y"] * u.pix)
        h = c.transform_to(HeliographicStonyhurst(obstime=m.date))
    assert body["tx"] == pytest.approx(c.Tx.to_value("arcsec"), abs=0.01)
    assert body["hgs_lat"] == pytest.approx(h.lat.to_value("deg"), abs=1e-3)
    assert body["hgs_lon"] == pytest.approx(h.lon.wrap_at(180 * u.deg).to_value("deg"), abs=1e-3)
    # the cosmic-ray pixel, by pixel index
    y, x = CR_PIXEL
    cr = client.get(f"/api/v1/products/{p.id}/pixel", params=dict(x=x, y=y)).json()
    assert "COSMIC_RAY" in cr["dq_flags"] and cr["dq"] & int(DQ.COSMIC_RAY)
    # off the disk: no Stonyhurst coordinates
    off = client.get(f"/api/v1/products/{p.id}/pixel", params=dict(tx=1050, ty=0)).json()
    assert not off["on_disk"] and off["hgs_lat"] is None and off["r_rsun"] > 1


# -- overlays -------------------------------------------------------------------------------


def test_flare_is_rotated_to_the_frames_date_obs_as_sunpy_computes(stored):
    client, db, prods, flare = stored
    before = prods[0]  # 02:00, three hours before the flare's peak
    ov = client.get(f"/api/v1/products/{before.id}/overlays", params=dict(margin_h=2)).json()
    (fl,) = [e for e in ov["events"] if e["id"] == flare.id]
    tx, ty, x, y = expected_rotated(Path(before.path), flare.hpc_x, flare.hpc_y, flare.peak_time)
    assert fl["kind"] == "point" and fl["rotated"] and fl["visible"] and fl["url"] == f"/events/{flare.id}"
    assert fl["rotation_s"] == pytest.approx(-3 * 3600, abs=120)
    assert fl["hpc_x"] == pytest.approx(tx, abs=0.5) and fl["hpc_y"] == pytest.approx(ty, abs=0.5)
    assert fl["pixel_x"] == pytest.approx(x, abs=0.05) and fl["pixel_y"] == pytest.approx(y, abs=0.05)
    assert tx < flare.hpc_x - 20  # three hours earlier it was further east (about 0.55 deg/h at -27 deg)
    assert "GOES M2.5" in fl["label"]
    # at the peak frame: no rotation, the catalogue's position
    at_peak = client.get(f"/api/v1/products/{prods[1].id}/overlays").json()
    (fp,) = [e for e in at_peak["events"] if e["id"] == flare.id]
    assert not fp["rotated"] and fp["hpc_x"] == pytest.approx(flare.hpc_x, abs=1.0)


def test_cme_wedge_limb_flare_and_unplaced_event(stored):
    client, db, prods, flare = stored
    p = prods[1]
    t = flare.peak_time
    cme = Event(event_type="CE", source="cdaw", source_key=uuid.uuid4().hex, start_time=t, position_angle=90.0,
                angular_width=60.0, speed_km_s=800.0, attributes={})
    # at the east limb three days after the frame: three days earlier it was behind the limb
    limb = Event(event_type="FL", source="goes_xrs", source_key=uuid.uuid4().hex, start_time=t + dt.timedelta(days=3),
                 hpc_x=-940.0, hpc_y=100.0, goes_class="C3.0", attributes={})
    bare = Event(event_type="FL", source="goes_xrs", source_key=uuid.uuid4().hex, start_time=t, goes_class="B5.0",
                 attributes={})
    db.add_all([cme, limb, bare])
    db.flush()
    ov = client.get(f"/api/v1/products/{p.id}/overlays", params=dict(event=limb.id)).json()
    by_id = {e["id"]: e for e in ov["events"]}
    assert ov["highlight"] == limb.id and set(by_id) >= {flare.id, cme.id, limb.id, bare.id}
    w = by_id[cme.id]
    assert w["kind"] == "wedge" and w["x"][0] == w["x"][-1]
    rsun = client.get(f"/api/v1/products/{p.id}/wcs").json()["rsun_arcsec"]
    r = np.hypot(w["x"], w["y"])
    pa = np.degrees(np.arctan2(-np.asarray(w["x"]), np.asarray(w["y"]))) % 360  # CCW from north
    assert r.min() == pytest.approx(rsun, rel=1e-3) and r.max() > 1.3 * rsun
    assert pa.min() == pytest.approx(60, abs=0.1) and pa.max() == pytest.approx(120, abs=0.1)
    assert max(w["x"]) < 0  # PA 90 is east: negative Tx
    lf = by_id[limb.id]
    assert lf["kind"] == "point" and lf["visible"] is False and "behind the limb" in lf["note"]
    assert math.hypot(lf["hpc_x"], lf["hpc_y"]) == pytest.approx(rsun, rel=1e-3)  # drawn on the limb
    assert by_id[bare.id]["kind"] == "none" and "no position" in by_id[bare.id]["note"]


def test_bad_viewer_parameters_are_422_with_a_message(stored):
    from tests.test_api import assert_error

    client, _, prods, _ = stored
    base = f"/api/v1/products/{prods[0].id}"
    assert_error(client.get(f"{base}/region.png", params=dict(stretch="cubic")), 422, "unknown stretch", "asinh")
    assert_error(client.get(f"{base}/region.png", params=dict(pmin=60, pmax=40)), 422, "pmin", "below pmax")
    assert_error(client.get(f"{base}/region.png", params=dict(pmin=-1)), 422, "between 0 and 100")
    assert_error(client.get(f"{base}/region.png", params=dict(pmax="nan")), 422, "pmax")
    assert_error(client.get(f"{base}/region.png", params=dict(x0=5000, x1=6000)), 422, "outside the image")
    assert_error(client.get(f"{base}/region.png", params=dict(x0=50, x1=20)), 422, "empty region")
    assert_error(client.get(f"{base}/region.png", params=dict(x0="left")), 422, "x0")
    assert_error(client.get(f"{base}/region.png", params=dict(size=8)), 422, "size")
    assert_error(client.get(f"{base}/region.png", params=dict(size="big")), 422, "size")
    assert_error(client.get(f"{base}/region.png", params=dict(cmap="nosuchmap")), 422, "colour map")
    assert_error(client.get(f"{base}/pixel"), 422, "either as x and y")
    assert_error(client.get(f"{base}/pixel", params=dict(x=1, y=2, tx=3, ty=4)), 422, "either")
    assert_error(client.get(f"{base}/pixel", params=dict(tx=99999, ty=0)), 422, "outside the image")
    assert_error(client.get(f"{base}/pixel", params=dict(x="a", y=2)), 422, "x")
    assert_error(client.get(f"{base}/overlays", params=dict(event=2_000_000_000)), 422, "no event")
    assert_error(client.get(f"{base}/overlays", params=dict(margin_h=-1)), 422, "margin_h")
    assert_error(client.get("/api/v1/products/999999/wcs"), 404, "no product")


# -- pages ----------------------------------------------------------------------------------


def test_viewer_page_and_event_context_images(stored):
    client, _, prods, flare = stored
    r = client.get(f"/products/{prods[1].id}/view?event={flare.id}")
    assert r.status_code == 200
    assert f'data-event-id="{flare.id}"' in r.text and "viewer.js?v=" in r.text and "plotly-basic.min.js?v=" in r.text
    assert client.get("/products/999999/view").status_code == 404
    page = client.get(f"/events/{flare.id}").text
    # before the start (02:00), at the peak (05:00), after the end (09:00), each linking to the viewer
    import re

    roles = re.findall(r'data-role="(\w+)" data-product-id="(\d+)"', page)
    assert roles == [("before", str(prods[0].id)), ("peak", str(prods[1].id)), ("after", str(prods[2].id))]
    assert f'href="/products/{prods[0].id}/view?event={flare.id}"' in page
    # the marker of the peak frame sits on the flare's pixel of that frame
    cx, cy = (float(v) for v in re.findall(r'class="context-marker" cx="([\d.]+)" cy="([\d.]+)"', page)[1])
    _, _, x, y = expected_rotated(Path(prods[1].path), flare.hpc_x, flare.hpc_y, flare.peak_time)
    scale = 256 / N_SIM
    assert cx == pytest.approx((x + 0.5) * scale, abs=0.2) and cy == pytest.approx((N_SIM - 0.5 - y) * scale, abs=0.2)
    prods_page = client.get("/products").text
    assert f'href="/products/{prods[2].id}/view"' in prods_page


def test_viewer_benchmark_prints_one_result_line():
    """benchmarks/viewer.py end to end at a tiny size (its numbers come from the 4608² run)."""
    import re
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "viewer.py"), "--size", "256", "--png", "64",
                        "--repeat", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"RESULT cold_ms=([\d.]+) full_p50_ms=([\d.]+) zoom_p50_ms=([\d.]+) pan_p50_ms=([\d.]+) "
                     r"dq_p50_ms=([\d.]+) worst_p95_ms=([\d.]+) png_kib=(\d+)", last)
    assert m, last
    assert "zoom : " in r.stdout and "(1:1, 64x64 PNG" in r.stdout and "(1:4, 64x64 PNG" in r.stdout


def test_cme_wedge_on_a_coronagraph_frame_spans_its_field(api_client, db_session):
    """On SCI the wedge covers the coronagraph's field, 1.1-2.5 Rsun; a product whose header
    has no observer keywords is seen from Earth at DATE-OBS (sunpy's default)."""
    from backend.settings import get_settings
    from tests.test_api import RSUN_ARCSEC, T0, make_event, make_frame, make_product

    frame = make_frame(db_session, "SCI-UV", T0)
    p = make_product(db_session, frame, get_settings().products / "SCI-UV", bunit="MSB")
    halo = make_event(db_session, "CE", T0 - dt.timedelta(minutes=20), None, T0 + dt.timedelta(hours=2),
                      source="cdaw", position_angle=0.0, angular_width=360.0)
    narrow = make_event(db_session, "CE", T0, source="cdaw", position_angle=270.0, angular_width=None)
    ov = api_client.get(f"/api/v1/products/{p.id}/overlays").json()
    by_id = {e["id"]: e for e in ov["events"]}
    h, n = by_id[halo.id], by_id[narrow.id]
    assert h["kind"] == "wedge" and h["r_rsun"] == [1.1, 2.5] and "1.1-2.5 Rsun" in h["note"]
    r = np.hypot(h["x"], h["y"])
    assert r.min() == pytest.approx(1.1 * RSUN_ARCSEC, rel=1e-4) and r.max() == pytest.approx(2.5 * RSUN_ARCSEC, rel=1e-4)
    pa = np.degrees(np.arctan2(-np.asarray(h["x"]), np.asarray(h["y"]))) % 360
    assert np.histogram(pa, bins=12, range=(0, 360))[0].min() > 0  # all the way round (a halo)
    # no width: a radial line at PA 270 (west: positive Tx)
    assert n["angular_width"] is None and "a line" in n["note"]
    assert min(n["x"]) > 0 and max(abs(y) for y in n["y"]) < 1e-6
    wcs = api_client.get(f"/api/v1/products/{p.id}/wcs").json()
    assert wcs["channel"] == "SCI-UV" and wcs["defaults"]["stretch"] == "log"
    assert abs(wcs["observer"]["lat_deg"]) < 7.3  # Earth's B0 at DATE-OBS


def test_flare_without_position_is_placed_by_its_same_flare_partner(stored):
    """A GOES report flare with no location (the 2011-06-07 M2.5 has none) is drawn where the
    same flare seen by another source lies, and says so; without the link it stays unplaced."""
    from backend.models import EventAssociation
    from backend.services.events import SAME_FLARE

    client, db, prods, flare = stored
    bare = Event(event_type="FL", source="goes_xrs", source_key=uuid.uuid4().hex, start_time=flare.start_time,
                 peak_time=flare.peak_time, end_time=flare.end_time, goes_class="M2.5", attributes={})
    db.add(bare)
    db.flush()
    p = prods[1]
    before = {e["id"]: e for e in client.get(f"/api/v1/products/{p.id}/overlays").json()["events"]}
    assert before[bare.id]["kind"] == "none"
    db.add_all([EventAssociation(event_id=bare.id, other_event_id=flare.id, kind=SAME_FLARE),
                EventAssociation(event_id=flare.id, other_event_id=bare.id, kind=SAME_FLARE)])
    db.flush()
    after = {e["id"]: e for e in client.get(f"/api/v1/products/{p.id}/overlays").json()["events"]}
    b, f = after[bare.id], after[flare.id]
    assert b["kind"] == "point" and b["position_event"] == flare.id
    assert f"event #{flare.id}" in b["note"] and "no position of its own" in b["position_from"]
    assert (b["pixel_x"], b["pixel_y"]) == pytest.approx((f["pixel_x"], f["pixel_y"]), abs=1e-6)
    assert "position_event" not in f  # the partner keeps its own position
