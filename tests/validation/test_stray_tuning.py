"""``benchmarks/sci_stray_sigma_tune.py``: the stray light's 1-sigma is tuned on seeds >= 1000 only,
and re-scoring a kept product with the constants it was made with gives the chain's own score."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.simulation import lyman_alpha_corona, stray_light_model
from tests.validation.test_calibration_gates import _sci_frames
from tests.validation.test_stray_stated import RADII, _profile

ROOT = Path(__file__).resolve().parents[2]


def _tune():
    spec = importlib.util.spec_from_file_location("sci_stray_sigma_tune", ROOT / "benchmarks" / "sci_stray_sigma_tune.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_test_seeds_are_never_kept_or_tuned_on(tmp_path):
    tune = _tune()
    with pytest.raises(SystemExit, match="test seeds"):
        tune.keep(tmp_path, [9, 1000])
    (tmp_path / "7_SCI-UV.npz").write_bytes(b"")
    with pytest.raises(SystemExit, match="test seed"):
        tune.load(tmp_path)


def test_rescoring_with_the_products_own_constants_is_the_chains_score(tmp_path, monkeypatch):
    """A SCI product kept as the chain keeps it (:func:`validation.blind_chain._keep_stray_scoring`),
    re-scored with today's constants: the re-fitted 1-sigma is the product's, and the pull widths
    are those :func:`validation.blind_chain.score_total_pulls` gives the product itself."""
    from validation import blind_chain as bc
    from validation.blind_stray import fit_stray_model_set

    prof, sig, stray_r = _profile(np.random.default_rng(3))
    law = stray_light_model("SCI-UV").brightness
    ms = fit_stray_model_set(RADII, prof, sig, lyman_alpha_corona, fallback=law)
    assert not ms.refused and ms.inputs is not None
    _, _, hdr, _, rho = _sci_frames(np.random.default_rng(4), [(0.0, 0.0)])  # the geometry
    rc = np.clip(rho, 1.0, 3.0)
    truth = np.where((rho >= 1.1) & (rho <= 2.5), 0.7 * lyman_alpha_corona(rc), np.nan)  # [MSB], as the profile
    inj = np.interp(rc, RADII, stray_r)  # the injected stray light; the product subtracted the estimate
    noise = 0.005 * truth
    data = truth + (inj - ms.stray(rc)) + np.random.default_rng(6).normal(0.0, np.nan_to_num(noise))
    unc = np.hypot(noise, ms.sigma(rc))
    l2 = type("L2", (), {"data": data, "uncertainty": unc, "header": hdr, "dq": np.zeros(truth.shape, np.uint8)})
    out: dict[str, float] = {}
    bc.score_total_pulls(l2, truth, "SCI-UV", out, stray_sigma=ms.sigma)
    monkeypatch.setattr(bc, "STRAY_KEEP_DIR", tmp_path)
    monkeypatch.setattr(bc, "_SCORING_SEED", 1234)
    bc._keep_stray_scoring(l2, truth, "SCI-UV", rho, inj, 0.1 * truth, ms.stray(rc), ms.sigma(rc), ms.inputs)
    tune = _tune()
    rows = tune.load(tmp_path)
    assert [(d["seed"], d["chan"]) for d in rows] == [(1234, "SCI-UV")]
    import validation.blind_stray as bs

    res = tune.rescore(rows, bs.STRAY_SIGMA_SCALE, bs.STRAY_SIGMA_FLOOR, {"SCI-UV": bs.STRAY_CORONA_FRACTION})
    want = bc.pooled_pull_width([out["pull_width_total_SCI-UV"]], [out["pull_median_total_SCI-UV"]],
                                [out["pull_plane_total_SCI-UV"]])
    assert res["tw_SCI-UV"] == pytest.approx(want, rel=1e-3), (res, out)
    # another candidate changes the score: the re-scoring is not a copy of the kept numbers
    assert np.nanmedian(ms.sigma(rc) / noise) > 1.0  # the stray term dominates this product's error
    other = tune.rescore(rows, 4 * bs.STRAY_SIGMA_SCALE, 4 * bs.STRAY_SIGMA_FLOOR, {"SCI-UV": 4 * bs.STRAY_CORONA_FRACTION})
    assert other["tw_SCI-UV"] < 0.5 * res["tw_SCI-UV"], (other, res)
