"""PSF models, Richardson-Lucy deconvolution of real scenes, and the PSF calibration master."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from astropy.io import fits
from scipy.signal import fftconvolve

from pipelines.calibration.masters.psf import (
    airy_core_psf,
    deconvolve_richardson_lucy,
    gaussian_psf,
    nominal_fwhm_px,
    psf_calibration_hdul,
    read_psf_calibration,
)
from pipelines.errors import DataError
from pipelines.fitsio import read_image, write_fits_atomic
from tests.conftest import SAMPLE

SWAP = "full-disk/swap_lv1_20120101_001607.fits"
MDI = "full-disk/mdi.fd_ic.20101015_230100_TAI.data.fits"


def real_scene(name: str, n: int = 512) -> np.ndarray:
    data = read_image(SAMPLE / name).data
    f = data.shape[0] // n
    return data.reshape(n, f, n, f).mean(axis=(1, 3))


def blur(img: np.ndarray, psf: np.ndarray, mode: str = "reflect") -> np.ndarray:
    p = psf.shape[0]
    return fftconvolve(np.pad(img, p, mode=mode), psf, mode="same")[p:-p, p:-p]


def measured_fwhm(profile: np.ndarray) -> float:
    """FWHM [pixel] of a 1-D peak by linear interpolation of the half-maximum crossings."""
    i = int(np.argmax(profile))
    half = profile[i] / 2.0
    left = i - np.argmax(profile[i::-1] < half)
    right = i + np.argmax(profile[i:] < half)
    xl = left + (half - profile[left]) / (profile[left + 1] - profile[left])
    xr = right - 1 + (profile[right - 1] - half) / (profile[right - 1] - profile[right])
    return float(xr - xl)


def rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(a ** 2)))


def test_psf_models():
    g = gaussian_psf(31, 5.0)
    assert g.shape == (31, 31) and g.sum() == pytest.approx(1.0)
    assert np.unravel_index(np.argmax(g), g.shape) == (15, 15)
    assert measured_fwhm(np.pad(gaussian_psf(61, 12.0)[30], 1)) == pytest.approx(12.0, rel=0.02)
    a = airy_core_psf(63, 10.0)
    assert a.sum() == pytest.approx(1.0)
    assert measured_fwhm(np.pad(a[31], 1)) == pytest.approx(10.0, rel=0.03)
    # First dark ring of the Airy pattern at 1.22 lambda/D = 1.186 FWHM
    r0 = int(round(31 + 1.186 * 10.0))
    assert a[31, r0] < 0.01 * a[31, 31]
    halo = airy_core_psf(63, 10.0, halo_fraction=0.2)
    yy, xx = np.mgrid[0:63, 0:63]
    far = np.hypot(yy - 31, xx - 31) > 25
    # scattered-light wings: the halo adds ~6% of the energy beyond 25 px to the Airy rings' ~3%
    assert halo[far].sum() - a[far].sum() > 0.04
    assert a[far].sum() < 0.04
    # SDI: 9.5 arcsec at 0.5 arcsec/pixel on the full 4608 frame
    assert nominal_fwhm_px("SDI", 4608) == pytest.approx(19.0)
    assert nominal_fwhm_px("sdi", 1152) == pytest.approx(4.75)
    with pytest.raises(ValueError, match="odd"):
        gaussian_psf(10, 2.0)


def test_deconvolution_restores_real_scene():
    """SWAP 174 A (structured EUV disk, nearest public proxy of SDI) blurred by a known PSF."""
    truth = real_scene(SWAP)
    psf = gaussian_psf(21, 2.5)
    blurred = blur(truth, psf)
    dec = deconvolve_richardson_lucy(blurred, psf, n_iter=50, preserve_flux=False)
    err_blur, err_dec = rms(blurred - truth), rms(dec - truth)
    flux_err = dec.sum() / truth.sum() - 1
    print(f"\nRL SWAP 512^2, Gaussian FWHM 2.5 px, 50 iterations: RMS error blurred {err_blur:.3f}, "
          f"deconvolved {err_dec:.3f} DN/s (x{err_blur / err_dec:.2f} better); flux change {flux_err:.1e} "
          f"without rescaling")
    assert err_dec < err_blur / 2
    assert abs(flux_err) < 0.01  # Richardson-Lucy itself conserves flux (rescaling off)
    assert np.all(dec >= 0)
    rescaled = deconvolve_richardson_lucy(blurred, psf, n_iter=5)
    assert rescaled.sum() == pytest.approx(blurred.sum(), rel=1e-12)


def test_point_sources_sharpen_more_than_threefold():
    """Isolated point-like features: the mechanism behind SDI's >3x gain (Liu H. et al. 2025)."""
    sky = np.zeros((128, 128))
    for y, x in ((32, 32), (32, 96), (96, 40), (90, 90)):
        sky[y, x] = 1e4
    psf = gaussian_psf(41, 6.0)
    obs = blur(sky, psf, mode="constant") + 1.0
    dec = deconvolve_richardson_lucy(obs, psf, n_iter=300)
    before = measured_fwhm(obs[32, 10:55] - 1.0)
    after = measured_fwhm(dec[32, 10:55] - 1.0)
    print(f"\npoint source FWHM {before:.2f} px -> {after:.2f} px after 300 RL iterations")
    assert before == pytest.approx(6.0, rel=0.05)
    assert after < before / 3


