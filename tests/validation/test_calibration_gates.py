"""The calibration validation gates at a small size (the report runs them at full size:
``benchmarks/validate_calibration.py``). Frames simulated from real scenes with known truth,
noise off; see :mod:`validation.gates` for the definitions.

* median relative error < 0.1 % per channel (pixels the 16-bit ADC resolves to 0.02 %),
  signed bias < 0.1 % over all signal pixels;
* SCI stray-light residual < 1 % of the injected stray light in every 0.05 Rsun annulus
  from 1.1 to 2.5 Rsun, with the power-law master and with a map measured from a sequence;
* Sun centre of the north-up L2 image within 0.25 px of the truth's (limb fits);
* KLL flat from a dithered set within 0.5 % RMS of the injected flat.
"""

from __future__ import annotations

import numpy as np
import pytest

from validation import gates as v
from pipelines.simulation import simulate

N = 192
N_SEQ = 384  # below ~300 px the coronal structure's azimuthal median is too coarse for a 1 % profile


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return simulate(tmp_path_factory.mktemp("gates"), naxis=N, noise=False, seed=7, sdi_sequence=False)


@pytest.fixture(scope="module")
def rows(sim):
    return {r["channel"]: r for r in v.validate_simulation(sim)}


def test_median_relative_error_and_bias_below_gates(rows):
    assert set(rows) == {"SDI", "WST", "SCI-UV", "SCI-WL"}
    for ch, r in rows.items():
        print(f"{ch}: median |rel err| {100 * r['median_rel_error']:.4f} % on {100 * r['resolved_fraction']:.0f} % "
              f"of signal pixels; all pixels {100 * r['median_rel_error_all']:.4f} %; bias {100 * r['median_bias']:.5f} %")
        assert r["median_rel_error"] < v.GATES["median_rel_error"], ch
        assert abs(r["median_bias"]) < v.GATES["median_bias"], ch
        assert r["resolved_fraction"] > (0.05 if ch.startswith("SCI") else 0.9), ch
        # the rest is the ADC: its rounding floor explains the all-pixel median
        assert r["median_rel_error_all"] < 1.5 * max(r["adc_floor_median"], v.GATES["median_rel_error"]), ch


def test_sun_centre_within_a_quarter_pixel_after_north_up(rows):
    for ch in ("SDI", "WST"):
        r = rows[ch]
        print(f"{ch}: L2 limb centre - truth limb centre = ({r['centre_dx']:+.4f}, {r['centre_dy']:+.4f}) px")
        assert r["centre_offset_px"] < v.GATES["sun_centre_px"], ch


def test_stray_light_residual_with_the_power_law_master(rows):
    for ch in ("SCI-UV", "SCI-WL"):
        prof = rows[ch]["stray_profile"]
        assert len(prof) == len(v.ANNULI) - 1 and prof[0]["r_lo"] == 1.1 and prof[-1]["r_hi"] == 2.5
        assert rows[ch]["stray_residual"] < v.GATES["stray_residual"], ch


def test_stray_light_residual_with_a_map_measured_from_a_sequence(tmp_path):
    seq = simulate(tmp_path / "seq", channels=("SCI-UV", "SCI-WL"), naxis=N_SEQ, noise=False, seed=8,
                   sdi_sequence=False, frames_per_channel=4)
    # a static scene: the median over time is unbiased; the minimum is biased low by the pointing
    # jitter times the radial gradient (~0.7 % at 1.1 Rsun at this size, 5x less at full size)
    res, low, raw = v.stray_map_check(seq, variants=[("model", 50.0, 2), ("model", 0.0, 3), (None, 0.0, 4)])
    for ch, r in res.items():
        print(f"{ch}: measured profile, worst annulus residual {100 * r['stray_residual']:.3f} % of the stray light "
              f"(time median), {100 * low[ch]['stray_residual']:.3f} % (time minimum)")
        assert r["stray_residual"] < v.GATES["stray_residual"], ch
        assert low[ch]["stray_residual"] < 3 * v.GATES["stray_residual"], ch
        assert r["n_frames"] == 4 and r["power_law_index"] == pytest.approx(r["injected_index"], rel=0.02)
    # without a coronal model the background keeps the steady corona: the check must see it
    assert all(r["stray_residual"] > 0.05 for r in raw.values())


def test_kll_flat_recovered_within_half_a_percent(sim):
    for ch in ("WST", "SDI"):
        r = v.kll_flat_check(sim, ch, noise=False)
        assert r["rms"] < v.GATES["flat_rms"] and r["injected_rms"] > 0.01 and r["valid_fraction"] > 0.5, ch
    noisy = v.kll_flat_check(sim, "WST", noise=True, seed=3)
    assert noisy["rms"] < 0.02 and np.isfinite(noisy["p99"])  # reported at full size, not gated
