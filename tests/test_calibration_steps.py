"""The calibration steps one by one, on small synthetic frames whose right answer is known.

Every test sets values that a wrong step would get wrong (a dark not scaled with the
exposure, a flat multiplied instead of divided, a rotation the wrong way round, radii in
the wrong unit, ...).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from astropy.io import fits
from astropy.wcs import WCS

from pipelines import array_backend, sun
from pipelines.calibration.l2 import resample, steps
from pipelines.calibration.l2.flow import (CAL_KEYWORDS, CalibrationInput, calibrate_frame, load_calibration_master,
                                        required_kinds)
from pipelines.calibration.l2.options import CalibrationOptions, as_options
from pipelines.calibration.l2.steps import DQ, StrayLightModel
from pipelines.errors import CalibrationMissingError, DataError, FitsReadError, NotLSTFrameError
from pipelines.fitsio import write_fits_atomic
from pipelines.products import build_product_hdul, quicklook_image, write_quicklook_png

RSUN = 960.0  # arcsec


def make_header(n: int = 64, *, channel: str = "WST", x0: float | None = None, y0: float | None = None,
                roll: float = 0.0, scale: float = 40.0, exptime: float = 2.0, bunit: str = "DN") -> fits.Header:
    """A header as ``read_image`` returns it for an LST frame (quirks repaired)."""
    c = (n - 1) / 2.0
    h = fits.Header()
    h["TELESCOP"], h["INSTRUME"] = "ASO-S", "LST"
    h["DETECTOR"] = "SCI" if channel.startswith("SCI") else channel
    h["CHANNEL"] = channel
    h["WAVELNTH"], h["WAVEUNIT"] = {"SDI": 121.6, "WST": 360.0, "SCI-UV": 121.6, "SCI-WL": 700.0}[channel], "nm"
    h["DATE-OBS"] = "2023-05-01T13:07:58.713"
    h["EXPTIME"] = exptime
    h["CTYPE1"], h["CTYPE2"] = "HPLN-TAN", "HPLT-TAN"
    h["CUNIT1"], h["CUNIT2"] = "arcsec", "arcsec"
    h["CRPIX1"] = (c if x0 is None else x0) + 1.0
    h["CRPIX2"] = (c if y0 is None else y0) + 1.0
    h["CRVAL1"], h["CRVAL2"] = 0.0, 0.0
    h["CDELT1"], h["CDELT2"] = scale, scale
    h["CROTA2"] = roll
    h["HGLN_OBS"], h["HGLT_OBS"], h["DSUN_OBS"] = 0.0, -4.0, 1.5e11
    h["RSUN_OBS"] = RSUN
    h["BUNIT"] = bunit
    return h


def history(h: fits.Header) -> str:
    """All HISTORY text; long entries, which FITS wraps over several cards, joined back."""
    return "".join(str(v) for v in h.get("HISTORY", []))


# ------------------------------------------------------------------ arithmetic steps


def test_subtract_dark_scales_with_exposure_time():
    n = 8
    bias = np.full((n, n), 100.0)
    rate = np.full((n, n), 5.0)
    rate[2, 3] = 50.0  # a hot pixel
    data = np.full((n, n), 300.0)
    out2, h2 = steps.subtract_dark(data, make_header(n, exptime=2.0), bias, rate)
    out8, h8 = steps.subtract_dark(data, make_header(n, exptime=8.0), bias, rate)
    assert out2[0, 0] == pytest.approx(300 - 100 - 5 * 2)
    assert out8[0, 0] == pytest.approx(300 - 100 - 5 * 8)
    assert out8[2, 3] == pytest.approx(300 - 100 - 50 * 8)
    assert h2["BUNIT"] == "DN"
    assert "subtract_dark" in history(h2) and "2 s" in history(h2)
    assert "HISTORY" not in make_header(n), "the input header is not modified"


def test_subtract_dark_refuses_bad_exposure_and_shapes():
    n = 4
    h = make_header(n)
    del h["EXPTIME"]
    with pytest.raises(DataError, match="EXPTIME"):
        steps.subtract_dark(np.ones((n, n)), h, np.zeros((n, n)), np.zeros((n, n)))
    with pytest.raises(DataError, match="EXPTIME"):
        steps.subtract_dark(np.ones((n, n)), make_header(n, exptime=0.0), np.zeros((n, n)), np.zeros((n, n)))
    with pytest.raises(DataError, match="shape"):
        steps.subtract_dark(np.ones((n, n)), make_header(n), np.zeros((n + 1, n)), np.zeros((n, n)))


def test_correct_flat_divides_and_flags_bad_flat_values():
    data = np.array([[100.0, 100.0], [100.0, 100.0]])
    flat = np.array([[0.5, 2.0], [0.0, np.nan]])
    out, h = steps.correct_flat(data, make_header(2), flat)
    assert out[0, 0] == pytest.approx(200.0)
    assert out[0, 1] == pytest.approx(50.0)
    assert np.isnan(out[1, 0]) and np.isnan(out[1, 1])
    assert "2 pixels with flat <= 0" in history(h)


def test_normalize_exposure_gives_dn_per_second_once():
    out, h = steps.normalize_exposure(np.full((2, 2), 30.0), make_header(2, exptime=4.0))
    assert out[0, 0] == pytest.approx(7.5)
    assert h["BUNIT"] == "DN/s"
    with pytest.raises(DataError, match="DN"):
        steps.normalize_exposure(out, h)  # running it twice is caught


def test_convert_units_to_msb_and_radiance():
    out, h = steps.convert_units(np.full((2, 2), 2000.0), make_header(2, bunit="DN/s"), 2.5e-9, "MSB")
    assert out[0, 0] == pytest.approx(5e-6)
    assert h["BUNIT"] == "MSB"
    out, h = steps.convert_units(np.full((2, 2), 10.0), make_header(2, bunit="DN/s"), 3.0, steps.RADIANCE_UNIT)
    assert out[0, 0] == pytest.approx(30.0) and h["BUNIT"] == "erg cm-2 s-1 sr-1"
    with pytest.raises(DataError, match="DN/s"):
        steps.convert_units(out, h, 3.0, "MSB")
    with pytest.raises(DataError, match="positive"):
        steps.convert_units(np.ones((2, 2)), make_header(2, bunit="DN/s"), -1.0, "MSB")
    with pytest.raises(DataError, match="unit"):
        steps.convert_units(np.ones((2, 2)), make_header(2, bunit="DN/s"), 1.0, "W m-2")


def test_stray_light_power_law_passes_through_the_on_orbit_points():
    wl = StrayLightModel.through_points(1.1, 7.8e-6, 2.5, 7.6e-7)
    uv = StrayLightModel.through_points(1.1, 4.3e-3, 2.5, 4.1e-4)
    assert wl.brightness(1.1) == pytest.approx(7.8e-6, rel=1e-12)
    assert wl.brightness(2.5) == pytest.approx(7.6e-7, rel=1e-12)
    assert uv.brightness(2.5) == pytest.approx(4.1e-4, rel=1e-12)
    assert wl.index == pytest.approx(math.log(7.8e-6 / 7.6e-7) / math.log(2.5 / 1.1))
    # clipped beyond its radii: no blow-up behind the occulter
    assert wl.brightness(0.1) == pytest.approx(wl.brightness(1.0))
    assert float(wl.brightness(np.array([5.0]))[0]) == pytest.approx(wl.brightness(3.0))


def test_subtract_stray_light_uses_the_disk_centre_and_radius_of_the_header():
    n, scale = 96, 60.0
    x0, y0 = 50.7, 44.2  # disk centre off the frame centre
    h = make_header(n, channel="SCI-WL", x0=x0, y0=y0, roll=1.5, scale=scale, bunit="MSB")
    model = StrayLightModel.through_points(1.1, 7.8e-6, 2.5, 7.6e-7)
    yy, xx = np.mgrid[0:n, 0:n]
    r = np.hypot(xx - x0, yy - y0) * scale / RSUN
    corona = 1e-8 * (1 + 0.5 * np.sin(xx / 7.0))
    data = corona + model.brightness(r)
    out, h2 = steps.subtract_stray_light(data, h, model)
    sel = (r > 1.1) & (r < 2.5)
    assert np.allclose(out[sel], corona[sel], rtol=0, atol=1e-14)
    assert "subtract_stray_light: power law" in history(h2)
    # the same model with a wrong centre leaves a residual far larger than the corona
    bad, _ = steps.subtract_stray_light(data, make_header(n, channel="SCI-WL", scale=scale, bunit="MSB"), model)
    assert np.abs(bad[sel] - corona[sel]).max() > 1e-8


def test_subtract_stray_light_is_skipped_for_disk_imagers_with_a_history_line():
    data = np.ones((4, 4))
    out, h = steps.subtract_stray_light(data, make_header(4, channel="SDI", bunit=steps.RADIANCE_UNIT),
                                        StrayLightModel(1e-6, 1.1, 2.8))
    assert out is data
    assert "subtract_stray_light: skipped: SDI is a disk imager" in history(h)
    _, h = steps.subtract_stray_light(data, make_header(4, channel="SCI-UV", bunit="MSB"), None)
    assert "subtract_stray_light: skipped: no stray-light model" in history(h)


# ------------------------------------------------------------------ masks


def test_flag_invalid_pixels_sets_saturation_and_nan_bits():
    data = np.array([[10.0, 65535.0], [np.nan, 65534.0]])
    dq, h = steps.flag_invalid_pixels(data, None, make_header(2))
    assert dq.dtype == np.uint8
    assert dq.tolist() == [[0, int(DQ.SATURATED)], [int(DQ.NOT_FINITE), 0]]
    assert "1 saturated" in history(h) and "1 non-finite" in history(h)
    dq2, _ = steps.flag_invalid_pixels(data, np.full((2, 2), int(DQ.OCCULTED), np.uint8), make_header(2),
                                       saturation_dn=60000)
    assert dq2[1, 1] == DQ.OCCULTED | DQ.SATURATED  # bits are OR-ed, existing ones kept


def test_occulter_and_field_stop_radii_are_converted_to_pixels():
    n, scale = 200, 12.0  # 80 px per Rsun
    x0, y0 = 101.3, 97.6
    h = make_header(n, channel="SCI-UV", x0=x0, y0=y0, roll=0.7, scale=scale, bunit="MSB")
    dq = np.zeros((n, n), np.uint8)
    dq, h1 = steps.mask_occulter(dq, h, 1.1)
    dq, h2 = steps.mask_field_of_view(dq, h1, 1.2)
    rpx = RSUN / scale
    yy, xx = np.mgrid[0:n, 0:n]
    r = np.hypot(xx - x0, yy - y0) / rpx
    assert np.all(dq[r < 1.095] & DQ.OCCULTED)
    assert not np.any(dq[r > 1.105] & DQ.OCCULTED)
    assert np.all(dq[r > 1.205] & DQ.OUTSIDE_FOV)
    assert not np.any(dq[r < 1.195] & DQ.OUTSIDE_FOV)
    assert f"({1.1 * rpx:.2f} px)" in history(h2) and "OUTSIDE_FOV (DQ bit 8)" in history(h2)


def test_mask_occulter_is_skipped_for_disk_imagers():
    dq = np.zeros((8, 8), np.uint8)
    out, h = steps.mask_occulter(dq, make_header(8, channel="WST"), 1.1)
    assert not out.any()
    assert "mask_occulter: skipped: WST has no occulter" in history(h)
    out, h = steps.mask_field_of_view(dq, make_header(8), None)
    assert "mask_field_of_view: skipped" in history(h)


# ------------------------------------------------------------------ north up



# ------------------------------------------------------------------ fused kernels


def _random_detector(n: int = 97, *, bad_flat: bool = True, seed: int = 3):
    rng = np.random.default_rng(seed)
    raw = np.round(rng.uniform(80.0, 40000.0, (n, n))).astype(np.float32)
    bias = rng.normal(100.0, 3.0, (n, n)).astype(np.float32)
    rate = rng.uniform(0.0, 20.0, (n, n)).astype(np.float32)
    flat = rng.uniform(0.8, 1.2, (n, n)).astype(np.float32)
    if bad_flat:
        flat[3, 4], flat[10, 11], flat[20, 0] = 0.0, np.nan, -1.0
    planes = {"biaserr": rng.uniform(0.1, 2.0, (n, n)).astype(np.float32),
              "darkerr": rng.uniform(0.0, 0.5, (n, n)).astype(np.float32)}
    flat_err = rng.uniform(0.0, 0.02, (n, n)).astype(np.float32)
    h = make_header(n, exptime=3.7)
    h["DET_TEMP"] = -12.5
    return raw, h, bias, rate, flat, planes, flat_err


@pytest.mark.parametrize("bad_flat", [False, True])
def test_fused_detector_signal_equals_the_steps_one_by_one(bad_flat):
    """correct_detector_signal (numexpr, one pass) against subtract_dark -> correct_flat ->
    normalize_exposure -> convert_units: the same float32 values (to 1 ulp) and the same
    keywords and HISTORY lines; the variance too (detector_variance against the chain of
    raw_variance, dark_variance, flat_variance, / t**2, x C**2)."""
    from pipelines.calibration.l2 import kernels, uncertainty

    assert kernels.available(np.zeros(1))
    raw, h, bias, rate, flat, planes, flat_err = _random_detector(bad_flat=bad_flat)
    raw_before = raw.copy()
    kw = dict(reference_temperature_c=-20.0, doubling_temperature_c=6.0)
    fused, hf = steps.correct_detector_signal(raw, h, bias, rate, flat, 2.5e-3, steps.RADIANCE_UNIT, **kw)
    img, hs = steps.subtract_dark(raw, h, bias, rate, **kw)
    img, hs = steps.correct_flat(img, hs, flat)
    img, hs = steps.normalize_exposure(img, hs)
    img, hs = steps.convert_units(img, hs, 2.5e-3, steps.RADIANCE_UNIT)
    assert fused.dtype == np.float32 and np.array_equal(raw, raw_before)  # the input is not modified
    np.testing.assert_array_equal(np.isnan(fused), np.isnan(img))
    assert np.isnan(fused).sum() == (3 if bad_flat else 0)
    np.testing.assert_allclose(fused, img, rtol=2.5e-7, atol=0)
    assert list(hf.items()) == list(hs.items())  # BUNIT, DARKTFAC, the four HISTORY lines
    assert hf["DARKTFAC"] == pytest.approx(2 ** (7.5 / 6.0)) and "subtract_dark" in history(hf)

    t, s = 3.7, 3.7 * hf["DARKTFAC"]
    var = uncertainty.detector_variance(raw, bias, 2.0, 4.0, planes, s, flat, flat_err, rate, t, 2.5e-3)
    ref = uncertainty.raw_variance(raw, bias, 2.0, 4.0)
    ref, _ = uncertainty.dark_variance(ref, planes, s, np)
    after_flat, _ = steps.correct_flat(steps.subtract_dark(raw, h, bias, rate, **kw)[0], h, flat)
    ref = uncertainty.flat_variance(ref, after_flat, flat, flat_err)
    ref = ref / np.float32(t * t) * np.float32(2.5e-3 ** 2)
    np.testing.assert_array_equal(np.isnan(var), np.isnan(ref))
    np.testing.assert_allclose(var, ref, rtol=1e-6, atol=0)
    # a wrong term would show: the flat error's share is far above float32 rounding
    without = uncertainty.detector_variance(raw, bias, 2.0, 4.0, planes, s, flat, None, rate, t, 2.5e-3)
    assert np.nanmax(np.abs(without / ref - 1)) > 1e-3


@pytest.mark.parametrize("bad_flat", [False, True])
def test_compiled_detector_pass_equals_numexpr_bit_for_bit(bad_flat):
    """The compiled detector signal and variance (pipelines.calibration.l2.fused) against the numexpr
    expressions they replace: equal bytes (float32 operations in the same order), with and without
    the error planes, with raw values below the bias (the Poisson term's clip)."""
    from pipelines.calibration.l2 import fused, kernels, uncertainty

    assert fused.available(), "Numba is a dependency (pyproject.toml): the compiled path must be here"
    assert kernels.available(np.zeros(1))
    raw, h, bias, rate, flat, planes, flat_err = _random_detector(bad_flat=bad_flat)
    raw[5, :20] = 50.0  # below the bias
    kw = dict(reference_temperature_c=-20.0, doubling_temperature_c=6.0)
    t, s = 3.7, 3.7 * 2 ** (7.5 / 6.0)
    got, want = {}, {}
    for on, res in ((True, got), (False, want)):
        fused.set_enabled(on)
        try:
            res["img"], res["h"] = steps.correct_detector_signal(raw, h, bias, rate, flat, 2.5e-3, steps.RADIANCE_UNIT,
                                                                 **kw)
            for name, pl, fe in (("all", planes, flat_err), ("none", {}, None),
                                 ("bias", {"biaserr": planes["biaserr"]}, flat_err)):
                res[name] = uncertainty.detector_variance(raw, bias, 2.0, 4.0, pl, s, flat, fe, rate, t, 2.5e-3)
        finally:
            fused.set_enabled(None)
    assert got["img"].tobytes() == want["img"].tobytes()
    assert list(got["h"].items()) == list(want["h"].items())
    for name in ("all", "none", "bias"):
        assert got[name].tobytes() == want[name].tobytes(), name
    assert np.isnan(got["all"]).sum() == (3 if bad_flat else 0)


def test_flow_fused_and_step_by_step_paths_agree():
    """calibrate_frame on NumPy (fused) against the step-by-step path the flow takes on
    other backends (forced here by hiding numexpr): data, DQ, uncertainty, statistics."""
    from pipelines.calibration.l2 import kernels

    raw, h, cals, _ = _synthetic_wst(64)
    fused = calibrate_frame(raw, h, cals)
    saved = kernels._NE
    kernels._NE = False
    try:
        slow = calibrate_frame(raw, h, cals)
    finally:
        kernels._NE = saved
    np.testing.assert_array_equal(fused.dq, slow.dq)
    np.testing.assert_allclose(fused.data, slow.data, rtol=1e-6)
    np.testing.assert_allclose(fused.uncertainty, slow.uncertainty, rtol=1e-5)
    assert fused.stats["n_good"] == slow.stats["n_good"] and fused.stats["median"] == pytest.approx(slow.stats["median"])
    steps_of = lambda r: sorted(str(v).split(":")[0] for v in r.header["HISTORY"] if ":" in str(v))  # noqa: E731
    assert steps_of(fused) == steps_of(slow)


@pytest.mark.parametrize("inside", [True, False])
def test_fused_radius_mask_equals_the_radius_map(inside):
    n = 301
    h = make_header(n, channel="SCI-UV", x0=148.3, y0=155.9, roll=17.0, scale=9.0, bunit="MSB")
    geom = sun.sun_geometry(h)
    sel = steps._radius_select((n, n), geom, 1.7, inside)
    r = sun.radius_map((n, n), geom, np, dtype=np.float32)
    np.testing.assert_array_equal(sel, (r < 1.7) if inside else (r > 1.7))
    assert 0 < sel.sum() < n * n
    # the compiled pass (pipelines.calibration.l2.fused.radius_flag): the same pixels flagged, counted
    from pipelines.calibration.l2 import fused

    if fused.available():
        dq = np.zeros((n, n), np.uint8)
        dq[::7, ::5] = np.uint8(steps.DQ.BAD_PIXEL)
        out = np.empty_like(dq)
        count = fused.radius_flag(dq, steps._radius_terms((n, n), geom), 1.7, inside, int(steps.DQ.OCCULTED), out)
        assert count == int(sel.sum())
        np.testing.assert_array_equal(out, np.where(sel, dq | np.uint8(steps.DQ.OCCULTED), dq))


def test_statistics_exact_when_small_and_sampled_with_a_measured_rank_error_when_large():
    from pipelines.calibration.l2 import flow

    rng = np.random.default_rng(8)
    small = rng.lognormal(0.0, 1.0, (300, 300)).astype(np.float32)
    dq = np.zeros(small.shape, np.uint8)
    dq[:10] = DQ.OUTSIDE_FOV
    small[50, 50] = np.nan
    st = flow._stats(small, dq, make_header(300), "WST", "numpy")
    good = small[(dq == 0) & np.isfinite(small)]
    assert st["percentiles"] == "exact" and st["percentile_rank_error"] == 0.0
    assert st["n_good"] == good.size and st["median"] == pytest.approx(float(np.median(good)), rel=1e-6)
    assert st["p99"] == pytest.approx(float(np.percentile(good, 99)), rel=1e-6)
    assert st["min"] == float(good.min()) and st["max"] == float(good.max())
    assert st["mean"] == pytest.approx(float(good.mean(dtype=np.float64)), rel=1e-12)

    n = 1100  # 1.21 M pixels > EXACT_PERCENTILE_PIXELS: sampled every 2nd pixel
    big = rng.lognormal(0.0, 1.0, (n, n)).astype(np.float32)
    dq = np.zeros(big.shape, np.uint8)
    dq[:, :100] = DQ.OUTSIDE_FOV
    st = flow._stats(big, dq, make_header(n), "WST", "numpy")
    good = big[dq == 0]
    assert st["percentiles"] == "sampled: 1 pixel in 2, raster order"
    assert st["min"] == float(good.min()) and st["max"] == float(good.max()) and st["n_good"] == good.size
    assert st["mean"] == pytest.approx(float(good.mean(dtype=np.float64)), rel=1e-12)
    err = 0.0
    for want, key in ((1, "p01"), (50, "median"), (99, "p99")):
        rank = 100.0 * np.count_nonzero(good < np.float32(st[key])) / good.size
        err = max(err, abs(rank - want))
    assert st["percentile_rank_error"] == pytest.approx(err, abs=1e-4)  # the error stated is the true one
    assert 0 < st["percentile_rank_error"] < 0.2
    assert st["median"] == pytest.approx(float(np.median(good)), rel=5e-3)


def _blob(n: int, x: float, y: float, sigma: float = 2.0) -> np.ndarray:
    yy, xx = np.mgrid[0:n, 0:n]
    return np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * sigma ** 2))


