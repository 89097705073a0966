"""The simulator: ASO-S style raw frames, self-describing calibration masters, truth,
determinism, the injected flare and the limb fit that replaces EIT's wrong WCS."""

from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
import pytest
from astropy.io import fits
from astropy.time import Time

from pipelines.calibration.l2.flow import load_calibration_master
from pipelines.channels import CHANNELS, channel_from_header
from pipelines.fitsio import parse_date_obs, read_image, sha256_file
from pipelines.simulation import (SAMPLE_DIR, baumbach_f_corona, baumbach_k_corona, fit_solar_limb,
                                  limb_darkening_neckel2005, lyman_alpha_corona, simulate, ssw_date,
                                  stray_light_model)
from tests.conftest import SAMPLE

N = 128


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    return simulate(out, naxis=N, noise=True, seed=5, sdi_sequence=True)


def _frames(sim, channel):
    return [f for f in sim.frames if f.channel == channel]


def test_uses_the_project_sample_data():
    assert SAMPLE_DIR.resolve() == SAMPLE.resolve()


def test_writes_raw_calibration_truth_and_manifest(sim):
    assert len(sim.raw_files) == 13 + 3  # the SDI series and one frame per other channel
    assert all(p.is_file() for p in sim.raw_files + sim.truth_files)
    assert {c.kind for c in sim.calibration_files} == {"dark", "flat", "radiometric", "mask_geometry", "stray_light"}
    assert len(sim.calibration_files) == 4 * 4 + 2
    doc = json.loads(sim.manifest_path.read_text())
    assert len(doc["frames"]) == 16 and doc["seed"] == 5 and doc["flare"]["channel"] == "SDI"
    assert all((sim.out_dir / f["raw_path"]).is_file() for f in doc["frames"])


def test_raw_headers_are_aso_s_style(sim):
    for path in sim.raw_files:
        with fits.open(path) as hdul:
            h = hdul[0].header
            assert hdul[0].data.dtype == np.uint16
            assert h["BITPIX"] == 16 and h["BZERO"] == 32768
        assert h["TELESCOP"] == "ASO-S" and h["INSTRUME"] == "LST"
        assert h["DETECTOR"] in ("SDI", "WST", "SCI") and h["CHANNEL"] in CHANNELS
        assert h["WAVEUNIT"] == "nm" and h["WAVELNTH"] == CHANNELS[h["CHANNEL"]].wavelength_nm
        assert re.fullmatch(r"\d\d-[A-Z][a-z]{2}-\d\d \d\d:\d\d:\d\d\.\d{3}", h["DATE-OBS"]), h["DATE-OBS"]
        assert h["DATE_OBS"] == h["DATE-OBS"]
        assert h["CTYPE1"] == "solar_x" and h["CTYPE2"] == "solar_y"
        assert h["CUNIT1"] == "arcsecs" and h["CUNIT2"] == "arcsecs"
        assert h["CRVAL1"] == 0 and h["CRVAL2"] == 0 and h["LEVEL"] == "L1" and h["EXPTIME"] > 0
        assert 0.2 <= abs(h["CROTA2"]) <= 2.5 and h["CROTA1"] == h["CROTA2"]
        spec = CHANNELS[h["CHANNEL"]]
        assert h["CDELT1"] == pytest.approx(spec.plate_scale * spec.naxis / N)
        off = math.hypot(h["CRPIX1"] - (N + 1) / 2, h["CRPIX2"] - (N + 1) / 2)
        assert 0.5 < off < 6, "the disk centre is a few pixels off the frame centre"
        for k in ("HGLN_OBS", "HGLT_OBS", "DSUN_OBS", "CRLN_OBS", "RSUN_OBS"):
            assert k not in h


