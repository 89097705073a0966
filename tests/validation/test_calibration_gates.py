"""The calibration validation gates at a small size (the report runs them at full size:
``benchmarks/validate_calibration.py``). Frames simulated from real scenes with known truth,
noise off; see :mod:`validation.gates` for the definitions.

* median relative error < 0.1 % per channel (pixels the 16-bit ADC resolves to 0.02 %),
  signed bias < 0.1 % over all signal pixels;
* SCI stray-light residual < 1 % of the injected stray light in every 0.05 Rsun annulus
  from 1.1 to 2.5 Rsun, with the power-law master and with a map measured from a sequence;
* Sun centre of the north-up L2 image within 0.25 px of the truth's (limb fits);
* KLL flat from a dithered set within 0.5 % RMS of the injected flat.

And (issue 27 item 4) the blind chain's gates beyond seed 0: pulls against the truth as it is
over the total error a user reads from the product (:func:`pipelines.products.total_uncertainty`;
shown to need ``RADUNC`` and the centre term on synthetic frames), the cosmic-ray limits from
the limit seeds >= 1000, and the blind chain on two more seeds (:data:`EXTRA_GATE_SEEDS`; seed 0
with every channel is ``tests/validation/test_blind_chain.py``; seeds 0-9 on every channel are
the benchmark's, ``benchmarks/validate_calibration.py --blind --seeds 0-9``).
"""

from __future__ import annotations

import numpy as np
import pytest

from validation import gates as v
from pipelines.simulation import simulate

N = 192
N_SEQ = 384
#: The blind chain's gates on more seeds in ``make test`` (seed, channel): one channel per seed,
#: the cheapest end to end (SCI-UV: ~20 s at 256 px on a loaded 2-core machine, against ~50-85 s
#: for SDI or WST and ~170 s for all four); today's truth (the simulator's shapes).
EXTRA_GATE_SEEDS = ((1, "SCI-UV"), (2, "SCI-UV"))
BLIND_SIZE = 256  # below ~300 px the coronal structure's azimuthal median is too coarse for a 1 % profile


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


# ---- issue 27 item 4: pulls against the truth as it is, over the total error a user reads


def _product(data, uncert, **keys):
    """An L2-like HDU list (HDU 0, UNCERT, DQ) with ``keys`` in HDU 0's header."""
    from astropy.io import fits

    h = fits.Header()
    h["CDELT1"], h["CDELT2"], h["CUNIT1"], h["CUNIT2"] = 0.6, 0.6, "arcsec", "arcsec"
    for k, val in keys.items():
        h[k] = val
    return fits.HDUList([fits.PrimaryHDU(data.astype(np.float32), header=h),
                         fits.ImageHDU(uncert.astype(np.float32), name="UNCERT"),
                         fits.ImageHDU(np.zeros(data.shape, np.uint8), name="DQ")])


def _disk(n=64, r=20.0, limb_px=2.0, shift=(0.0, 0.0)):
    """A limb-darkened disk [arbitrary unit] with a smooth limb, centred ``shift`` px off the middle."""
    y, x = np.mgrid[:n, :n] - (n - 1) / 2.0
    rho = np.hypot(x - shift[0], y - shift[1]) / r
    mu = np.sqrt(np.clip(1.0 - np.minimum(rho, 1.0) ** 2, 0, 1))
    edge = 0.5 * (1.0 - np.tanh((rho - 1.0) * r / limb_px))
    return 1000.0 * (0.4 + 0.6 * mu) * edge + 5.0


def _normal_quantiles(k):
    """``k`` stratified draws of N(0, 1) (the quantiles at (i + 1/2) / k): an exact-width sample."""
    from scipy.special import ndtri

    return ndtri((np.arange(k) + 0.5) / k)


def _pooled(frames, truth_of, **keys):
    from validation import blind_chain as bc
    from pipelines.products import total_uncertainty

    w, m = [], []
    for i, (data, unc) in enumerate(frames):
        out = {}
        hdul = _product(data, unc, **keys)
        prod = type("L2", (), {"data": hdul[0].data.astype(np.float64), "uncertainty": hdul["UNCERT"].data,
                               "header": hdul[0].header, "dq": hdul["DQ"].data})
        bc.score_total_pulls(prod, truth_of(i), "X", out)
        # the product-reading function a user calls gives the same error
        assert np.allclose(total_uncertainty(hdul), np.sqrt(hdul["UNCERT"].data.astype(np.float64) ** 2
                                                            + (keys.get("RADUNC", 0.0) * hdul[0].data) ** 2),
                           rtol=1e-5) or "CSYER1" in keys
        w.append(out["pull_width_total_X"])
        m.append(out["pull_median_total_X"])
    return bc.pooled_pull_width(w, m), np.array(w), np.array(m)


