"""The steps added to the L2 chain: dark by temperature, bad pixels and cosmic rays into the
DQ, a measured stray-light map, SDI PSF deconvolution on request, and a KLL flat master
version. Small synthetic frames whose right answer is known.
"""

from __future__ import annotations


import numpy as np
import pytest
from scipy import ndimage

from pipelines import sun
from pipelines.calibration.l2 import steps
from pipelines.calibration.l2.flow import CalibrationInput, calibrate_frame, load_calibration_master, required_kinds
from pipelines.calibration.l2.options import CalibrationOptions
from pipelines.calibration.l2.steps import DQ
from pipelines.errors import CalibrationMissingError, DataError
from tests.test_calibration_steps import _cal, _synthetic_wst, history, make_header


def test_dark_scales_with_detector_temperature_by_the_masters_doubling_law():
    n = 16
    h = make_header(n, exptime=2.0)
    bias, rate = np.full((n, n), 100.0), np.full((n, n), 5.0)
    raw = np.full((n, n), 500.0)
    out, h1 = steps.subtract_dark(raw, h, bias, rate)  # no temperature: exposure only
    assert np.allclose(out, 500 - 100 - 10) and h1["DARKTFAC"] == 1.0
    assert "no detector temperature" in history(h1)
    h["DET_TEMP"] = -14.0  # 6 C above the master's -20 C, doubling every 6 C: twice the dark
    out, h2 = steps.subtract_dark(raw, h, bias, rate, reference_temperature_c=-20.0, doubling_temperature_c=6.0)
    assert np.allclose(out, 500 - 100 - 20) and h2["DARKTFAC"] == pytest.approx(2.0)
    assert "doubling every 6 C" in history(h2)
    h["DET_TEMP"] = -26.0
    out, _ = steps.subtract_dark(raw, h, bias, rate, reference_temperature_c=-20.0, doubling_temperature_c=6.0)
    assert np.allclose(out, 500 - 100 - 5)
    out, h3 = steps.subtract_dark(raw, h, bias, rate)  # temperature known, master silent: no scaling, said so
    assert np.allclose(out, 500 - 100 - 10) and "no DARKTREF/DARKTDBL" in history(h3)
    assert steps.dark_temperature_factor(10.0, 0.0, 5.0) == pytest.approx(4.0)
    with pytest.raises(DataError, match="doubling"):
        steps.dark_temperature_factor(10.0, 0.0, 0.0)


def test_flow_applies_the_temperature_model_of_the_dark_master():
    raw, h, cals, _ = _synthetic_wst(48, roll=0.0)
    base = calibrate_frame(raw, h, cals, CalibrationOptions(rotate_north_up=False))
    h["CCDTEMP"] = 5.0
    dark = cals["dark"]
    warm = dict(cals, dark=_cal("dark", "WST", dict(dark.data), DARKTREF=-5.0, DARKTDBL=10.0))
    res = calibrate_frame(raw, h, warm, CalibrationOptions(rotate_north_up=False))  # 2x the dark: lower by rate t / flat / t C
    expected = base.data - (dark.data["dark_rate"] * 0.5 / cals["flat"].data["flat"] / 0.5 * 2.0)
    ok = (res.dq == 0) & (base.dq == 0)
    assert res.header["DARKTFAC"] == pytest.approx(2.0)
    assert ok.sum() > 1000 and np.allclose(res.data[ok], expected[ok], rtol=1e-5)