def _centroid(img: np.ndarray) -> tuple[float, float]:
    w = np.nan_to_num(np.clip(img, 0, None))
    yy, xx = np.mgrid[0:img.shape[0], 0:img.shape[1]]
    return float((w * xx).sum() / w.sum()), float((w * yy).sum() / w.sum())


@pytest.mark.parametrize("roll", [90.0, -35.0, 1.3])
def test_rotate_north_up_puts_a_known_feature_where_the_sky_says(roll):
    n, scale = 101, 20.0
    x0, y0 = 53.4, 47.9
    h = make_header(n, x0=x0, y0=y0, roll=roll, scale=scale, bunit=steps.RADIANCE_UNIT)
    # a feature at helioprojective (+300", +100") (west, north), placed with astropy's WCS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        px, py = WCS(h).world_to_pixel_values(300.0 / 3600.0, 100.0 / 3600.0)
    data = 5.0 + 100.0 * _blob(n, float(px), float(py))
    out, dq, h2 = resample.rotate_north_up(data, None, h)
    c = (n - 1) / 2.0
    cx, cy = _centroid(np.where(dq == 0, out - 5.0, 0.0))
    assert cx == pytest.approx(c + 300.0 / scale, abs=0.05)
    assert cy == pytest.approx(c + 100.0 / scale, abs=0.05)
    assert h2["CRPIX1"] == pytest.approx(c + 1) and h2["CRPIX2"] == pytest.approx(c + 1)
    assert "CROTA2" not in h2 and h2["PC1_2"] == 0.0 and h2["PC1_1"] == 1.0
    assert h2["CTYPE1"] == "HPLN-TAN" and h2["CUNIT1"] == "arcsec"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qx, qy = WCS(h2).world_to_pixel_values(300.0 / 3600.0, 100.0 / 3600.0)
    assert (float(qx), float(qy)) == pytest.approx((cx, cy), abs=0.05)
    assert f"roll was {roll:+.4f} deg" in history(h2)
    assert out.dtype == np.float32


