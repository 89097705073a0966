"""The SCI diffuser flat states the diffuser's large-scale non-uniformity (issue 27).

The chain's SCI flat master carries ``FLATDFSG``
(:data:`pipelines.calibration.masters.diffuser_flat.DIFFUSER_NONUNIFORMITY_SIGMA`) and the
L2 flow copies it and grows ``UNCERT**2`` by exactly ``(data x FLATDFSG)**2``.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.calibration.masters.diffuser_flat import (DIFFUSER_NONUNIFORMITY_SIGMA, DIFFUSER_SIGMA_KEY,
                                                         diffuser_flat_keywords)

N = 64


def test_the_chain_sci_flat_master_carries_the_stated_diffuser_term(tmp_path):
    from pipelines.simulation import simulate
    from validation import blind_chain as bc

    sim = simulate(tmp_path / "sim", channels=("SCI-UV",), naxis=N, noise=True, seed=3, sdi_sequence=False)
    out: dict[str, float] = {}
    cals, _est, _det, _flat = bc._masters(sim, "SCI-UV", 2, True, 3, tmp_path / "chain", out)
    assert float(cals["flat"].parameters[DIFFUSER_SIGMA_KEY]) == pytest.approx(DIFFUSER_NONUNIFORMITY_SIGMA)
    assert DIFFUSER_NONUNIFORMITY_SIGMA > 0 and np.isfinite(out["flat_pull_SCI-UV"])


def test_a_product_from_a_diffuser_flat_carries_the_term_in_uncert_and_keywords(tmp_path):
    """UNCERT**2 grows by exactly ``(data x FLATDFSG)**2`` on the detector grid (stray light off:
    the data at the flat step are the product's)."""
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.calibration.l2.options import CalibrationOptions
    from pipelines.fitsio import read_image
    from pipelines.simulation import simulate
    from validation.gates import load_masters

    sim = simulate(tmp_path, channels=("SCI-UV",), naxis=N, noise=True, seed=3, sdi_sequence=False)
    raw = read_image(sim.frames[0].raw_path)
    opts = CalibrationOptions(rotate_north_up=False, fit_centre=False, remove_cosmic_rays=False,
                              subtract_stray_light=False)
    cals = load_masters(sim.calibration_files)["SCI-UV"]
    cals["flat"].parameters.pop(DIFFUSER_SIGMA_KEY, None)
    plain = calibrate_frame(raw.data, raw.header, cals, opts)
    assert DIFFUSER_SIGMA_KEY not in plain.header
    sig = 0.02
    cals["flat"].parameters.update({k: v[0] for k, v in diffuser_flat_keywords(sig).items()})
    l2 = calibrate_frame(raw.data, raw.header, cals, opts)
    assert l2.header[DIFFUSER_SIGMA_KEY] == sig
    assert "FLATTLT1" not in l2.header  # no roll tilt recorded: none stated
    from pipelines.calibration.masters.diffuser_flat import roll_tilt_keywords

    kw = roll_tilt_keywords((0.003, -0.001), "roll sequence", sigma=(1e-5, 2e-5), rsun_px=20.0)
    cals["flat"].parameters.update({k: v[0] for k, v in kw.items()})
    tilted = calibrate_frame(raw.data, raw.header, cals, opts)
    assert {k: tilted.header[k] for k in kw} == {k: v[0] for k, v in kw.items()}
    from pipelines.errors import DataError

    cals["flat"].parameters["FLATTLT1"] = "tilted"
    with pytest.raises(DataError, match="FLATTLT1"):
        calibrate_frame(raw.data, raw.header, cals, opts)
    assert np.array_equal(l2.data, plain.data, equal_nan=True)  # the data are not touched, only the error
    ok = np.isfinite(l2.uncertainty) & np.isfinite(plain.uncertainty) & (l2.dq == 0) & (np.abs(l2.data) > 0)
    extra = l2.uncertainty[ok].astype(np.float64) ** 2 - plain.uncertainty[ok].astype(np.float64) ** 2
    want = (l2.data[ok].astype(np.float64) * sig) ** 2
    bright = want > 0.05 * np.median(plain.uncertainty[ok].astype(np.float64) ** 2)
    assert bright.sum() > 100
    assert np.allclose(extra[bright], want[bright], rtol=0.02)


def test_a_bad_diffuser_sigma_is_refused():
    with pytest.raises(ValueError):
        diffuser_flat_keywords(-0.01)
