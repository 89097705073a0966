"""KLL flat fielding on real full-disk scenes with a known striped CMOS-like flat.

The scenes are real (SOHO/MDI continuum, white light like WST; PROBA2/SWAP 174 A, a
structured EUV disk with corona, the nearest public proxy of SDI's Lyman-alpha disk),
binned 2x2 to 512 x 512 and scaled so that their 99th percentile is 2e4 photo-electrons
(a CMOS well). The flat has 2% bands, 1% column stripes, 2% pixel gain and a 5% vignetting.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipelines.calibration.masters.kll import (
    KLLShiftWarning,
    flat_calibration_hdul,
    kll_flat,
    make_dithered_set,
    striped_flat,
)
from pipelines.fitsio import read_image, write_fits_atomic
from tests.conftest import SAMPLE

SCENES = {
    "mdi": "full-disk/mdi.fd_ic.20101015_230100_TAI.data.fits",
    "swap": "full-disk/swap_lv1_20120101_001607.fits",
}
# Nine pointings with non-collinear, mixed-parity differences (they generate Z^2).
SHIFTS = np.array([(0, 0), (7, 18), (-12, 5), (23, -10), (-29, -16), (4, -31), (31, 28), (-18, 37), (16, -41)])


def real_scene(name: str, n: int = 512, peak: float = 2e4) -> np.ndarray:
    data = read_image(SAMPLE / SCENES[name]).data
    f = data.shape[0] // n
    scene = data.reshape(n, f, n, f).mean(axis=(1, 3))  # NaN blocks stay NaN (MDI off-disk)
    return scene / np.nanpercentile(scene, 99) * peak


def rms_error(result, flat) -> float:
    v = result.valid_mask
    truth = flat[v] / flat[v].mean()
    return float(np.sqrt(np.mean((result.flat[v] / truth - 1) ** 2)))


@pytest.mark.parametrize(("scene_name", "noisy_bound"), [("mdi", 0.010), ("swap", 0.015)])
def test_kll_recovers_striped_flat_on_real_scene(scene_name, noisy_bound):
    scene = real_scene(scene_name)
    flat = striped_flat(scene.shape, rng=1, vignetting=0.05)
    flat_rms = float(flat.std())

    images = make_dithered_set(scene, flat, SHIFTS)
    t0 = time.perf_counter()
    res = kll_flat(images, SHIFTS)
    dt = time.perf_counter() - t0
    err_clean = rms_error(res, flat)

    noisy = make_dithered_set(scene, flat, SHIFTS, rng=2, noise="poisson", read_noise=3.0)
    res_noisy = kll_flat(noisy, SHIFTS)
    err_noisy = rms_error(res_noisy, flat)
    print(f"\nKLL {scene_name} 512^2, 9 images: injected flat RMS {flat_rms:.2%}; recovered RMS error "
          f"{err_clean:.1e} (noise off, {res.n_iter} CG iterations, {dt:.2f} s), {err_noisy:.3%} (Poisson "
          f"noise, peak 2e4 e-); valid {res.valid_mask.mean():.1%} of the frame")

    assert res.converged and res_noisy.converged
    assert res.n_pairs == 36
    # The brief's bound is 0.5%; noiseless whole-pixel shifts make the solution exact up to tol.
    assert err_clean < 0.005
    assert err_clean < 1e-4
    assert err_noisy < noisy_bound
    assert err_noisy < flat_rms / 2  # the flat removes most of the detector pattern
    # Normalisation and the fill outside the recovered region
    assert res.flat[res.valid_mask].mean() == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.isnan(res.flat[~res.valid_mask]))
    # Gain recovered on the disk only: never where no image saw the Sun (MDI: NaN off-disk)
    sky = ~np.isfinite(scene) | (scene < 0.05 * np.nanpercentile(scene, 99))
    never_on_disk = np.all([~np.isfinite(im) | (im < 0.05 * 2e4) for im in images], axis=0)
    assert not np.any(res.valid_mask & never_on_disk)
    assert res.valid_mask.mean() > (0.8 if scene_name == "mdi" else 0.45)
    assert sky.any()


def test_kll_recovers_the_stripes():
    """The column profile (CMOS stripes) of the flat comes back, not just its RMS."""
    scene = real_scene("mdi")
    flat = striped_flat(scene.shape, rng=5, stripe_amplitude=0.01, column_rms=0.01, pixel_rms=0.0)
    noisy = make_dithered_set(scene, flat, SHIFTS, rng=6, noise="poisson")
    res = kll_flat(noisy, SHIFTS)
    rows = slice(150, 360)  # a band across the disk, inside valid_mask
    assert res.valid_mask[rows, 60:450].all()
    got = res.flat[rows, 60:450].mean(axis=0)
    want = flat[rows, 60:450].mean(axis=0)
    got, want = got / got.mean(), want / want.mean()
    corr = np.corrcoef(got, want)[0, 1]
    print(f"\nstripe profile: correlation {corr:.4f}, RMS error {np.std(got - want):.4%} "
          f"of a {np.std(want):.3%} RMS profile")
    assert corr > 0.99
    assert np.std(got - want) < 0.1 * np.std(want)


def test_jacobi_iteration_agrees_with_cg():
    """KLL's own fixed-point iteration and CG solve the same least-squares problem."""
    scene = real_scene("swap", n=128)
    flat = striped_flat(scene.shape, rng=3, stripe_period_px=11)
    shifts = np.array([(0, 0), (3, 7), (-5, 2), (6, -4), (-7, -6)])
    images = make_dithered_set(scene, flat, shifts)
    cg = kll_flat(images, shifts, tol=1e-9)
    jac = kll_flat(images, shifts, method="jacobi", n_iter=5000, tol=1e-9)
    assert cg.converged and jac.converged
    assert jac.n_iter > 3 * cg.n_iter
    np.testing.assert_array_equal(cg.valid_mask, jac.valid_mask)
    np.testing.assert_allclose(jac.flat[jac.valid_mask], cg.flat[cg.valid_mask], rtol=1e-6)
    assert rms_error(cg, flat) < 1e-5