def test_rotate_north_up_moves_dq_bits_by_nearest_neighbour_and_flags_no_data():
    n = 64
    h = make_header(n, x0=30.0, y0=33.0, roll=30.0, scale=30.0)
    data = np.ones((n, n))
    data[10, 12] = np.nan
    dq = np.zeros((n, n), np.uint8)
    dq[28:36, 28:36] = DQ.OCCULTED
    out, dq2, _ = resample.rotate_north_up(data, dq, h)
    assert set(np.unique(dq2)) <= {0, int(DQ.OCCULTED), int(DQ.NO_DATA), int(DQ.NOT_FINITE),
                                   int(DQ.NO_DATA | DQ.OCCULTED)}
    assert (dq2 == DQ.OCCULTED).sum() == pytest.approx(64, abs=8)  # the 8x8 block, rotated, not smeared
    assert dq2[0, 0] & DQ.NO_DATA and np.isnan(out[0, 0])  # a 30 deg roll leaves corners without data
    # the NaN pixel is not lost between the grids: it flags the output pixels it touches
    bad = (dq2 & DQ.NOT_FINITE) > 0
    assert 1 <= bad.sum() <= 6 and np.isnan(out[bad]).all()
    good = dq2 == 0
    assert np.allclose(out[good], 1.0, atol=1e-5)  # a flat field stays flat (the NaN did not spread)


