"""Issue 27 item 6: one irradiance convention, two references (LASP, LYRA), a law that knows its shape.

* The simulator's SDI frame of 2012-01-01 (real SWAP 174 A structure, 64 px, its own masters)
  calibrated by the chain reads the LASP composite of that day under the one convention
  (:data:`~pipelines.calibration.masters.radiometry.IRRADIANCE_RADIUS_RSUN`): before, the
  simulator put the LASP value on the disk alone and SDI read 1.030 x LASP.
* On the real files (LASP composite, PROBA2/LYRA level 2 of 2012-01-01), SDI tied to LASP agrees
  with LYRA, and SDI tied to LYRA with LASP, within their stated budget
  (:func:`~pipelines.calibration.masters.radiometry.reference_budget`), and LASP's scale alone
  would not cover their 1.1775.
* The degradation fit flags a law of the wrong shape (a step, a fast early loss:
  :class:`validation.families.Degradation`) and not the right one.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest
from astropy.io import fits
from astropy.time import Time

from pipelines.calibration.masters import radiometry
from pipelines.simulation.sources import LYA_INDEX_FILE, SAMPLE_DIR

LYRA_FILE = SAMPLE_DIR / "lyman-alpha" / "lyra_20120101-000000_lev2_std.fits"
DAY = dt.date(2012, 1, 1)


@pytest.fixture(scope="module")
def refs():
    return (radiometry.read_lasp_composite(SAMPLE_DIR / LYA_INDEX_FILE),
            radiometry.lyra_daily_irradiance(LYRA_FILE))


@pytest.fixture(scope="module")
def sdi_frame(tmp_path_factory):
    """The simulator's single SDI frame of 2012-01-01 calibrated by the chain with its masters."""
    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from pipelines.fitsio import read_image
    from pipelines.simulation import simulate

    out = tmp_path_factory.mktemp("sdi1")
    simulate(out, channels=["SDI"], naxis=64, seed=0, sdi_sequence=False)
    cals = {fits.getheader(p)["CALKIND"]: load_calibration_master(p) for p in sorted((out / "calibration").glob("*.fits"))}
    raw = read_image(sorted((out / "raw").glob("*.fits"))[0])
    l2 = calibrate_frame(raw.data, raw.header, cals)
    return l2, radiometry.disk_integrated_irradiance(l2.data, l2.dq, l2.header), raw, cals


def test_one_convention_simulator_and_chain_agree(sdi_frame, refs):
    lasp, _ = refs
    l2, e = sdi_frame[:2]
    assert e["r_max_rsun"] == radiometry.IRRADIANCE_RADIUS_RSUN == 1.2
    assert Time(l2.header["DATE-OBS"]).utc.to_datetime().date() == DAY
    # the frame was made with the LASP value within 1.2 Rsun and calibrated with the coefficient it
    # was made with: the chain's integral reads it back (photometry, band limit, fill: < 0.5 %);
    # the former disk-only scaling read 1.030 (the limb and inner corona hold 3 %)
    assert e["irradiance_ph_cm2_s"] / lasp.on(DAY) == pytest.approx(1.0, abs=0.005)
    assert e["disk_fraction"] < 0.99  # the integral holds more than the disk


def test_sdi_against_lasp_and_lyra_on_the_same_day_within_their_budget(sdi_frame, refs):
    lasp, lyra = refs
    e_sdi = sdi_frame[1]["irradiance_ph_cm2_s"]
    assert lasp.on(DAY) / lyra.on(DAY) == pytest.approx(1.1775, abs=0.001)  # the two real series
    # tied to LASP (one-day cross-calibration), checked against LYRA; and the reverse
    to_lasp = e_sdi * radiometry.cross_calibrate_on_day(e_sdi, DAY, lasp)
    to_lyra = e_sdi * radiometry.cross_calibrate_on_day(e_sdi, DAY, lyra)
    fwd = radiometry.compare_with_reference(to_lasp, DAY, lasp, lyra)
    rev = radiometry.compare_with_reference(to_lyra, DAY, lyra, lasp)
    assert fwd.ratio == pytest.approx(1.1775, abs=0.001) and rev.ratio == pytest.approx(1 / 1.1775, abs=0.001)
    for chk in (fwd, rev):
        assert chk.budget["LASP scale"] == radiometry.LASP_SCALE_UNCERTAINTY == 0.05
        assert chk.budget["LYRA scale"] == radiometry.LYRA_SCALE_UNCERTAINTY == 0.11
        assert chk.sigma == pytest.approx(0.1209, abs=0.001)
        assert abs(chk.z) == pytest.approx(1.35, abs=0.02)
        assert chk.within
    assert fwd.z > 0 > rev.z
    # the SDI frame as calibrated (the simulator's coefficient, LASP's scale) checks the same way
    assert radiometry.compare_with_reference(e_sdi, DAY, lasp, lyra).within
    # LASP's scale alone (a LYRA that claimed to be exact) would not cover 1.1775: 3.3 sigma
    exact = radiometry.LyaSeries("LYRA", lyra.days, lyra.rel_uncertainty, 0.0, lyra.source)
    assert not radiometry.compare_with_reference(to_lasp, DAY, lasp, exact).within