def test_nan_mask_and_negative_pixels():
    """MDI continuum: NaN off disk and masked bad pixels keep their values; negatives clipped."""
    truth = real_scene(MDI)
    off_disk = ~np.isfinite(truth)
    psf = gaussian_psf(15, 2.5)
    obs = blur(np.nan_to_num(truth, nan=0.0), psf, mode="constant")
    obs[off_disk] = np.nan                         # blanked off disk, as in the MDI file
    rng = np.random.default_rng(0)
    bad = np.zeros(obs.shape, bool)
    bad[rng.integers(100, 400, 50), rng.integers(100, 400, 50)] = True
    obs_bad = obs.copy()
    obs_bad[bad] = -5e4                             # junk values, masked by the caller
    obs_bad[0:3, 0:3] = np.nan
    edge = np.isfinite(obs_bad) & (np.nan_to_num(truth) < 3000) & ~bad
    obs_bad[edge] = -20.0                           # dark-subtraction noise just inside the blank
    dec = deconvolve_richardson_lucy(obs_bad, psf, n_iter=20, mask=bad)
    assert np.all(np.isnan(dec[off_disk]))
    np.testing.assert_array_equal(dec[bad], obs_bad[bad])
    good = np.isfinite(obs_bad) & ~bad
    assert np.all(np.isfinite(dec[good])) and np.all(dec[good] >= 0)
    assert np.nansum(dec[good]) == pytest.approx(np.sum(obs_bad[good]), rel=1e-9)
    # Inside 0.9 Rsun (away from the blank edge) the restoration is closer to the truth
    yy, xx = np.mgrid[0:512, 0:512]
    inner = np.hypot(yy - 256, xx - 256) < 0.9 * 244
    inner &= ~bad
    for k in range(1, 4):  # and away from the masked pixels (their fill is not data)
        inner &= ~np.roll(bad, k, 0) & ~np.roll(bad, -k, 0) & ~np.roll(bad, k, 1) & ~np.roll(bad, -k, 1)
    e0, e1 = rms((obs - truth)[inner]), rms((dec - truth)[inner])
    print(f"\nRL MDI inner disk: RMS error {e0:.1f} -> {e1:.1f}")
    assert e1 < e0


def test_psf_master_round_trip(tmp_path):
    psf = airy_core_psf(41, 4.75, halo_fraction=0.1)
    hdul = psf_calibration_hdul(psf * 3.0, "sdi", 2, "2023-04-01T00:00:00", dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
                                fwhm_px=4.75, model="airy+moffat", naxis=1152)
    path = tmp_path / "sdi_psf_v2.fits"
    sha = write_fits_atomic(hdul, path)
    assert len(sha) == 64
    with fits.open(path) as f:
        h = f[0].header
        assert (h["CALKIND"], h["CHANNEL"], h["CALVER"]) == ("psf", "SDI", 2)
        assert (h["VALIDFRM"], h["VALIDTO"]) == ("2023-04-01T00:00:00.000", "2024-01-01T00:00:00.000")
        assert "airy+moffat" in h["CALDESC"] and h["PSFFWHM"] == 4.75 and h["FRMNAXIS"] == 1152 and h["DETECTOR"] == "SDI"
    back, hdr = read_psf_calibration(path)
    np.testing.assert_allclose(back, psf / psf.sum(), rtol=1e-12)
    assert hdr["CALVER"] == 2
    from pipelines.calibration.l2.flow import load_calibration_master

    cal = load_calibration_master(path)  # the calibration flow's loader accepts it
    assert (cal.kind, cal.channel, cal.version) == ("psf", "SDI", 2)
    np.testing.assert_allclose(cal.data["primary"], psf / psf.sum(), rtol=1e-6)
    open_ended = psf_calibration_hdul(psf, "SDI", 3, "01-May-23 13:07:58.713")
    assert open_ended[0].header["VALIDTO"] == "" and open_ended[0].header["VALIDFRM"] == "2023-05-01T13:07:58.713"
    with pytest.raises(ValueError, match="not after"):
        psf_calibration_hdul(psf, "SDI", 1, "2024-01-01", "2023-01-01")
    with pytest.raises(KeyError):
        psf_calibration_hdul(psf, "XRT", 1, "2024-01-01")
    fits.PrimaryHDU(psf, fits.Header([("CALKIND", "flat")])).writeto(tmp_path / "flat.fits")
    with pytest.raises(DataError, match="not a PSF"):
        read_psf_calibration(tmp_path / "flat.fits")


def test_psf_master_is_registered_by_ingest(sqlite_env, tmp_path):
    """The master is in the format the calibration registry accepts."""
    from backend.db import session_scope
    from backend.services.ingest import ingest_path

    path = tmp_path / "sdi_psf_v1.fits"
    write_fits_atomic(psf_calibration_hdul(gaussian_psf(21, 4.75), "SDI", 1, "2023-04-01T00:00:00"), path)
    with session_scope() as s:
        out = ingest_path(s, path, sqlite_env)
    assert out.status == "calibration", out.reason