def test_read_image_and_channel_from_header_identify_all_four_channels(sim):
    seen = {}
    for f in sim.frames:
        raw = read_image(f.raw_path)
        code = channel_from_header(raw.header)
        assert code == f.channel
        assert raw.header["CTYPE1"] == "HPLN-TAN" and "DSUN_OBS" in raw.header  # quirks repaired on read
        assert raw.date_obs.isot == Time(f.date_obs).isot
        seen.setdefault(code, []).append(raw.date_obs)
    assert set(seen) == {"SDI", "WST", "SCI-UV", "SCI-WL"}
    # frames dated at their scenes: EIT's hourly 2004-03-01 series, MDI, COR1
    sdi = sorted(t.isot for t in seen["SDI"])
    assert sdi[0].startswith("2004-03-01T00:00") and sdi[-1].startswith("2004-03-01T12:00")
    assert seen["WST"][0].isot == "2010-10-15T23:00:11.000"
    assert seen["SCI-UV"][0].isot == seen["SCI-WL"][0].isot == "2007-05-03T10:20:18.005"


def test_raw_frames_use_the_16_bit_range_without_saturating(sim):
    for f in sim.frames:
        assert 30000 < f.peak_dn < 60000, (f.channel, f.peak_dn)


def test_calibration_masters_describe_themselves(sim):
    dates = {c: [Time(f.date_obs) for f in _frames(sim, c)] for c in CHANNELS}
    for info in sim.calibration_files:
        h = fits.getheader(info.path)
        assert h["CALKIND"] == info.kind and h["CHANNEL"] == info.channel and h["CALVER"] == 1
        assert isinstance(h["CALVER"], int) and h["CALDESC"] and h["FRMNAXIS"] == N
        lo, hi = parse_date_obs(h["VALIDFRM"]), parse_date_obs(h["VALIDTO"])
        assert all(lo <= t <= hi for t in dates[info.channel])
        assert sha256_file(info.path) == info.sha256
        cal = load_calibration_master(info.path)
        assert cal.kind == info.kind and cal.channel == info.channel
        if info.kind == "dark":
            assert set(cal.data) == {"bias", "dark_rate"}
            assert 90 < float(np.median(cal.data["bias"])) < 110 and float(np.median(cal.data["dark_rate"])) > 0
            assert fits.getheader(info.path, "DARKRATE")["BUNIT"] == "DN/s"
        if info.kind == "flat":
            flat = cal.data["flat"]
            assert flat.shape == (N, N) and float(flat.mean()) == pytest.approx(1.0, abs=1e-5)
            # stripes along the columns: column means jump from column to column, row means do not
            assert np.diff(flat.mean(axis=0)).std() > 5 * np.diff(flat.mean(axis=1)).std()
        if info.kind == "radiometric":
            assert h["RADCOEF"] > 0 and h["RADUNIT"] == CHANNELS[info.channel].bunit
        if info.kind == "mask_geometry":
            spec = CHANNELS[info.channel]
            assert h["FOVRAD"] == spec.fov_rsun_max
            assert (h.get("OCCRAD") == 1.1) if spec.is_coronagraph else ("OCCRAD" not in h)
        if info.kind == "stray_light":
            assert info.channel in ("SCI-UV", "SCI-WL")
            b11, b25 = {"SCI-WL": (7.8e-6, 7.6e-7), "SCI-UV": (4.3e-3, 4.1e-4)}[info.channel]
            assert h["STRAYB11"] == pytest.approx(b11) and h["STRAYB25"] == pytest.approx(b25)


