"""Blind SCI stray light (issue 14 item 3): roll sequence + radial-law fit with a wrong coronal prior.

The gate of the issue is a stray-light residual <= 5 % of the K corona at 1.1-2.5 Rsun with a
prior x0.5 and x1.5, noise on. Measured here at 256 px, seed 0 (validation.blind_stray.run,
profile refined from the sky-frame mean of the model-subtracted frames): the prior's scale does
not matter (x0.5 and x1.5 give the same map); worst over 1.1-2.5 Rsun 3.1 % (WL) and 4.1 % (UV)
of the K corona (seeds 1 and 2: 3.3 / 3.2 % and 3.7 / 2.2 %). The negative control: the
instrument-frame profile (refine=0) fails it (SCI-UV 2.0 Rsun, 6.3 %), and so does the
time-minimum map of stray_light.measure_stray_light_map (12-400 %).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from validation import blind_stray
from validation.blind_stray import RADII, fit_radial_laws, run

GATE = 0.05
BOUND = 0.10


@pytest.fixture(scope="module")
def metrics():
    return run(256, True, 0, shape_tilts=())


@pytest.mark.parametrize("tag", ["wl", "uv"])
def test_prior_scale_does_not_enter_the_estimate(metrics, tag):
    for r0 in RADII:
        a, b = metrics[f"stray_{tag}_x0.5_r{r0:g}"], metrics[f"stray_{tag}_x1.5_r{r0:g}"]
        assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), (r0, a, b)
    # the fitted corona brightness is the truth's, whatever the prior said (within 10 %)
    for name in ("x0.5", "x1.5"):
        assert abs(metrics[f"corona_scale_{tag}_{name}"] - 1.0) < 0.1


@pytest.mark.parametrize("tag", ["wl", "uv"])
def test_old_map_follows_the_prior_new_one_does_not(metrics, tag):
    for name in ("x0.5", "x1.5"):
        for r0 in RADII:
            base = metrics[f"baseline_{tag}_{name}_r{r0:g}"]
            new = metrics[f"stray_{tag}_{name}_r{r0:g}"]
            assert base > 0.1, (name, r0, base)  # the time-minimum map carries the prior's error
            assert new < BOUND, (name, r0, new)
            assert new < base / 2


GATED = [(tag, r0) for tag in ("wl", "uv") for r0 in RADII]


@pytest.mark.parametrize(("tag", "r0"), GATED)
def test_gate(metrics, tag, r0):
    for name in ("x0.5", "x1.5"):
        assert metrics[f"stray_{tag}_{name}_r{r0:g}"] <= GATE


@pytest.mark.parametrize("tag", ["wl", "uv"])
def test_gate_between_the_radii(metrics, tag):
    # every 0.1 Rsun from 1.1 to 2.5, the worse prior, in percent of the K corona
    assert metrics[f"stray_pct_k_corona_{tag}_max"] <= 100 * GATE


def test_the_gate_fails_for_the_instrument_frame_profile():
    """Negative control: without the sky-frame refinement (refine=0, the method before this
    revision) the same sequence fails the gate for SCI-UV at 2.0 Rsun (measured 6.3 %)."""
    from pipelines import simulation as simmod
    from validation.blind_stray import estimate_stray_light, roll_separation

    l1s, hdrs, valids, rho, stray, kcor = _uv_sequence()
    prior = lambda r: 0.5 * simmod.lyman_alpha_corona(r)  # noqa: E731
    sep = roll_separation(l1s, hdrs, valid=valids)
    errs = {}
    for refine in (0, 1):
        est = estimate_stray_light(l1s, hdrs, prior, valid=valids, separation=sep, refine=refine)
        s_est = est.stray(np.clip(rho, 1.0, 3.0))
        sel = blind_stray._annulus(rho, 2.0)
        errs[refine] = abs(float(np.mean(s_est[sel] - stray[sel]))) / float(np.mean(kcor[sel]))
    assert errs[0] > GATE, errs
    assert errs[1] <= GATE, errs


def _uv_sequence():
    import tempfile
    from pathlib import Path

    from pipelines import simulation as simmod
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.calibration.l2.options import CalibrationOptions
    from validation.gates import _read_truth, _rho, load_masters
    from pipelines.fitsio import read_image

    with tempfile.TemporaryDirectory() as tmp:
        sim = simmod.simulate(Path(tmp), channels=("SCI-UV",), naxis=256, noise=True, seed=0,
                              sci_roll_deg=list(blind_stray.ROLLS_DEG))
        cals = load_masters(sim.calibration_files)["SCI-UV"]
        opts = CalibrationOptions(subtract_stray_light=False, rotate_north_up=False)
        l1s, hdrs, valids = [], [], []
        for f in sim.frames:
            raw = read_image(f.raw_path)
            l1 = calibrate_frame(raw.data, raw.header, cals, opts)
            l1s.append(np.asarray(l1.data, dtype=np.float64))
            hdrs.append(l1.header)
            valids.append(l1.dq == 0)
        truth, stray, th = _read_truth(sim.frames[0].truth_path)
        rho = _rho(truth.shape[0], th)
    return l1s, hdrs, valids, rho, stray, blind_stray._k_corona_truth("SCI-UV", truth, rho)


@pytest.mark.parametrize("tag", ["wl", "uv"])
def test_roll_removes_coronal_structure_from_the_detector_map(metrics, tag):
    assert metrics[f"asym_{tag}_roll"] < 0.5 * metrics[f"asym_{tag}_noroll"]
    assert metrics[f"asym_{tag}_noroll"] > 0.1  # one frame: the streamers are in the map


def test_fit_recovers_exact_laws_and_refuses_short_profiles():
    from pipelines.simulation import sci_wl_corona

    r = np.linspace(1.1, 2.5, 141)
    p = 7.8e-6 * (r / 1.1) ** -2.8363 + 0.8 * sci_wl_corona(r)
    model, (s0, s1), _ = fit_radial_laws(r, p, 1e-4 * p, lambda x: 0.5 * sci_wl_corona(x))
    assert model.index == pytest.approx(2.8363, abs=1e-5)
    assert model.b_ref == pytest.approx(7.8e-6, rel=1e-5)
    assert s0 == pytest.approx(1.6, rel=1e-4) and s1 == 0.0
    with pytest.raises(ValueError, match="at least 6"):
        fit_radial_laws(r[:5], p[:5], 1e-4 * p[:5], sci_wl_corona)


def test_run_refuses_bad_sizes():
    with pytest.raises(ValueError, match="32-2048"):
        run(16, False, 0)
    with pytest.raises(ValueError, match="empty"):
        run(64, False, 0, rolls_deg=())


def test_simulator_roll_sequence(tmp_path):
    from pipelines.simulation import simulate

    sim = simulate(tmp_path, channels=("SCI-UV",), naxis=64, noise=False, seed=2, sci_roll_deg=[0.0, 90.0, 200.0])
    rolls = [f.crota2 for f in sim.frames]
    assert len(rolls) == 3
    assert rolls[1] - rolls[0] == pytest.approx(90.0, abs=0.1)
    assert rolls[2] - rolls[0] == pytest.approx(200.0, abs=0.1)
    from astropy.io import fits

    with fits.open(sim.frames[1].raw_path) as h:
        assert h[0].header["CROTA2"] == pytest.approx(rolls[1])
    for bad in ([], [float("nan")]):
        with pytest.raises(ValueError, match="sci_roll_deg"):
            simulate(tmp_path, channels=("SCI-UV",), naxis=64, sci_roll_deg=bad)


def test_module_cites_its_methods():
    doc = blind_stray.__doc__
    for ref in ("Morgan & Habbal", "Lamy et al.", "Morrill et al. 2006", "Baumbach 1937", "polaris"):
        assert ref in doc


# --- the measured master in the chain (issue 14 item 3, part 2) ---------------------------------

def test_chain_calibrates_with_the_measured_profile_master(metrics):
    """L2 frames calibrated with the blind master (option stray_light_source='profile') carry the
    estimate's stray residual (plus the frames' noise) and say so in HISTORY."""
    for tag in ("wl", "uv"):
        for name in ("x0.5", "x1.5"):
            assert metrics[f"l2_history_profile_{tag}_{name}"] == 1.0
            for r0 in RADII:
                l2 = metrics[f"l2stray_{tag}_{name}_r{r0:g}"]  # L2(measured master) - L2(simulator's master)
                assert l2 <= GATE, (tag, name, r0, l2)
                assert abs(l2 - metrics[f"stray_{tag}_{name}_r{r0:g}"]) < 0.01, (tag, name, r0)


def test_summary_keys_per_channel_and_radius(metrics):
    for tag in ("wl", "uv"):
        vals = [metrics[f"stray_pct_k_corona_{tag}_r{r0:g}"] for r0 in blind_stray.FINE_RADII]
        assert metrics[f"stray_pct_k_corona_{tag}_max"] == pytest.approx(max(vals))
        assert metrics[f"stray_pct_k_corona_{tag}_r2"] == pytest.approx(
            100 * max(metrics[f"stray_{tag}_x0.5_r2"], metrics[f"stray_{tag}_x1.5_r2"]), rel=1e-6)


def _stray_master(data, params):
    from pipelines.calibration.l2.flow import CalibrationInput

    return CalibrationInput(kind="stray_light", id=1, version=1, sha256="0" * 64, name="lst_sci-uv_stray_test.fits",
                            channel="SCI-UV", data=data, parameters=params)


def test_stray_light_source_option_selects_and_refuses():
    from pipelines.calibration.l2.flow import _stray_representation
    from pipelines.calibration.l2.options import as_options
    from pipelines.calibration.l2.steps import StrayLightModel, StrayLightProfile
    from pipelines.errors import DataError

    law = {"STRAYB0": 4.3e-3, "STRAYR0": 1.1, "STRAYIDX": 2.86}
    prof = {"_profile_r": np.array([1.0, 2.0, 3.0]), "_profile": np.array([3e-3, 1e-3, 5e-4]),
            "straymap": np.ones((8, 8), np.float32)}
    m = _stray_master(prof, {"STRAYTYP": "PROFILE", **law})
    model, why = _stray_representation(m, "auto", np)
    assert isinstance(model, StrayLightProfile) and "STRAYTYP=PROFILE chose the profile" in why
    model, why = _stray_representation(m, "map", np)
    assert model.shape == (8, 8) and why.startswith("measured map")
    model, why = _stray_representation(m, "law", np)
    assert isinstance(model, StrayLightModel) and model.index == 2.86
    bare = _stray_master({}, law)
    assert isinstance(_stray_representation(bare, "auto", np)[0], StrayLightModel)
    with pytest.raises(DataError, match="no PROFILE table"):
        _stray_representation(bare, "profile", np)
    with pytest.raises(DataError, match="no stray-light map"):
        _stray_representation(bare, "map", np)
    with pytest.raises(DataError, match="power-law keywords"):
        _stray_representation(_stray_master(prof, {"STRAYTYP": "PROFILE"}), "law", np)
    with pytest.raises(DataError, match="stray_light_source"):
        as_options({"stray_light_source": "guess"})
    assert as_options({"stray_light_source": "profile"}).identity() == {"stray_light_source": "profile"}