def test_a_level_off_by_its_radunc_gives_width_one_only_with_radunc():
    """Frames whose level is off by draws of their stated RADUNC: the pulls over the total error
    (UNCERT with RADUNC) have width 1 over the frames; UNCERT alone is far too narrow an error; and
    L2 is scored as it is: a frame 5 RADUNC off fails the frame-pull gate (a level measured
    against the truth and divided out first would hide it)."""
    from validation import blind_chain as bc

    rng = np.random.default_rng(27)
    truth = _disk()
    unc = 0.01 * truth  # 1 % random per pixel, the scale's 5 % dominates the bright pixels
    radunc = 0.05
    frames = [(truth * (1.0 + radunc * a) + rng.normal(0.0, unc), unc) for a in _normal_quantiles(24)]
    width, w, m = _pooled(frames, lambda i: truth, RADUNC=radunc)
    assert abs(width - 1.0) <= bc.GATES["pull_width_dev"], width
    assert np.all(w <= 1.0 + bc.GATES["pull_width_dev"])  # pixel-to-pixel: not understated within a frame
    assert np.std(m) > 0.5  # the frame-wide term moves whole frames: the width is mostly between frames
    without, _, _ = _pooled(frames, lambda i: truth)  # the product without RADUNC: UNCERT alone
    assert without > 2.0, without
    # one frame 5 RADUNC off: its shift breaks the 3-sigma frame gate
    out = {}
    bad = type("L2", (), {"data": truth * (1 + 5 * radunc) + rng.normal(0.0, unc), "uncertainty": unc,
                          "header": _product(truth, unc, RADUNC=radunc)[0].header, "dq": np.zeros(truth.shape, np.uint8)})
    bc.score_total_pulls(bad, truth, "SDI", out)
    assert out["pull_median_total_SDI"] > bc.GATES["frame_pull_max"]
    # the same frame scored after dividing L2 by its truth-measured level (what the gate did before
    # issue 27) would sit at 0: the gate sees the error only because nothing corrects L2 first
    out_c = {}
    lvl = float(np.median(bad.data / truth))
    bc.score_total_pulls(type("L2", (), {"data": bad.data / lvl, "uncertainty": unc / lvl, "header": bad.header,
                                         "dq": bad.dq}), truth, "SDI", out_c)
    assert abs(out_c["pull_median_total_SDI"]) < 1.0
    print(f"pooled width {width:.3f} with RADUNC, {without:.3f} without; 5-RADUNC frame shift "
          f"{out['pull_median_total_SDI']:.2f} (after a truth-measured level: {out_c['pull_median_total_SDI']:.2f})")


def _plane_frames(rng, truth, sg, draws, noise_scale=1.0):
    """Frames of ``truth`` times a flat-plane error exp(-g . r) (g per axis = draw x ``sg`` / nx about
    the frame centre), noise 0.3 % + 0.5 (times ``noise_scale``), and the UNCERT a product states:
    the noise (unscaled) and the stated plane's per-pixel 1-sigma in quadrature."""
    n = truth.shape[0]
    y, x = np.mgrid[:n, :n] - (n - 1) / 2.0
    noise = 0.003 * truth + 0.5
    unc = np.hypot(noise, truth * sg / n * np.hypot(y, x))
    frames = []
    for ay, ax in draws:
        data = truth * np.exp(-(ay * y + ax * x) * sg / n)
        frames.append((data + rng.normal(0.0, noise_scale * noise), unc))
    return frames


