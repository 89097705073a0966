"""The disk centre from the data (issue 14, item 4): limb and occulter-edge fits, their use in
the chain, and the blind gate with a 2 px pointing error in the simulated headers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from astropy.io import fits
from scipy.special import erf

from validation.blind_centre import run
from pipelines.calibration.l2.centre import fit_and_apply_centre, fit_circle, fit_disk_centre, pointing_uncertainty_px
from pipelines.calibration.l2.quality import FrameQuality
from pipelines.calibration.l2.options import as_options
from pipelines.errors import DataError
from pipelines.simulation import simulate

N = 256


@pytest.fixture(scope="module")
def blind():
    return run(N, True, 0)


def test_gate_centre_within_0p1_px_with_a_2_px_header_error(blind):
    for ch in ("wst", "sci_uv", "sci_wl"):
        print(f"{ch}: header {blind[f'header_err_px_{ch}']:.3f} px off, fit {blind[f'centre_err_px_{ch}']:.4f} px "
              f"(sigma {blind[f'fit_sigma_px_{ch}']:.4f})")
        assert blind[f"header_err_px_{ch}"] == pytest.approx(2.0, abs=1e-3)
        assert blind[f"centre_err_px_{ch}"] <= 0.1, ch
        assert blind[f"fit_used_{ch}"] == 1.0
    # SDI: the fit finds the scene's limb, which the simulated EUV scene puts off its nominal centre
    assert blind["fit_used_sdi"] == 1.0
    assert blind["centre_err_px_sdi"] <= blind["sdi_scene_limb_offset_px"] + 0.05
    assert blind["centre_err_px_sdi"] < 0.15


def test_gate_wl_corona_back_within_noise(blind):
    for side in ("west", "east"):
        sig = blind[f"wl_noise_{side}"]
        fit, hdr, true = (blind[f"wl_err_{side}_{c}"] for c in ("fit", "header", "true"))
        print(f"{side}: corona error header {100 * hdr:+.1f} %, fit {100 * fit:+.2f} %, true centre "
              f"{100 * true:+.2f} %, noise {100 * sig:.2f} %")
        assert sig > 0
        assert abs(hdr - true) > 10 * sig  # the header's error is far outside the noise: the check can fail
        assert abs(fit - true) <= 3 * sig


def _disk(n: int, x0: float, y0: float, r: float, rng: np.random.Generator, peak: float = 2e4) -> np.ndarray:
    y, x = np.mgrid[:n, :n]
    rho = np.hypot(x - x0, y - y0)
    mu = np.sqrt(np.clip(1.0 - (rho / r) ** 2, 0.0, 1.0))
    img = peak * 0.5 * (1.0 - erf((rho - r) / 1.2)) * (0.4 + 0.6 * mu ** 0.5)
    # two bright active regions on the limb: outliers the robust fit rejects
    for a in (0.7, 3.9):
        img += 0.8 * peak * np.exp(-((x - x0 - (r + 1) * math.cos(a)) ** 2 + (y - y0 - (r + 1) * math.sin(a)) ** 2) / 8)
    return rng.poisson(img).astype(np.float64)


def test_limb_fit_on_a_noisy_disk_with_limb_features():
    rng = np.random.default_rng(3)
    x0, y0 = 101.37, 95.81
    f = fit_disk_centre(_disk(200, x0, y0, 80.0, rng), x0 + 1.6, y0 - 1.2, 80.0, method="limb")
    assert math.hypot(f.x0 - x0, f.y0 - y0) < 0.02
    assert 0 < f.sigma < 0.02
    assert f.n_points < f.n_rays  # the limb features were rejected


def test_occulter_fit_on_a_noisy_shadow():
    rng = np.random.default_rng(4)
    n, x0, y0, r_occ = 200, 98.62, 100.91, 45.0
    y, x = np.mgrid[:n, :n]
    rho = np.hypot(x - x0, y - y0)
    ramp = np.sin(0.5 * np.pi * np.clip((rho - (r_occ - 3)) / 3, 0, 1)) ** 2
    img = rng.poisson(3e4 * (r_occ / np.maximum(rho, 1)) ** 2.8 * ramp).astype(float)
    f = fit_disk_centre(img, x0 - 1.4, y0 + 1.5, r_occ, method="occulter")
    assert math.hypot(f.x0 - x0, f.y0 - y0) < 0.02


def test_circle_fit_refuses_too_few_points():
    with pytest.raises(DataError):
        fit_circle(np.arange(5.0), np.arange(5.0))


def _header(n: int, cx: float, cy: float) -> fits.Header:
    h = fits.Header()
    h["CTYPE1"], h["CTYPE2"] = "HPLN-TAN", "HPLT-TAN"
    h["CUNIT1"], h["CUNIT2"] = "arcsec", "arcsec"
    h["CRPIX1"], h["CRPIX2"] = cx + 1.0, cy + 1.0
    h["CRVAL1"], h["CRVAL2"] = 0.0, 0.0
    h["CDELT1"], h["CDELT2"] = 12.0, 12.0
    h["RSUN_OBS"] = 960.0  # 80 px
    h["DATE-OBS"] = "2024-01-01T00:00:00"
    return h


def test_apply_moves_the_wcs_onto_the_fit_and_records_both():
    rng = np.random.default_rng(5)
    img = _disk(200, 99.3, 100.6, 80.0, rng)
    h, fit = fit_and_apply_centre(img, _header(200, 101.0, 99.0), coronagraph=False, tolerance_px=0.25)
    assert h["CTRSRC"] == "FIT" and h["FITCSTAT"] == "OK"
    assert h["CRPIX1"] - 1 == pytest.approx(99.3, abs=0.03) and h["CRPIX2"] - 1 == pytest.approx(100.6, abs=0.03)
    assert h["HDRCRPX1"] == pytest.approx(102.0) and h["HDRCRPX2"] == pytest.approx(100.0)
    assert h["FITCRPX1"] == pytest.approx(h["CRPIX1"], abs=1e-3)
    assert h["CTRSHIFT"] == pytest.approx(math.hypot(1.7, 1.6), abs=0.05)
    assert any("CRPIX moved" in line for line in h["HISTORY"])
    # the header within the tolerance: kept, and said so
    h2, _ = fit_and_apply_centre(img, _header(200, 99.4, 100.6), coronagraph=False, tolerance_px=0.25)
    assert h2["CTRSRC"] == "HEADER" and h2["CRPIX1"] == pytest.approx(100.4)
    assert any("header's centre kept" in line for line in h2["HISTORY"])


def test_centre_uncertainty_in_the_wcs_error_keywords(tmp_path):
    """CRDERia = the fit's 1 sigma, CSYERia = max(systematic, 0.1 px) (+ the header's distance when kept), in CUNIT."""
    from astropy.wcs import WCS

    from pipelines.calibration.l2.centre import EDGE_SYSTEMATIC_FLOOR_PX

    rng = np.random.default_rng(5)
    img = _disk(200, 99.3, 100.6, 80.0, rng)
    h, fit = fit_and_apply_centre(img, _header(200, 101.0, 99.0), coronagraph=False, tolerance_px=0.25,
                                  systematic_arcsec=3.0)  # 0.25 px at 12 arcsec/px: above the floor
    assert h["CRDER1"] == pytest.approx(fit.sigma_x * 12.0, rel=0.01)
    assert h["CRDER2"] == pytest.approx(fit.sigma_y * 12.0, rel=0.01)
    assert h["CSYER1"] == h["CSYER2"] == pytest.approx(3.0, rel=0.01)
    w = WCS(h)
    assert list(w.wcs.crder) == pytest.approx([h["CRDER1"], h["CRDER2"]])
    assert list(w.wcs.csyer) == pytest.approx([3.0, 3.0])
    # below the floor the floor is stated; the header kept: its distance from the fit is added
    h2, _ = fit_and_apply_centre(img, _header(200, 99.4, 100.6), coronagraph=False, tolerance_px=0.25)
    assert h2["CTRSRC"] == "HEADER"
    assert h2["CSYER1"] == pytest.approx((EDGE_SYSTEMATIC_FLOOR_PX + h2["CTRSHIFT"]) * 12.0, rel=0.01)
    # degrees when the WCS is in degrees
    hd = _header(200, 101.0, 99.0)
    hd["CUNIT1"], hd["CUNIT2"], hd["CDELT1"], hd["CDELT2"] = "deg", "deg", 12.0 / 3600, 12.0 / 3600
    hd["CRVAL1"] = hd["CRVAL2"] = 0.0
    h3, _ = fit_and_apply_centre(img, hd, coronagraph=False, tolerance_px=0.25, systematic_arcsec=3.0)
    assert h3["CSYER1"] == pytest.approx(3.0 / 3600, rel=0.01)
    # a failed fit measures nothing: no random error; the systematic error is the pointing
    # uncertainty, and the frame is flagged (issue 27 item 5)
    h4, _ = fit_and_apply_centre(np.zeros((200, 200)), _header(200, 101.0, 99.0), coronagraph=False)
    assert not any(k in h4 for k in ("CRDER1", "CRDER2"))
    for axis in (1, 2):
        assert h4[f"CSYER{axis}"] == pytest.approx(pointing_uncertainty_px(200) * abs(h4[f"CDELT{axis}"]), rel=2e-3)
    assert h4["QUALITY"] == int(FrameQuality.CENTRE_FAILED) and h4["CENTFAIL"]


def test_wcs_error_keywords_reach_every_hdu_of_the_product(tmp_path):
    from astropy.wcs import WCS

    from pipelines.calibration.l2.flow import calibrate_frame
    from validation.gates import load_masters
    from pipelines.fitsio import read_image
    from pipelines.products import build_product_hdul

    sim = simulate(tmp_path, channels=("WST",), naxis=128, noise=True, seed=3, sdi_sequence=False,
                   pointing_error_px=2.0)
    raw = read_image(sim.frames[0].raw_path)
    l2 = calibrate_frame(raw.data, raw.header, load_masters(sim.calibration_files)["WST"])
    assert l2.header["CTRSRC"] == "FIT"
    path = tmp_path / "l2.fits"
    build_product_hdul(l2, "test").writeto(path)
    with fits.open(path) as hdul:
        for hdu in hdul:
            assert hdu.header["CSYER1"] == l2.header["CSYER1"] > 0, hdu.name
            assert hdu.header["CRDER2"] == l2.header["CRDER2"] > 0, hdu.name
        assert WCS(hdul[0].header).wcs.csyer[0] == pytest.approx(l2.header["CSYER1"])


def test_failed_fit_falls_back_to_the_header_and_says_so():
    h, fit = fit_and_apply_centre(np.zeros((200, 200)), _header(200, 101.0, 99.0), coronagraph=False)
    assert fit is None
    assert h["FITCSTAT"] == "FAILED" and h["CTRSRC"] == "HEADER"
    assert h["CRPIX1"] == 102.0 and h["CRPIX2"] == 100.0
    assert any("FAILED" in line for line in h["HISTORY"])
    h, fit = fit_and_apply_centre(np.zeros((200, 200)), _header(200, 101.0, 99.0), coronagraph=False,
                                  enabled=False)
    assert fit is None and h["CTRSRC"] == "HEADER"
    assert any("fit_centre=false" in line for line in h["HISTORY"])


def test_options_limits():
    assert as_options({"fit_centre": False}).fit_centre is False
    with pytest.raises(DataError, match="centre_tolerance_px"):
        as_options({"centre_tolerance_px": -1})
    with pytest.raises(DataError, match="occulter_tolerance_px"):
        as_options({"occulter_tolerance_px": 11})


def test_simulated_pointing_error_changes_only_the_header(tmp_path):
    a = simulate(tmp_path / "a", channels=("SCI-WL",), naxis=64, noise=True, seed=2, sdi_sequence=False)
    b = simulate(tmp_path / "b", channels=("SCI-WL",), naxis=64, noise=True, seed=2, sdi_sequence=False,
                 pointing_error_px=2.0)
    fa, fb = a.frames[0], b.frames[0]
    assert fa.header_crpix == pytest.approx(fa.crpix)
    assert fb.crpix == pytest.approx(fa.crpix)
    assert math.hypot(fb.header_crpix[0] - fb.crpix[0], fb.header_crpix[1] - fb.crpix[1]) == pytest.approx(2.0)
    with fits.open(fa.raw_path) as ha, fits.open(fb.raw_path) as hb:
        assert np.array_equal(ha[0].data, hb[0].data)
        assert hb[0].header["CRPIX1"] == pytest.approx(fb.header_crpix[0])
        assert not any("pointing" in str(line).lower() for line in hb[0].header.get("HISTORY", []))
    with pytest.raises(ValueError, match="pointing_error_px"):
        simulate(tmp_path / "c", channels=("SCI-WL",), naxis=64, pointing_error_px=11.0)


def test_wcs_error_keywords_are_the_steps_own_claim_and_reach_the_product(tmp_path):
    """CRDERia (the fit's 1 sigma) and CSYERia (the edge systematic, at least 0.1 px, plus the header's
    distance from the fit when the header is kept) in CUNITia; none, and no stale ones, when no fit is
    asked for; a failed fit: CSYERia the pointing uncertainty only (issue 27 item 5); astropy.wcs reads
    them back from every image HDU of the product."""
    import warnings

    from astropy.wcs import WCS

    from pipelines.calibration.l2.centre import EDGE_SYSTEMATIC_FLOOR_PX
    from pipelines.calibration.l2.flow import L2Result
    from pipelines.products import build_product_hdul

    rng = np.random.default_rng(5)
    img = _disk(200, 99.3, 100.6, 80.0, rng)
    stale = _header(200, 101.0, 99.0)
    stale["CRDER1"], stale["CSYER2"] = 99.0, 99.0  # a claim that came in with the header
    h, fit = fit_and_apply_centre(img, stale, coronagraph=False, tolerance_px=0.25)
    assert h["CTRSRC"] == "FIT"
    assert h["CRDER1"] == pytest.approx(fit.sigma_x * 12.0, rel=1e-2)
    assert h["CRDER2"] == pytest.approx(fit.sigma_y * 12.0, rel=1e-2)
    assert h["CSYER1"] == h["CSYER2"] == pytest.approx(EDGE_SYSTEMATIC_FLOOR_PX * 12.0)
    # the header's centre kept: the systematic grows by the header's distance from the fit
    hk, fk = fit_and_apply_centre(img, _header(200, 99.4, 100.6), coronagraph=False, tolerance_px=0.25)
    assert hk["CTRSRC"] == "HEADER"
    assert hk["CSYER1"] == pytest.approx((EDGE_SYSTEMATIC_FLOOR_PX + hk["CTRSHIFT"]) * 12.0, rel=2e-3)
    # in degrees when CUNIT says so
    hd = _header(200, 101.0, 99.0)
    hd["CUNIT1"], hd["CUNIT2"], hd["CDELT1"], hd["CDELT2"], hd["RSUN_OBS"] = "deg", "deg", 12 / 3600, 12 / 3600, 960.0
    hd, _ = fit_and_apply_centre(img, hd, coronagraph=False, tolerance_px=0.25)
    assert hd["CSYER1"] == pytest.approx(EDGE_SYSTEMATIC_FLOOR_PX * 12.0 / 3600.0, rel=2e-3)  # 3 significant digits
    # no fit asked for: no claim at all, the stale one removed
    hn, _ = fit_and_apply_centre(img, stale, coronagraph=False, enabled=False)
    assert not any(k in hn for k in ("CRDER1", "CRDER2", "CSYER1", "CSYER2"))
    # a failed fit: the stale claim replaced by the pointing uncertainty (systematic only)
    hn, _ = fit_and_apply_centre(np.zeros_like(img), stale, coronagraph=False)
    assert not any(k in hn for k in ("CRDER1", "CRDER2"))
    assert hn["CSYER1"] == pytest.approx(pointing_uncertainty_px(max(img.shape)) * abs(hn["CDELT1"]), rel=2e-3)
    assert hn["CSYER2"] == hn["CSYER1"] != 99.0
    # the product: HDU 0 and the UNCERT / DQ extensions on the same grid carry them; astropy.wcs reads them
    res = L2Result(data=img.astype(np.float32), dq=np.zeros(img.shape, np.uint8), header=h, stats={},
                   uncertainty=np.sqrt(img).astype(np.float32))
    path = tmp_path / "l2.fits"
    build_product_hdul(res, "test").writeto(path)
    with fits.open(path) as hdul, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [hdu.name for hdu in hdul] == ["PRIMARY", "UNCERT", "DQ"]
        for hdu in hdul:
            w = WCS(hdu.header)
            np.testing.assert_allclose(w.wcs.crder, [h["CRDER1"], h["CRDER2"]])
            np.testing.assert_allclose(w.wcs.csyer, [h["CSYER1"], h["CSYER2"]])