def test_mask_excludes_a_bad_column():
    """A column that does not follow the gain model (e.g. non-linear) spoils the solution
    unless masked; masked, it is left out and the rest is recovered exactly."""
    scene = real_scene("mdi", n=128)
    flat = striped_flat(scene.shape, rng=4)
    shifts = np.array([(0, 0), (3, 7), (-5, 2), (6, -4), (-7, -6)])
    images = make_dithered_set(scene, flat, shifts)
    rng = np.random.default_rng(9)
    for im in images:
        im[:, 40] *= rng.uniform(0.5, 1.5)  # a different gain in every image
    bad = np.zeros(scene.shape, bool)
    bad[:, 40] = True
    res = kll_flat(images, shifts, mask=bad)
    assert not res.valid_mask[:, 40].any()
    assert rms_error(res, flat) < 1e-4
    unmasked = kll_flat(images, shifts)
    assert rms_error(unmasked, flat) > 10 * rms_error(res, flat)


def test_collinear_or_common_factor_shifts_warn():
    scene = real_scene("mdi", n=128)
    flat = striped_flat(scene.shape, rng=0)
    for shifts in (np.array([(0, 0), (0, 3), (0, 8), (0, -5)]),        # collinear: rows independent
                   np.array([(0, 0), (2, 4), (-4, 2), (6, -2)])):        # every difference even
        images = make_dithered_set(scene, flat, shifts)
        with pytest.warns(KLLShiftWarning, match="lattice"):
            kll_flat(images, shifts)


def test_bad_arguments():
    img = np.ones((16, 16))
    with pytest.raises(ValueError, match="two"):
        kll_flat([img], [(0, 0)])
    with pytest.raises(ValueError, match="whole pixels"):
        kll_flat([img, img], [(0, 0), (0.5, 1)])
    with pytest.raises(ValueError, match="shape"):
        kll_flat([img, img], [(0, 0)])
    with pytest.raises(ValueError, match="non-zero shift"):
        kll_flat([img, img], [(1, 1), (1, 1)])


def test_flat_master_round_trip(tmp_path):
    """The KLL flat as a calibration master, read back by the calibration flow's loader."""
    from pipelines.calibration.l2.flow import load_calibration_master

    scene = real_scene("mdi", n=128)
    flat = striped_flat(scene.shape, rng=7)
    shifts = np.array([(0, 0), (3, 7), (-5, 2), (6, -4), (-7, -6)])
    res = kll_flat(make_dithered_set(scene, flat, shifts), shifts)
    path = tmp_path / "wst_flat_v3.fits"
    write_fits_atomic(flat_calibration_hdul(res, "WST", 3, "2023-04-01T00:00:00", "2023-07-01T00:00:00",
                                            shifts=shifts), path)
    cal = load_calibration_master(path)
    assert (cal.kind, cal.channel, cal.version) == ("flat", "WST", 3)
    assert cal.parameters["FLATMETH"] == "KLL" and cal.parameters["KLLSH01"] == "3,7"
    assert cal.parameters["VALIDTO"] == "2023-07-01T00:00:00.000" and cal.parameters["FRMNAXIS"] == 128
    got = cal.data["flat"]
    np.testing.assert_allclose(got[res.valid_mask], res.flat[res.valid_mask], rtol=1e-6)
    assert np.all(got[~res.valid_mask] == 1.0)
    np.testing.assert_array_equal(cal.data["valid"].astype(bool), res.valid_mask)
