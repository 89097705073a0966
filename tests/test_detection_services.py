"""Detector services on L2 product files in the database: SCI CMEs, prominence eruptions,
WST white-light flares; plus the pure white-light detector on a synthetic WST disk."""

from __future__ import annotations

import datetime as dt
import hashlib

import numpy as np
import pytest
from astropy.io import fits
from sqlalchemy import func, select

from backend.models import Event, EventFrame, EventProduct, Frame, Product, ProductState
from backend.services.detection import (
    detect_prominence_eruptions,
    detect_sci_cmes,
    detect_wst_white_light_flares,
)
from pipelines.detect.whitelight import FRM_NAME as WLF_NAME
from pipelines.detect.whitelight import WhiteLightParams, detect_white_light_flares
from pipelines.products import dq_table_hdu
from pipelines.simulation import limb_darkening_neckel2005
from validation import synthetic as S

N = 512
RSUN = 960.0
CENTER = ((N - 1) / 2.0, (N - 1) / 2.0)
START = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.UTC)


def _dpa(a: float, b: float) -> float:
    return abs((a - b + 180.0) % 360.0 - 180.0)


def l2_header(when: dt.datetime, scale: float, channel: str, bunit: str) -> fits.Header:
    return fits.Header({
        "DATE-OBS": when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3], "BUNIT": bunit, "LEVEL": "L2",
        "TELESCOP": "ASO-S", "INSTRUME": "LST", "DETECTOR": channel,
        "CTYPE1": "HPLN-TAN", "CTYPE2": "HPLT-TAN", "CUNIT1": "arcsec", "CUNIT2": "arcsec",
        "CRPIX1": CENTER[0] + 1.0, "CRPIX2": CENTER[1] + 1.0, "CRVAL1": 0.0, "CRVAL2": 0.0,
        "CDELT1": scale, "CDELT2": scale, "PC1_1": 1.0, "PC1_2": 0.0, "PC2_1": 0.0, "PC2_2": 1.0,
        "RSUN_OBS": RSUN, "HGLN_OBS": 0.0, "HGLT_OBS": 0.0, "DSUN_OBS": 1.495978707e11,
    })


def store_products(session, tmp_path, channel: str, times, images, scale: float, bunit: str,
                   dq: np.ndarray | None = None) -> list[tuple[Frame, Product]]:
    """Frames and written L2 products (relative paths in ``tmp_path``) for a sequence."""
    rows = []
    for k, (when, im) in enumerate(zip(times, images)):
        name = f"{channel}_{k:03d}.fits"
        d = np.zeros(im.shape, np.uint8) if dq is None else dq
        fits.HDUList([fits.PrimaryHDU(np.asarray(im, np.float32), l2_header(when, scale, channel, bunit)),
                      dq_table_hdu(d)]).writeto(tmp_path / name)
        fr = Frame(channel_code=channel, date_obs=when, exposure_s=1.0, level="L1", naxis1=im.shape[1],
                   naxis2=im.shape[0], path=f"raw/{name}", original_name=name,
                   sha256=hashlib.sha256(f"{channel}-{k}-{tmp_path}".encode()).hexdigest(), size_bytes=1, header={})
        session.add(fr)
        session.flush()
        pr = Product(frame_id=fr.id, level="L2", version=1, calibration_key="cal", params_hash="p",
                     software_version="test", state=ProductState.written, path=name)
        session.add(pr)
        session.flush()
        rows.append((fr, pr))
    return rows


def check_links_and_provenance(session, ev: Event, rows, frm_name: str) -> None:
    prods = set(session.scalars(select(EventProduct.product_id).where(EventProduct.event_id == ev.id)))
    frames = set(session.scalars(select(EventFrame.frame_id).where(EventFrame.event_id == ev.id)))
    assert prods and prods == set(ev.attributes["product_ids"])
    assert frames == set(ev.attributes["frame_ids"])
    assert prods <= {p.id for _, p in rows}
    assert ev.attributes["product_versions"] == [1] * len(prods)
    assert ev.attributes["detector"]["frm_name"] == frm_name == ev.frm_name
    assert ev.source == "detected" and ev.frm_version


