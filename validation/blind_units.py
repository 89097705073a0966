"""Blind check of the per-pixel uncertainty: do the L2 residuals have the width the ``UNCERT`` plane says?

:func:`run` simulates one frame per channel (:func:`pipelines.simulation.simulate`) and,
like the instrument in flight, the **calibration exposures** of each detector: bias frames
(zero exposure), dark frames (20 s, LST.md's longest exposure) and flat-field frames
(uniform illumination, as SCI's transmissive diffuser gives; LST.md). The simulator's
hidden detector (bias, dark-rate and flat planes, gain, read noise) makes those frames and
nothing else.

The chain side (:func:`estimate_detector_masters`) sees only the frames and derives, per
pixel, the bias, the dark rate and the flat with their standard errors (``BIASERR``,
``DARKERR``, ``FLATERR`` planes), and the gain and read noise by photon transfer (the
variance of the difference of two equal exposures, Janesick 2007, *Photon Transfer*,
SPIE Press: ``var(F1 - F2) / 2 = S / g + sigma_read**2``). It writes them as calibration
masters and :func:`pipelines.calibration.l2.flow.calibrate_frame` calibrates the raw frame with
them. The truth is read only to score:

* ``pull_width_<channel>``: robust width ``1.4826 * MAD`` of ``(L2 - truth) / sigma`` over
  the good pixels (DQ 0, finite) (Rousseeuw & Croux 1993, JASA 88, 1273: the MAD's
  consistency factor 1.4826 for a Gaussian). 1 when the uncertainty model is right;
* ``pull_median_<channel>``: their median (a bias in units of sigma);
* ``median_l2_error_pct_<channel>``: median of ``|L2 - truth| / truth`` [%] over the good
  pixels whose truth is above 1 % of the channel's 99th-percentile truth (the dark sky just
  off the SDI/WST limb is left out of a *relative* error);
* ``gain_<channel>``, ``gain_true_<channel>``, ``read_noise_<channel>``,
  ``read_noise_true_<channel>``: the photon-transfer estimates and the hidden values.

What is *not* estimated here (other parts of issue 14): the radiometric coefficient
(``RADCOEF``, the cross-calibration of item 5), the SCI stray-light law (item 3) and the Sun
centre (item 4) are the simulator's; they are the same law and header the chain would be
given otherwise. The flat is made from diffuser-like uniform frames for every channel, not
by KLL from dithers (item 2); its error plane is what matters here.

The gate (``tests/validation/test_blind_units.py``): ``|pull_width - 1| <= 0.05`` for every channel,
noise on.

Measured (seed 5, noise on; SDI / WST / SCI-UV / SCI-WL): pull width 1.007 / 1.005 / 1.007 /
1.009 at 256 px (11 s); 0.998 / 0.992 / 1.001 / 0.998 at 1024 px (69 s); 1.000 / 0.991 /
1.000 / 0.999 at 2048 px (205 s, 4.4 GB); at 128 px 1.01-1.04 (the error of the double
resampling truth -> detector -> L2 at the limb and occulter, which sigma does not hold).
Median L2 error 0.37 / 0.26 / 11.0 / 11.0 % at 1024 px (the SCI value is the per-pixel photon
noise of the faint corona); noise off at 256 px 0.024 / 0.012 / 0.055 / 0.060 %. Gain and
read noise by photon transfer within 0.2 % of the hidden 1.6 e/DN and 2.5 DN at 1024 px.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
from astropy.io import fits

from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
from pipelines.fitsio import read_image

__all__ = ["run", "estimate_detector_masters", "write_detector_masters", "N_CAL_FRAMES", "DARK_EXPTIME_S",
           "FLAT_LEVEL_DN"]

#: Frames of each calibration kind (bias, dark, flat) per detector.
N_CAL_FRAMES = 16

#: Dark-frame exposure [s]: LST.md's longest exposure (20 s).
DARK_EXPTIME_S = 20.0

#: Mean signal of the flat-field frames [DN] (a third of the 16-bit range: linear, far from
#: saturation with the flat's stripes and gradient).
FLAT_LEVEL_DN = 20000.0

#: Flat-field exposure [s] (any: the level is set by the illumination).
FLAT_EXPTIME_S = 1.0


# --------------------------------------------------------------------------- instrument side (simulation)


def _hidden_detector(cal_dir: Path, channel: str) -> dict[str, np.ndarray]:
    """The simulator's own detector planes (truth): used only to *make* calibration frames."""
    code = channel.lower()
    dark = next(cal_dir.glob(f"lst_{code}_dark_*.fits"))
    flat = next(cal_dir.glob(f"lst_{code}_flat_*.fits"))
    with fits.open(dark) as h:
        bias = np.asarray(h[0].data, dtype=np.float64)
        rate = np.asarray(h["DARKRATE"].data, dtype=np.float64)
    with fits.open(flat) as h:
        fl = np.asarray(h[0].data, dtype=np.float64)
    return {"bias": bias, "dark_rate": rate, "flat": fl}