def test_a_flat_plane_off_by_its_flatplsg_is_a_frame_wide_mode_not_pixel_scatter():
    """Frames whose flat plane is off by draws of the stated FLATPLSG (in UNCERT per pixel): a
    frame with a large draw has its pixels' pulls spread along the gradient, so their width about
    the median alone exceeds the 1.1 gate although the statement is right; about the fitted plane
    mode it does not, the mode's gradient over FLATPLSG is what was drawn, and the pooled width
    (with the mode's RMS) is 1. A pixel noise understated by 2.5 still fails the frame's width, and
    a plane 5 stated sigma off fails the frame-pull gate."""
    from validation import blind_chain as bc

    rng = np.random.default_rng(11)
    truth = _disk(n=96, r=36.0)
    sg = 0.02
    q = _normal_quantiles(16)
    draws = [(q[i], q[(5 * i + 3) % len(q)]) for i in range(len(q))]
    frames = _plane_frames(rng, truth, sg, draws)
    outs = []
    for data, unc in frames:
        out = {}
        prod = type("L2", (), {"data": data, "uncertainty": unc, "header": _product(truth, unc, FLATPLSG=sg)[0].header,
                               "dq": np.zeros(truth.shape, np.uint8)})
        bc.score_total_pulls(prod, truth, "WST", out)
        outs.append(out)
        assert bc.gate_checks(out | {"level_WST": 1.0, "centre_err_arcsec_WST": 0.0, "centre_claim_arcsec_WST": 1.0,
                                     "dark_err_frac_WST": 0.0, "centre_err_px_WST": 0.0, "flat_rms_WST": 0.0},
                              ("WST",), cosmic=False)[:2] == [("pull width WST", True), ("frame pull WST", True)]
    raw = np.array([o["pull_width_total_raw_WST"] for o in outs])
    amp = np.array([o["pull_plane_amp_WST"] for o in outs])
    assert raw.max() > 1.0 + bc.GATES["pull_width_dev"]  # the largest draws: the plane read as pixel scatter
    assert all(o["pull_width_total_WST"] <= 1.0 + bc.GATES["pull_width_dev"] for o in outs)
    assert np.allclose(amp, [np.sqrt((a * a + b * b) / 2) for a, b in draws], atol=0.1)
    pooled = bc.pooled_pull_width([o["pull_width_total_WST"] for o in outs], [o["pull_median_total_WST"] for o in outs],
                                  [o["pull_plane_total_WST"] for o in outs])
    assert abs(pooled - 1.0) <= bc.GATES["pull_width_dev"], pooled
    # the fit takes out the plane and nothing else: a frame whose pixel noise is understated (x 2.5)
    # has the width about the fitted plane that the same noise gives with no plane error at all
    # (the stated plane's 1-sigma in UNCERT dilutes any pixel-level understatement alike)
    widths = []
    for draw in ((1.5, -1.5), (0.0, 0.0)):
        (data, unc), = _plane_frames(np.random.default_rng(5), truth, sg, [draw], noise_scale=2.5)
        out = {}
        bc.score_total_pulls(type("L2", (), {"data": data, "uncertainty": unc,
                                             "header": _product(truth, unc, FLATPLSG=sg)[0].header,
                                             "dq": np.zeros(truth.shape, np.uint8)}), truth, "WST", out)
        widths.append((out["pull_width_total_WST"], out["pull_width_total_raw_WST"]))
    assert widths[0][0] > 1.0 + bc.GATES["pull_width_dev"]
    assert abs(widths[0][0] / widths[1][1] - 1.0) < 0.03, widths
    # a plane 5 stated sigma off on both axes: the frame gate
    (data, unc), = _plane_frames(rng, truth, sg, [(5.0, 5.0)])
    out = {}
    hdr = _product(truth, unc, FLATPLSG=sg)[0].header
    bc.score_total_pulls(type("L2", (), {"data": data, "uncertainty": unc, "header": hdr,
                                         "dq": np.zeros(truth.shape, np.uint8)}), truth, "WST", out)
    assert out["pull_plane_amp_WST"] > bc.GATES["frame_pull_max"]
    print(f"plane frames: width about the median alone up to {raw.max():.2f}, about the plane up to "
          f"{max(o['pull_width_total_WST'] for o in outs):.2f}; pooled {pooled:.3f}")


def _sci_frames(rng, draws, n=96, rsun_px=18.0, noise_scale=1.0):
    """SCI-like frames (1.1-2.5 Rsun of a corona falling as r^-3) whose subtracted stray light is off
    by one smooth radial draw each, ``ssig(r) (a cos phi + b sin phi)``, ``phi = pi x / 2``,
    ``x = (r - 1.8) / 0.7``: with ``a, b`` ~ N(0, 1) the error at every radius is a draw of exactly
    the stated ``ssig(r)``, whose shape (level and slope) the scoring does not assume. Noise 0.5 %
    of the corona (times ``noise_scale``; UNCERT states the unscaled noise and ssig in quadrature).
    Returns the frames, the truth, the header, ``ssig`` as a function of r, and the radii."""
    from astropy.io import fits

    y, x = np.mgrid[:n, :n] - (n - 1) / 2.0
    rho = np.hypot(x, y) / rsun_px
    truth = np.where((rho >= 1.1) & (rho <= 2.5), 100.0 * rho ** -3, np.nan)
    ssig = lambda r: 4.0 * (np.asarray(r) / 1.1) ** -1.5  # noqa: E731 - the stated stray 1-sigma [data unit]
    noise = 0.005 * 100.0 * rho ** -3
    unc = np.hypot(noise, ssig(rho))
    phi = np.pi * np.clip((rho - 1.8) / 0.7, -1, 1) / 2
    h = fits.Header()
    for k, v in {"CTYPE1": "HPLN-TAN", "CTYPE2": "HPLT-TAN", "CUNIT1": "arcsec", "CUNIT2": "arcsec",
                 "CDELT1": 60.0, "CDELT2": 60.0, "CRPIX1": (n + 1) / 2.0, "CRPIX2": (n + 1) / 2.0,
                 "CRVAL1": 0.0, "CRVAL2": 0.0, "RSUN_OBS": 60.0 * rsun_px, "DSUN_OBS": 1.496e11}.items():
        h[k] = v
    frames = [(truth + ssig(rho) * (a * np.cos(phi) + b * np.sin(phi)) + rng.normal(0, noise_scale * noise), unc)
              for a, b in draws]
    return frames, truth, h, ssig, rho