def test_hot_pixels_of_the_dark_master_are_flagged_and_survive_the_rotation():
    raw, h, cals, _ = _synthetic_wst(64, roll=5.0)
    rate = cals["dark"].data["dark_rate"].copy()
    rate[20, 30] = 80.0  # hot: 20x the others
    rate[40, 12] = 120.0
    dark = _cal("dark", "WST", {"bias": cals["dark"].data["bias"], "dark_rate": rate})
    res = calibrate_frame(raw + (rate - cals["dark"].data["dark_rate"]) * 0.5, h, dict(cals, dark=dark))
    assert "2 bad pixels flagged BAD_PIXEL" in history(res.header)
    bad = (res.dq & DQ.BAD_PIXEL) != 0
    lab, n = ndimage.label(bad)
    assert n == 2 and 2 <= bad.sum() <= 12  # each hot pixel flags the few L2 pixels it touches
    off = calibrate_frame(raw, h, dict(cals, dark=dark), CalibrationOptions(flag_bad_pixels=False))
    assert not ((off.dq & DQ.BAD_PIXEL) != 0).any() and "flag_bad_pixels: skipped" in history(off.header)
    # a BADPIX plane of the master wins over the hot-pixel search
    plane = np.zeros_like(rate)
    plane[5, 5] = 1
    dark2 = _cal("dark", "WST", {"bias": cals["dark"].data["bias"], "dark_rate": rate, "badpix": plane})
    res2 = calibrate_frame(raw, h, dict(cals, dark=dark2), CalibrationOptions(rotate_north_up=False))
    assert np.argwhere((res2.dq & DQ.BAD_PIXEL) != 0).tolist() == [[5, 5]]


def test_cosmic_rays_are_replaced_and_flagged_on_request():
    raw, h, cals, _ = _synthetic_wst(96, roll=0.0)
    raw = raw.copy()
    hits = [(30, 40), (60, 20), (70, 71)]
    for y, x in hits:
        raw[y, x] += 3000.0
    raw[50, 50:54] += 2000.0  # a short track
    off = calibrate_frame(raw, h, cals, CalibrationOptions(rotate_north_up=False))
    assert "clean_cosmic_rays: skipped" in history(off.header)
    on = calibrate_frame(raw, h, cals, CalibrationOptions(rotate_north_up=False, remove_cosmic_rays=True))
    cr = (on.dq & DQ.COSMIC_RAY) != 0
    for y, x in hits + [(50, 51)]:
        assert cr[y, x], (y, x)
    assert cr.sum() <= 12
    clean = calibrate_frame(raw * 0 + _synthetic_wst(96, roll=0.0)[0], h, cals, CalibrationOptions(rotate_north_up=False))
    for y, x in hits:
        assert on.data[y, x] == pytest.approx(clean.data[y, x], rel=0.01)  # replaced by its neighbours
        assert off.data[y, x] > 1.5 * clean.data[y, x]
    assert "L.A.Cosmic" in history(on.header)


def _psf_scene(n=96, fwhm=4.0):
    from pipelines.calibration.masters.psf import gaussian_psf

    truth = np.full((n, n), 100.0)
    yy, xx = np.mgrid[0:n, 0:n]
    for (y, x) in ((30, 30), (60, 50), (45, 70)):
        truth += 900.0 * np.exp(-((yy - y) ** 2 + (xx - x) ** 2) / (2 * 1.2 ** 2))
    psf = gaussian_psf(15, fwhm)
    from scipy.signal import fftconvolve

    blurred = fftconvolve(np.pad(truth, 15, mode="reflect"), psf, mode="same")[15:-15, 15:-15]
    return truth, blurred, psf


def test_deconvolve_psf_step_sharpens_towards_the_truth():
    truth, blurred, psf = _psf_scene()
    h = make_header(96, channel="SDI", bunit=steps.RADIANCE_UNIT)
    dq = np.zeros(truth.shape, np.uint8)
    out, h2 = steps.deconvolve_psf(blurred.astype(np.float32), dq, h, psf, n_iter=40, source="psf.fits")
    before = np.sqrt(np.mean((blurred - truth) ** 2))
    after = np.sqrt(np.mean((out - truth) ** 2))
    assert after < 0.5 * before, (before, after)
    assert h2["PSFDECON"] is True and "Richardson-Lucy, 40 iterations" in history(h2) and "psf.fits" in history(h2)
    same, h3 = steps.deconvolve_psf(blurred, dq, h, None)
    assert same is blurred and "deconvolve_psf: skipped" in history(h3)


