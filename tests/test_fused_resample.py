"""The compiled north-up pass (pipelines.calibration.l2.fused) against its SciPy reference.

The reference is written out here with ``scipy.ndimage`` calls (one ``affine_transform`` of
the float32 spline coefficients, ``mode="nearest"``), not taken from the module under test.
Numba compiles the kernels once per environment (``cache=True``); a cached load costs
about 1-2 s on a loaded 2-core machine, the first compilation 10-25 s.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as nd

from pipelines.calibration.l2 import fused
from pipelines.calibration.l2.resample import _north_up_exact
from pipelines.calibration.l2.steps import DEFECT_BITS, DQ

numba_only = pytest.mark.skipif(not fused.available(), reason="numba not installed")

NY, NX = 131, 157  # small, odd, not square


def _map(roll_deg: float, scale: float = 1.0004, centre=(66.3, 77.6)) -> tuple[np.ndarray, np.ndarray]:
    th = np.deg2rad(roll_deg)
    k = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]]) * scale
    out_c = np.array([(NY - 1) / 2.0, (NX - 1) / 2.0])
    return k, np.asarray(centre) - k @ out_c


def _frame(seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:NY, :NX]
    data = (1000.0 * np.exp(-((yy - 60) ** 2 + (xx - 80) ** 2) / 900.0) + rng.normal(0, 3, (NY, NX)))
    data = data.astype(np.float32)
    data[40, 50] = np.nan
    data[0, 7] = np.inf
    dq = np.zeros((NY, NX), np.uint8)
    dq[rng.integers(0, NY, 30), rng.integers(0, NX, 30)] |= np.uint8(DQ.BAD_PIXEL)
    dq[rng.integers(0, NY, 10), rng.integers(0, NX, 10)] |= np.uint8(DQ.COSMIC_RAY)
    dq[:, :12] |= np.uint8(DQ.OUTSIDE_FOV)
    dq[NY - 1, NX - 1] |= np.uint8(DQ.SATURATED)
    var = (np.abs(data) + 9.0).astype(np.float32)
    var[5, 100] = np.nan
    return data, dq, var


def _reference_data(data: np.ndarray, k: np.ndarray, off: np.ndarray) -> np.ndarray:
    """One scipy call on the float32 coefficients of the NaN-filled frame (NaN-fill by hand)."""
    finite = np.isfinite(data)
    z = np.where(finite, data, 0).astype(np.float32)
    num = nd.uniform_filter(z, 5, mode="nearest")
    den = nd.uniform_filter(finite.astype(np.float32), 5, mode="nearest")
    filled = np.where(finite, z, num / np.where(den > 0, den, 1)).astype(np.float32)
    coef = nd.spline_filter(filled, 3, output=np.float32, mode="nearest")
    return nd.affine_transform(coef, k, offset=off, output_shape=data.shape, order=3, mode="nearest",
                               prefilter=False, output=np.float32)


@numba_only
def test_prefilter_equals_scipy_bit_for_bit():
    data, _, _ = _frame()
    a = np.nan_to_num(data, nan=0.0, posinf=0.0)
    ours = a.copy()
    fused.spline_prefilter(ours)
    ref = nd.spline_filter(a, 3, output=np.float32, mode="nearest")
    assert ours.tobytes() == ref.tobytes()


@numba_only
@pytest.mark.parametrize("roll", [-1.36, 30.0, 0.37, -97.0])
def test_compiled_pass_equals_scipy_reference(roll):
    data, dq, var = _frame()
    k, off = _map(roll)
    out, dq_out, sig = _north_up_exact(data, dq, var, k, off, order=3, threads=2, compiled=True)
    ref_out, ref_dq, ref_sig = _north_up_exact(data, dq, var, k, off, order=3, threads=2, compiled=False)
    # data: bit for bit against one scipy call wherever the product holds data
    ref = _reference_data(data, k, off)
    has = np.isfinite(out)
    assert has.sum() > 0.5 * out.size
    assert out[has].tobytes() == ref[has].tobytes()
    # the NumPy/SciPy fallback gives the same three frames
    assert np.array_equal(out, ref_out, equal_nan=True)
    assert np.array_equal(dq_out, ref_dq)
    assert np.array_equal(sig, ref_sig, equal_nan=True)
    # the defects reached the output, and NaN sits exactly on NO_DATA / NOT_FINITE
    defect = sum(int(b) for b in DEFECT_BITS)
    assert np.count_nonzero(dq_out & defect) > 30
    bad = (dq_out & int(DQ.NO_DATA | DQ.NOT_FINITE)) != 0
    assert np.array_equal(~has, bad)
    assert np.isnan(sig[~has]).all() and np.isfinite(sig[has]).all()


def test_edge_pixels_the_source_covers_are_filled():
    """A source up to half a pixel beyond the edge pixel is data; beyond that NO_DATA (both paths)."""
    data, dq, var = _frame()
    data = np.nan_to_num(data, nan=1.0, posinf=1.0)
    k = np.eye(2)
    off = np.array([0.3, -0.45])  # rows +0.3 px, columns -0.45 px: the last row's and first column's sources lie outside
    paths = [False] + ([True] if fused.available() else [])
    for compiled in paths:
        out, dq_out, sig = _north_up_exact(data, np.zeros_like(dq), var, k, off, order=3, threads=1,
                                           compiled=compiled)
        assert np.isfinite(out).all(), compiled  # row NY-1 samples y = NY - 0.7, column 0 x = -0.45
        assert not (dq_out & int(DQ.NO_DATA)).any()
        out2, dq2, _ = _north_up_exact(data, np.zeros_like(dq), None, k, np.array([0.6, 0.0]), order=3,
                                       threads=1, compiled=compiled)
        assert (dq2[NY - 1] == int(DQ.NO_DATA)).all() and np.isnan(out2[NY - 1]).all()
        assert not (dq2[:NY - 1] & int(DQ.NO_DATA)).any()


def test_fallback_runs_when_disabled(monkeypatch):
    """LSTDP_NUMBA=0 (or set_enabled(False)) runs the SciPy path; rotate_north_up gives the same frames."""
    from astropy.io import fits

    from pipelines.calibration.l2.resample import rotate_north_up_full

    monkeypatch.setenv("LSTDP_NUMBA", "0")
    assert not fused.enabled()
    data, dq, var = _frame()
    h = fits.Header({"NAXIS": 2, "NAXIS1": NX, "NAXIS2": NY, "CTYPE1": "HPLN-TAN", "CTYPE2": "HPLT-TAN",
                     "CUNIT1": "arcsec", "CUNIT2": "arcsec", "CDELT1": 2.0, "CDELT2": 2.0, "CRPIX1": 70.2,
                     "CRPIX2": 60.7, "CRVAL1": 0.0, "CRVAL2": 0.0, "CROTA2": -1.36, "DATE-OBS": "2025-01-01T00:00:00",
                     "RSUN_OBS": 100.0, "DSUN_OBS": 1.47e11})
    slow = rotate_north_up_full(data, dq, var, h)
    if not fused.available():
        return
    monkeypatch.setenv("LSTDP_NUMBA", "1")
    fused.set_enabled(None)
    assert fused.enabled()
    fast = rotate_north_up_full(data, dq, var, h)
    for a, b in zip(slow[:3], fast[:3]):
        assert np.array_equal(a, b, equal_nan=True)
    fused.set_enabled(False)
    try:
        assert not fused.enabled()
    finally:
        fused.set_enabled(None)


@numba_only
def test_statistics_in_two_passes_equal_the_reference():
    """flow._stats of a frame above 2**20 pixels: the compiled two-pass path gives every field equal."""
    from astropy.io import fits

    from pipelines.calibration.l2 import flow

    rng = np.random.default_rng(11)
    n = 1100  # 1.21e6 pixels > EXACT_PERCENTILE_PIXELS: the sampled branch
    data = (rng.lognormal(3.0, 1.0, (n, n)) - 5.0).astype(np.float32)
    data[rng.random((n, n)) < 0.01] = np.nan
    data[5, 5], data[6, 6] = np.inf, -np.inf  # not finite: not good, not the min or max
    dq = np.zeros((n, n), np.uint8)
    dq[rng.random((n, n)) < 0.03] = np.uint8(DQ.BAD_PIXEL)
    dq[:40] |= np.uint8(DQ.NO_DATA)
    h = fits.Header({"BUNIT": "DN"})
    fused.set_enabled(False)
    try:
        ref = flow._stats(data, dq, h, "WST", "numpy")
    finally:
        fused.set_enabled(None)
    got = flow._stats(data, dq, h, "WST", "numpy")
    assert got["percentiles"].startswith("sampled") and got["percentile_rank_error"] > 0
    assert got == ref


@numba_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ray_profiles_equal_scipy_map_coordinates(dtype):
    """The centre fit's compiled ray sampling gives scipy's profiles bit for bit (rays leaving the frame too)."""
    rng = np.random.default_rng(5)
    image = rng.normal(100.0, 20.0, (90, 110)).astype(dtype)
    theta = np.linspace(0.0, 2.0 * np.pi, 97, endpoint=False)
    radii = np.arange(20.0, 60.0, 0.1)
    x0, y0 = 55.3, 44.8
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
    ref = np.zeros((theta.size, radii.size))
    for t in (-0.5, 0.0, 0.5):
        xs = x0 + c * radii[None, :] - s * t
        ys = y0 + s * radii[None, :] + c * t
        ref += nd.map_coordinates(image, [ys.ravel(), xs.ravel()], order=1, mode="nearest").reshape(ref.shape)
    ref /= 3.0
    got = fused.ray_profiles(image, x0, y0, theta, radii, (-0.5, 0.0, 0.5))
    assert got.tobytes() == ref.tobytes()


@numba_only
@pytest.mark.parametrize("all_finite", [False, True])
def test_overwriting_the_input_gives_the_same_frames(all_finite):
    """In place or not, the same data, DQ and sigma. With all-finite data the pass skips the
    NOT_FINITE marking and samples the caller's DQ plane in place (the path the calibration flow
    takes on a clean frame); with NaN/inf it marks them in a new plane first."""
    data, dq, var = _frame()
    if all_finite:
        data = np.where(np.isfinite(data), data, np.float32(5.0)).astype(np.float32)
    k, off = _map(-1.36)
    ref = _north_up_exact(data, dq, var, k, off, order=3, threads=2, compiled=True)
    mine, my_dq = data.copy(), dq.copy()
    got = _north_up_exact(mine, my_dq, var, k, off, order=3, threads=2, compiled=True, overwrite=True)
    for a, b in zip(ref, got):
        assert np.array_equal(a, b, equal_nan=True)
    assert not np.array_equal(mine, data, equal_nan=True)  # the input's memory held the coefficients
    if all_finite:  # the caller's DQ memory held the plane the pass sampled
        assert not np.array_equal(my_dq, dq)


@numba_only
def test_an_input_bit_7_cannot_pose_as_the_defect_mark():
    """The DQ pre-pass keeps its "pixel holds a defect" mark in bit 7, which no DQ bit uses: an
    input with bit 7 set (a foreign plane) gives the frames of one without it."""
    assert max(int(b) for b in DQ) < 128
    data, dq, var = _frame()
    k, off = _map(-1.36)
    ref = _north_up_exact(data, dq, var, k, off, order=3, threads=2, compiled=True)
    dirty = dq | np.uint8(128)
    got = _north_up_exact(data, dirty, var, k, off, order=3, threads=2, compiled=True)
    for a, b in zip(ref, got):
        assert np.array_equal(a, b, equal_nan=True)