def test_injected_flare_is_recorded_and_in_the_truth(sim):
    fl = sim.flare
    assert fl is not None and fl.channel == "SDI"
    start, peak, end = Time(fl.start), Time(fl.peak), Time(fl.end)
    assert start < peak < end
    times = sorted(Time(f.date_obs) for f in _frames(sim, "SDI"))
    assert times[0] < start and end < times[-1]
    assert fl.peak_enhancement >= 0.5
    assert math.hypot(fl.hpc_x, fl.hpc_y) < 0.8 * 960, "on the disk"
    prof = dict(fl.profile)
    assert prof[fl.peak] == pytest.approx(fl.peak_enhancement)
    assert prof[fl.start] == 0 and prof[fl.end] == 0
    # the truth of the peak frame: kernel brightness = (1 + enhancement) x the pre-flare level
    f = next(f for f in _frames(sim, "SDI") if f.date_obs == fl.peak)
    with fits.open(f.truth_path) as h:
        truth, flare = h[0].data.astype(float), h["FLARE"].data.astype(float)
        scale = h[0].header["CDELT1"]
    c = (N - 1) / 2
    j, i = np.unravel_index(np.argmax(flare), flare.shape)
    assert (i - c) * scale == pytest.approx(fl.hpc_x, abs=1.5 * scale)
    assert (j - c) * scale == pytest.approx(fl.hpc_y, abs=1.5 * scale)
    # the flare is a real brightening of the frame: more than 30 % at the kernel at 128 px
    assert truth[j, i] / (truth[j, i] - flare[j, i]) > 1.3
    quiet = next(f for f in _frames(sim, "SDI") if Time(f.date_obs) < start)
    with fits.open(quiet.truth_path) as h:
        assert "FLARE" not in h


def test_eit_wcs_is_replaced_by_a_limb_fit(sim):
    assert len(sim.limb_fits) == 13
    for lf in sim.limb_fits:
        # rebinned 8x from 1024: the header's native SOLAR_R (372 px) is 7-9 times the fitted radius
        assert 7.0 < lf["wcs_factor"] < 9.0
        assert 40 < lf["radius_px"] < 56 and abs(lf["x0"] - 63.5) < 4 and abs(lf["y0"] - 63.5) < 4
        assert lf["rms_px"] < 1.5


def test_limb_fit_recovers_mdi_header_geometry():
    """MDI's header is trustworthy: the fit must agree with it to a fraction of a pixel."""
    raw = read_image(SAMPLE / "full-disk/mdi.fd_ic.20101015_230100_TAI.data.fits")
    lf = fit_solar_limb(raw.data)
    h = raw.header
    assert lf.radius == pytest.approx(h["R_SUN"], abs=0.5)
    # sunpy: disk centre = CRPIX - CRVAL / CDELT (CRVAL is 0 here), 0-based
    assert lf.x0 == pytest.approx(h["CRPIX1"] - 1, abs=0.5) and lf.y0 == pytest.approx(h["CRPIX2"] - 1, abs=0.5)


def test_truth_files_carry_a_helioprojective_wcs_and_physics(sim):
    import sunpy.map
    from astropy.coordinates import SkyCoord
    import astropy.units as u

    for f in sim.frames[-3:] + sim.frames[:1]:
        with warnings.catch_warnings():
            # 'MSB' (mean solar brightness, the coronagraph convention, as in LASCO L1 files) is no FITS unit
            warnings.filterwarnings("ignore", message='Could not parse unit string "MSB"')
            m = sunpy.map.Map(f.truth_path, hdus=0)
        c = m.world_to_pixel(SkyCoord(0 * u.arcsec, 0 * u.arcsec, frame=m.coordinate_frame))
        assert (c.x.value, c.y.value) == pytest.approx(((N - 1) / 2, (N - 1) / 2), abs=1e-6)
        assert m.meta["bunit"] == CHANNELS[f.channel].bunit
        assert m.data.dtype.kind == "f" and m.data.dtype.itemsize == 4
    wst = _frames(sim, "WST")[0]
    with fits.open(wst.truth_path) as h:
        truth, rsun, scale = h[0].data.astype(float), h[0].header["RSUN_OBS"], h[0].header["CDELT1"]
    yy, xx = np.mgrid[0:N, 0:N]
    rho = np.hypot(xx - (N - 1) / 2, yy - (N - 1) / 2) * scale / rsun
    centre = np.median(truth[rho < 0.1])
    ring = np.median(truth[np.abs(rho - math.sqrt(0.75)) < 0.03])  # mu = 0.5
    assert ring / centre == pytest.approx(float(limb_darkening_neckel2005(360.0, 0.5)), rel=0.03)
    assert truth[rho > 1.1].max() < 1e-3 * centre  # no photosphere beyond the limb
    for chan, model in (("SCI-UV", lyman_alpha_corona), ("SCI-WL", None)):
        f = _frames(sim, chan)[0]
        with fits.open(f.truth_path) as h:
            truth, stray = h[0].data.astype(float), h["STRAY"].data.astype(float)
            rsun, scale = h[0].header["RSUN_OBS"], h[0].header["CDELT1"]
        rho = np.hypot(xx - (N - 1) / 2, yy - (N - 1) / 2) * scale / rsun
        ring = np.abs(rho - 1.5) < 0.04
        expect = (lyman_alpha_corona(1.5) if chan == "SCI-UV"
                  else baumbach_f_corona(1.5) + 2.0 * baumbach_k_corona(1.5))
        assert np.median(truth[ring]) == pytest.approx(float(expect), rel=0.3)
        assert np.median(stray[ring]) == pytest.approx(stray_light_model(chan).brightness(1.5), rel=0.02)
        assert np.median(stray[rho < 1.0]) == 0.0  # behind the occulter nothing arrives