@pytest.mark.postgres
def test_detect_sci_cmes_on_products(db_session, tmp_path):
    ps = 2.4 * 2048 / N
    bg = S.coronal_background(N, ps, rsun_arcsec=RSUN)
    times = S.make_times(START, 12, 180)
    ims, truth = S.inject_cme_sequence(bg, times, pa_deg=150.0, width_deg=60.0, speed_km_s=800.0, t0=times[2],
                                       plate_scale_arcsec=ps, rsun_arcsec=RSUN, contrast=0.3)
    ims = S.add_photon_noise(ims, 1e10, rng=np.random.default_rng(3))
    rows = store_products(db_session, tmp_path, "SCI-UV", times, ims, ps, "MSB")
    events = detect_sci_cmes(db_session, channel="SCI-UV", product_root=tmp_path)
    assert len(events) == 1
    ev = events[0]
    assert ev.event_type == "CE" and ev.channels == "SCI-UV" and ev.frm_name == "lst-sci-cme"
    assert _dpa(ev.position_angle, 150.0) <= 10.0
    assert ev.speed_km_s == pytest.approx(800.0, rel=0.2)
    check_links_and_provenance(db_session, ev, rows, "lst-sci-cme")
    # idempotent; another channel has no products; a wrong channel is refused
    assert [e.id for e in detect_sci_cmes(db_session, channel="SCI-UV", product_root=tmp_path)] == [ev.id]
    assert db_session.scalar(select(func.count()).select_from(Event)) == 1
    assert detect_sci_cmes(db_session, channel="SCI-WL", product_root=tmp_path) == []
    with pytest.raises(ValueError, match="SCI-UV or SCI-WL"):
        detect_sci_cmes(db_session, channel="SDI")


@pytest.mark.postgres
def test_detect_prominence_eruptions_on_sdi_products(db_session, tmp_path):
    ps = 4608 * 0.5 / N
    limb = S.limb_background(N, ps, rsun_arcsec=RSUN, static_prominences=[(45.0, 1.05, 8.0, 0.05)])
    times = S.make_times(START, 20, 60)
    ims, truth = S.inject_prominence_eruption(limb, times, pa_deg=100.0, t_start=times[5] + dt.timedelta(seconds=20),
                                              speed_km_s=40.0, plate_scale_arcsec=ps, rsun_arcsec=RSUN,
                                              contrast=1.5, width_deg=10.0, resolution_arcsec=9.5)
    ims = S.add_photon_noise(ims, 2e4, rng=np.random.default_rng(4))
    rows = store_products(db_session, tmp_path, "SDI", times, ims, ps, "erg cm-2 s-1 sr-1")
    events = detect_prominence_eruptions(db_session, channel="SDI", product_root=tmp_path)
    assert len(events) == 1
    ev = events[0]
    assert ev.event_type == "PR" and ev.channels == "SDI"
    assert _dpa(ev.position_angle, 100.0) <= 10.0
    assert abs((ev.start_time - truth.t_start).total_seconds()) <= 60.0
    check_links_and_provenance(db_session, ev, rows, "lst-prominence-eruption")
    assert [e.id for e in detect_prominence_eruptions(db_session, channel="SDI", product_root=tmp_path)] == [ev.id]
    with pytest.raises(ValueError, match="SDI or SCI-UV"):
        detect_prominence_eruptions(db_session, channel="WST")


# -- white-light flares -----------------------------------------------------------------------

WST_PS = 4.5  # arcsec/px: a 4608 WST frame binned 9x9 (0.5 arcsec/px)
WST_CADENCE = 120.0