@pytest.mark.parametrize("threads", [2, 3])
def test_rotate_north_up_on_threads_equals_one_call(threads):
    # row blocks (resampling) and column/row blocks (spline prefilter) on threads must
    # join into the single-threaded result: region and defect DQ bits exactly, data to float rounding
    n = 300
    rng = np.random.default_rng(4)
    h = make_header(n, x0=151.7, y0=146.2, roll=-7.5, scale=8.0)
    data = 50.0 + 10.0 * _blob(n, 120.0, 170.0, sigma=9.0) + rng.normal(0.0, 1.0, (n, n))
    data[40, 200] = np.nan
    dq = np.zeros((n, n), np.uint8)
    dq[140:160, 140:160] = DQ.OCCULTED
    dq[77, 33] = DQ.BAD_PIXEL
    one, dq_one, _ = resample.rotate_north_up(data, dq, h, threads=1)
    many, dq_many, h2 = resample.rotate_north_up(data, dq, h, threads=threads)
    assert resample._blocks(n, threads) and len(resample._blocks(n, threads)) == threads
    np.testing.assert_array_equal(dq_many, dq_one)
    assert (dq_one & DQ.BAD_PIXEL).any() and (dq_one & DQ.NO_DATA).any()
    np.testing.assert_allclose(many, one, rtol=0, atol=1e-5, equal_nan=True)
    assert np.array_equal(np.isnan(many), np.isnan(one))


