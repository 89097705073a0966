"""The validation's model families (issue 27 item 1) depart from the shapes the chain assumes.

Each family drawn by :func:`validation.families.draw_families` with ``mismatch=True`` must
differ from the estimator's own shape by what was drawn (the bent stray light through both
anchors yet off the power law between them; a coronal truth whose ratio to the simulator's
law is not constant; a dark law that is no doubling law; ...), and ``mismatch=False`` must
leave today's truth bit for bit. One small simulation (64 px, SDI and SCI-UV, noise off)
is shared by the tests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from astropy.io import fits

from validation import families as fm
from validation.blind_chain import DARK_TEMPS_C, SCIENCE_TEMP_C

SIZE = 64
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    """Noise-off SDI + SCI-UV at 64 px, seed 0: without variants, with the zero variant, with seed 0's families."""
    from pipelines.simulation import simulate
    from pipelines.simulation.variants import ChannelVariant

    fam = fm.draw_families(0, True, size=SIZE)
    out = {}
    for tag, variants in (("none", None), ("zero", {"SDI": ChannelVariant(), "SCI-UV": ChannelVariant()}),
                          ("off", fm.draw_families(0, False, size=SIZE).variants or None),
                          ("on", fam.variants)):
        out[tag] = simulate(tmp_path_factory.mktemp(tag), channels=("SDI", "SCI-UV"), naxis=SIZE, noise=False,
                            seed=0, sdi_sequence=False, variants=variants)
    out["families"] = fam
    return out


def _data(path, ext=0):
    with fits.open(path) as h:
        return np.asarray(h[ext].data, dtype=np.float64)


@pytest.mark.parametrize("seed", range(4))
def test_stray_families_pass_both_anchors_and_depart_between(seed):
    fam = fm.draw_families(seed, True)
    for chan in ("SCI-UV", "SCI-WL"):
        stray = fam.variants[chan].stray
        r1, b1, r2, b2 = fm.STRAY_ANCHORS[chan]
        assert stray.brightness(np.array([r1, r2])) == pytest.approx([b1, b2], rel=1e-9)
        r = np.linspace(r1, r2, 281)
        k = math.log(b1 / b2) / math.log(r2 / r1)
        rel = stray.brightness(r) / (b1 * (r / r1) ** -k) - 1.0
        if fam.params[f"stray_family_{chan}"] == "bent":
            bend = fam.params[f"stray_bend_{chan}"]
            assert 0.005 <= abs(bend) <= 0.02
            assert rel[np.argmax(np.abs(rel))] == pytest.approx(bend, rel=1e-3)  # the drawn bend, at its middle
        else:  # a sum of two power laws: its local index runs from one component's towards the other's
            assert np.max(np.abs(rel)) > 0.02
            idx = -np.gradient(np.log(stray.brightness(r)), np.log(r))
            assert idx[0] - idx[-1] > 0.1
    # both shapes over two consecutive seeds, per channel
    fams = {fm.draw_families(s, True).params[f"stray_family_SCI-UV"] for s in (seed, seed + 1)}
    assert fams == {"bent", "two-component"}


def test_coronal_truth_is_not_a_scaled_copy(sims):
    """SCI-UV truth = Ly-alpha law x COR1 structure x f(r): its ratio to today's truth is f(r), not a constant."""
    on, off = (next(f for f in sims[t].frames if f.channel == "SCI-UV") for t in ("on", "none"))
    t_on, t_off = _data(on.truth_path), _data(off.truth_path)
    n = t_on.shape[0]
    h = fits.getheader(off.truth_path)
    rsun = float(h["RSUN_OBS"]) / float(h["CDELT1"])
    yy, xx = np.mgrid[0:n, 0:n] - (n - 1) / 2.0
    rho = np.hypot(yy, xx) / rsun
    ratios = [np.median(t_on[(rho > a) & (rho < a + 0.1)] / t_off[(rho > a) & (rho < a + 0.1)]) for a in (1.2, 2.3)]
    cor = sims["families"].variants["SCI-UV"].corona_factor
    assert ratios == pytest.approx([cor(1.25), cor(2.35)], rel=0.05)
    assert abs(ratios[0] / ratios[1] - 1.0) > 0.1


def test_zero_variant_and_mismatch_off_leave_todays_truth(sims):
    for tag in ("zero", "off"):
        for a, b in zip(sims["none"].frames, sims[tag].frames):
            assert np.array_equal(_data(a.raw_path), _data(b.raw_path))
            assert np.array_equal(_data(a.truth_path), _data(b.truth_path))
    fam = fm.draw_families(3, False)
    assert (fam.variants, fam.diffuser, fam.flat_inputs, fam.dither_gradient, fam.dark_law, fam.degradation,
            fam.lasp_scale_error) == ({}, {}, {}, {}, None, None, None)