def test_a_stray_light_off_by_its_stated_sigma_is_a_radial_mode_not_pixel_scatter():
    """SCI frames whose stray light is off by draws of its stated 1-sigma (in UNCERT per pixel, one
    smooth radial error per frame): about the median alone a large draw exceeds the 1.1 pixel-width
    gate although the statement is right; about the fitted radial mode it does not, and the pooled
    width (with the mode's share) is 1. The mode is fitted whatever its size, so the fitted field's
    RMS is gated with the shift: a stray 1-sigma stated 3 times too small fails it on many frames
    (and the pooled width is 3). The fit takes out the stray light's mode and nothing else: a pixel
    noise understated by 2.5 widens the width about the mode as it widens a frame with no stray
    error (the stated stray 1-sigma dilutes it: 0.13, not above the 1.1 gate)."""
    from validation import blind_chain as bc

    rng = np.random.default_rng(13)
    q = _normal_quantiles(16)
    frames, truth, hdr, ssig, rho = _sci_frames(rng, [(q[i], q[(5 * i + 3) % len(q)]) for i in range(len(q))])
    # the radius the scoring computes from the header is the frames' own
    from pipelines.sun import radius_map, sun_geometry

    assert np.allclose(radius_map(truth.shape, sun_geometry(hdr)), rho, atol=1e-6)
    outs = []
    for data, unc in frames:
        out = {}
        prod = type("L2", (), {"data": data, "uncertainty": unc, "header": hdr, "dq": np.zeros(truth.shape, np.uint8)})
        bc.score_total_pulls(prod, truth, "SCI-UV", out, stray_sigma=ssig)
        outs.append(out)
    raw = np.array([o["pull_width_total_raw_SCI-UV"] for o in outs])
    assert raw.max() > 1.0 + bc.GATES["pull_width_dev"], raw  # the largest draws read as pixel scatter
    assert all(o["pull_width_total_SCI-UV"] <= 1.0 + bc.GATES["pull_width_dev"] for o in outs)
    # the mode's shape is the stated 1-sigma's times a smooth function of radius: about it only the
    # noise (0.05-0.1 here) and the little of the draw the three terms miss are left (a mode of the
    # level alone leaves up to 0.84; one that ignores the 1-sigma's radial profile is caught below,
    # where the noise is understated: here the stray term dominates the total, so u is nearly 1)
    assert max(o["pull_width_total_SCI-UV"] for o in outs) < 0.2
    assert all(np.isnan(o["pull_plane_amp_SCI-UV"]) for o in outs)  # no flat plane stated, none scored
    pooled = bc.pooled_pull_width([o["pull_width_total_SCI-UV"] for o in outs],
                                  [o["pull_median_total_SCI-UV"] for o in outs],
                                  [o["pull_plane_total_SCI-UV"] for o in outs])
    assert abs(pooled - 1.0) <= bc.GATES["pull_width_dev"], pooled
    gates = [bc.gate_checks(o | {"level_SCI-UV": 1.0, "centre_err_arcsec_SCI-UV": 0.0, "centre_claim_arcsec_SCI-UV": 1.0,
                                 "centre_err_px_SCI-UV": 0.0,
                                 "dark_err_frac_SCI-UV": 0.0, **{f"stray_pct_SCI-UV_r{r:g}": 0.0 for r in bc.RADII},
                                 "stray_level_sigma_SCI-UV": 0.0, "k_share_SCI-UV": 1.0},
                             ("SCI-UV",), cosmic=False)[:2] for o in outs]
    assert all(g == [("pull width SCI-UV", True), ("frame pull SCI-UV", True)] for g in gates), gates
    # errors 3 x the stated 1-sigma: the width about the mode still passes every frame; the shift
    # and the fitted field's RMS (both within 3 total sigma) fail a quarter of the frames (a pass
    # rate far below the campaign's 90 %), and the pooled width is 3. Errors 5 x the stated 1-sigma
    # in the slope alone move no frame's shift: the field's RMS still fails frames.
    def scored(draws):
        res = []
        for data, unc in _sci_frames(np.random.default_rng(13), draws)[0]:
            out = {}
            bc.score_total_pulls(type("L2", (), {"data": data, "uncertainty": unc, "header": hdr,
                                                 "dq": np.zeros(truth.shape, np.uint8)}), truth, "SCI-UV", out,
                                 stray_sigma=ssig)
            res.append(out)
        fails = lambda k: sum(abs(o[k]) > bc.GATES["frame_pull_max"] for o in res)  # noqa: E731
        return res, fails("pull_field_total_SCI-UV"), fails("pull_median_total_SCI-UV")

    outs3, field_fail, median_fail = scored([(3 * q[i], 3 * q[(5 * i + 3) % len(q)]) for i in range(len(q))])
    assert all(o["pull_width_total_SCI-UV"] <= 1.0 + bc.GATES["pull_width_dev"] for o in outs3)
    assert field_fail >= median_fail >= 3, (field_fail, median_fail)
    under_pooled = bc.pooled_pull_width(*([o[k] for o in outs3] for k in ("pull_width_total_SCI-UV",
                                                                          "pull_median_total_SCI-UV",
                                                                          "pull_plane_total_SCI-UV")))
    assert under_pooled > 2.5, under_pooled
    _, slope_fail, slope_median_fail = scored([(0.0, 5 * q[i]) for i in range(len(q))])
    assert slope_fail >= 3 and slope_median_fail <= 1, (slope_fail, slope_median_fail)
    # a stray 1-sigma stated twice too large: the pooled width falls to about half (the mode does not hide it)
    half = []
    for data, unc in frames:
        out = {}
        unc2 = np.hypot(0.005 * 100.0 * rho ** -3, 2 * ssig(rho))
        bc.score_total_pulls(type("L2", (), {"data": data, "uncertainty": unc2, "header": hdr,
                                             "dq": np.zeros(truth.shape, np.uint8)}), truth, "SCI-UV", out,
                             stray_sigma=lambda r: 2 * ssig(r))
        half.append(out)
    over = bc.pooled_pull_width(*([o[k] for o in half] for k in ("pull_width_total_SCI-UV", "pull_median_total_SCI-UV",
                                                                "pull_plane_total_SCI-UV")))
    assert over < 0.75, over
    # the fit takes out the stray light's mode and nothing else: a frame whose pixel noise is
    # understated (x 2.5) has about the mode nearly the width that the same noise gives with no
    # stray error at all (0.13 against 0.11: the mode's three terms leave a little of the draw; the
    # stated stray 1-sigma in UNCERT dilutes a pixel-level understatement alike), well above the
    # width with the noise as stated (0.08)
    widths = []
    for draw, scale in (((1.5, -1.5), 2.5), ((0.0, 0.0), 2.5), ((1.5, -1.5), 1.0)):
        (data, unc), = _sci_frames(np.random.default_rng(5), [draw], noise_scale=scale)[0]
        out = {}
        bc.score_total_pulls(type("L2", (), {"data": data, "uncertainty": unc, "header": hdr,
                                             "dq": np.zeros(truth.shape, np.uint8)}), truth, "SCI-UV", out,
                             stray_sigma=ssig)
        widths.append((out["pull_width_total_SCI-UV"], out["pull_width_total_raw_SCI-UV"]))
    assert abs(widths[0][0] / widths[1][1] - 1.0) < 0.3, widths
    assert widths[0][0] > 1.4 * widths[2][0], widths
    print(f"SCI frames: width about the median alone up to {raw.max():.2f}, about the radial mode up to "
          f"{max(o['pull_width_total_SCI-UV'] for o in outs):.2f}; pooled {pooled:.3f}, "
          f"with the stray 1-sigma doubled {over:.3f}; errors 3 x the stated 1-sigma: pooled {under_pooled:.2f}, "
          f"field gate failed on {field_fail} of 16 frames (shift alone {median_fail}); 5 x in the slope alone "
          f"{slope_fail} (shift {slope_median_fail})")