def test_rotate_north_up_skips_a_frame_already_north_up_and_centred():
    n = 16
    out, dq, h = resample.rotate_north_up(np.arange(n * n, dtype=float).reshape(n, n), None, make_header(n))
    assert "rotate_north_up: skipped" in history(h)
    assert out[3, 5] == 3 * n + 5


def test_sun_geometry_needs_a_wcs_and_a_distance():
    h = make_header(8)
    del h["RSUN_OBS"], h["DSUN_OBS"]
    with pytest.raises(DataError, match="radius"):
        sun.sun_geometry(h)
    h = make_header(8)
    for k in ("CTYPE1", "CTYPE2"):
        del h[k]
    with pytest.raises(DataError):
        sun.sun_geometry(h)
    g = sun.sun_geometry(make_header(8, roll=2.0, scale=10.0))
    assert g.roll_deg == pytest.approx(2.0) and g.scale == pytest.approx(10.0) and g.rsun_px == pytest.approx(96.0)


# ------------------------------------------------------------------ the flow on a synthetic frame


def _cal(kind: str, channel: str, data: dict | None = None, **params) -> CalibrationInput:
    return CalibrationInput(kind=kind, id=7, version=3, sha256="ab" * 32, name=f"{kind}.fits", channel=channel,
                            data=data or {}, parameters=params)