def test_occulter_offset_and_roll_error_reach_the_raw_frame(sims):
    fam = sims["families"]
    on, off = (next(f for f in sims[t].frames if f.channel == "SCI-UV") for t in ("on", "none"))
    h_on, h_off = fits.getheader(on.raw_path), fits.getheader(off.raw_path)
    err = fam.params["roll_error_deg_SCI-UV"]
    assert float(h_on["CROTA2"]) - float(h_off["CROTA2"]) == pytest.approx(err, abs=1e-6)
    assert on.crota2 == pytest.approx(off.crota2)  # the true roll is unchanged
    arcsec_per_px = 2.4 * 2048 / SIZE
    lo, hi = fm.OCCULTER_OFFSET_ARCSEC
    assert lo / arcsec_per_px <= fam.params["occulter_offset_px_SCI-UV"] <= hi / arcsec_per_px
    # the occulter's edge moved: the raw frames differ beyond the stray light's and corona's change
    assert not np.array_equal(_data(on.raw_path), _data(off.raw_path))


def test_dither_scene_is_real_and_asymmetric(sims):
    sdi = next(f for f in sims["none"].frames if f.channel == "SDI")
    scene = fm.RealDitherScene(sdi.truth_path, 0.03, 0.0)
    y, x = np.mgrid[-1:1:101j, -1:1:101j]
    on_disk = np.hypot(y, x) < 0.95
    v = scene(y, x)
    east, west = v[on_disk & (x < -0.1)].mean(), v[on_disk & (x > 0.1)].mean()
    assert abs(west / east - 1.0) > 0.01  # the gradient plus the real scene's own asymmetry
    # plages: a real scene is not a smooth disk (the symmetric disk's texture is 3 % RMS in ln I)
    assert np.std(np.log(v[np.hypot(y, x) < 0.5])) > 0.05


@pytest.mark.parametrize("seed", SEEDS)
def test_dark_law_is_no_doubling_law(seed):
    law = fm.draw_families(seed, True).dark_law
    assert law(SCIENCE_TEMP_C) == pytest.approx(1.0)
    t = np.array(DARK_TEMPS_C)
    y = np.log2([law(x) for x in t])
    resid = y - np.polyval(np.polyfit(t, y, 1), t)  # a doubling law is a straight line in log2
    assert np.max(np.abs(resid)) > 0.01


@pytest.mark.parametrize("seed", SEEDS)
def test_degradation_diffuser_and_flat_inputs_depart(seed):
    fam = fm.draw_families(seed, True)
    g = fam.degradation
    y = np.linspace(0.0, 1.0, 201)
    s = np.array([g(v, 0.0, 1.0) for v in y])
    assert s[0] == 1.0 and 1.0 - s[-1] >= 0.009  # a step or an early loss of >= 1 %
    if g.kind == "step":
        assert np.max(-np.diff(s)) == pytest.approx(g.depth)
    else:  # most of the loss within the first third of the span
        assert 1.0 - s[67] > 0.6 * (1.0 - s[-1])
    for chan in ("SCI-UV", "SCI-WL"):
        d = fam.diffuser[chan](64)
        assert np.ptp(d) > fam.diffuser[chan].amplitude * 0.9
    fi = fam.flat_inputs["WST"]
    ims = fi.contaminate([np.full((64, 64), 1000.0)] * 2, np.full((64, 64), 10.0), exptime_s=1.0, detector_px=4608,
                         gain=2.0, quiet_rate_cm2_s=1.2)
    assert np.min(ims[0]) >= 1000.0 + fi.bias_dn + 10.0 * fi.dark_residual - 1e-9
    assert np.max(ims[0]) > 1000.0 + 0.2 * fi.hot_dn


def test_lasp_scale_error_is_gaussian_at_its_sigma():
    d = np.array([fm.draw_families(s, True).lasp_scale_error for s in range(200)])
    assert np.std(d) == pytest.approx(fm.LASP_SIGMA, rel=0.2)
    assert np.mean(np.abs(d) > fm.LASP_SIGMA) > 0.2  # a +-1 sigma uniform draw never leaves the band


def test_one_family_at_a_time_keeps_only_that_one():
    fam = fm.draw_families(0, True)
    for comp in fm.COMPONENTS:
        one = fam.only(comp)
        departs = {"stray": any(v.stray is not None for v in one.variants.values()),
                   "corona": any(v.corona_factor is not None for v in one.variants.values()),
                   "occulter": any(v.occulter_offset_px != (0.0, 0.0) for v in one.variants.values()),
                   "roll": any(v.roll_error_deg != 0.0 for v in one.variants.values()),
                   "dither_scene": bool(one.dither_gradient), "diffuser": bool(one.diffuser),
                   "dark": one.dark_law is not None, "flat_inputs": bool(one.flat_inputs),
                   "degradation": one.degradation is not None, "lasp": one.lasp_scale_error is not None}
        assert {k for k, v in departs.items() if v} == {comp}
    with pytest.raises(ValueError, match="unknown component"):
        fam.only("psf")