def test_a_centre_off_by_its_csyer_gives_width_one_only_with_the_centre_term():
    """Frames of a disk whose centre is off by draws of its stated CSYER (0.3 px per axis): the
    centre term (CSYER through the image gradient) makes the pooled pull width 1; without it the
    limb's pulls are far too wide."""
    from validation import blind_chain as bc

    rng = np.random.default_rng(7)
    truth = _disk()
    sig_px = 0.3
    q = _normal_quantiles(24)
    frames = []
    for i, a in enumerate(q):
        data = _disk(shift=(sig_px * a, sig_px * q[(7 * i + 3) % len(q)]))
        unc = 0.002 * truth + 0.5
        frames.append((data + rng.normal(0.0, unc), unc))
    csyer = sig_px * 0.6  # arcsec: 0.3 px at CDELT 0.6 arcsec
    with_c, _, _ = _pooled(frames, lambda i: truth, CSYER1=csyer, CSYER2=csyer)
    without, _, _ = _pooled(frames, lambda i: truth)
    print(f"pooled width {with_c:.3f} with the centre term, {without:.3f} without")
    assert abs(with_c - 1.0) <= 0.2, with_c
    assert without > 1.5, without


def test_cosmic_ray_limits_are_the_ones_the_limit_seeds_give():
    """The cosmic-ray limits come from seeds >= 1000 (the committed measurements), not from the test seeds."""
    import json
    from pathlib import Path

    from validation import blind_chain as bc

    data = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "reports"
                       / "cosmic_ray_limits_tuning.json").read_text())
    assert sorted(r["seed"] for r in data["rows"]) == list(bc.LIMIT_SEEDS)
    assert min(bc.LIMIT_SEEDS) >= 1000
    lim = bc.derive_cosmic_ray_limits(data["rows"])
    assert lim == {k: bc.GATES[k] for k in ("cr_found_frac", "cr_residual_frac")}
    # the rule rounds outward: a weaker seed would loosen the limits
    worse = [dict(data["rows"][0], **{"cr_found_frac_saa_SDI": 0.74, "cr_residual_frac_saa_SDI": 0.31})]
    assert bc.derive_cosmic_ray_limits(worse) == {"cr_found_frac": 0.7, "cr_residual_frac": 0.35}
    assert bc.reported_seeds(range(10)) == [s for s in range(10) if s not in bc.TUNING_SEEDS]