def wst_series(flares=(), n: int = 24, seed: int = 0):
    """A limb-darkened 360-nm disk (Neckel 2005) with granulation-like texture that changes
    from frame to frame (1.5 % rms) and injected white-light kernels.

    flares: (x_arcsec, y_arcsec, amplitude, sigma_arcsec, first_frame, n_frames) with a
    triangular time profile peaking at ``amplitude`` (relative to the local intensity).
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.indices((N, N))
    x_as, y_as = (xx - CENTER[0]) * WST_PS, (yy - CENTER[1]) * WST_PS
    r = np.hypot(x_as, y_as) / RSUN
    mu = np.sqrt(np.clip(1 - r ** 2, 0, 1))
    disk = np.where(r < 1, 1e6 * limb_darkening_neckel2005(360.0, mu), 0.0)
    times = [START + dt.timedelta(seconds=WST_CADENCE * k) for k in range(n)]
    frames = []
    for k in range(n):
        texture = 1 + 0.015 * rng.standard_normal((N, N))
        frame = disk * texture
        for x0, y0, amp, sig, k0, nk in flares:
            if k0 <= k < k0 + nk:
                half = (nk - 1) / 2.0
                prof = 1 - abs(k - k0 - half) / (half + 1)
                g = np.exp(-((x_as - x0) ** 2 + (y_as - y0) ** 2) / (2 * sig ** 2))
                frame = frame * (1 + amp * prof * g)
        frames.append(frame.astype(np.float32))
    headers = [l2_header(t, WST_PS, "WST", "erg cm-2 s-1 sr-1 nm-1") for t in times]
    return times, frames, headers


def test_white_light_flare_above_8_percent_found_below_not():
    strong = (-300.0, 200.0, 0.30, 9.0, 14, 5)
    weak = (400.0, -150.0, 0.05, 9.0, 14, 5)
    times, frames, headers = wst_series([strong, weak], seed=1)
    found = detect_white_light_flares(times, frames, headers)
    assert len(found) == 1
    f = found[0]
    assert np.hypot(f.hpc_x - strong[0], f.hpc_y - strong[1]) < 2 * WST_PS
    assert 0.08 <= f.peak_enhancement <= 0.45
    assert f.peak_time == times[16]
    # the same series without the strong kernel: nothing
    times, frames, headers = wst_series([weak], seed=1)
    assert detect_white_light_flares(times, frames, headers) == []
    # a higher threshold rejects the strong one as well
    times, frames, headers = wst_series([strong], seed=1)
    assert detect_white_light_flares(times, frames, headers, params=WhiteLightParams(threshold=0.5)) == []


def test_quiet_wst_series_has_no_flare():
    times, frames, headers = wst_series([], seed=2)
    assert detect_white_light_flares(times, frames, headers) == []


@pytest.mark.postgres
def test_detect_wst_white_light_flares_on_products(db_session, tmp_path):
    times, frames, _ = wst_series([(-300.0, 200.0, 0.30, 9.0, 14, 5)], seed=3)
    rows = store_products(db_session, tmp_path, "WST", times, frames, WST_PS, "erg cm-2 s-1 sr-1 nm-1")
    events = detect_wst_white_light_flares(db_session, product_root=tmp_path)
    assert len(events) == 1
    ev = events[0]
    assert ev.event_type == "FL" and ev.channels == "WST" and ev.peak_unit == "%" and ev.peak_value >= 8.0
    assert abs(ev.hpc_x + 300.0) < 2 * WST_PS and abs(ev.hpc_y - 200.0) < 2 * WST_PS
    assert ev.hgs_lat is not None
    check_links_and_provenance(db_session, ev, rows, WLF_NAME)
    assert [e.id for e in detect_wst_white_light_flares(db_session, product_root=tmp_path)] == [ev.id]


def test_detection_tasks_run_on_the_configured_database(sqlite_env):
    """The Celery tasks (called in process) load by range, detect, link, and report ids."""
    from backend.worker import tasks

    assert tasks.detect_cmes.run(channel="SCI-UV") == {"channel": "SCI-UV", "events": [], "associations": 0}
    assert tasks.detect_prominences.run(channel="SDI", start="2024-03-01T00:00:00+00:00") == {
        "channel": "SDI", "events": [], "associations": 0}
    assert tasks.detect_white_light_flares.run() == {"events": [], "associations": 0}
    with pytest.raises(ValueError, match="SCI-UV or SCI-WL"):
        tasks.detect_cmes.run(channel="WST")
    # the generic task that follow-ups send: any registry detector by name
    assert tasks.detect_events.run("cmes", "SCI-WL") == {"detector": "cmes", "channel": "SCI-WL", "events": [],
                                                         "associations": 0}
    assert tasks.detect_flares.run() == {"events": [], "associations": 0}
    with pytest.raises(KeyError, match="white-light"):
        tasks.detect_events.run("sunspots")