def _synthetic_wst(n: int = 80, roll: float = 8.0):
    """A WST-like frame of a known linear scene, made with the forward model (no rounding)."""
    scale, x0, y0, t, coef = 15.0, 41.3, 37.8, 0.5, 2.0
    h = make_header(n, channel="WST", x0=x0, y0=y0, roll=roll, scale=scale, exptime=t)
    rng = np.random.default_rng(1)
    bias = 100 + rng.normal(0, 2, (n, n))
    rate = 3 + rng.random((n, n))
    flat = 1 + 0.05 * np.sin(np.arange(n) / 3.0)[None, :] * np.ones((n, 1))
    yy, xx = np.mgrid[0:n, 0:n]
    a = math.radians(roll)
    tx = scale * (math.cos(a) * (xx - x0) - math.sin(a) * (yy - y0))
    ty = scale * (math.sin(a) * (xx - x0) + math.cos(a) * (yy - y0))
    scene = 1000.0 + 0.5 * tx - 0.2 * ty  # radiance, linear in helioprojective x, y
    raw = bias + rate * t + flat * t * scene / coef
    cals = {"dark": _cal("dark", "WST", {"bias": bias, "dark_rate": rate}),
            "flat": _cal("flat", "WST", {"flat": flat}),
            "radiometric": _cal("radiometric", "WST", RADCOEF=coef, RADUNIT=steps.RADIANCE_UNIT),
            "mask_geometry": _cal("mask_geometry", "WST", FOVRAD=1.2)}
    return raw, h, cals, scale


def test_calibrate_frame_recovers_a_known_scene_north_up():
    raw, h, cals, scale = _synthetic_wst()
    res = calibrate_frame(raw, h, cals)
    n = raw.shape[0]
    c = (n - 1) / 2.0
    g = (np.arange(n) - c) * scale
    expected = 1000.0 + 0.5 * g[None, :] - 0.2 * g[:, None]
    inner = np.zeros((n, n), bool)
    inner[16:-16, 16:-16] = True  # away from the spline's boundary handling
    good = (res.dq == 0) & inner
    assert good.sum() == inner.sum()
    assert np.allclose(res.data[good], expected[good], rtol=1e-6)
    assert res.data.dtype == np.float32 and res.dq.dtype == np.uint8
    hdr = res.header
    assert hdr["LEVEL"] == "L2" and hdr["BUNIT"] == "erg cm-2 s-1 sr-1"
    for kind, (kname, kver, kid, ksha) in CAL_KEYWORDS.items():
        if kind in cals:
            assert hdr[kname] == f"{kind}.fits" and hdr[kver] == 3 and hdr[kid] == 7 and hdr[ksha] == "ab" * 32
    text = history(hdr)
    for step in ("flag_invalid_pixels", "subtract_dark", "correct_flat", "normalize_exposure", "convert_units",
                 "subtract_stray_light: skipped", "mask_occulter: skipped", "mask_field_of_view", "rotate_north_up"):
        assert step in text, step
    assert res.stats["n_pixels"] == n * n and res.stats["median"] == pytest.approx(np.median(res.data[res.dq == 0]))