def test_flow_deconvolves_sdi_with_the_psf_master_only_when_asked():
    from pipelines.calibration.masters.psf import gaussian_psf

    raw, h, cals, _ = _synthetic_wst(48, roll=0.0)
    for key in ("CHANNEL", "DETECTOR"):
        h[key] = "SDI"
    cals = {k: CalibrationInput(**{**v.__dict__, "channel": "SDI"}) for k, v in cals.items()}
    assert "psf" in required_kinds("SDI", CalibrationOptions(deconvolve_psf=True)) and "psf" not in required_kinds("SDI")
    with pytest.raises(CalibrationMissingError, match="psf"):
        calibrate_frame(raw, h, cals, CalibrationOptions(deconvolve_psf=True))
    psf = _cal("psf", "SDI", {"primary": gaussian_psf(9, 2.0)})
    res = calibrate_frame(raw, h, dict(cals, psf=psf), CalibrationOptions(deconvolve_psf=True, psf_iterations=5))
    text = history(res.header)
    assert "deconvolve_psf: Richardson-Lucy, 5 iterations, PSF 9x9 from psf.fits" in text
    assert res.header["PSFDECON"] is True and res.header["CALPSF"] == "psf.fits" and res.header["CALPSVER"] == 3
    plain = calibrate_frame(raw, h, dict(cals, psf=psf))
    assert "PSFDECON" not in plain.header and "deconvolve_psf: not applied" in history(plain.header)
    assert not np.allclose(res.data[plain.dq == 0], plain.data[plain.dq == 0])


def test_measured_stray_light_map_round_trips_through_a_master(tmp_path):
    from pipelines.calibration.masters.stray_light import measure_stray_light_map, stray_light_map_hdul
    from pipelines.fitsio import write_fits_atomic

    n = 128
    h = make_header(n, channel="SCI-WL", scale=960.0 / 22.0, bunit="MSB")
    geom = sun.sun_geometry(h)
    r = sun.radius_map((n, n), geom)
    model = steps.StrayLightModel.through_points(1.1, 7.8e-6, 2.5, 7.6e-7)
    stray = model.brightness(r)
    corona = lambda rr: 1e-6 * 1.425 * np.maximum(rr, 1.0) ** -7.0  # noqa: E731
    rng = np.random.default_rng(3)
    frames = []
    for k in range(6):  # corona + stray + a transient blob in one frame
        f = stray + corona(r)
        if k == 2:
            f = f + 5e-6 * np.exp(-((np.arange(n)[None, :] - 90) ** 2 + (np.arange(n)[:, None] - 64) ** 2) / 50.0)
        frames.append(f + rng.normal(0, 1e-9, f.shape))
    meas = measure_stray_light_map(frames, h, corona=corona, percentile=0.0)
    ring = (r > 1.15) & (r < 2.45)
    rel = np.abs(meas.map[ring] - stray[ring]) / stray[ring]
    assert np.median(rel) < 0.01 and meas.n_frames == 6
    assert meas.power_law.index == pytest.approx(model.index, rel=0.03)
    assert np.isnan(meas.map[r < 1.0]).all()
    path = tmp_path / "lst_sci-wl_stray_light_128_v02.fits"
    write_fits_atomic(stray_light_map_hdul(meas, "SCI-WL", 2, "2023-01-01T00:00:00"), path)
    cal = load_calibration_master(path)
    assert cal.kind == "stray_light" and cal.version == 2 and cal.data["straymap"].shape == (n, n)
    data = (stray + corona(r)).astype(np.float32)
    out, h2 = steps.subtract_stray_light(data, h, cal.data["straymap"], source=cal.name)
    assert np.median(np.abs(out[ring] - corona(r)[ring]) / stray[ring]) < 0.01
    assert "measured stray-light map subtracted" in history(h2)
    with pytest.raises(DataError, match="shape"):
        steps.subtract_stray_light(data[:64, :64], h, cal.data["straymap"])