def _exposures(rng: np.random.Generator, det: dict[str, np.ndarray], *, t: float, level_dn: float, n: int,
               gain: float, read_noise: float, noise: bool) -> np.ndarray:
    """``n`` raw uint16 frames of exposure ``t`` under uniform illumination ``level_dn`` (0: dark).

    The forward model of :func:`pipelines.simulation.forward._forward_model`: Poisson on the
    photo- and dark electrons, Gaussian read noise, rounding, clipping to 16 bits.
    """
    expected = det["dark_rate"] * t + det["flat"] * level_dn
    out = np.empty((n,) + expected.shape, dtype=np.uint16)
    for k in range(n):
        if noise:
            counts = rng.poisson(expected * gain) / gain + rng.standard_normal(expected.shape) * read_noise
        else:
            counts = expected
        out[k] = np.clip(np.rint(det["bias"] + counts), 0, 65535)
    return out


# --------------------------------------------------------------------------- chain side (blind)


def _robust_var(a: np.ndarray, clip: float = 5.0) -> float:
    """Variance of the values within ``clip`` robust standard deviations of the median.

    The robust standard deviation (``1.4826 MAD``) only sets the clipping limit, which
    removes hot pixels and cosmic-ray hits; the variance itself is the sample variance of
    what is kept (a MAD of integer-valued differences is quantised, the variance is not).
    A 5-sigma clip of a Gaussian keeps all but 6e-7 of it (bias < 1e-5 of the variance).
    """
    a = np.asarray(a, dtype=np.float64).ravel()
    med = np.median(a)
    lim = clip * max(1.4826 * np.median(np.abs(a - med)), 0.5)
    return float(np.var(a[np.abs(a - med) <= lim], ddof=1))


def estimate_detector_masters(bias_frames: np.ndarray, dark_frames: np.ndarray, dark_exptime_s: float,
                              flat_frames: np.ndarray, flat_exptime_s: float) -> dict[str, object]:
    """Bias, dark rate, flat (each with its standard error), gain and read noise, from frames alone.

    Parameters
    ----------
    bias_frames : numpy.ndarray, shape (N, ny, nx) [DN]
        Zero-exposure frames, N >= 2.
    dark_frames : numpy.ndarray, shape (N, ny, nx) [DN]
        Closed-shutter frames of ``dark_exptime_s`` [s].
    flat_frames : numpy.ndarray, shape (N, ny, nx) [DN]
        Uniformly illuminated frames of ``flat_exptime_s`` [s], N even and >= 2.

    Returns
    -------
    dict
        ``bias``, ``biaserr`` [DN]; ``dark_rate``, ``darkerr`` [DN/s]; ``flat``, ``flaterr``
        (mean 1); float32 planes (ny, nx); ``gain`` [e/DN]; ``read_noise`` [DN] (without the
        ADC's 1/12 DN**2, which the uncertainty adds itself).

    Raises
    ------
    ValueError
        If fewer than two frames of a kind are given or the shapes differ.

    Notes
    -----
    Per pixel: the mean of the frames and its standard error ``s / sqrt(N)`` (sample
    standard deviation ``s``). Each flat frame is divided by its own mean before averaging
    (level normalisation: a lamp or diffuser drifts between frames). Photon transfer
    (Janesick 2007, *Photon Transfer*): ``sigma_total**2 = var(B1 - B2) / 2`` over bias pairs (read
    noise and ADC); ``g = S / (var(F1 - F2) / 2 - sigma_total**2)`` over flat pairs, ``S``
    the pair's mean signal above bias and dark [DN]. Differences remove the fixed pattern
    (bias columns, flat stripes); the robust variance removes hot pixels.
    """
    b = np.asarray(bias_frames, dtype=np.float64)
    d = np.asarray(dark_frames, dtype=np.float64)
    f = np.asarray(flat_frames, dtype=np.float64)
    if min(len(b), len(d), len(f)) < 2 or not (b.shape[1:] == d.shape[1:] == f.shape[1:]):
        raise ValueError("at least two bias, dark and flat frames of one shape are needed")
    nb, nd, nf = len(b), len(d), len(f)
    bias = b.mean(axis=0)
    biaserr = b.std(axis=0, ddof=1) / math.sqrt(nb)
    rate = (d.mean(axis=0) - bias) / dark_exptime_s
    darkerr = np.sqrt(d.var(axis=0, ddof=1) / nd + biaserr ** 2) / dark_exptime_s
    sig = f - bias - rate * flat_exptime_s
    levels = sig.reshape(nf, -1).mean(axis=1)
    norm = sig / levels[:, None, None]
    flat = norm.mean(axis=0)
    flaterr = norm.std(axis=0, ddof=1) / math.sqrt(nf)
    # photon transfer
    var_total = float(np.mean([_robust_var(b[i] - b[i + 1]) / 2.0 for i in range(0, nb - 1, 2)]))
    gains = []
    for i in range(0, nf - 1, 2):
        s = 0.5 * (levels[i] + levels[i + 1])
        excess = _robust_var(f[i] - f[i + 1]) / 2.0 - var_total
        gains.append(s / excess if excess > 0 else math.inf)
    gain = float(np.median(gains))
    if not math.isfinite(gain):  # no shot noise measurable (a noise-free simulation)
        gain = 1e6
    read_noise = math.sqrt(max(var_total - 1.0 / 12.0, 0.0))
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # noqa: E731
    return {"bias": f32(bias), "biaserr": f32(biaserr), "dark_rate": f32(rate), "darkerr": f32(darkerr),
            "flat": f32(flat), "flaterr": f32(flaterr), "gain": gain, "read_noise": read_noise}


