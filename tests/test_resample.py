"""The north-up resampling back ends (issue 15 item 1): spline (reference) and OpenCV.

Each back end must put a known feature where the sky says (an analytic Gaussian through a
known roll and shift), use the kernel it names (OpenCV's INTER_CUBIC is Keys' cubic
convolution with a = -0.75, sampled at the exact source positions), keep the NaN/DQ
semantics of the spline path, give the variance its own kernel's factor, and be chosen
per job through ``CalibrationOptions(resample=...)`` (refused when unknown or inconsistent),
with HISTORY and the ``RESAMPLE`` keyword naming the kernel.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from astropy.io import fits
from astropy.wcs import WCS

from pipelines.calibration.l2 import resample, uncertainty
from pipelines.calibration.l2.flow import calibrate_frame
from pipelines.calibration.l2.options import CalibrationOptions, as_options
from pipelines.calibration.l2.steps import DQ
from pipelines.errors import DataError
from tests.test_calibration_steps import _synthetic_wst, history, make_header

METHODS = ("spline", "opencv-cubic", "opencv-lanczos4")
#: Largest error [of a 1000 peak, sigma 3 px Gaussian] and flux error each kernel is allowed.
#: Cubic convolution with a = -0.75 is first-order accurate (Keys 1981): its error is
#: ~0.5 f'' f(1 - f) (f the fractional position), 1.35 % at this Gaussian's peak (measured);
#: OpenCV's Lanczos-4 deviates from the exact formula (table positions), 0.48 % and 3e-4 of the flux.
PEAK_TOL = {"spline": 0.5, "opencv-cubic": 15.0, "opencv-lanczos4": 6.0}
FLUX_TOL = {"spline": 1e-5, "opencv-cubic": 2e-4, "opencv-lanczos4": 1e-3}  # cubic: 8e-5 at roll -1.35 (measured)
#: Centroid tolerance [px]: a = -0.75 does not reproduce a linear ramp, it moves it by
#: sum_k k W(f - k) - f, up to 0.048 px at f = 0.2 (0 at f = 0, 0.5): a small roll keeps f
#: nearly constant over the blob, so the centroid moves (0.035 px here, measured).
CENTROID_TOL = {"spline": 0.01, "opencv-cubic": 0.05, "opencv-lanczos4": 0.02}  # Lanczos-4: 0.012 px measured


def _keys(x: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys (1981) cubic convolution kernel, written out independently of the code under test."""
    x = np.abs(x)
    return np.where(x <= 1, (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1,
                    np.where(x < 2, a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a, 0.0))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("roll", [23.0, -1.35])
def test_a_gaussian_lands_where_the_sky_says(method, roll):
    n, scale = 129, 10.0
    h = make_header(n, x0=66.37, y0=61.81, roll=roll, scale=scale)
    sky = (250.0 / 3600.0, -130.0 / 3600.0)  # (+250", -130") helioprojective
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        px, py = (float(v) for v in WCS(h).world_to_pixel_values(*sky))
    yy, xx = np.mgrid[0:n, 0:n].astype(float)
    s = 3.0
    data = 1000.0 * np.exp(-((xx - px) ** 2 + (yy - py) ** 2) / (2 * s * s))
    out, dq, h2 = resample.rotate_north_up(data, None, h, method=method)
    # the analytic answer: every output pixel's sky position, back through the input WCS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lon, lat = WCS(h2).pixel_to_world_values(xx, yy)
        sx, sy = WCS(h).world_to_pixel_values(lon, lat)
    expected = 1000.0 * np.exp(-((sx - px) ** 2 + (sy - py) ** 2) / (2 * s * s))
    good = dq == 0
    assert np.abs(out[good] - expected[good]).max() < PEAK_TOL[method]
    w = np.where(good, out, 0.0)
    cx, cy = (w * xx).sum() / w.sum(), (w * yy).sum() / w.sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qx, qy = (float(v) for v in WCS(h2).world_to_pixel_values(*sky))
    tol = CENTROID_TOL[method]
    assert cx == pytest.approx(qx, abs=tol) and cy == pytest.approx(qy, abs=tol)
    assert w.sum() == pytest.approx(data.sum(), rel=FLUX_TOL[method])  # flux kept by the rotation (det 1)
    assert out.dtype == np.float32


def test_opencv_cubic_is_keys_a_minus_075_at_exact_source_positions():
    # a random frame through a rotation and a sub-pixel shift, against the Keys kernel summed
    # directly at float64 source positions: no 1/32-pixel quantisation of the position
    import cv2

    n = 64
    rng = np.random.default_rng(11)
    a = rng.random((n, n)).astype(np.float32)
    t = np.deg2rad(7.3)
    k_yx = np.array([[np.cos(t), np.sin(t)], [-np.sin(t), np.cos(t)]])
    off = np.array([-3.77, 5.123])
    nd = resample.ndimage_for(np)
    out = resample._resample_data_opencv(nd, a, np.isfinite(a), k_yx, off, method="opencv-cubic", threads=2)
    rows, cols = np.mgrid[0:n, 0:n].astype(float)
    y = off[0] + k_yx[0, 0] * rows + k_yx[0, 1] * cols
    x = off[1] + k_yx[1, 0] * rows + k_yx[1, 1] * cols
    ref = np.zeros_like(x)
    x0, y0 = np.floor(x), np.floor(y)
    for j in range(-1, 3):
        for i in range(-1, 3):
            xi = np.clip(x0 + i, 0, n - 1).astype(int)
            yi = np.clip(y0 + j, 0, n - 1).astype(int)
            ref += _keys(x - (x0 + i)) * _keys(y - (y0 + j)) * a[yi, xi]
    inner = (x > 3) & (x < n - 4) & (y > 3) & (y < n - 4)
    assert np.abs(out - ref)[inner].max() < 1e-4  # 1/32-px quantisation would give ~2.5e-2
    assert cv2.getNumThreads() >= 1  # the thread count was restored, not left at the call's


@pytest.mark.parametrize("frac", [0.2, 0.5, 0.8])
def test_opencv_cubic_moves_a_linear_ramp_by_the_keys_bias(frac):
    # f(x) = x shifted by frac: the spline returns x + frac; cubic convolution with a = -0.75
    # returns x + frac + b(frac), b = sum_k k W(frac - k) - frac (Keys 1981: only a = -0.5 is exact)
    n = 40
    ramp = np.tile(np.arange(n, dtype=np.float32), (n, 1))
    k_yx = np.eye(2)
    off = np.array([0.0, frac])
    nd = resample.ndimage_for(np)
    out = resample._resample_data_opencv(nd, ramp, np.isfinite(ramp), k_yx, off, method="opencv-cubic", threads=1)
    ks = np.arange(-2, 4)
    bias = float((_keys(frac - ks) * ks).sum() - frac)
    inner = out[:, 4:-4] - (np.arange(n)[4:-4] + frac)
    assert np.allclose(inner, bias, atol=1e-5)
    assert abs(bias) == pytest.approx({0.2: 0.048, 0.5: 0.0, 0.8: 0.048}[frac], abs=1e-3)
    spl = resample._affine(nd, ramp.copy(), k_yx, off, (n, n), order=1, mode="nearest", dtype=np.float32)
    assert np.allclose(spl[:, 4:-4] - (np.arange(n)[4:-4] + frac), 0.0, atol=1e-5)  # a linear kernel is exact


@pytest.mark.parametrize("method", ["opencv-cubic", "opencv-lanczos4"])
def test_opencv_keeps_the_nan_and_dq_semantics_of_the_spline_path(method):
    n = 64
    h = make_header(n, x0=30.0, y0=33.0, roll=30.0, scale=30.0)
    data = np.ones((n, n))
    data[10, 12] = np.nan
    dq = np.zeros((n, n), np.uint8)
    dq[28:36, 28:36] = DQ.OCCULTED
    out, dq2, _ = resample.rotate_north_up(data, dq, h, method=method)
    ref, dq_ref, _ = resample.rotate_north_up(data, dq, h, method="spline")
    np.testing.assert_array_equal(dq2, dq_ref)  # the DQ is the same nearest-neighbour path
    assert dq2[0, 0] & DQ.NO_DATA and np.isnan(out[0, 0])  # corners without data: NaN
    bad = (dq2 & DQ.NOT_FINITE) > 0
    assert 1 <= bad.sum() <= 6 and np.isnan(out[bad]).all()
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    good = dq2 == 0
    assert np.allclose(out[good], 1.0, atol=1e-5)  # the NaN did not spread over the kernel


def test_bad_methods_are_refused():
    n = 32
    h = make_header(n, x0=15.0, y0=16.0, roll=5.0)
    with pytest.raises(ValueError, match="unknown resampling method"):
        resample.rotate_north_up(np.ones((n, n)), None, h, method="bicubic")
    with pytest.raises(ValueError, match="fixed kernel"):
        resample.rotate_north_up(np.ones((n, n)), None, h, method="opencv-cubic", order=1)


@pytest.mark.parametrize("method", ["opencv-cubic", "opencv-lanczos4"])
def test_resampled_variance_of_the_opencv_kernels_matches_monte_carlo(method):
    n = 40
    h = make_header(n, x0=19.5 + 1.37, y0=19.5 - 0.81, roll=7.0, scale=40.0)
    rng = np.random.default_rng(5)
    var_in = np.full((n, n), 4.0, np.float32)
    pred = uncertainty.resample_variance(var_in, h, method=method)
    outs = [resample.rotate_north_up((rng.standard_normal((n, n)) * 2.0).astype(np.float32), None, h,
                                     method=method, threads=1)[0] for _ in range(300)]
    emp = np.var(np.stack(outs), axis=0)
    inner = (slice(8, n - 8), slice(8, n - 8))
    rel = emp[inner] / pred[inner]
    assert np.nanmean(rel) == pytest.approx(1.0, abs=0.03)
    # the kernel's own factor: the spline's would be wrong by a few per cent for the cubic convolution
    spline = uncertainty.resample_variance(var_in, h, method="spline")
    assert not np.allclose(spline[inner], pred[inner], rtol=0.01)


def test_resample_option_is_validated_and_part_of_the_identity():
    assert CalibrationOptions().resample == "spline" and CalibrationOptions().identity() == {}
    assert as_options({"resample": "opencv-cubic"}).identity() == {"resample": "opencv-cubic"}
    with pytest.raises(DataError, match="resample"):
        as_options({"resample": "bicubic"})
    with pytest.raises(DataError, match="interpolation_order"):
        as_options({"resample": "opencv-cubic", "interpolation_order": 1})
    with pytest.raises(DataError, match="CPU only"):
        as_options({"resample": "opencv-lanczos4", "device": "gpu"})


def test_calibrate_frame_with_opencv_names_the_kernel_in_history_and_header():
    raw, h, cals, scale = _synthetic_wst()
    ref = calibrate_frame(raw, h, cals)
    res = calibrate_frame(raw, h, cals, CalibrationOptions(resample="opencv-cubic"))
    text = history(res.header)
    assert "resample=opencv-cubic" in text and "Keys 1981" in text and "a=-0.75" in text
    assert res.header["RESAMPLE"] == "opencv-cubic" and ref.header["RESAMPLE"] == "spline3"
    assert "resample=spline" in history(ref.header) and "Unser 1999" in history(ref.header)
    n = raw.shape[0]
    inner = np.zeros((n, n), bool)
    inner[16:-16, 16:-16] = True
    good = (res.dq == 0) & inner
    # a scene linear in the sky: the spline is exact; cubic convolution (a = -0.75) moves it by
    # up to 0.048 px (test_opencv_cubic_moves_a_linear_ramp_by_the_keys_bias) times the gradient
    n_c = (n - 1) / 2.0
    g = (np.arange(n) - n_c) * scale
    expected = 1000.0 + 0.5 * g[None, :] - 0.2 * g[:, None]
    assert np.allclose(ref.data[good], expected[good], rtol=1e-6)
    grad = np.sqrt(2.0) * np.hypot(0.5, 0.2) * scale  # per pixel: |g_x| + |g_y| on any rotated axes
    assert np.abs(res.data[good] - expected[good]).max() < 0.049 * grad
    assert np.abs(res.data[good] - expected[good]).max() > 1e-3 * grad  # the bias is there: not the spline
    assert np.isfinite(res.uncertainty[good]).all() and (res.uncertainty[good] > 0).all()
    assert not np.array_equal(res.uncertainty[good], ref.uncertainty[good])  # the kernel's own variance factor


@pytest.fixture(scope="module")
def sdi_sim_dir(simulated_dataset):
    return simulated_dataset(channels=("SDI",), naxis=128, noise=True, seed=3).out_dir  # shared, read-only


def test_a_product_made_with_opencv_says_so_in_its_file_and_manifest(sqlite_env, sdi_sim_dir):
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Frame, ProductState
    from backend.worker.processing import calibrate_product, plan_product
    from pipelines.products import read_product
    from tests.live import ingest_simulated

    ingest_simulated(sdi_sim_dir)
    with session_scope() as s:
        frame = s.scalars(select(Frame).where(Frame.channel_code == "SDI").order_by(Frame.date_obs)).first()
        default, _ = plan_product(s, frame, pinned=None, options=None, job_id=None)
        prod, _ = plan_product(s, frame, pinned=None, options={"resample": "opencv-cubic"}, job_id=None)
        s.commit()
        assert prod.id != default.id and prod.params_hash != default.params_hash  # another product
        pid = prod.id
    with session_scope() as s:
        prod = calibrate_product(s, pid, sqlite_env)
        assert prod.state == ProductState.written, prod.error
        assert prod.manifest["options"]["resample"] == "opencv-cubic"
        _, _, header = read_product(prod.path)
    assert header["RESAMPLE"] == "opencv-cubic"
    assert "Keys 1981" in history(header)


def test_the_accuracy_benchmark_runs_on_a_real_scene_and_prints_its_result(tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    report = tmp_path / "r.md"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "resample_accuracy.py"), "--scenes", "HMI",
                        "--lst-size", "0", "--rolls", "5", "--no-timing", "--report", str(report)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"RESULT opencv_p99_over_sigma=([\d.]+) flux_ratio=([\d.]+) limb_shift_px=([\d.]+) "
                     r"opencv_s=n/a scipy_s=n/a lst_p99_over_sigma=\S+ lst_limb_shift_px=\S+ "
                     r"qualifies=(True|False) default=spline", last)
    assert m, last
    assert 0 < float(m.group(1)) < 100 and abs(float(m.group(2)) - 1) < 1e-3 and float(m.group(3)) < 1
    text = report.read_text()
    assert "SDO/HMI" in text and "Rule and decision" in text and "Round trip" in text


