"""Gate of issue 14 item 6: the per-pixel uncertainty matches the residuals (blind masters).

``validation.blind_units.run`` simulates one frame per channel and the bias,
dark and flat frames of each detector; the chain estimates its masters, gain and read noise
from those frames only, calibrates, and the truth scores ``(L2 - truth) / sigma``.
"""

from __future__ import annotations

import numpy as np
import pytest

from validation import blind_units

CHANNELS = ("SDI", "WST", "SCI-UV", "SCI-WL")


@pytest.fixture(scope="module")
def blind_256():
    return blind_units.run(256, True, 5)


def test_pull_width_within_5_percent_of_one(blind_256):
    for c in CHANNELS:
        assert abs(blind_256[f"pull_width_{c}"] - 1.0) <= 0.05, (c, blind_256)
        assert abs(blind_256[f"pull_median_{c}"]) <= 0.05, (c, blind_256)
    assert blind_256["pull_width_max_dev"] <= 0.05


def test_photon_transfer_recovers_gain_and_read_noise(blind_256):
    for c in CHANNELS:
        assert blind_256[f"gain_{c}"] == pytest.approx(blind_256[f"gain_true_{c}"], rel=0.03)
        assert blind_256[f"read_noise_{c}"] == pytest.approx(blind_256[f"read_noise_true_{c}"], rel=0.03)
        assert 0 < blind_256[f"median_l2_error_pct_{c}"] < 50


def test_a_wrong_noise_model_fails_the_gate():
    """Half the true gain (twice the Poisson variance): the pulls narrow well below 0.95."""
    res = blind_units._run(128, True, 5, gain_factor=0.5)
    assert res["pull_width_SDI"] < 0.9 and res["pull_width_WST"] < 0.9
    assert res["pull_width_max_dev"] > 0.05


def test_estimate_detector_masters_from_frames_alone():
    rng = np.random.default_rng(1)
    n, g, rn = 64, 2.0, 3.0
    bias = 100 + rng.normal(0, 2, (n, n))
    rate = np.full((n, n), 5.0)
    flat = 1 + 0.02 * rng.standard_normal((n, n))
    flat /= flat.mean()
    det = {"bias": bias, "dark_rate": rate, "flat": flat}
    kw = {"n": 16, "gain": g, "read_noise": rn, "noise": True}
    est = blind_units.estimate_detector_masters(
        blind_units._exposures(rng, det, t=0.0, level_dn=0.0, **kw), blind_units._exposures(rng, det, t=20.0, level_dn=0.0, **kw),
        20.0, blind_units._exposures(rng, det, t=1.0, level_dn=20000.0, **kw), 1.0)
    assert est["gain"] == pytest.approx(g, rel=0.05)
    assert est["read_noise"] == pytest.approx(rn, rel=0.05)
    # standard errors: the scatter of the estimate about the truth matches the stated error
    for plane, err, truth in (("bias", "biaserr", bias), ("dark_rate", "darkerr", rate), ("flat", "flaterr", flat)):
        z = (est[plane] - truth) / est[err]
        assert 0.85 < 1.4826 * np.median(np.abs(z - np.median(z))) < 1.15, plane
    with pytest.raises(ValueError):
        blind_units.estimate_detector_masters(np.zeros((1, 4, 4)), np.zeros((2, 4, 4)), 1.0, np.zeros((2, 4, 4)), 1.0)