def write_detector_masters(est: dict[str, object], channel: str, out_dir: Path, *, valid_from: str,
                           valid_to: str) -> dict[str, Path]:
    """Write the estimated ``dark`` (BIAS, DARKRATE, BIASERR, DARKERR; GAIN, RDNOISE) and ``flat`` (FLAT, FLATERR) masters."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n = est["bias"].shape[0]

    def header(kind: str, desc: str) -> fits.Header:
        h = fits.Header()
        h["TELESCOP"], h["INSTRUME"] = "ASO-S", "LST"
        h["CALKIND"] = (kind, "calibration kind")
        h["CHANNEL"] = (channel, "LST channel")
        h["FRMNAXIS"] = (n, "[pix] frame size it applies to")
        h["CALVER"] = (1, "calibration version")
        h["VALIDFRM"] = (valid_from, "[UTC] valid from")
        h["VALIDTO"] = (valid_to, "[UTC] valid to")
        h["CALDESC"] = desc
        return h

    h = header("dark", f"{channel} dark estimated from {N_CAL_FRAMES} bias and {N_CAL_FRAMES} dark frames")
    h["EXTNAME"] = "BIAS"
    h["BUNIT"] = "DN"
    h["GAIN"] = (float(est["gain"]), "[electron/DN] photon-transfer gain")
    h["RDNOISE"] = (float(est["read_noise"]), "[DN] read noise (bias pairs)")
    dark = fits.HDUList([fits.PrimaryHDU(est["bias"], h),
                         fits.ImageHDU(est["dark_rate"], name="DARKRATE"),
                         fits.ImageHDU(est["biaserr"], name="BIASERR"),
                         fits.ImageHDU(est["darkerr"], name="DARKERR")])
    h = header("flat", f"{channel} flat estimated from {N_CAL_FRAMES} uniform frames")
    h["EXTNAME"] = "FLAT"
    flat = fits.HDUList([fits.PrimaryHDU(est["flat"], h), fits.ImageHDU(est["flaterr"], name="FLATERR")])
    paths = {"dark": out_dir / f"lst_{channel.lower()}_dark_est.fits",
             "flat": out_dir / f"lst_{channel.lower()}_flat_est.fits"}
    dark.writeto(paths["dark"], overwrite=True, checksum=True)
    flat.writeto(paths["flat"], overwrite=True, checksum=True)
    return paths


# --------------------------------------------------------------------------- the check


def _score(l2, truth: np.ndarray) -> tuple[float, float, float]:
    good = (l2.dq == 0) & np.isfinite(l2.data) & np.isfinite(l2.uncertainty) & (l2.uncertainty > 0)
    resid = l2.data.astype(np.float64) - truth
    pull = resid[good] / l2.uncertainty[good]
    med = float(np.median(pull))
    width = float(1.4826 * np.median(np.abs(pull - med)))
    t = truth[good]
    bright = t > 0.01 * np.percentile(t, 99)
    err = float(np.median(np.abs(resid[good][bright]) / t[bright]) * 100.0)
    return width, med, err


def run(size: int, noise: bool, seed: int) -> dict[str, float]:
    """Blind uncertainty check of every channel at ``size`` px (see the module docstring).

    Parameters
    ----------
    size : int
        Frame side [pixel] (32 to the detector; SCI capped at 2048).
    noise : bool
        Poisson and read noise in the raw and calibration frames (the gate needs True;
        without noise the pull width measures only interpolation error over ADC noise).
    seed : int
        Seeds the simulation and the calibration frames.

    Returns
    -------
    dict of str to float
        Per channel ``pull_width_<C>``, ``pull_median_<C>``, ``median_l2_error_pct_<C>``,
        ``gain_<C>``, ``gain_true_<C>``, ``read_noise_<C>``, ``read_noise_true_<C>``; and
        ``pull_width_max_dev`` (the largest ``|pull_width - 1|``).
    """
    return _run(size, noise, seed)


def _run(size: int, noise: bool, seed: int, *, gain_factor: float = 1.0) -> dict[str, float]:
    """:func:`run`, with the chain's estimated gain multiplied by ``gain_factor`` (tests: a
    wrong noise model must move the pull width)."""
    from pipelines.simulation import INSTRUMENT, simulate

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lstdp-blind-units-") as tmp:
        tmp_path = Path(tmp)
        sim = simulate(tmp_path / "sim", naxis=int(size), noise=noise, seed=seed, sdi_sequence=False)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 14, 6]))
        for frame in sim.frames:
            chan = frame.channel
            model = INSTRUMENT[chan]
            det = _hidden_detector(sim.out_dir / "calibration", chan)
            kw = {"n": N_CAL_FRAMES, "gain": model.gain_e_per_dn, "read_noise": model.read_noise_dn, "noise": noise}
            bias_f = _exposures(rng, det, t=0.0, level_dn=0.0, **kw)
            dark_f = _exposures(rng, det, t=DARK_EXPTIME_S, level_dn=0.0, **kw)
            flat_f = _exposures(rng, det, t=FLAT_EXPTIME_S, level_dn=FLAT_LEVEL_DN, **kw)
            del det
            est = estimate_detector_masters(bias_f, dark_f, DARK_EXPTIME_S, flat_f, FLAT_EXPTIME_S)
            est["gain"] = float(est["gain"]) * gain_factor
            cals = {}
            for info in sim.calibration_files:  # what the chain is given besides its own masters
                if info.channel == chan and info.kind in ("radiometric", "stray_light", "mask_geometry"):
                    cals[info.kind] = load_calibration_master(info.path)
            ref = next(i for i in sim.calibration_files if i.channel == chan)
            paths = write_detector_masters(est, chan, tmp_path / "blind", valid_from=ref.valid_from,
                                           valid_to=ref.valid_to)
            for kind, p in paths.items():
                cals[kind] = load_calibration_master(p)
            raw = read_image(frame.raw_path)
            header = raw.header.copy()
            for key in ("GAIN", "RDNOISE"):  # the chain uses its own photon-transfer values
                header.remove(key, ignore_missing=True)
            l2 = calibrate_frame(raw.data, header, cals)
            with fits.open(frame.truth_path) as h:
                truth = np.asarray(h[0].data, dtype=np.float64)
            width, med, err = _score(l2, truth)
            out[f"pull_width_{chan}"] = width
            out[f"pull_median_{chan}"] = med
            out[f"median_l2_error_pct_{chan}"] = err
            out[f"gain_{chan}"] = float(est["gain"])
            out[f"gain_true_{chan}"] = float(model.gain_e_per_dn)
            out[f"read_noise_{chan}"] = float(est["read_noise"])
            out[f"read_noise_true_{chan}"] = float(model.read_noise_dn)
    out["pull_width_max_dev"] = max(abs(v - 1.0) for k, v in out.items() if k.startswith("pull_width_"))
    return out


if __name__ == "__main__":  # pragma: no cover - manual runs: python -m validation.blind_units 512
    import json
    import sys
    import time

    t0 = time.perf_counter()
    res = run(int(sys.argv[1]) if len(sys.argv) > 1 else 256, True, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    res["seconds"] = time.perf_counter() - t0
    print(json.dumps(res, indent=2))