def test_derive_flat_master_recovers_an_injected_flat(tmp_path):
    from pipelines.calibration.masters.flatfield import compare_flats, derive_flat_master
    from pipelines.calibration.masters.kll import make_dithered_set, striped_flat

    n = 96
    yy, xx = np.mgrid[0:n, 0:n]
    rho = np.hypot(xx - 47.5, yy - 47.5) / 40.0
    mu = np.sqrt(np.clip(1 - rho ** 2, 0, 1))
    scene = np.where(rho < 1, 1e4 * (0.4 + 0.6 * mu) * (1 + 0.05 * np.sin(xx / 3.0) * np.cos(yy / 4.0)), 1.0)
    flat = striped_flat((n, n), rng=4, stripe_amplitude=0.02, pixel_rms=0.01)
    shifts = np.array([(0, 0), (7, 18), (-12, 5), (23, -10), (-5, -17), (14, 9), (-20, -3), (3, 22), (11, -21)])
    dark = 100.0
    images = [im + dark for im in make_dithered_set(scene, flat, shifts, fill_value=1.0)]
    der = derive_flat_master(images, shifts, "WST", 4, "2024-01-01T00:00:00", dark_dn=dark,
                             out_path=tmp_path / "lst_wst_flat_96_v04.fits")
    cmp = compare_flats(der.result.flat, flat, der.result.valid_mask)
    assert cmp["rms"] < 0.005 and cmp["injected_rms"] > 0.01 and cmp["n"] > 0.4 * n * n
    cal = load_calibration_master(der.path)
    h = der.hdul[0].header
    assert (cal.kind, cal.channel, cal.version) == ("flat", "WST", 4) and h["FRMNAXIS"] == n
    assert h["VALIDFRM"].startswith("2024-01-01") and h["VALIDTO"] == "" and h["FLATMETH"] == "KLL"
    assert np.all(cal.data["flat"][~der.result.valid_mask] == 1.0)
    prev = flat * 1.3
    der2 = derive_flat_master(images, shifts, "WST", 5, "2024-02-01", dark_dn=dark, previous_flat=prev)
    fill = ~der2.result.valid_mask
    assert np.allclose(der2.flat[fill] / flat[fill], np.median(der2.flat[~fill] / flat[~fill]), rtol=0.01)
    with pytest.raises(ValueError, match="diffuser"):
        derive_flat_master(images, shifts, "SCI-WL", 1, "2024-01-01")


def test_dark_curve_interpolates_the_measured_factors_and_the_flow_reads_them():
    """The master's measured curve (DARKNT/DARKTn/DARKFn) replaces the doubling law (issue 27)."""
    temps, facs = (-30.0, -24.0, -18.0, -12.0), (0.2, 0.5, 1.4, 3.5)
    for t, f in zip(temps, facs):  # through its points, and between them smooth in ln
        assert steps.dark_curve_factor(t, temps, facs) == (pytest.approx(f), False)
    f_mid, outside = steps.dark_curve_factor(-15.0, temps, facs)
    assert 1.4 < f_mid < 3.5 and not outside
    f_out, outside = steps.dark_curve_factor(-6.0, temps, facs)
    assert outside and f_out > 3.5
    with pytest.raises(DataError, match="positive"):
        steps.dark_curve_factor(-15.0, temps, (0.2, 0.5, -1.0, 3.5))
    assert steps.dark_curve_from_header({"DARKNT": 1, "DARKT1": 0.0, "DARKF1": 1.0}) is None
    raw, h, cals, _ = _synthetic_wst(48, roll=0.0)
    base = calibrate_frame(raw, h, cals, CalibrationOptions(rotate_north_up=False))
    h["CCDTEMP"] = -15.0
    dark = cals["dark"]
    kw = {"DARKTREF": -21.0, "DARKTDBL": 6.0, "DARKNT": 4}  # the curve wins over the doubling law
    kw.update({f"DARKT{i}": t for i, t in enumerate(temps, 1)})
    kw.update({f"DARKF{i}": f for i, f in enumerate(facs, 1)})
    res = calibrate_frame(raw, h, dict(cals, dark=_cal("dark", "WST", dict(dark.data), **kw)),
                          CalibrationOptions(rotate_north_up=False))
    assert res.header["DARKTFAC"] == pytest.approx(f_mid, rel=1e-6)
    assert "measured curve" in history(res.header)
    expected = base.data - (dark.data["dark_rate"] * 0.5 / cals["flat"].data["flat"] / 0.5 * 2.0 * (f_mid - 1.0))
    ok = (res.dq == 0) & (base.dq == 0)
    assert ok.sum() > 1000 and np.allclose(res.data[ok], expected[ok], rtol=1e-5)
