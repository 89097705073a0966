"""The flat's degenerate plane, stated (issue 27, item 2), and a flat robust to dirty inputs.

A dithered set cannot measure the flat's linear gain gradient (with free per-image levels a
gain plane, the opposite scene plane and level changes fit the data exactly as well). The
chain's flat master therefore removes it (zero gradient over the measured pixels by
convention), says so (``FLATPLSR = 'STATED'``, ``FLATPLWY``) and states its uncertainty
(``FLATPLSG``), which the L2 flow puts into ``UNCERT`` in quadrature and flags
(``QUALITY`` bit ``FLAT_PLANE_STATED``, ``FLATPLAN``). Small sets (64 px) keep these cheap.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.calibration.masters.flatfield import compare_flats, derive_flat_master
from pipelines.calibration.masters.subpixel_flat import FLAT_PLANE_SIGMA, plane_sigma_map
from pipelines.simulation.dithers import simulate_dithered_flat_set

N = 64
#: A scene gradient: 6 % from limb to limb along x (a real Sun's asymmetry; the symmetric-disk prior's trap).
TILT = 0.06


def _tilted_disk(y, x):
    r2 = np.minimum(x * x + y * y, 1.0)
    mu = np.sqrt(1.0 - r2)
    disk = np.where(x * x + y * y < 1.0, 1.0 - 0.6 * (1.0 - mu), 0.0)
    return disk * (1.0 + 0.5 * TILT * x)


def _plane(err, valid):
    """``(d/dy, d/dx)`` [1/pixel] of ``err`` fitted over ``valid`` (with a constant)."""
    yy, xx = np.nonzero(valid)
    design = np.column_stack([np.ones(yy.size), yy, xx])
    return np.linalg.lstsq(design, err[valid], rcond=None)[0][1:]


@pytest.fixture(scope="module")
def tilted():
    return simulate_dithered_flat_set(N, noise=True, seed=5, scene=_tilted_disk)


@pytest.fixture(scope="module")
def stated(tilted):
    return derive_flat_master(tilted.images, tilted.commanded, "WST", 2, "2024-01-01", method="subpixel")


def test_the_stated_plane_is_removed_said_and_sized(tilted, stated):
    s, der = tilted, stated
    h, res = der.hdul[0].header, der.result
    v = res.valid_mask
    assert h["FLATPLSR"] == "STATED" and "convention" in h["FLATPLWY"]
    assert h["FLATPLSG"] == pytest.approx(FLAT_PLANE_SIGMA)
    assert (h["FLATPLY0"] - 1, h["FLATPLX0"] - 1) == pytest.approx(tuple(np.argwhere(v).mean(axis=0)))
    # the convention holds: the flat has no gradient over what it measured
    assert np.abs(_plane(np.log(np.where(v, res.flat, 1.0)), v)).max() < 1e-9
    # its plane error is the hidden flat's own plane (what is stated), the rest is recovered
    err = np.log(np.where(v, res.flat / s.flat, 1.0))
    true_plane = _plane(np.log(s.flat), v)
    assert np.allclose(_plane(err, v), -true_plane, atol=2e-5)
    resid = err - np.mean(err[v])
    yy, xx = np.nonzero(v)
    resid[v] -= np.column_stack([yy, xx]) @ _plane(err, v) - np.mean(np.column_stack([yy, xx]) @ _plane(err, v))
    assert np.sqrt(np.mean(resid[v] ** 2)) < 0.005
    # the disk prior takes the scene's 6 % tilt for gain: a plane far beyond the stated sigma
    prior = derive_flat_master(s.images, s.commanded, "WST", 2, "2024-01-01", method="subpixel", plane="disk")
    perr = _plane(np.log(np.where(v, prior.result.flat / s.flat, 1.0)), v)
    assert abs(perr[1]) * N > 2 * FLAT_PLANE_SIGMA > abs(_plane(err, v)[1]) * N
    assert prior.hdul[0].header["FLATPLWY"] == "symmetric disk prior" and "FLATPLSG" not in prior.hdul[0].header
    assert compare_flats(res.flat, s.flat, v)["rms"] < compare_flats(prior.result.flat, s.flat, v)["rms"]
    with pytest.raises(ValueError, match="plane"):
        derive_flat_master(s.images, s.commanded, "WST", 2, "2024-01-01", method="subpixel", plane="limb")


def test_hot_pixels_and_cosmic_rays_in_the_flat_set_are_dropped(tilted, stated):
    s, ref = tilted, stated
    rng = np.random.default_rng(11)
    peak = max(float(np.percentile(im, 99)) for im in s.images)
    v = ref.result.valid_mask
    inner = np.argwhere(v & (ref.result.coverage == len(s.images)))
    hot = inner[rng.choice(len(inner), 6, replace=False)]
    dirty = []
    for k, im in enumerate(s.images):
        a = im.copy()
        a[hot[:, 0], hot[:, 1]] += 0.1 * peak  # static: new hot pixels
        y, x = inner[rng.choice(len(inner), 4, replace=False)].T
        a[y, x] += 0.5 * peak  # a few cosmic-ray hits in each image
        dirty.append(a)
    out = {}
    for robust in (True, False):
        der = derive_flat_master(dirty, s.commanded, "WST", 2, "2024-01-01", method="subpixel", outliers=robust)
        ratio = der.result.flat / ref.result.flat
        out[robust] = (der, np.abs(ratio[v] / np.mean(ratio[v]) - 1.0).max())
    der, worst = out[True]
    assert der.result.replaced[hot[:, 0], hot[:, 1]].all() and der.hdul[0].header["FLATNHOT"] >= 6
    assert der.hdul[0].header["FLATNCR"] >= 4 * len(s.images)
    assert worst < 0.02 < 0.05 < out[False][1]  # without step 4 the hot pixels stay in the flat (~10 %)


def test_plane_sigma_map_is_the_stated_gradient_about_the_pivot():
    m = plane_sigma_map((N, N), 0.02, (31.5, 20.0))
    assert m.dtype == np.float32 and m[31, 20] == pytest.approx(0.02 / N * 0.5, rel=1e-5)
    assert m[0, 0] == pytest.approx(0.02 / N * math.hypot(31.5, 20.0), rel=1e-5)


def test_a_product_with_a_stated_plane_carries_it_in_uncert_and_keywords(tmp_path):
    """The L2 flow: ``FLATPLSG`` copied, the frame flagged, and UNCERT**2 grown by exactly
    ``(data x plane sigma)**2`` on the detector grid (no rotation to compare pixel by pixel)."""
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.calibration.l2.options import CalibrationOptions
    from pipelines.calibration.l2.quality import FrameQuality, frame_quality
    from pipelines.fitsio import read_image
    from pipelines.simulation import simulate
    from validation.gates import load_masters

    sim = simulate(tmp_path, channels=("WST",), naxis=N, noise=True, seed=3, sdi_sequence=False)
    raw = read_image(sim.frames[0].raw_path)
    opts = CalibrationOptions(rotate_north_up=False, fit_centre=False, remove_cosmic_rays=False)
    cals = load_masters(sim.calibration_files)["WST"]
    plain = calibrate_frame(raw.data, raw.header, cals, opts)
    assert "FLATPLSG" not in plain.header and not frame_quality(plain.header) & FrameQuality.FLAT_PLANE_STATED
    sig, pivot = 0.03, (30.0, 35.0)
    cals["flat"].parameters.update(FLATPLSR="STATED", FLATPLWY="zero gradient by convention", FLATPLSG=sig,
                                   FLATPLY0=pivot[0] + 1, FLATPLX0=pivot[1] + 1)
    l2 = calibrate_frame(raw.data, raw.header, cals, opts)
    h = l2.header
    assert frame_quality(h) & FrameQuality.FLAT_PLANE_STATED and h["FLATPLAN"].startswith("zero gradient")
    assert h["FLATPLSG"] == sig
    assert np.array_equal(l2.data, plain.data, equal_nan=True)  # the data are not touched, only the error
    ok = np.isfinite(l2.uncertainty) & np.isfinite(plain.uncertainty) & (l2.dq == 0) & (np.abs(l2.data) > 0)
    extra = l2.uncertainty[ok].astype(np.float64) ** 2 - plain.uncertainty[ok].astype(np.float64) ** 2
    want = (l2.data[ok].astype(np.float64) * plane_sigma_map((N, N), sig, pivot)[ok]) ** 2
    bright = want > 0.05 * np.median(plain.uncertainty[ok].astype(np.float64) ** 2)
    assert bright.sum() > 100
    assert np.allclose(extra[bright], want[bright], rtol=0.02)


def test_a_stated_plane_is_not_shrunk_by_the_resampling(tmp_path):
    """On the north-up grid the plane's error is its stated cone, ``FLATPLSG / nx`` per pixel from the pivot.

    The plane is one error of the whole frame, smooth over the interpolation kernel: a resampled
    value's error from it is the plane's 1-sigma at the source position times the value, not the
    squared-weight sum of pixel noise (which shrinks a 1-sigma by ``sqrt(g(fx) g(fy))``, down to
    0.76 at a half-pixel shift on both axes for the cubic spline; 0.89 here before the fix). A
    header centre moved by half a pixel forces a fractional shift; the
    extra ``UNCERT**2`` over ``data**2`` must be a cone of slope ``FLATPLSG / nx`` (a rotation
    or a shift keeps a cone's slope), whatever the pivot ends up as on the output grid.
    """
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.calibration.l2.options import CalibrationOptions
    from pipelines.fitsio import read_image
    from pipelines.simulation import simulate
    from validation.gates import load_masters

    sim = simulate(tmp_path, channels=("WST",), naxis=N, noise=True, seed=3, sdi_sequence=False)
    raw = read_image(sim.frames[0].raw_path)
    h = raw.header.copy()
    h["CRPIX1"] = float(h["CRPIX1"]) + 0.5  # a half-pixel resampling shift on both axes
    h["CRPIX2"] = float(h["CRPIX2"]) + 0.5
    opts = CalibrationOptions(rotate_north_up=True, fit_centre=False, remove_cosmic_rays=False)
    cals = load_masters(sim.calibration_files)["WST"]
    plain = calibrate_frame(raw.data, h, cals, opts)
    sig, pivot = 0.03, (30.0, 35.0)
    cals["flat"].parameters.update(FLATPLSR="STATED", FLATPLWY="zero gradient by convention", FLATPLSG=sig,
                                   FLATPLY0=pivot[0] + 1, FLATPLX0=pivot[1] + 1)
    l2 = calibrate_frame(raw.data, h, cals, opts)
    assert np.array_equal(l2.data, plain.data, equal_nan=True)
    ok = np.isfinite(l2.uncertainty) & np.isfinite(plain.uncertainty) & (l2.dq == 0)
    d = l2.data.astype(np.float64)
    ok &= np.abs(d) > 0.3 * np.nanpercentile(np.abs(d[ok]), 99)  # the disk: the plane term well above the noise
    rel2 = (l2.uncertainty[ok].astype(np.float64) ** 2 - plain.uncertainty[ok].astype(np.float64) ** 2) / d[ok] ** 2
    yy, xx = np.nonzero(ok)
    # rel2 = s**2 ((y - y0)**2 + (x - x0)**2): linear in (y**2 + x**2, y, x, 1)
    coef = np.linalg.lstsq(np.column_stack([yy ** 2 + xx ** 2, yy, xx, np.ones(yy.size)]), rel2, rcond=None)[0]
    assert ok.sum() > 500
    assert math.sqrt(coef[0]) * N == pytest.approx(sig, rel=0.02)  # squared weights on it: 0.0266