def test_deterministic_for_a_seed(tmp_path):
    kw = dict(channels=("WST", "SCI-UV"), naxis=64, noise=True, frames_per_channel=2)
    a = simulate(tmp_path / "a", seed=11, **kw)
    b = simulate(tmp_path / "b", seed=11, **kw)
    c = simulate(tmp_path / "c", seed=12, **kw)
    files_a = sorted(a.raw_files + a.truth_files + [x.path for x in a.calibration_files])
    files_b = sorted(b.raw_files + b.truth_files + [x.path for x in b.calibration_files])
    assert [p.name for p in files_a] == [p.name for p in files_b]
    assert [sha256_file(p) for p in files_a] == [sha256_file(p) for p in files_b]
    assert sha256_file(a.raw_files[0]) != sha256_file(c.raw_files[0])
    assert len(a.raw_files) == 4
    wst = [f for f in a.frames if f.channel == "WST"]
    assert len(wst) == 2
    t0, t1 = (parse_date_obs(fits.getheader(f.raw_path)["DATE-OBS"]) for f in wst)
    assert (t1 - t0).sec == pytest.approx(CHANNELS["WST"].cadence_s)


def test_single_sdi_frames_come_from_swap_and_sizes_per_channel(tmp_path):
    res = simulate(tmp_path, channels=("SDI",), naxis={"SDI": 96}, noise=False, sdi_sequence=False)
    assert len(res.raw_files) == 1 and res.flare is None
    h = read_image(res.raw_files[0]).header
    assert h["DATE-OBS"] == "2012-01-01T00:16:07.836" and h["NAXIS1"] == 96
    assert res.frames[0].scene.endswith("swap_lv1_20120101_001607.fits")
    with pytest.raises(ValueError):
        simulate(tmp_path, channels=("HMI",))
    # sizes are those ingest accepts: 32 px to the channel's detector
    with pytest.raises(ValueError, match="between 32 and 2048 pixels"):
        simulate(tmp_path, channels=("SCI-WL",), naxis={"SCI-WL": 2304})
    with pytest.raises(ValueError, match="between 32 and 4608"):
        simulate(tmp_path, channels=("SDI",), naxis={"SDI": 16})
    from pipelines.simulation.run import _sizes
    assert _sizes(("WST", "SCI-UV"), 4608) == {"WST": 4608, "SCI-UV": 2048}  # one size for all: capped


def test_ssw_date_format():
    assert ssw_date(Time("2004-03-01T00:00:10.515")) == "01-Mar-04 00:00:10.515"
    assert ssw_date(Time("2023-05-01T13:07:59.9996")) == "01-May-23 13:08:00.000"
    assert parse_date_obs(ssw_date(Time("2007-05-03T10:20:18.005"))).isot == "2007-05-03T10:20:18.005"