@pytest.fixture(scope="module", params=EXTRA_GATE_SEEDS, ids=lambda p: f"seed{p[0]}-{p[1]}")
def blind_seed(request):
    from validation import blind_chain as bc

    seed, chan = request.param
    return seed, chan, bc._run(BLIND_SIZE, True, seed, channels=(chan,))


def test_the_blind_chain_passes_its_gates_on_more_seeds(blind_seed):
    """Every gate of :func:`validation.blind_chain.gate_checks` on seeds 1 and 2 (one channel each)."""
    from validation import blind_chain as bc

    seed, chan, m = blind_seed
    checks = bc.gate_checks(m, (chan,))
    print(f"seed {seed} {chan}: pull width {m[f'pull_width_total_{chan}']:.3f}, frame pull "
          f"{m[f'pull_median_total_{chan}']:+.2f}, {len(checks)} gates")
    assert len(checks) >= 10 and any(n.startswith("pull width") for n, _ in checks)
    assert [n for n, ok in checks if not ok] == []


def test_total_uncertainty_reads_a_written_product(tmp_path):
    """A user's call on a product file: the same error as on the open HDU list, its terms, and a
    clear error for planes of different shapes."""
    from pipelines.products import total_uncertainty, total_uncertainty_from

    truth = _disk()
    unc = 0.01 * truth
    hdul = _product(truth, unc, RADUNC=0.05, CRDER1=0.06, CRDER2=0.06, CSYER1=0.6, CSYER2=0.6)
    hdul.writeto(tmp_path / "p.fits")
    tot, parts = total_uncertainty(tmp_path / "p.fits", parts=True)
    assert np.allclose(tot, total_uncertainty(hdul), rtol=1e-6)
    assert set(parts) == {"uncert", "RADUNC", "centre"}
    assert np.allclose(tot ** 2, parts["uncert"] ** 2 + parts["RADUNC"] ** 2 + parts["centre"] ** 2, rtol=1e-6)
    # the centre term lives on the limb (the gradient), the scale term on the bright disk
    y, x = np.mgrid[:64, :64] - 31.5
    rho = np.hypot(x, y)
    assert parts["centre"][np.abs(rho - 20) < 1].mean() > 10 * parts["centre"][rho < 10].mean()
    with pytest.raises(ValueError, match="one shape"):
        total_uncertainty_from(truth, unc[:10], hdul[0].header)