def test_calibrate_frame_refuses_missing_or_mismatched_calibrations():
    raw, h, cals, _ = _synthetic_wst(32)
    with pytest.raises(CalibrationMissingError, match="flat"):
        calibrate_frame(raw, h, {k: v for k, v in cals.items() if k != "flat"})
    bad = dict(cals, flat=_cal("flat", "SDI", {"flat": np.ones_like(raw)}))
    with pytest.raises(DataError, match="for SDI"):
        calibrate_frame(raw, h, bad)
    bad = dict(cals, flat=_cal("flat", "WST", {"flat": np.ones((16, 16))}))
    with pytest.raises(DataError, match="16x16"):
        calibrate_frame(raw, h, bad)
    h2 = h.copy()
    h2["TELESCOP"], h2["INSTRUME"], h2["CHANNEL"], h2["DETECTOR"] = "SOHO", "EIT", "", ""
    with pytest.raises(NotLSTFrameError):
        calibrate_frame(raw, h2, cals)
    assert "stray_light" in required_kinds("SCI-WL") and "stray_light" not in required_kinds("SDI")
    # mask geometry is optional (nominal field of view), a PSF kernel is recorded, not applied
    psf = _cal("psf", "WST", {"primary": np.ones((5, 5))})
    res = calibrate_frame(raw, h, dict({k: v for k, v in cals.items() if k != "mask_geometry"}, psf=psf))
    assert "nominal WST field of view" in history(res.header) and res.header["CALPSF"] == "psf.fits"
    assert "deconvolve_psf: not applied" in history(res.header) and "outside r = 1.2 Rsun" in history(res.header)
    assert "stray_light" not in required_kinds("SCI-UV", CalibrationOptions(subtract_stray_light=False))


def test_calibrate_frame_options_skip_steps_and_unknown_options_are_refused():
    raw, h, cals, _ = _synthetic_wst(32, roll=3.0)
    res = calibrate_frame(raw, h, cals, CalibrationOptions(rotate_north_up=False, device="cpu"))
    text = history(res.header)
    assert "rotate_north_up: skipped on request" in text
    assert res.header["CROTA2"] == 3.0  # not rotated: the WCS is the input's
    with pytest.raises(DataError, match="colour"):
        as_options({"rotate_north_up": False, "colour": "blue"})
    with pytest.raises(DataError, match="interpolation_order"):
        as_options({"interpolation_order": 7})
    assert as_options({"rotate_north_up": False}) == CalibrationOptions(rotate_north_up=False)
    with pytest.raises(TypeError, match="CalibrationOptions"):
        calibrate_frame(raw, h, cals, {"rotate_north_up": False})


# ------------------------------------------------------------------ masters, products, backend


def test_load_calibration_master_reads_and_verifies(tmp_path):
    n = 8
    h = fits.Header()
    h["CALKIND"], h["CHANNEL"], h["CALVER"] = "dark", "WST", 2
    h["VALIDFRM"], h["VALIDTO"] = "2023-01-01T00:00:00", "2024-01-01T00:00:00"
    hdul = fits.HDUList([fits.PrimaryHDU(np.full((n, n), 100, np.float32), header=h),
                         fits.ImageHDU(np.full((n, n), 2, np.float32), name="DARKRATE")])
    p = tmp_path / "dark.fits"
    write_fits_atomic(hdul, p)
    cal = load_calibration_master(p)
    assert cal.kind == "dark" and cal.version == 2 and cal.channel == "WST" and cal.id is None
    assert cal.data["bias"][0, 0] == 100 and cal.data["dark_rate"][0, 0] == 2
    assert len(cal.sha256) == 64
    # one flipped byte in the data: the checksum catches it
    raw = bytearray(p.read_bytes())
    raw[-10] ^= 0xFF
    q = tmp_path / "corrupt.fits"
    q.write_bytes(bytes(raw))
    with pytest.raises(FitsReadError, match="CHECKSUM"):
        load_calibration_master(q)
    q.write_bytes(b"not a fits file")
    with pytest.raises(FitsReadError):
        load_calibration_master(q)
    plain = tmp_path / "plain.fits"
    fits.PrimaryHDU(np.zeros((2, 2))).writeto(plain)
    with pytest.raises(DataError, match="CALKIND"):
        load_calibration_master(plain)


def test_read_product_reads_both_dq_layouts_and_names_the_file_on_errors(tmp_path):
    from pipelines.products import dq_table_hdu, read_product

    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    dq = np.zeros((3, 4), np.uint8)
    dq[1, 2] = DQ.OCCULTED
    h = fits.Header({"BUNIT": "MSB"})
    table, image, none = tmp_path / "table.fits", tmp_path / "image.fits", tmp_path / "none.fits"
    fits.HDUList([fits.PrimaryHDU(data, h), dq_table_hdu(dq)]).writeto(table)
    fits.HDUList([fits.PrimaryHDU(data, h), fits.ImageHDU(dq, name="DQ")]).writeto(image)
    fits.HDUList([fits.PrimaryHDU(), fits.ImageHDU(data, h)]).writeto(none)  # image in an extension, no DQ
    for p in (table, image):
        d, q, hh = read_product(p)
        assert d.dtype == np.float32 and q.dtype == np.uint8 and np.array_equal(d, data) and np.array_equal(q, dq)
        assert hh["BUNIT"] == "MSB"
    d, q, _ = read_product(none, dtype=np.float64)
    assert d.dtype == np.float64 and np.array_equal(d, data) and not q.any() and q.shape == data.shape
    bad = tmp_path / "bad.fits"
    fits.HDUList([fits.PrimaryHDU(data), dq_table_hdu(np.zeros((2, 2), np.uint8))]).writeto(bad)
    with pytest.raises(FitsReadError, match="DQ shape"):
        read_product(bad)
    junk = tmp_path / "junk.fits"
    junk.write_bytes(b"not FITS" * 400)
    with pytest.raises(FitsReadError, match="junk.fits: unreadable"):
        read_product(junk)
    fits.PrimaryHDU(np.zeros(5)).writeto(tmp_path / "one_d.fits")
    with pytest.raises(FitsReadError, match="no 2-D image"):
        read_product(tmp_path / "one_d.fits")


