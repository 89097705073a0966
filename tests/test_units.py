"""Units, uncertainty and the L2 file layout (issue 14 items 5 and 6).

* MSB per SCI passband: the constants are recomputed from the real series and spectrum in
  ``sample-data`` (LASP Lyman-alpha composite, ASTM G173-03 ETR);
* every channel's product: ``astropy.units.Unit(BUNIT, format='fits', parse_strict='raise')``
  parses (SCI: dimensionless, the data in MSB, ``MSBVALUE`` 1 MSB as a radiance),
  ``sunpy.map.Map(path, hdus=0).unit`` is not None, ``DATE-BEG``/``DATE-END`` bracket the exposure, the file passes
  ``verify('exception')``, HDUs ``UNCERT`` and ``DQ`` are images;
* :func:`pipelines.io.load_l2` returns one map with mask and uncertainty, also for a product
  of the older layout (DQ as a binary table, ``BUNIT='MSB'``);
* the resampling's variance propagation against a Monte Carlo of white noise.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from astropy import units as u
from astropy.io import fits
from astropy.time import Time

from pipelines.calibration.l2 import resample, uncertainty
from pipelines.calibration.l2.flow import calibrate_frame
from pipelines.fitsio import read_image, write_fits_atomic
from pipelines.products import build_product_hdul, dq_table_hdu, read_product, read_uncertainty
from pipelines.simulation import load_simulated_masters, simulate
from pipelines.units import (LYA_COMPOSITE_MEAN_1E11, MSB_UV, MSB_WL, OMEGA_SUN_1AU, WL_BAND_IRRADIANCE_W_M2,
                             header_unit, msb_definition, msb_unit, product_bunit)

SAMPLE = Path(__file__).resolve().parents[1] / "sample-data" / "real"
CHANNELS = ("SDI", "WST", "SCI-UV", "SCI-WL")


def test_msb_constants_from_the_sample_data():
    rows = [ln.split(",") for ln in (SAMPLE / "lyman-alpha" / "lymanalpha_composite_1997-2013.txt").read_text().splitlines()
            if ln[:1].isdigit()]
    assert len(rows) > 6000
    assert np.mean([float(r[1]) for r in rows]) == pytest.approx(LYA_COMPOSITE_MEAN_1E11, rel=1e-6)
    spec = np.loadtxt(SAMPLE / "spectra" / "astm_g173_etr_655-745nm.csv", delimiter=",", comments="#", skiprows=4)
    band = (spec[:, 0] >= 660) & (spec[:, 0] <= 740)
    assert np.trapezoid(spec[band, 1], spec[band, 0]) == pytest.approx(WL_BAND_IRRADIANCE_W_M2, rel=1e-6)
    assert OMEGA_SUN_1AU == pytest.approx(6.794e-5, rel=1e-3)
    # 1 MSB: Lyman-alpha ~1e5, 700 nm band ~1.7e9 erg cm-2 s-1 sr-1
    assert MSB_UV == pytest.approx(1.0241e5, rel=1e-3) and MSB_WL == pytest.approx(1.6794e9, rel=1e-3)
    assert msb_definition("sci_wl").band_nm == (660.0, 740.0)
    with pytest.raises(KeyError, match="MSB is defined for SCI"):
        msb_definition("SDI")
    for c in CHANNELS:  # strict FITS (issue 27 item 8): radiance, or dimensionless MSB for SCI
        unit = u.Unit(product_bunit(c), format="fits", parse_strict="raise")
        assert unit == (u.dimensionless_unscaled if c.startswith("SCI") else u.erg / u.cm ** 2 / u.s / u.sr)
    assert (1 * msb_unit("SCI-UV")).to_value("erg cm-2 s-1 sr-1") == pytest.approx(MSB_UV, rel=1e-6)


def test_header_unit_reads_old_msb_products():
    h = fits.Header({"BUNIT": "MSB", "CHANNEL": "SCI-WL"})
    assert (1 * header_unit(h)).to_value("erg cm-2 s-1 sr-1") == pytest.approx(MSB_WL)
    assert header_unit(fits.Header({"BUNIT": "MSB"})) is None  # no channel: no MSB value
    assert header_unit(fits.Header({"BUNIT": "furlongs"})) is None
    assert header_unit(fits.Header({"BUNIT": "DN/s"})) == u.DN / u.s
    # the SCI BUNIT of products made before issue 27 (1 MSB as a scaled radiance) is still read
    old = fits.Header({"BUNIT": "1.024078E+05 erg cm-2 s-1 sr-1", "BUNITNAM": "MSB", "CHANNEL": "SCI-UV"})
    assert (1 * header_unit(old)).to_value("erg cm-2 s-1 sr-1") == pytest.approx(1.024078e5)
    # today's: dimensionless BUNIT, BUNITNAM MSB, MSBVALUE
    new = fits.Header({"BUNIT": "", "BUNITNAM": "MSB", "MSBVALUE": 1.679353e9, "CHANNEL": "SCI-WL"})
    assert (1 * header_unit(new)).to_value("erg cm-2 s-1 sr-1") == pytest.approx(1.679353e9)
    assert header_unit(fits.Header({"BUNIT": ""})) is None  # dimensionless without MSB: no radiance


@pytest.fixture(scope="module")
def products(tmp_path_factory):
    out = tmp_path_factory.mktemp("units")
    res = simulate(out / "sim", naxis=128, noise=True, seed=4, sdi_sequence=False)
    rows = {}
    for f in res.frames:
        raw = read_image(f.raw_path)
        l2 = calibrate_frame(raw.data, raw.header, load_simulated_masters(out / "sim", f.channel))
        path = out / f"{f.channel}_l2.fits"
        write_fits_atomic(build_product_hdul(l2, "test"), path)
        rows[f.channel] = (f, l2, path)
    return rows


def test_every_channel_product_has_units_dates_and_image_extensions(products):
    import sunpy.map

    for c, (frame, l2, path) in products.items():
        with fits.open(path, checksum=True) as hdul:
            hdul.verify("exception")
            assert [h.name for h in hdul] == ["PRIMARY", "UNCERT", "DQ"]
            assert isinstance(hdul["UNCERT"], fits.ImageHDU) and hdul["UNCERT"].header["BITPIX"] == -32
            assert isinstance(hdul["DQ"], fits.ImageHDU) and hdul["DQ"].header["BITPIX"] == 8
            h = hdul[0].header
            assert hdul["UNCERT"].header["BUNIT"] == h["BUNIT"] and hdul["DQ"].header["CRPIX1"] == h["CRPIX1"]
        u.Unit(h["BUNIT"], format="fits", parse_strict="raise")  # strict FITS reads it
        beg, end = Time(h["DATE-BEG"]), Time(h["DATE-END"])
        assert (end - beg).to_value("s") == pytest.approx(frame.exptime_s, abs=1e-3)
        assert Time(h["DATE-OBS"]) == beg
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no "could not parse unit" from sunpy
            m = sunpy.map.Map(path, hdus=0)
        assert len(sunpy.map.Map(path)) == 3  # what sunpy.map.Map(path) returns (README)
        if c.startswith("SCI"):  # MSB: dimensionless in the file, 1 MSB = MSBVALUE radiance
            assert m.unit == u.dimensionless_unscaled, c
            assert h["BUNITNAM"] == "MSB" and h["MSBVALUE"] == pytest.approx(msb_definition(c).radiance, rel=1e-6)
            assert (1 * header_unit(h)).to_value("erg cm-2 s-1 sr-1") == pytest.approx(h["MSBVALUE"], rel=1e-6)
        else:
            assert m.unit is not None and m.unit.is_equivalent("erg cm-2 s-1 sr-1"), c
        data, dq, _ = read_product(path)
        sigma = read_uncertainty(path)
        assert np.array_equal(dq, l2.dq) and np.array_equal(sigma, l2.uncertainty, equal_nan=True)
        good = dq == 0
        assert np.all(np.isfinite(sigma[good])) and np.all(sigma[good] > 0)
        assert np.all(np.isnan(sigma[np.isnan(data)]))
        assert h["UNCGAIN"] == pytest.approx(1.6) and "raw header" in h.comments["UNCGAIN"]


def test_load_l2_gives_mask_and_uncertainty(products):
    from astropy.nddata import StdDevUncertainty

    from pipelines.io import load_l2

    for c, (_, l2, path) in products.items():
        m = load_l2(path)
        assert m.unit.is_equivalent("erg cm-2 s-1 sr-1")
        assert isinstance(m.uncertainty, StdDevUncertainty)
        assert np.array_equal(m.uncertainty.array, l2.uncertainty, equal_nan=True)
        assert np.array_equal(m.mask, (l2.dq != 0) | ~np.isfinite(l2.data))
        assert m.date_start.isot.startswith(l2.header["DATE-BEG"][:19])


def test_older_layout_still_read(products, tmp_path):
    from pipelines.io import load_l2

    _, l2, _ = products["SCI-UV"]
    h = l2.header.copy()
    h["BUNIT"] = "MSB"
    for key in ("BUNITNAM", "MSBVALUE", "MSBWAVE1", "MSBWAVE2", "MSBSRC"):
        del h[key]
    old = tmp_path / "old.fits"
    fits.HDUList([fits.PrimaryHDU(l2.data, h), dq_table_hdu(l2.dq)]).writeto(old)
    data, dq, _ = read_product(old)
    assert np.array_equal(dq, l2.dq) and read_uncertainty(old) is None
    m = load_l2(old)
    assert m.uncertainty is None and m.mask.sum() == int(((l2.dq != 0) | ~np.isfinite(l2.data)).sum())
    assert (1 * m.unit).to_value("erg cm-2 s-1 sr-1") == pytest.approx(MSB_UV, rel=1e-6)


def test_uncertainty_tracks_the_noise_model(products):
    """In the disk centre of SDI the uncertainty is the Poisson + read noise of the frame:
    sigma_DN**2 = S/g + rn**2 + 1/12 over (t / C)**2, up to the flat and the resampling factor."""
    frame, l2, _ = products["SDI"]
    n = l2.data.shape[0]
    c = slice(n // 2 - 6, n // 2 + 6)
    from pipelines.simulation import INSTRUMENT

    model = INSTRUMENT["SDI"]
    coef = float(l2.header["HISTORY"][[i for i, x in enumerate(l2.header["HISTORY"]) if x.startswith("convert_units")][0]]
                 .split("x ")[1].split(" ")[0])
    s_dn = l2.data[c, c] * model.exptime_s / coef
    expect = np.sqrt(s_dn / model.gain_e_per_dn + model.read_noise_dn ** 2 + 1 / 12) * coef / model.exptime_s
    ratio = l2.uncertainty[c, c] / expect
    # the resampling factor g(fx) g(fy) lies in [0.756**2, 1]; the flat's +-2 % scales it
    assert 0.52 < ratio.min() and ratio.max() < 1.05


@pytest.mark.parametrize("order", [3, 1])
def test_resampled_variance_matches_monte_carlo(order):
    """White noise of known variance through rotate_north_up: the empirical variance of the
    output pixels agrees with resample_variance within 3 % (400 realisations)."""
    n = 48
    h = fits.Header()
    h.update({"CTYPE1": "HPLN-TAN", "CTYPE2": "HPLT-TAN", "CUNIT1": "arcsec", "CUNIT2": "arcsec",
              "CDELT1": 40.0, "CDELT2": 40.0, "CRPIX1": 24.3 + 1.37, "CRPIX2": 24.5 - 0.81, "CRVAL1": 0.0, "CRVAL2": 0.0,
              "CROTA2": 7.0, "DATE-OBS": "2023-05-01T00:00:00", "RSUN_OBS": 950.0, "DSUN_OBS": 1.5e11,
              "HGLN_OBS": 0.0, "HGLT_OBS": 0.0})
    rng = np.random.default_rng(3)
    var_in = np.full((n, n), 4.0, np.float32) * (1 + 0.5 * (np.arange(n) / n))[None, :].astype(np.float32)
    pred = uncertainty.resample_variance(var_in, h, order=order)
    outs = []
    for _ in range(400):
        img = (rng.standard_normal((n, n)) * np.sqrt(var_in)).astype(np.float32)
        out, _, _ = resample.rotate_north_up(img, None, h, order=order, threads=1)
        outs.append(out)
    emp = np.var(np.stack(outs), axis=0)
    inner = (slice(8, n - 8), slice(8, n - 8))
    rel = emp[inner] / pred[inner]
    assert np.nanmean(rel) == pytest.approx(1.0, abs=0.03)
    assert np.nanpercentile(rel, 5) > 0.8 and np.nanpercentile(rel, 95) < 1.2
    # the factor matters: without it the variance would be 10-40 % too large
    assert np.nanmean(emp[inner] / var_in[inner]) < 0.9