def test_a_series_without_a_stated_scale_has_no_budget(refs):
    lasp, lyra = refs
    blind = radiometry.LyaSeries("LYRA", lyra.days, lyra.rel_uncertainty, float("nan"), lyra.source)
    with pytest.raises(radiometry.DataError, match="no scale uncertainty"):
        radiometry.reference_budget(lasp, blind)
    with pytest.raises(ValueError):
        radiometry.compare_with_reference(0.0, DAY, lasp, lyra)


def _campaign_ratios(seed: int, extra=None):
    """SDI/LASP ratios of a 13-day campaign (the campaign's day layout) calibrated with a constant
    coefficient: ``C_g / C_true(t)`` with an exponential loss (rate 2-6 %/yr) times ``extra``
    (a validation family's shape) and the LASP composite's daily noise."""
    from pipelines.simulation.campaign import LAUNCH, _days

    rng = np.random.default_rng([seed, 27, 6])
    days = _days(rng, 12)
    times = [Time(dt.datetime.combine(d, dt.time(12)), scale="utc") for d in days]
    years = [float((t - LAUNCH).to_value("day")) / 365.25 for t in times]
    rate = rng.uniform(0.02, 0.06)
    g = extra or (lambda y, a, b: 1.0)
    e = [1.1 * math.exp(-rate * y) * g(y, years[0], years[-1]) * (1 + rng.normal(0, radiometry.LASP_DAILY_SCATTER))
         for y in years]
    ref = radiometry.LyaSeries("LASP", {d: 1.0 for d in days}, radiometry.LASP_DAILY_SCATTER, 0.05, "unit")
    return radiometry.fit_cross_calibration(times, e, ref, 1.0)


def test_a_degradation_law_of_the_wrong_shape_is_flagged(tmp_path):
    from validation.families import Degradation

    right = [_campaign_ratios(s) for s in range(8)]
    step = [_campaign_ratios(s, Degradation("step", 0.03, 0.5)) for s in range(8)]
    early = [_campaign_ratios(s, Degradation("early", 0.05, 0.1)) for s in range(8)]
    assert sum(f.law_mismatch for f in right) <= 1, [f.mismatch_p for f in right]
    assert all(f.law_mismatch for f in step), [f.mismatch_p for f in step]
    assert all(f.law_mismatch for f in early), [f.mismatch_p for f in early]
    assert {f.mismatch_alternative for f in step} == {"STEP"}
    # all accepted by the chi-square rule: the flag is what tells them apart
    assert all(f.accepted for f in step + right)
    # the master records it
    p = radiometry.write_radiometric_master(step[0], tmp_path / "m.fits", naxis=64, version=2,
                                            valid_from="1997-01-01T00:00:00", valid_to="2014-01-01T00:00:00")
    h = fits.getheader(p)
    assert h["RADMISFL"] == "STEP" and 0 < h["RADMISP"] < radiometry.MISMATCH_P
    p = radiometry.write_radiometric_master(right[0], tmp_path / "r.fits", naxis=64, version=2,
                                            valid_from="1997-01-01T00:00:00", valid_to="2014-01-01T00:00:00")
    assert not right[0].law_mismatch and fits.getheader(p)["RADMISFL"] == "NONE"


def test_a_flagged_master_says_so_on_the_product(sdi_frame, tmp_path):
    """A product calibrated with a master whose law's shape was refuted carries ``RADMISFL``."""
    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from validation.families import Degradation

    fit = _campaign_ratios(0, Degradation("step", 0.03, 0.5))
    assert fit.law_mismatch
    l2, _, raw, cals = sdi_frame
    assert "RADMISFL" not in l2.header  # the simulator's master
    m = radiometry.write_radiometric_master(fit, tmp_path / "m.fits", naxis=64, version=2,
                                            valid_from="1997-01-01T00:00:00", valid_to="2014-01-01T00:00:00")
    flagged = dict(cals, radiometric=load_calibration_master(m))
    assert calibrate_frame(raw.data, raw.header, flagged).header["RADMISFL"] == "STEP"