def test_product_hdul_and_quicklook(tmp_path):
    raw, h, cals, _ = _synthetic_wst(64)
    res = calibrate_frame(raw, h, cals)
    hdul = build_product_hdul(res, software_version="9.9.9")
    assert hdul[0].data.dtype == np.float32 and hdul["DQ"].data.dtype == np.uint8
    assert hdul["DQ"].data.shape == hdul[0].data.shape == hdul["UNCERT"].data.shape
    assert isinstance(hdul["DQ"], fits.ImageHDU) and isinstance(hdul["UNCERT"], fits.ImageHDU)
    assert hdul[0].header["SOFTVERS"] == "9.9.9" and hdul["DQ"].header["CTYPE1"] == "HPLN-TAN"
    assert hdul["UNCERT"].header["CTYPE1"] == "HPLN-TAN" and hdul["UNCERT"].header["BUNIT"] == hdul[0].header["BUNIT"]
    p = tmp_path / "l2.fits"
    write_fits_atomic(hdul, p)
    with fits.open(p, checksum=True) as f:
        assert all(h._checksum_valid and h._datasum_valid for h in f)
        f.verify("exception")
    img = quicklook_image(np.arange(1024 * 1024, dtype=float).reshape(1024, 1024), np.zeros((1024, 1024), np.uint8),
                          "WST", size=256)
    assert img.shape == (256, 256) and np.nanmin(img) >= 0 and np.nanmax(img) <= 1
    dq = res.dq.copy()
    dq[:5, :5] = DQ.OCCULTED
    png = write_quicklook_png(res.data, dq, tmp_path / "ql.png", "SCI-UV")
    import matplotlib.image as mpimg

    rgba = mpimg.imread(png)
    assert rgba.shape[:2] == (64, 64)
    assert np.allclose(rgba[-1, 0, :3], 0.0)  # masked corner (row 0 is drawn at the bottom) is black


def test_array_backend_resolves_numpy_and_refuses_missing_cupy():
    xp = array_backend.resolve_namespace("cpu")
    assert array_backend.backend_name(xp) == "numpy"
    a = array_backend.to_device([1.0, 2.0], xp, xp.float32)
    assert array_backend.to_numpy(a * 2).tolist() == [2.0, 4.0]
    with pytest.raises(ValueError):
        array_backend.resolve_namespace("tpu")
    if not array_backend.cupy_available():
        with pytest.raises(array_backend.BackendUnavailableError):
            array_backend.resolve_namespace("gpu")
    else:  # pragma: no cover - only where a GPU is present
        raw, h, cals, _ = _synthetic_wst(48)
        cpu = calibrate_frame(raw, h, cals)
        gpu = calibrate_frame(raw, h, cals, backend="cupy")
        assert np.allclose(cpu.data, gpu.data, rtol=1e-5, equal_nan=True)


def test_worker_shares_its_cores_among_its_processes():
    from types import SimpleNamespace

    from backend.worker import tasks

    try:
        tasks._share_cores(sender=SimpleNamespace(concurrency=2))
        assert resample.default_threads() == max(1, resample.available_cores() // 2)
        tasks._share_cores(sender=SimpleNamespace(concurrency=10_000))
        assert resample.default_threads() == 1
        resample.set_default_threads(None)
        tasks._share_cores(sender=SimpleNamespace(concurrency="auto"))  # left alone
        assert resample.default_threads() == resample.available_cores()
    finally:
        resample.set_default_threads(None)


_NUMEXPR_RACE = r"""
import sys, threading
import numpy as np
from pipelines.calibration.l2 import kernels
a = np.random.default_rng(0).random(300_000).astype(np.float32)
env = {"a": a, "b": a[::-1].copy(), "c": np.float32(2.0)}
want = a * env["b"] + np.float32(2.0)
errors = []
def lane(k):
    for i in range(300):
        kernels.set_threads(1 + (i + k) % 2)  # numexpr.set_num_threads between other threads' calls
        if not np.array_equal(kernels.evaluate("a * b + c", env), want):
            errors.append(i)
ts = [threading.Thread(target=lane, args=(k,)) for k in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print("wrong" if errors else "ok")
"""


def test_fused_kernels_called_from_several_threads_neither_hang_nor_mix_results():
    """The batch executor's lanes call the fused kernels at once. numexpr's thread pool is
    global: ``set_num_threads`` while another thread evaluated deadlocked (gpu_check --cpu-only
    hung in ``_stats``; this script hung 3 times in 3 before the lock). In a child process, so a
    hang fails this test instead of the suite."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", _NUMEXPR_RACE], capture_output=True, text=True, timeout=180,
                       cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.stdout, r.stderr[-2000:])