# --------------------------------------------------------------------------- the DQ pass on OpenCV


def _rotation(n: int, roll: float, shift: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """``(k_yx, offset)`` of a roll [deg] about the frame centre and an off-centre shift [px] (row, column)."""
    t = np.deg2rad(roll)
    k = np.array([[np.cos(t), np.sin(t)], [-np.sin(t), np.cos(t)]])
    c = np.full(2, (n - 1) / 2.0)
    return k, c + np.asarray(shift) - k @ c


def _random_dq(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random DQ plane (every bit, defects on ~10 % of the pixels) and a finite mask (1 % not finite)."""
    rng = np.random.default_rng(seed)
    dq = rng.integers(0, 128, (n, n)).astype(np.uint8)
    dq &= np.where(rng.random((n, n)) < 0.9, int(DQ.OCCULTED | DQ.OUTSIDE_FOV | DQ.NO_DATA), 0xFF).astype(np.uint8)
    return dq, rng.random((n, n)) > 0.01


@pytest.mark.parametrize("n", [63, 64, 129])
@pytest.mark.parametrize("roll", [0.0, 0.3, 1.35, 17.0, 30.0, -12.0])
@pytest.mark.parametrize("shift", [(0.0, 0.0), (1.37, -2.81), (0.5, 0.5), (-3.25, 4.0)])
def test_opencv_dq_is_the_scipy_dq_except_at_rounding_ties(n, roll, shift):
    # the same DQ as the scipy passes (threads=1: one call), bit for bit, except where an output
    # pixel's source position falls exactly on a half-integer (two input pixels equally near)
    k, off = _rotation(n, roll, shift)
    dq, finite = _random_dq(n, seed=n + int(abs(roll) * 10))
    nd = resample.ndimage_for(np)
    ref = resample._resample_dq(nd, dq, finite, k, off, threads=1, use_opencv=False)
    out = resample._resample_dq(nd, dq, finite, k, off, threads=2)
    assert out.dtype == np.uint8 and out.shape == ref.shape
    rows, cols = np.mgrid[0:n, 0:n].astype(float)
    y = resample._source_coordinate(k, off, 0, rows, cols)
    x = resample._source_coordinate(k, off, 1, rows, cols)
    tie = (np.abs(y - np.floor(y) - 0.5) < 1e-9) | (np.abs(x - np.floor(x) - 0.5) < 1e-9)
    diff = out != ref
    assert not (diff & ~tie).any(), np.argwhere(diff & ~tie)[:5]
    assert diff.sum() <= max(1, tie.sum())
    # the half-pixel margin OpenCV samples beyond the edge pixels is NO_DATA, as in scipy
    margin = ((y < 0) & (y > -0.5)) | ((x < 0) & (x > -0.5)) | ((y > n - 1) & (y < n - 0.5)) | \
             ((x > n - 1) & (x < n - 0.5))
    if roll:  # (unrolled grids with these shifts have no source in the margin)
        assert margin.any()
        assert (out[margin] & DQ.NO_DATA).all()
    assert (ref & int(DQ.BAD_PIXEL | DQ.COSMIC_RAY)).any()  # defects were spread, not all dropped


@pytest.mark.parametrize("frac", [1 / 510, 1 / 510 + 1e-7, 1 / 510 - 1e-7, 0.25])
def test_opencv_dq_decides_the_bilinear_defect_threshold_as_scipy(frac):
    # one defect, shifted so that its bilinear weight in the next pixel is at the 0.5/255
    # rounding threshold of scipy's uint8 pass: OpenCV's float32 value is re-decided in float64
    n = 16
    dq = np.zeros((n, n), np.uint8)
    dq[5, 7] = DQ.BAD_PIXEL
    dq[9, 3] = DQ.COSMIC_RAY
    k = np.eye(2)
    nd = resample.ndimage_for(np)
    for off in (np.array([0.0, frac]), np.array([frac, 0.0]), np.array([-frac, 2.0 - frac])):
        ref = resample._resample_dq(nd, dq, np.ones((n, n), bool), k, off, threads=1, use_opencv=False)
        out = resample._resample_dq(nd, dq, np.ones((n, n), bool), k, off, threads=1)
        np.testing.assert_array_equal(out, ref)


def test_rotate_north_up_gives_every_back_end_the_same_dq():
    # the DQ of every back end is the spline path's (nearest neighbour, defects spread,
    # NO_DATA more than half a pixel outside: resample._resample_dq_reference / the compiled pass)
    n = 64
    h = make_header(n, x0=30.2, y0=33.7, roll=17.0, scale=30.0)
    data = np.ones((n, n))
    data[10, 12] = np.nan
    dq = np.zeros((n, n), np.uint8)
    dq[28:36, 28:36] = DQ.OCCULTED
    dq[40, 20] = DQ.BAD_PIXEL
    first = None
    for method in METHODS:
        _, dq2, _ = resample.rotate_north_up(data, dq, h, method=method)
        assert (dq2 & DQ.BAD_PIXEL).sum() and (dq2 & DQ.NO_DATA).sum() and (dq2 & DQ.NOT_FINITE).sum()
        if first is None:
            first = dq2
        np.testing.assert_array_equal(dq2, first)


def test_the_opencv_dq_needs_opencv_5_1_and_falls_back_to_scipy(monkeypatch):
    import cv2

    assert resample._opencv_dq_available() == (tuple(int(p) for p in cv2.__version__.split(".")[:2]) >= (5, 1))
    monkeypatch.setattr(cv2, "__version__", "4.10.0")
    assert not resample._opencv_dq_available()
    called = []
    monkeypatch.setattr(resample, "_resample_dq_opencv", lambda *a, **kw: called.append(1))
    n = 32
    dq, finite = _random_dq(n, seed=1)
    k, off = _rotation(n, 7.0, (0.3, -0.6))
    nd = resample.ndimage_for(np)
    out = resample._resample_dq(nd, dq, finite, k, off, threads=1)
    assert not called and out.dtype == np.uint8  # the scipy passes ran
    np.testing.assert_array_equal(out, resample._resample_dq(nd, dq, finite, k, off, threads=1, use_opencv=False))
