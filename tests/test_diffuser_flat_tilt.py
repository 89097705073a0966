"""SCI diffuser flat: the gain tilt a roll sequence measures is taken out of the flat (issue 27 item 2).

The diffuser's illumination ``D`` is in the flat (``G D``) but not in the science frames
(``G``), so an L1 frame keeps ``1 / D``. The roll sequence measures that tilt
(:func:`measure_occulter_offset`'s ``gradient``); :func:`remove_roll_tilt` multiplies it back
into the flat. Checked here on an exact tilt (the sign, the centre, the normalisation) and end
to end: a synthetic roll sequence through a tilted gain, measured, then the flat corrected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.calibration.masters.diffuser_flat import (ROLL_TILT_KEYWORDS, remove_roll_tilt, roll_tilt_gain,
                                                         roll_tilt_keywords)
from pipelines.calibration.masters.occulter import measure_occulter_offset
from tests.test_occulter_offset import N, _sequence

RS = 30.0  # px per Rsun of tests.test_occulter_offset


def _u(n: int = N):
    y, x = np.mgrid[:n, :n].astype(float)
    return (x - (n - 1) / 2.0) / RS, (y - (n - 1) / 2.0) / RS


def test_the_gain_is_one_at_the_detector_centre_and_grows_along_the_gradient():
    """The centre convention (0-based ``(n - 1) / 2``, x = columns), which the flat's
    renormalisation would hide: the roll sequence's frames are divided by this gain unnormalised."""
    g = roll_tilt_gain((5, 7), (0.02, -0.01), 2.0)
    assert g[2, 3] == 1.0  # the centre pixel of a 5 x 7 (rows x columns) frame
    assert g[2, 4] == pytest.approx(math.exp(0.02 / 2.0)) and g[3, 3] == pytest.approx(math.exp(-0.01 / 2.0))
    even = roll_tilt_gain((4, 4), (0.02, 0.0), 2.0)  # centre between pixels 1 and 2
    assert even[0, 1] * even[0, 2] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive"):
        roll_tilt_gain((0, 4), (0.0, 0.0), 2.0)


def test_an_exact_tilt_is_taken_out_with_the_right_sign():
    rng = np.random.default_rng(3)
    gain = 1.0 + 0.01 * rng.standard_normal((N, N))  # the detector's pixel-scale gain G
    ux, uy = _u()
    g = (0.004, -0.003)  # what the roll finds in L1: ln(1 / D) = g . u
    flat = gain * np.exp(-(g[0] * ux + g[1] * uy))  # G D
    flat /= flat.mean()
    out = remove_roll_tilt(flat, g, RS)
    assert out.mean() == pytest.approx(flat.mean(), rel=1e-12)  # the normalisation does not move
    np.testing.assert_allclose(out / out.mean(), gain / gain.mean(), rtol=1e-12)
    wrong = remove_roll_tilt(flat, (-g[0], -g[1]), RS)  # the other sign doubles the tilt
    assert np.std(np.log(wrong / gain)) > 1.5 * np.std(np.log(flat / gain))


def test_nan_stays_nan_and_the_mean_is_kept_over_the_valid_pixels():
    flat = np.ones((16, 16))
    flat[0, :4] = np.nan
    valid = np.isfinite(flat)
    valid[5, 5] = False
    out = remove_roll_tilt(flat, (0.02, 0.0), 5.0, valid)
    assert np.isnan(out[0, :4]).all() and out[valid].mean() == pytest.approx(1.0, rel=1e-12)
    assert out[8, 15] > out[8, 0]  # +x gradient: the flat grows along x (the L1 gain is divided out)


@pytest.mark.parametrize("kwargs, match", [
    ({"flat": np.ones(5)}, "2-D"),
    ({"gradient": (float("nan"), 0.0)}, "finite"),
    ({"rsun_px": 0.0}, "positive"),
    ({"valid": np.ones((3, 3), bool)}, "one shape"),
    ({"flat": np.full((4, 4), np.nan)}, "no valid pixel"),
])
def test_bad_input_is_refused(kwargs, match):
    args = {"flat": np.ones((4, 4)), "gradient": (0.0, 0.0), "rsun_px": 2.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        remove_roll_tilt(args["flat"], args["gradient"], args["rsun_px"], args.get("valid"))


def test_keywords_record_the_tilt_its_error_radius_and_source():
    kw = roll_tilt_keywords((0.0012345678, -0.002), "roll sequence OCCGRAD1/2", sigma=(1.5e-5, 2e-5), rsun_px=50.8)
    assert tuple(kw) == tuple(ROLL_TILT_KEYWORDS) and kw["FLATTLT1"][0] == pytest.approx(0.0012346)
    assert (kw["FLATTLE2"][0], kw["FLATTLRS"][0], kw["FLATTLSR"][0]) == (2e-5, 50.8, "roll sequence OCCGRAD1/2")
    for bad in ({"source": " "}, {"sigma": (-1.0, 0.0)}, {"rsun_px": 0.0}, {"gradient": (np.inf, 0.0)}):
        args = {"gradient": (0.0, 0.0), "source": "x", "sigma": (0.0, 0.0), "rsun_px": 1.0, **bad}
        with pytest.raises(ValueError):
            roll_tilt_keywords(args["gradient"], args["source"], sigma=args["sigma"], rsun_px=args["rsun_px"])


def test_a_roll_sequence_through_a_tilted_gain_corrects_the_flat():
    """End to end: the frames carry a 2 %/Rsun (x) and -1 %/Rsun (y) gain left by the flat;
    the flat that left it (1 / gain, with G = 1) corrected with what the roll measured is flat
    to a tenth of the injected tilt."""
    tilt = (0.02, -0.01)
    imgs, hdrs = _sequence(21, tilt=tilt)
    off = measure_occulter_offset(imgs, hdrs)
    ux, uy = _u()
    left = 1.0 + tilt[0] * ux + tilt[1] * uy  # the sequence's gain (tests.test_occulter_offset._frame)
    flat = 1.0 / left  # G D with G = 1: the flat whose division left that gain
    assert off.rsun_px == pytest.approx(RS, rel=1e-3)
    assert 0 < off.gradient_sigma[0] < 0.1 * tilt[0] and 0 < off.gradient_sigma[1] < 0.1 * abs(tilt[1])
    corrected = remove_roll_tilt(flat, off.gradient, off.rsun_px)
    before = np.std(np.log(flat))
    after = np.std(np.log(corrected))
    assert after < 0.1 * before, (off.gradient, before, after)
    assert math.hypot(off.gradient[0] - tilt[0], off.gradient[1] - tilt[1]) < 0.1 * math.hypot(*tilt)