def test_seed_summary_prints_the_issue_27_result_fields():
    """The RESULT fields in the issue's order, each from its per-seed metric keys, nan where absent;
    the total pull width pools the frames' widths and shifts."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "validate_calibration", Path(__file__).resolve().parents[2] / "benchmarks" / "validate_calibration.py")
    vc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vc)

    def row(seed, **m):
        return {"seed": seed, "seconds": 1.0, "metrics": m, "checks": [("pull width SDI", True), ("flat SDI", seed != 2)],
                "error": None, "families": {}}

    base = {"pull_width_total_SDI": 0.6, "pull_median_total_SDI": 0.8, "flat_rms_SDI": 0.004, "flat_pull_SDI": 1.1}
    rows = [row(s, **base) for s in range(4)]
    res = vc._seed_summary({"rows": rows})
    r = res["result"]
    assert tuple(r) == vc.RESULT_FIELDS == ("seeds", "gates", "worst_gate_pass_rate", "stray_pct_max",
                                            "stray_pull_width", "stray_refused_frac", "flat_rms_real_pct",
                                            "flat_plane_stated", "flat_rms_real_resid_pct", "flat_plane_pull_width",
                                            "flat_pull_width", "total_pull_width_worst")
    assert r["seeds"] == 4 and r["gates"] == 2 and r["worst_gate_pass_rate"] == "0.75"
    assert r["total_pull_width_worst"] == "1.000"  # sqrt(0.6^2 + 0.8^2)
    assert r["flat_pull_width"] == "1.100" and r["flat_rms_real_pct"] == "0.400"  # fallback: 100 x flat_rms
    assert r["stray_pull_width"] == r["stray_refused_frac"] == r["flat_plane_pull_width"] == "nan"
    assert r["flat_plane_stated"] == 0 and r["stray_pct_max"] == "nan"
    # the other helpers' keys, when a chain reports them
    more = dict(base, **{"stray_pull_SCI-UV": 1.2, "stray_pull_SCI-WL": 0.8, "stray_refused_SCI-UV": 1.0,
                         "stray_refused_SCI-WL": 0.0, "flat_plane_stated_SDI": 1.0, "flat_plane_pull_SDI": 0.9,
                         "flat_rms_real_pct_SDI": 3.0, "flat_rms_real_resid_pct_SDI": 0.3})
    r = vc._seed_summary({"rows": [row(s, **more) for s in range(4)]})["result"]
    assert r["stray_pull_width"] == f"{np.sqrt((1.2 ** 2 + 0.8 ** 2) / 2):.3f}" and r["stray_refused_frac"] == "0.50"
    assert r["flat_plane_stated"] == 1 and r["flat_plane_pull_width"] == "0.900"
    assert r["flat_rms_real_pct"] == "3.000" and r["flat_rms_real_resid_pct"] == "0.300"


def _load_validate_calibration():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "validate_calibration", Path(__file__).resolve().parents[2] / "benchmarks" / "validate_calibration.py")
    vc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vc)
    return vc


def test_seed_sampling_intervals_match_a_monte_carlo_and_the_wilson_definition():
    """How far the seeds alone move a width, checked against what it claims from outside: the
    chance a right claim lands within 1 +- 0.1 against a Monte Carlo of Gaussian shifts; the
    bootstrap interval narrows as 1/sqrt(n) and holds the estimate; the pass-rate interval is
    the set of p with |p_hat - p| <= sqrt(p (1 - p) / n) (Wilson's definition, solved on a grid)."""
    vc = _load_validate_calibration()
    rng = np.random.default_rng(11)

    def rows(n, fail_every=0):
        out = []
        for s in range(n):
            m = {"pull_width_total_SDI": 0.0, "pull_median_total_SDI": float(rng.normal()),
                 "flat_pull_SDI": abs(float(rng.normal()))}
            out.append({"seed": s, "metrics": m, "checks": [("g", not (fail_every and s % fail_every == 0))]})
        return out

    r10 = vc.seed_sampling_intervals(rows(10, fail_every=3), channels=("SDI",))
    mc = np.sqrt(np.mean(rng.normal(size=(40000, 10)) ** 2, axis=1))
    assert r10["p_within"] == pytest.approx(np.mean(np.abs(mc - 1.0) <= 0.1), abs=0.01)
    assert 0.25 < r10["p_within"] < 0.45  # 10 seeds rarely tell a right claim from a 10 % wrong one
    lo10, hi10 = r10["boot"]["SDI"]["total"]
    big = rows(400)
    r400 = vc.seed_sampling_intervals(big, channels=("SDI",))
    lo400, hi400 = r400["boot"]["SDI"]["total"]
    est = np.sqrt(np.mean([x["metrics"]["pull_median_total_SDI"] ** 2 for x in big]))
    assert lo400 < est < hi400 and 0.5 < (hi10 - lo10) / (hi400 - lo400) / np.sqrt(40) < 2.0
    # a 68 % interval: half-width near the RMS's own scatter, est / sqrt(2 n), for the pooled and the flat
    assert (hi400 - lo400) / 2 == pytest.approx(est / np.sqrt(800), rel=0.2)
    flo, fhi = r400["boot"]["SDI"]["flat"]
    fest = np.sqrt(np.mean([x["metrics"]["flat_pull_SDI"] ** 2 for x in big]))
    assert flo < fest < fhi and (fhi - flo) / 2 == pytest.approx(fest / np.sqrt(800), rel=0.2)
    assert r400["p_within"] > 0.95
    # the channel's own split: all shift -> the shift-only chance; all within-frame, width 1 -> certain
    assert r10["p_within_C"]["SDI"] == pytest.approx(r10["p_within"], rel=1e-9)
    flat_rows = [{"seed": s, "metrics": {"pull_width_total_SDI": 1.0, "pull_median_total_SDI": 0.0}, "checks": []}
                 for s in range(10)]
    assert vc.seed_sampling_intervals(flat_rows, channels=("SDI",))["p_within_C"]["SDI"] == 1.0
    # 4 of 10 seeds fail (0, 3, 6, 9): p_hat = 0.6
    lo, hi = r10["rate"]["g"]
    grid = np.linspace(0, 1, 200001)
    inside = grid[np.abs(0.6 - grid) <= np.sqrt(grid * (1 - grid) / 10)]
    assert lo == pytest.approx(inside.min(), abs=1e-4) and hi == pytest.approx(inside.max(), abs=1e-4)
    with pytest.raises(ValueError, match="resamples"):
        vc.seed_sampling_intervals(rows(3), resamples=10)


def test_more_seeds_are_pooled_into_one_result_each_seed_once(tmp_path):
    """``calibration_mismatch_on_seeds*.json`` beside the mismatch-on run: the report's "more seeds"
    section scores all their seeds together, a seed present twice counted once."""
    import json
    import shutil
    from pathlib import Path

    vc = _load_validate_calibration()
    src = Path(__file__).resolve().parents[2] / "benchmarks" / "reports" / "calibration_mismatch_on.json"
    shutil.copy(src, tmp_path / src.name)
    run = json.loads(src.read_text())
    n = len(run["rows"])
    assert vc._more_seeds_section(tmp_path, [run]) == []  # nothing more: no section
    moved = dict(run, rows=[dict(r, seed=r["seed"] + 500) for r in run["rows"]])
    (tmp_path / "calibration_mismatch_on_seeds500.json").write_text(json.dumps(moved))
    (tmp_path / "calibration_mismatch_on_seeds_again.json").write_text(json.dumps(run))  # the same seeds again
    text = vc.write_mismatch_report(tmp_path).read_text()
    assert "## Mismatch on, more seeds" in text and f"All {2 * n} seeds: `RESULT seeds={2 * n} " in text
    both = vc._seed_summary({"rows": run["rows"] + moved["rows"]})["result"]
    assert f"RESULT {' '.join(f'{k}={v}' for k, v in both.items())}`" in text


def test_sci_centre_holds_with_an_offset_occulter_and_a_tilted_diffuser():
    """Issue 27: the truth from model families the chain does not assume (``--mismatch on``), seed 4
    of SCI-UV: the occulter 22 arcsec off the Sun and a diffuser whose tilt, read by a pairwise roll
    fit as an offset, put the centre 0.285 px off (the report of 2026-12-06 02:19). The roll-averaged
    fit with the flat's tilt free (:mod:`pipelines.calibration.masters.occulter`) must hold every
    gate, the centre's 0.1 px included. The same fit measures the diffuser's tilt (94 % of its
    2 % here), which the chain takes out of the flat: the flat the science frame used must be
    far better than the diffuser flat (1.1 % RMS error)."""
    from validation import blind_chain as bc
    from validation.families import draw_families

    fam = draw_families(4, True, size=BLIND_SIZE)
    assert fam.params["occulter_offset_px_SCI-UV"] is not None
    m = bc._run(BLIND_SIZE, True, 4, channels=("SCI-UV",), families=fam)
    print(f"SCI-UV seed 4, mismatch on: centre {m['centre_err_px_SCI-UV']:.4f} px, "
          f"claim {m['centre_claim_arcsec_SCI-UV']:.2f} arcsec; flat RMS {m['flat_rms_diffuser_SCI-UV']:.4f} "
          f"-> {m['flat_rms_SCI-UV']:.4f}")
    assert m["centre_err_px_SCI-UV"] <= 0.05
    assert m["flat_rms_diffuser_SCI-UV"] > 0.008 and m["flat_rms_SCI-UV"] < 0.25 * m["flat_rms_diffuser_SCI-UV"]
    assert abs(m["flat_level_SCI-UV"] - 1.0) < 1e-3  # the correction keeps the flat's normalisation
    assert [n for n, ok in bc.gate_checks(m, ("SCI-UV",)) if not ok] == []
