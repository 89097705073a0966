"""The blind chain end to end, per channel (issue 14 item 1): raw frames and calibration exposures in, L2 out, scored.

What the **instrument side** (the simulator; it alone reads the hidden detector) gives the chain:

* the raw science frames of :func:`pipelines.simulation.simulate`, with the Sun centre in
  the header wrong by :data:`POINTING_ERROR_PX` (``pointing_error_px``), taken at the detector
  temperature :data:`SCIENCE_TEMP_C` (``DET_TEMP`` in the header), with cosmic-ray hits at a
  low-Earth-orbit rate (:func:`cosmic_ray_rate`, higher in South Atlantic Anomaly passes
  flagged by time, :func:`in_saa`; header keyword ``SAAFLAG``);
* bias frames (zero exposure) and dark frames of :data:`DARK_EXPTIME_S` at the detector
  temperatures :data:`DARK_TEMPS_C` (``DET_TEMP``), from the hidden bias and dark-rate planes,
  the dark rate doubling every :data:`HIDDEN_DOUBLING_C` (a hidden law: the chain fits its own);
* flats: SDI and WST a dithered full-disk set through the *same* hidden flat
  (:func:`pipelines.simulation.dithers.simulate_dithered_flat_set`, sub-pixel pointing, 0.5 %
  level jitter); SCI diffuser-like uniform frames (as :mod:`validation.blind_units`);
* SCI: the roll sequence :data:`ROLLS_DEG` of raw frames (``simulate(sci_roll_deg=...)``).

The **chain side** derives every master from those frames and nothing else:

* dark model (:func:`estimate_dark_model`): bias plane, dark-rate plane at a reference
  temperature and the doubling temperature fitted from the darks (``DARKTREF``, ``DARKTDBL``),
  read noise (bias pairs) and gain (photon transfer on dark pairs); the flow scales the dark
  to the science frame's ``DET_TEMP`` (:func:`pipelines.calibration.l2.steps.subtract_dark`);
* flat: SDI/WST :func:`pipelines.calibration.masters.flatfield.derive_flat_master` (``method="subpixel"``)
  with its statistical error (:func:`kll_flat_error`); SCI
  :func:`validation.blind_units.estimate_detector_masters` (flat and ``FLATERR``), then the
  gain tilt the roll sequence measures (``OCCGRAD1/2``, the occulter offset's fit) taken out
  of it (:func:`_flat_without_roll_tilt`, ``FLATTLT1/2``; ``FLATDFSG`` restated for the
  diffuser's radial part left);
* SCI stray light: :func:`validation.blind_stray.estimate_stray_light` on the roll
  sequence calibrated with the chain's dark and flat, the coronal prior wrong by x0.5 (only its
  shape is used), written by :func:`validation.blind_stray.blind_stray_master`; with the model
  set of issue 27 item 3 (:func:`validation.blind_stray.fit_stray_model_set`): the master carries
  the law's stated 1-sigma (``PROFILE`` ``SIGMA``, added to SCI ``UNCERT``), the fit's
  ``STRYCHI2`` and residual profile, and a refusal (``STRYREFU``: the default law, LST.md's
  on-orbit power law, is used and the product flagged, ``QUALITY`` bit 4 / ``STRYFAIL``);
* centre: the limb / occulter fit of :func:`pipelines.calibration.l2.centre.fit_and_apply_centre`
  inside :func:`pipelines.calibration.l2.flow.calibrate_frame`;
* cosmic rays: L.A.Cosmic (:func:`pipelines.calibration.l2.steps.clean_cosmic_rays`,
  ``remove_cosmic_rays=True``).

* SDI radiometry (default, ``sdi_radiometry="campaign"``): the law ``C(t) = C0 exp(lambda (t - t0))``
  fitted against the LASP composite by :func:`validation.blind_chain.cross_calibrate_campaign`
  on a radiometric campaign of the *same* hidden instrument (:func:`_sdi_campaign_radiometry`),
  calibrated with the chain's own dark and KLL flat; the science frame's DATE-OBS is checked
  to lie within the fitted master's validity.

Only the mask geometry and, for WST and SCI (and SDI with ``sdi_radiometry="given"``), the
radiometric coefficient (``RADCOEF``) are the simulator's. The truth scores; see :func:`run`
for the metrics and :func:`gate_failures` for the gates (``tests/validation/test_blind_chain.py``).

SDI with the campaign's law (256 px, noise on; seeds 0 / 1): ``level_SDI`` 0.9709 / 1.0045,
i.e. ``1 / (1 + delta)`` of the campaign's hidden LASP scale error (+3.03 / -0.35 %);
``level_scale_error_removed_SDI`` 1.0002 / 1.0010 against ``level_given_radcoef_SDI`` 0.9973 /
0.9977 (the KLL flat's constant ``flat_level_SDI`` 1.0026 / 1.0023, which the law fitted
through the same flat cancels); the campaign adds ~8 s (SDI alone 25 s, 17 s with the given
``RADCOEF``). The level gate for SDI is then the radiometric one (:func:`level_tolerance`).

Measured (seed 0, noise on; SDI / WST / SCI-UV / SCI-WL): at 256 px (60-90 s) every gate passes
(:func:`gate_failures`; ``benchmarks/reports/calibration_blind.md``). With SDI's campaign law
(the default): SDI level 0.9709 against 2 % + its ``RADUNC`` of 5.00 % (1.0002 with the series'
hidden +3.03 % scale error taken out), SDI pull width against the truth as it is 2.373 (the
3 % level in it; over UNCERT, RADUNC and the centre's CRDER/CSYER, the gated total error since
issue 27 item 4: pixel-to-pixel width 0.212 / 0.952 / 0.993 / 0.972 and frame shift -0.57 / -0.35 /
+0.11 / +0.08, all four channels, measured 2026-12-05). The figures that follow are with the given
``RADCOEF``, scored before item 4. Pull width against the random error (then gated, against a
truth-measured level and centre) 0.966 / 0.982 / 1.014 /
0.991; against the truth as it is 1.306 / 1.125 / 1.016 / 0.996: the SDI/WST pulls are widened
there by the chain's own centre error (0.097 / 0.069 px = 0.87 / 0.62 arcsec, within the
products' CRDER/CSYER claims of 1.75 / 1.40 arcsec) on the structured disk and by the KLL flat's
constant (``flat_level_C`` 1.0026 / 1.0024), both frame-wide errors gated on their own. L2 level
0.9973 / 0.9975 / 1.018 / 1.011 (gates 1 % / 1 % / 6.0 % / 5.1 %: SCI's is 1 % plus the issue's
stray allowance of 5 % of the K corona times its share, ``k_share_C`` 1.00 / 0.82); the SCI
level error is the stray-light estimate's (``level_stray_corrected_C`` 1.0002 / 0.9997 with its
error put back; the SCI flat level is exact, ``flat_level_C`` 1.000). Stray light (``refine=1``)
0.75 / 2.5 / 3.7 / 0.41 % (UV) and
0.46 / 1.7 / 3.0 / 2.6 % (WL) of the K corona at 1.1 / 1.5 / 2.0 / 2.5 Rsun (gate 5 %); centre error
0.097 / 0.069 / 0.012 / 0.012 px, flat RMS 0.28 / 0.31 / 0.14 / 0.14 %, dark-current error
<= 0.06 % (48 % without the temperature law). At 1024 px (14 min, 0.55 GB; before these gates
and before ``refine=1``, corrected pull width only) pull width 0.991 / 0.959 / 1.004 / 1.012, centre
0.31 (SDI: the scene's limb offset) / 0.0005 / 0.015 / 0.008 px, flat RMS 0.34 / 0.30 / 0.14 /
0.14 %, SCI stray light 1.0-6.1 % of the K corona at 1.1-2.5 Rsun.

Memory and time at full size (``--blind --size 4608``, SCI 2048): calibration frames are made
and accumulated one at a time (running sums, float64 planes: ~0.2 GB each at 4608 px); the
largest items are the SDI/WST dithered flat set (9 float64 frames, 1.5 GB; its simulation
holds complex FFT grids of (2 x 5444)**2 and super-sampled scene planes, ~2 GB each at
once, so ~10-14 GB for a moment), the dark-pair photon transfer (4 float64 pairs, 1.4 GB) and
the sub-pixel flat solve; SDI's radiometric campaign (since 2026-12-03: 13 frames simulated
and calibrated twice, one at a time; not yet run at full size). Expected peak 12-16 GB (estimated from the array sizes, not
measured). Expected run time: 256 px 70-110 s per noise setting on 2 busy cores; full size
of the order of an hour per noise setting, dominated by the dither simulation and sub-pixel
KLL solves (blind_flat: 216 s at 2048 px, so ~15-20 min at 4608 per disk channel) and
L.A.Cosmic (~25 s per 4608 px frame, four calibrations per disk channel). Not run at full
size here.
"""

from __future__ import annotations

import datetime as dt
import math
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable, Iterator

import numpy as np
from astropy.io import fits
from scipy import ndimage

__all__ = ["run", "gate_failures", "gate_checks", "estimate_dark_model", "derive_chain_masters", "cross_calibrate_campaign",
           "gate_tolerance", "GATE_BASE", "kll_flat_error",
           "inject_cosmic_rays", "cosmic_ray_rate",
           "in_saa", "saa_passes", "CHANNELS", "frame_pull_stats", "pooled_pull_width", "TUNING_SEEDS",
           "reported_seeds", "score_total_pulls", "LIMIT_SEEDS", "derive_cosmic_ray_limits", "DARK_TEMPS_C", "SCIENCE_TEMP_C", "HIDDEN_DOUBLING_C",
           "CR_RATE_QUIET_CM2_S", "SAA_RATE_FACTOR", "GATES", "level_tolerance"]

CHANNELS = ("SDI", "WST", "SCI-UV", "SCI-WL")

#: Header pointing error [pixel] (issue 14: "up to 2 px"; :data:`validation.blind_centre.POINTING_ERROR_PX`).
POINTING_ERROR_PX = 2.0

#: Detector temperatures of the dark campaign [deg C]. LST.md gives no detector temperature
#: (only "dark current subtraction per exposure time and temperature"); a cooled space CMOS
#: runs at about -30 to -10 C. The science frames are taken at :data:`SCIENCE_TEMP_C`, which is
#: none of them: the chain must scale its dark by the law it fitted.
DARK_TEMPS_C = (-30.0, -24.0, -18.0, -12.0)
#: Detector temperature of the science frames [deg C] (``DET_TEMP``).
SCIENCE_TEMP_C = -15.0
#: Hidden doubling temperature of the dark current [deg C] (simulator only; 5-9 C for CMOS
#: sensors: Janesick 2001, *Scientific Charge-Coupled Devices*, ch. 5; Widenhorn et al. 2002,
#: Proc. SPIE 4669, 193).
HIDDEN_DOUBLING_C = 6.3
#: Bias frames and dark frames per temperature.
N_BIAS = 16
N_DARK_PER_TEMP = 8
#: Dark exposure [s] (LST.md's longest exposure, as :data:`validation.blind_units.DARK_EXPTIME_S`).
DARK_EXPTIME_S = 20.0
#: SCI roll sequence [deg] (:data:`validation.blind_stray.ROLLS_DEG`).
ROLLS_DEG = tuple(float(a) for a in range(0, 360, 45))
#: Scale error of the coronal prior given to the stray-light estimate (only its shape is used).
STRAY_PRIOR_FACTOR = 0.5
#: Radii [Rsun] of the stray-light score (issue 14).
RADII = (1.1, 1.5, 2.0, 2.5)

# ---- cosmic rays in low Earth orbit
#: Cosmic-ray event rate outside the SAA [events cm-2 s-1]: the WF/PC-1 IDT measured
#: 1.7 events s-1 per 800 x 800 CCD of 15 um pixels (1.44 cm2) in HST's orbit (HST Data
#: Handbook, WF/PC-1, "Cosmic rays"), i.e. 1.2 cm-2 s-1; galactic cosmic rays at ASO-S's
#: 720 km sun-synchronous orbit (LST.md) are of the same order outside the SAA and polar caps.
CR_RATE_QUIET_CM2_S = 1.2
#: Rate factor inside an SAA pass. HST sees 10-100 times the quiet rate in the SAA's outer
#: parts and up to ~1100 particles cm-2 s-1 at its core (Miles et al. 2021, ApJ 918, 86,
#: STIS/CCD across the SAA); 50 is a mid-pass value.
SAA_RATE_FACTOR = 50.0
#: Detector pixel pitch [um]: not in LST.md; 10 um is assumed (4608 px = 4.6 cm; SCI 2048 px = 2.0 cm).
PIXEL_PITCH_UM = 10.0
#: Sensitive (epitaxial) depth [um] of the CMOS, assumed; tracks are this deep.
SENSITIVE_DEPTH_UM = 10.0
#: Charge per um of a minimum-ionising particle in silicon [electron/um]: ~290 eV/um most
#: probable loss at 3.6 eV per pair (PDG, "Passage of particles through matter"), ~80 e/um.
ELECTRONS_PER_UM = 80.0
#: ASO-S orbital period [s]: Kepler's law for a = 6378 + 720 km (LST.md: ~720 km).
ORBIT_PERIOD_S = 2 * math.pi * math.sqrt((6378.137e3 + 720e3) ** 3 / 3.986004418e14)
#: SAA passes per day and duration [s]: a sun-synchronous orbit at 720 km crosses the SAA on
#: about 5 consecutive of its ~14.5 daily orbits, for up to ~15 min each (schematic: real
#: passes come from the spacecraft's housekeeping flag or an AE8/AP8 contour, not from here).
SAA_ORBITS_PER_DAY = 5
SAA_PASS_S = 12 * 60.0
_SAA_FIRST_ORBIT = 4
_SAA_PHASE = 0.3

#: A hit pixel counts as detectable when its deposit exceeds this many sigma of the pixel's
#: noise (Poisson + read noise of the frame without hits): L.A.Cosmic's limit is 4.5 on the
#: noise-normalised Laplacian, whose subsampled kernel and median-filtered noise estimate
#: (``noise='local'``, :func:`pipelines.calibration.l2.cosmics.remove_cosmic_rays`) put the
#: single-pixel limit at several times the pixel noise; fainter hits sit in the noise.
CR_DETECTABLE_SIGMA = 10.0

#: The gates of ``tests/validation/test_blind_chain.py`` (issue 14 points 2, 4, 6 and item 1's dark and cosmic rays).
#: Each error source is gated against its own claim:
#:
#: * ``pull_width_dev`` and ``frame_pull_max``: pulls ``(L2 - truth) / sigma_total`` against the
#:   truth *as it is*, ``sigma_total`` the total error a user reads from the product
#:   (:func:`pipelines.products.total_uncertainty`: ``UNCERT`` with the frame-wide ``RADUNC`` and
#:   the centre's ``CRDERia``/``CSYERia`` through the image gradient). Nothing measured against
#:   the truth (level, centre) corrects L2 before it is scored (issue 27 item 4; until then the
#:   truth was moved by the chain's centre error and L2 divided by its truth-measured level).
#:   A frame-wide error is one draw per frame: it shifts the pulls of all pixels of a frame
#:   together, so one frame's pixels cannot test it. Two widths, then (:func:`frame_pull_stats`,
#:   :func:`pooled_pull_width`): per frame, the robust width of its pixels' pulls about their
#:   median (``pull_width_total_C``: the pixel-to-pixel error, which the frame-wide terms do not
#:   widen) and the median itself (``pull_median_total_C``: the frame's shift); over seeds,
#:   ``sqrt(mean(width**2) + mean(median**2))``, the pull width of a pixel of a product taken at
#:   random, which is what a user's error bar claims. Per seed the gates are: the pixel-to-pixel
#:   width within ``1 + pull_width_dev`` (the stated error does not understate the scatter; it may
#:   be below 1 where a frame-wide term dominates the total) and the frame's shift within
#:   ``frame_pull_max`` = 3 total sigma (a claim broken; 99.7 % pass for a right Gaussian claim).
#:   Over the seeds the pooled width is gated within ``1 +- pull_width_dev`` (0.1: issue 27)
#:   in the benchmark (``benchmarks/validate_calibration.py --seeds``, ``total_pull_width_worst``).
#:   The flat's stated plane (``FLATPLSG``, SDI and WST) is frame-wide too but not a shift: one
#:   gain gradient per frame, whose 1-sigma ``UNCERT`` holds per pixel; a frame whose gradient is
#:   a large draw has its pixels' pulls spread along it (WST seed 1: the plane 1.44 stated sigma
#:   on both axes, the pixel width 1.27 with it and 0.69 about it, 2026-12-06). Where the product
#:   states ``FLATPLSG`` the width is taken about the fitted plane mode (:func:`frame_pull_stats`),
#:   the mode's gradient over ``FLATPLSG`` (``pull_plane_amp_C``) is gated within
#:   ``frame_pull_max`` with the shift, and its share of the pixels' mean square in pull units
#:   (``pull_plane_total_C``, signed: :func:`frame_pull_stats`) enters the pooled width as the
#:   shift does, so the pooled width still holds all of the plane.
#:   SCI's ``UNCERT`` holds the stated stray-light 1-sigma (issue 27 item 3), so it is part of
#:   the total error. The stray light is one axisymmetric law per frame, so its error is frame-wide
#:   too, one smooth radial draw per frame: a frame whose draw is large has its pixels' pulls
#:   spread along radius (seeds 1000-1079 with the calibrated 1-sigma: 14 of 159 SCI frames above
#:   the 1.1 pixel width, up to 1.58; none about the mode, at most 0.78). Where the product states
#:   it, its radial mode (level, slope and curvature in radius, in units of the stated 1-sigma) is
#:   fitted as the plane is, its share enters the pooled width the same way
#:   (``pull_plane_total_C`` holds whichever mode was fitted), and the fitted field's RMS
#:   (``pull_field_total_C``) is gated within ``frame_pull_max`` with the shift.
#: * ``centre_err_px``: the centre within 0.1 px with a 2 px header error (issue 14 point 4),
#:   every channel (SDI only just at 256 px, :func:`gate_failures`); it must also lie within its own claim,
#:   ``hypot(CSYER1, CSYER2) + 3 hypot(CRDER1, CRDER2)`` (``centre_claim_arcsec_C``).
#: * ``level_dev_disk``: |level - 1| of WST (and SDI with the given ``RADCOEF``). The chain's
#:   KLL flat is known up to a constant (``flat_level_C``, measured 0.24-0.26 % at 256 px) and
#:   WST's radiometric coefficient is given, so the level error should be that constant; 1 %
#:   leaves four times it (a choice, no LST.md requirement). SDI calibrated with its
#:   campaign's law (the default): 2 % + 3 x the product's ``RADUNC`` against the truth as it
#:   is (:func:`level_tolerance`; the level carries the LASP composite's scale error, which the
#:   validation draws Gaussian at its stated sigma: issue 27 item 1). The level with the
#:   series' hidden scale error taken out (``level_scale_error_removed_SDI``) is reported
#:   only (it uses the truth).
#: * ``level_dev_sci``: SCI's level may be off by 1 % plus what the issue's stray-light
#:   allowance (``stray_pct``: 5 % of the K corona) makes of the scored brightness,
#:   ``0.05 x k_share_C`` (the K corona's median share of it): a 1 % gate alone would ask the
#:   stray-light estimate for more than the issue does (the SCI diffuser flat is exact in level,
#:   ``flat_level_C`` 1.000, and the level with the stray error put back is within 0.03 %,
#:   ``level_stray_corrected_C``).
#: * ``stray_pct``: stray-light error [% of the K corona] at each of :data:`RADII` (issue 14:
#:   5 % of the K corona), *or* (issue 27 item 3, "solved or stated") within ``stray_pull_max``
#:   times the product's own stated stray-light 1-sigma (``|stray_pull_C_rR| <= 3``): two points
#:   of the law (LST.md) do not fix it in between, so under a bent law the estimate may miss by
#:   more than 5 % as long as the product says so. 3 sigma: a Gaussian pull passes 99.7 % of the
#:   time; the pulls' width over the seeds is reported on its own (``stray_pull_C``).
#:   The SCI level's tolerance (:func:`level_tolerance`) likewise takes the larger of the 5 %
#:   allowance and 3 times the stated 1-sigma's share of the brightness (``stray_level_sigma_C``).
GATES = {"pull_width_dev": 0.1, "frame_pull_max": 3.0, "centre_err_px": 0.1, "flat_rms_disk": 0.005, "dark_err_frac": 0.02,
         "cr_found_frac": 0.8, "cr_residual_frac": 0.25, "level_dev_disk": 0.01, "level_dev_sci": 0.01,
         "stray_pct": 5.0, "stray_pull_max": 3.0}


# --------------------------------------------------------------------------- instrument side (simulation)


def saa_passes(day: dt.date) -> list[tuple[dt.datetime, dt.datetime]]:
    """The (schematic) SAA passes of one UTC day: :data:`SAA_ORBITS_PER_DAY` consecutive orbits.

    Parameters
    ----------
    day : datetime.date

    Returns
    -------
    list of (datetime, datetime)
        Start and end [UTC, naive] of each pass: orbit ``k`` (counted from 00:00 UTC,
        :data:`ORBIT_PERIOD_S`) for ``k`` in 4-8, from phase 0.3 of the orbit for
        :data:`SAA_PASS_S`.
    """
    t0 = dt.datetime(day.year, day.month, day.day)
    out = []
    for k in range(_SAA_FIRST_ORBIT, _SAA_FIRST_ORBIT + SAA_ORBITS_PER_DAY):
        s = t0 + dt.timedelta(seconds=(k + _SAA_PHASE) * ORBIT_PERIOD_S)
        out.append((s, s + dt.timedelta(seconds=SAA_PASS_S)))
    return out


def in_saa(t: dt.datetime) -> bool:
    """Whether ``t`` [UTC, naive] lies in one of :func:`saa_passes` of its day (the time flag)."""
    return any(a <= t < b for a, b in saa_passes(t.date()))


def cosmic_ray_rate(t: dt.datetime) -> float:
    """Cosmic-ray event rate at time ``t`` [events cm-2 s-1]: quiet, or x :data:`SAA_RATE_FACTOR` in an SAA pass."""
    return CR_RATE_QUIET_CM2_S * (SAA_RATE_FACTOR if in_saa(t) else 1.0)


def inject_cosmic_rays(raw: np.ndarray, *, rate_cm2_s: float, exptime_s: float, detector_px: int, gain: float,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """Add cosmic-ray tracks to a raw frame.

    Parameters
    ----------
    raw : numpy.ndarray of uint16, shape (n, n) [DN]
    rate_cm2_s : float
        Event rate [cm-2 s-1] (:func:`cosmic_ray_rate`).
    exptime_s : float
        Integration time [s] (the exposure; the read-out's share is neglected).
    detector_px : int
        Full detector side [pixel] (4608 SDI/WST, 2048 SCI); the frame may be binned from it.
    gain : float
        [electron/DN] of the hidden detector.
    rng : numpy.random.Generator

    Returns
    -------
    raw : numpy.ndarray of uint16, shape (n, n)
        With the hits (rounded, clipped to 16 bits).
    deposit : numpy.ndarray of float32, shape (n, n) [DN]
        What each pixel received.
    n_events : int

    Notes
    -----
    Events are Poisson in number (``rate x area x exptime``, area = (``detector_px`` x
    :data:`PIXEL_PITCH_UM`)**2), uniform in position, isotropic in direction onto the plane
    (``cos theta = sqrt(U)``), track length :data:`SENSITIVE_DEPTH_UM` / cos theta (capped at 20
    depths), charge :data:`ELECTRONS_PER_UM` per um with a log-normal straggling of 0.35 (a
    stand-in for the Landau tail), spread along the track's projection on the (binned) pixels.
    """
    n = raw.shape[0]
    binning = detector_px / n
    side_cm = detector_px * PIXEL_PITCH_UM * 1e-4
    n_ev = int(rng.poisson(rate_cm2_s * side_cm * side_cm * exptime_s))
    dep = np.zeros(raw.shape, dtype=np.float64)
    if n_ev:
        x0 = rng.uniform(0, n, n_ev)
        y0 = rng.uniform(0, n, n_ev)
        cos_t = np.sqrt(rng.uniform(1e-4, 1.0, n_ev))
        phi = rng.uniform(0, 2 * math.pi, n_ev)
        path_um = np.minimum(SENSITIVE_DEPTH_UM / cos_t, 20 * SENSITIVE_DEPTH_UM)
        proj_px = np.sqrt(np.maximum(path_um ** 2 - SENSITIVE_DEPTH_UM ** 2, 0.0)) / (PIXEL_PITCH_UM * binning)
        charge_dn = ELECTRONS_PER_UM * path_um * np.exp(0.35 * rng.standard_normal(n_ev)) / gain
        for i in range(n_ev):
            m = max(int(math.ceil(proj_px[i] * 4)), 1)
            s = (np.arange(m) + 0.5) / m
            xs = np.clip((x0[i] + s * proj_px[i] * math.cos(phi[i])).astype(int), 0, n - 1)
            ys = np.clip((y0[i] + s * proj_px[i] * math.sin(phi[i])).astype(int), 0, n - 1)
            np.add.at(dep, (ys, xs), charge_dn[i] / m)
    out = np.clip(np.rint(raw.astype(np.float64) + dep), 0, 65535).astype(np.uint16)
    return out, dep.astype(np.float32), n_ev


def _hidden(cal_dir: Path, chan: str) -> dict[str, np.ndarray]:
    from validation.blind_units import _hidden_detector

    return _hidden_detector(cal_dir, chan)


def _frames(rng, det, *, t, level_dn, n, rate_factor=1.0, model, noise) -> Iterator[np.ndarray]:
    """``n`` raw frames made one at a time (:func:`validation.blind_units._exposures`)."""
    from validation.blind_units import _exposures

    d = dict(det)
    if rate_factor != 1.0:
        d["dark_rate"] = det["dark_rate"] * rate_factor
    for _ in range(n):
        yield _exposures(rng, d, t=t, level_dn=level_dn, n=1, gain=model.gain_e_per_dn,
                         read_noise=model.read_noise_dn, noise=noise)[0]


# --------------------------------------------------------------------------- chain side (blind)


class _Acc:
    """Per-pixel running mean and variance (sums in float64), and pair differences' robust variances."""

    def __init__(self):
        self.n = 0
        self.s = self.ss = None
        self.prev = None
        self.pair_vars: list[float] = []
        self.pairs: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, frame: np.ndarray, keep_pair: bool = False) -> None:
        f = np.asarray(frame, dtype=np.float64)
        if self.s is None:
            self.s = np.zeros_like(f)
            self.ss = np.zeros_like(f)
        self.s += f
        self.ss += f * f
        self.n += 1
        if self.n % 2 == 0 and self.prev is not None:
            if keep_pair:
                self.pairs.append((self.prev, f))
            else:
                from validation.blind_units import _robust_var

                self.pair_vars.append(_robust_var(f - self.prev) / 2.0)
            self.prev = None
        else:
            self.prev = f

    def mean(self) -> np.ndarray:
        return self.s / self.n

    def var(self) -> np.ndarray:
        return np.maximum((self.ss - self.s * self.s / self.n) / (self.n - 1), 0.0)


def estimate_dark_model(bias_frames: Iterable[np.ndarray], dark_frames: Iterable[tuple[float, np.ndarray]],
                        dark_exptime_s: float) -> dict[str, object]:
    """Bias, dark rate at a reference temperature, its doubling temperature, read noise and gain, from frames alone.

    Parameters
    ----------
    bias_frames : iterable of numpy.ndarray, shape (ny, nx) [DN]
        Zero-exposure frames (>= 2), consumed one at a time.
    dark_frames : iterable of (float, numpy.ndarray)
        ``(DET_TEMP [deg C], frame [DN])`` closed-shutter frames of ``dark_exptime_s``, at two
        or more temperatures, an even number (>= 2) at each, consumed one at a time.
    dark_exptime_s : float
        [s], > 0.

    Returns
    -------
    dict
        ``bias``, ``biaserr`` [DN]; ``dark_rate``, ``darkerr`` [DN/s] at ``tref`` [deg C] (the
        mean of the temperatures); ``tdbl`` [deg C] (doubling temperature); ``gain``
        [electron/DN]; ``read_noise`` [DN] (ADC's 1/12 DN**2 removed); ``temps``, ``levels``
        (median dark rate at each temperature [DN/s]), ``factors`` (those over the rate plane's
        level, the measured curve). Planes float32, shape (ny, nx).

    Raises
    ------
    ValueError
        Fewer than two bias frames, fewer than two temperatures, an odd or short set at a
        temperature, a non-positive exposure, a fit that gives no positive doubling.

    Notes
    -----
    * Temperature law: the measured curve, no assumed form (issue 27: the truth's law may be
      the depletion + diffusion sum, not a doubling law). ``F_k = L_k / L(T_ref)``, ``L_k`` the
      median dark rate at ``T_k`` (immune to hot pixels) and ``L(T)`` the cubic in ``ln L``
      through them (:func:`pipelines.calibration.l2.steps.dark_curve_factor`, which the flow
      uses at the science frame's temperature from the master's ``DARKNT``/``DARKTn``/``DARKFn``);
      ``R_ref`` per pixel by least squares over the temperatures, ``R_ref = sum F_k R_k / sum
      F_k**2``, and its standard error from each temperature's frame scatter and the bias
      error. ``T_dbl`` (``DARKTDBL``, kept for readers of the old law) is the least-squares
      doubling temperature through ``log2 L_k``; ``factors`` holds the ``F_k``.
    * Photon transfer on dark pairs (the dark current's shot noise; Janesick 2007, *Photon
      Transfer*, SPIE Press): ``var(D1 - D2) / 2 = S / g + sigma_total**2`` over the pixels
      whose rate is within a factor 2 of the median (no hot pixels), ``S`` their mean dark
      signal, ``sigma_total**2 = var(B1 - B2) / 2`` from bias pairs, at the warmest
      temperature (the largest ``S``).
    """
    from pipelines.calibration.l2.steps import dark_curve_factor
    from validation.blind_units import _robust_var

    if not dark_exptime_s > 0:
        raise ValueError("dark_exptime_s must be positive")
    b = _Acc()
    for f in bias_frames:
        b.add(f)
    if b.n < 2:
        raise ValueError("at least two bias frames are needed")
    bias = b.mean()
    biaserr = np.sqrt(b.var() / b.n)
    var_total = float(np.mean(b.pair_vars)) if b.pair_vars else float(np.median(b.var()))
    accs: dict[float, _Acc] = {}
    warm = None
    for temp, f in dark_frames:
        temp = float(temp)
        if warm is None or temp > warm:
            warm = temp
        accs.setdefault(temp, _Acc()).add(f, keep_pair=True)
        # keep only the warmest temperature's pairs (photon transfer); drop the others as we go
        for t_other, a in accs.items():
            if t_other != warm:
                a.pairs.clear()
    temps = sorted(accs)
    if len(temps) < 2 or any(accs[t].n < 2 or accs[t].n % 2 for t in temps):
        raise ValueError("dark frames at two or more temperatures, an even number (>= 2) at each, are needed")
    rates = {t: (accs[t].mean() - bias) / dark_exptime_s for t in temps}
    levels = np.array([float(np.median(rates[t])) for t in temps])
    if np.any(levels <= 0):
        raise ValueError("a dark level is not positive: no temperature law can be fitted")
    tt = np.array(temps)
    slope, _ = np.polyfit(tt, np.log2(levels), 1)
    if not slope > 0:
        raise ValueError(f"the dark current does not grow with temperature (slope {slope:g} per C)")
    tdbl = 1.0 / float(slope)
    tref = float(np.mean(tt))
    # the temperature law: the measured curve itself (levels over the level at tref, the cubic
    # in ln through them; pipelines.calibration.l2.steps.dark_curve_factor), not a doubling law
    ref_level = dark_curve_factor(tref, temps, levels)[0]
    fk = levels / ref_level
    den = float(np.sum(fk ** 2))
    rate = sum(fk[i] * rates[t] for i, t in enumerate(temps)) / den
    var_rate = sum(fk[i] ** 2 * (accs[t].var() / accs[t].n) for i, t in enumerate(temps)) / (den ** 2 * dark_exptime_s ** 2)
    darkerr = np.sqrt(var_rate + (np.sum(fk) / den) ** 2 * biaserr ** 2 / dark_exptime_s ** 2)
    del rates
    med = float(np.median(rate))
    ok = (rate > 0.5 * med) & (rate < 2.0 * med)
    gains = []
    for d1, d2 in accs[warm].pairs:
        s = float(np.mean(0.5 * (d1 + d2)[ok] - bias[ok]))
        excess = _robust_var((d1 - d2)[ok]) / 2.0 - var_total
        gains.append(s / excess if excess > 0 else math.inf)
    gain = float(np.median(gains)) if gains else math.inf
    if not math.isfinite(gain):  # no shot noise measurable (a noise-free simulation)
        gain = 1e6
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # noqa: E731
    return {"bias": f32(bias), "biaserr": f32(biaserr), "dark_rate": f32(rate), "darkerr": f32(darkerr),
            "tref": tref, "tdbl": tdbl, "gain": gain, "read_noise": math.sqrt(max(var_total - 1.0 / 12.0, 0.0)),
            "temps": temps, "levels": levels.tolist(), "factors": fk.tolist()}


def kll_flat_error(images_dn, flat: np.ndarray, valid: np.ndarray, *, gain: float, read_noise: float,
                   threshold: float = 0.05, replaced: np.ndarray | None = None) -> np.ndarray:
    """Standard error of a KLL flat [fraction of the flat] from the images' noise model.

    Parameters
    ----------
    images_dn : sequence of numpy.ndarray, shape (ny, nx) [DN, dark-subtracted]
    flat : numpy.ndarray, shape (ny, nx)
        The recovered flat (mean 1 over ``valid``).
    valid : numpy.ndarray of bool, shape (ny, nx)
        Where the flat was measured.
    gain, read_noise : float
        [electron/DN], [DN] (the chain's photon-transfer values).
    threshold : float
        The KLL solve's usable-pixel threshold (fraction of each image's 99th percentile).
    replaced : numpy.ndarray of bool, shape (ny, nx), optional
        Hot pixels whose gain is their column neighbours' median
        (:attr:`pipelines.calibration.masters.subpixel_flat.SubpixelFlatResult.replaced`): their
        error is the flat's scatter about that median (1.4826 MAD over ``valid``).

    Returns
    -------
    numpy.ndarray of float32, shape (ny, nx)
        ``FLATERR`` [same unit as the flat]. Where nothing was measured, the RMS of the
        measured flat about 1 (the flat there is 1, its error the flat's own scatter).

    Notes
    -----
    KLL (Kuhn, Lin & Loranz 1991, PASP 103, 1097) gives ``ln G`` at a pixel as the mean over
    the ``c`` images covering it of ``ln I_k`` minus the scene, the scene at each sky point
    itself fitted to the ``c`` images that saw it. In the joint fit (every pixel and sky point
    seen ``c`` times, dithers all distinct) eliminating the scene leaves each pixel's gain
    tied to ``c - 1`` independent differences: ``var(ln G) ~ mean_k(var I_k / I_k**2) /
    (c - 1)`` (the ``c`` images' mean variance over ``c - 1``), with ``var I = I / g +
    sigma_read**2`` (Poisson and read noise). (Before issue 27 this was ``2 mean / c``, the
    scene taken as an independent mean of ``c`` other values: 1.33 x too large at ``c = 9``;
    the pulls of the flat's error over it were 0.75-0.82, seeds 1000-1001.)
    """
    acc = np.zeros(flat.shape, dtype=np.float64)
    cov = np.zeros(flat.shape, dtype=np.float64)
    for im in images_dn:
        a = np.asarray(im, dtype=np.float64)
        use = a > threshold * np.percentile(a, 99)
        safe = np.where(use, a, 1.0)
        acc += np.where(use, (np.maximum(safe, 0) / gain + read_noise ** 2) / safe ** 2, 0.0)
        cov += use
    rel = np.sqrt(acc / (np.maximum(cov, 2) * np.maximum(cov - 1, 1)))
    out = np.where(valid, rel * np.where(np.isfinite(flat), flat, 1.0), np.nan)
    fill = float(np.sqrt(np.mean((flat[valid] - 1.0) ** 2))) if valid.any() else 0.01
    out[~valid] = fill
    if replaced is not None and replaced.any():
        from pipelines.calibration.masters.subpixel_flat import _column_median

        lf = np.where(valid & ~replaced, np.log(np.where(flat > 0, flat, 1.0)), np.nan)
        d = (lf - _column_median(lf))[valid & ~replaced]
        d = d[np.isfinite(d)]
        scatter = 1.4826 * float(np.median(np.abs(d - np.median(d)))) if d.size else 0.01
        out[replaced] = np.hypot(out[replaced], scatter * flat[replaced])
    return out.astype(np.float32)


def _write_masters(est: dict, flat: np.ndarray, flaterr: np.ndarray, chan: str, out_dir: Path, ref, flat_desc: str,
                   flat_keywords: dict | None = None):
    """Dark and flat masters of the chain (:func:`validation.blind_units.write_detector_masters`),
    with the dark's temperature law (``DARKTREF``, ``DARKTDBL``), true descriptions and the
    flat derivation's plane keywords (``FLATPLSR``, ``FLATPLSG``, ...; ``flat_keywords``)."""
    from validation.blind_units import write_detector_masters

    paths = write_detector_masters({**est, "flat": np.asarray(flat, np.float32), "flaterr": flaterr}, chan, out_dir,
                                   valid_from=ref.valid_from, valid_to=ref.valid_to)
    with fits.open(paths["dark"], mode="update") as h:
        if est.get("tdbl") is not None:
            h[0].header["DARKTREF"] = (float(est["tref"]), "[deg C] detector temperature of DARKRATE")
            h[0].header["DARKTDBL"] = (float(est["tdbl"]), "[deg C] fitted doubling temperature of the dark")
        if est.get("factors") is not None:  # the measured curve (the flow prefers it to DARKTDBL)
            h[0].header["DARKNT"] = (len(est["temps"]), "points of the measured dark temperature curve")
            for i, (t, f) in enumerate(zip(est["temps"], est["factors"]), 1):
                h[0].header[f"DARKT{i}"] = (float(t), "[deg C] dark exposure temperature")
                h[0].header[f"DARKF{i}"] = (float(f), "median dark rate there / DARKRATE plane")
        temps = ", ".join(f"{t:g}" for t in est["temps"])
        h[0].header["CALDESC"] = f"{chan} dark model from {N_BIAS} bias and darks at {temps} C"
        for hdu in h:
            hdu.add_checksum()
    with fits.open(paths["flat"], mode="update") as h:
        h[0].header["CALDESC"] = flat_desc
        for key, val in (flat_keywords or {}).items():
            h[0].header[key] = val
        for hdu in h:
            hdu.add_checksum()
    return paths


def _chain_dark(est: dict, header: fits.Header, *, scaled: bool) -> np.ndarray:
    """What the flow subtracts as dark from a frame with ``header`` [DN] (the flow's own step)."""
    from pipelines.calibration.l2.steps import subtract_dark

    zero = np.zeros(est["bias"].shape, dtype=np.float32)
    out, _ = subtract_dark(zero, header, est["bias"], est["dark_rate"],
                           reference_temperature_c=est["tref"] if scaled else None,
                           doubling_temperature_c=est["tdbl"] if scaled else None,
                           temperature_curve=(est["temps"], est["factors"]) if scaled and est.get("factors") else None)
    return -np.asarray(out, dtype=np.float64)


# --------------------------------------------------------------------------- the check


def _centre_vec(h: fits.Header, crpix) -> tuple[float, float]:
    """(dx, dy): the centre the chain used minus the true one, detector frame [pixel]."""
    if h.get("CTRSRC") == "FIT":
        x, y = float(h["FITCRPX1"]), float(h["FITCRPX2"])
    else:
        x, y = float(h.get("HDRCRPX1", h["CRPIX1"])), float(h.get("HDRCRPX2", h["CRPIX2"]))
    return x - crpix[0], y - crpix[1]


def _centre_err(h: fits.Header, crpix) -> tuple[float, float]:
    """(|centre the chain used - true|, 1 if the fit was used) [pixel]."""
    return math.hypot(*_centre_vec(h, crpix)), 1.0 if h.get("CTRSRC") == "FIT" else 0.0


def run(size: int, noise: bool, seed: int, *, sdi_radiometry: str = "campaign", families=None) -> dict[str, float]:
    """One blind end-to-end run per channel at ``size`` px (module docstring), scored against the truth.

    Parameters
    ----------
    size : int
        SDI/WST frame side [pixel] (64-4608); SCI ``min(size, 2048)``.
    noise : bool
        Poisson and read noise in every frame (the pull width means something with noise only).
    seed : int
    sdi_radiometry : {"campaign", "given"}
        SDI calibrated with the law its radiometric campaign fitted (default;
        :func:`_sdi_campaign_radiometry`) or with the simulator's given ``RADCOEF``.
    families : validation.families.Families, optional
        Truths from model families the chain does not assume (issue 27;
        :func:`validation.families.draw_families`): stray light, coronal shape, occulter offset
        and header roll error through the simulator, the dither scene and the flat inputs, the
        diffuser, the dark law, the SDI degradation and the LASP scale error through the
        instrument side here. ``None`` (or drawn with ``mismatch=False``): today's truth.

    Returns
    -------
    dict of str to float
        Per channel ``C`` (``SDI``, ``WST``, ``SCI-UV``, ``SCI-WL``):

        * SDI radiometry: ``level_given_radcoef_SDI`` (the level with the given ``RADCOEF``:
          ``level_SDI`` times the ratio of the coefficients, L2 being proportional to it),
          ``radcoef_used_over_given_SDI``, ``radiometry_from_campaign_SDI`` (1: the campaign's
          law calibrated the frame), ``level_scale_error_removed_SDI`` (``level_SDI (1 + delta)``,
          ``delta`` the campaign's hidden LASP scale error ``lasp_scale_error_hidden_SDI``:
          diagnostic, scoring only), the campaign's ``radcal_*`` (fit accepted, chi-square,
          days, rate and its hidden value, validity, exposure);
        * ``level_C``: ``median(L2 / truth)`` over the good bright pixels, the truth as it is:
          the product's absolute level (gated). A KLL flat is known up to a constant (mean 1
          over the pixels it measured, not over the frame as the simulator's flat), which only
          the radiometric cross-calibration (item 5) fixes; with a given coefficient the
          disk level is off by that constant (``flat_level_C``, the chain's flat over the hidden
          one, SDI/WST ~0.25 %). SCI: ``level_stray_corrected_C`` the same with the stray-light
          error (estimate - injected) put back into L2 (diagnostic: how much of the level error
          is the stray estimate's);
        * ``pull_width_total_C``, ``pull_median_total_C``: :func:`frame_pull_stats` of
          ``(L2 - truth) / sigma_total`` over the good pixels, the truth as it is and
          ``sigma_total`` the product's total error (:func:`pipelines.products.total_uncertainty_from`):
          the frame's pixel-to-pixel pull width (about the fitted flat-plane mode where the product
          states ``FLATPLSG``, about the stray light's radial mode where a SCI product states its
          stray-light 1-sigma: ``pull_plane_total_C``, ``pull_plane_amp_C``, ``pull_width_total_raw_C``,
          :func:`score_total_pulls`) and its median (the frame-wide shift); gated
          (:data:`GATES`); ``pull_frame_total_C`` ``hypot`` of the two; ``level_pull_C``
          ``(level_C - 1) / RADUNC`` (NaN without ``RADUNC``) and ``centre_pull_C`` the centre
          error over ``hypot`` of its stated per-axis 1-sigma errors: each frame-wide claim
          alone (scoring only; RMS 1 over seeds when the claim is right);
        * ``pull_width_C``, ``pull_median_C``, ``median_l2_error_pct_C``: as
          :mod:`validation.blind_units` (good pixels, ``(L2 - truth) / UNCERT``): UNCERT alone,
          so the frame-wide centre and level errors widen them (reported, not gated);
        * ``centre_err_px_C`` (the centre the chain used minus the true one), ``centre_err_arcsec_C``,
          ``centre_claim_arcsec_C`` (the product's ``hypot(CSYER1, CSYER2) + 3 hypot(CRDER1, CRDER2)``
          [arcsec], NaN without them), ``header_err_px_C``, ``fit_used_C``;
        * SCI only: ``k_share_C``, the K corona's median share of the brightness over the
          pixels ``level_C`` scores (for :func:`level_tolerance`);
        * ``flat_rms_C``: RMS of (chain flat / hidden flat - 1), renormalised, over the pixels
          it measured (:func:`pipelines.calibration.masters.flatfield.compare_flats`); ``flat_pull_C``
          the robust width of that error over ``FLATERR`` (SCI: over ``hypot(FLATERR / flat, FLATDFSG)``,
          the stated diffuser non-uniformity in quadrature, of the flat the science frame used:
          the diffuser flat with the tilt its roll sequence measured taken out,
          :func:`_flat_without_roll_tilt`; the diffuser flat's own as ``flat_rms_diffuser_C``,
          ``flat_pull_diffuser_C``; SDI/WST: with the best-fit plane
          removed when the flat states its plane, whose error ``FLATPLSG`` states; also as
          ``flat_pull_width_C``); ``flat_rms_none_C`` the error with no flat; SDI/WST the
          stated plane's scores (issue 27 item 2, :func:`_score_flat_plane`):
          ``flat_rms_real_pct_C``, ``flat_plane_stated_C``, ``flat_rms_real_resid_pct_C``,
          ``flat_plane_pull_C`` (and ``_y``/``_x``), ``flat_plane_err_{y,x}_C``, ``flat_pull_total_C``;
        * ``dark_err_frac_C``: ``|mean(chain dark current - true)| / mean(true)`` at the science
          frame's temperature (what the flow subtracts, bias removed); ``dark_rms_dn_C`` its
          per-pixel RMS [DN]; ``dark_err_frac_unscaled_C`` the same without the temperature law;
          ``tdbl_C`` (hidden :data:`HIDDEN_DOUBLING_C`), ``gain_C``, ``read_noise_C``;
        * cosmic rays, for the frame's own time (``q``) and an SAA pass (``saa``):
          ``cr_events_{q,saa}_C``; ``cr_found_frac_{q,saa}_C``, the fraction of detectable hit
          pixels (deposit > :data:`CR_DETECTABLE_SIGMA` sigma of the pixel's noise) flagged; ``cr_found_all_{q,saa}_C``
          the same over all hit pixels; ``cr_false_per_mpx_{q,saa}_C`` flagged pixels that
          were not hit, per million pixels; ``cr_residual_frac_{q,saa}_C`` the injected
          signal left after cleaning, ``sum(L1_cr - L1_clean) / sum(deposit)`` (L1: detector
          grid, before north-up) over the detectable hit pixels; ``cr_residual_all_{q,saa}_C``
          the same over the whole frame (undetectable hits included); ``cr_residual_frac_off_C``
          the SAA frame's with the rejection off (control, ~1);
        * SCI only: ``stray_pct_C_r{R}`` for R in :data:`RADII`: ``|mean(stray estimate - injected)|
          / mean(K corona)`` in the annulus of +-0.025 Rsun about R [%]; ``l2_corona_pct_C_r{R}``
          ``|mean(L2 - truth)| / mean(K corona)`` of the science frame [%];
        * SCI stray light stated (issue 27 item 3; :func:`validation.blind_stray.fit_stray_model_set`):
          ``stray_sigma_pct_C_r{R}`` the stated 1-sigma (annulus mean) [% of the K corona];
          ``stray_pull_C_r{R}`` = ``mean(estimate - injected) / mean(stated 1-sigma)`` in the
          annulus (signed); ``stray_pull_C`` the RMS of the four (the width over seeds is the RMS
          of these over the seeds: ``sqrt(mean(stray_pull_C**2))``); ``stray_chi2_C`` the adopted
          fit's reduced chi-square; ``stray_refused_C`` 1 if the fit was refused (the default law
          used), ``stray_flagged_C`` 1 if the L2 carries QUALITY bit 4 and ``STRYFAIL``;
          ``stray_runs_z_C`` the runs statistic of the fit's residuals (``STRYRUNZ`` of the L2) and
          ``stray_structured_C`` 1 if the L2 says ``STRYSTRC = T`` (residuals structured, the 1-sigma widened);
          ``stray_level_sigma_C`` the median share of the stated 1-sigma in the scored brightness;
        * controls: ``centre_err_px_header_C`` (fit off: the header trusted), ``saa_flag_C``;
        * ``seconds``.

    Raises
    ------
    ValueError
        For a size outside 64-4608 px or an unknown ``sdi_radiometry``.
    pipelines.errors.DataError
        If the SDI campaign's fit is refused or the science frame lies outside its validity.
    """
    return _run(size, noise, seed, sdi_radiometry=sdi_radiometry, families=families)


def _raw(f, saa: bool | None = None) -> tuple[np.ndarray, fits.Header, bool]:
    """A raw science frame (a simulated frame or a raw file's path) as the instrument sends it:
    ``DET_TEMP``, ``SAAFLAG`` (by time, or forced), without the simulator's ``GAIN``/``RDNOISE``
    (the chain uses its own)."""
    from pipelines.fitsio import read_image

    raw = read_image(getattr(f, "raw_path", f))
    h = raw.header.copy()
    for key in ("GAIN", "RDNOISE"):
        h.remove(key, ignore_missing=True)
    h["DET_TEMP"] = (SCIENCE_TEMP_C, "[deg C] detector temperature")
    flag = in_saa(dt.datetime.fromisoformat(str(h["DATE-OBS"])[:19])) if saa is None else saa
    h["SAAFLAG"] = (bool(flag), "in a South Atlantic Anomaly pass (time flag)")
    return raw.data, h, bool(flag)


def _masters(sim, chan: str, ci: int, noise: bool, seed: int, work: Path, out: dict[str, float], families=None):
    """Calibration exposures (instrument side), then the chain's dark model and flat, written as
    masters; scores the flat and the dark into ``out``. Returns (cals, est, det, flat)."""
    from pipelines.calibration.l2.flow import load_calibration_master

    frames = [f for f in sim.frames if f.channel == chan]
    ref = next(i for i in sim.calibration_files if i.channel == chan)
    cals, est, det, flat = derive_chain_masters(
        sim.out_dir / "calibration", chan, frames[0].naxis, noise=noise,
        rng=np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 14, 1, ci])),
        dither_seed=int(seed) * 10 + ci, work=work, valid_from=ref.valid_from, valid_to=ref.valid_to, out=out,
        science_header=_raw(frames[0])[1], families=families,
        dither_scene=None if families is None else families.dither_scene(chan, frames[0].truth_path))
    for info in sim.calibration_files:  # what the chain is given besides its own masters
        if info.channel == chan and info.kind in ("radiometric", "mask_geometry"):
            cals[info.kind] = load_calibration_master(info.path)
    return cals, est, det, flat


def derive_chain_masters(hidden_cal_dir: Path, chan: str, n: int, *, noise: bool, rng: np.random.Generator,
                         dither_seed: int, work: Path, valid_from: str, valid_to: str, out: dict[str, float],
                         science_header: fits.Header | None = None, families=None, dither_scene=None):
    """The chain's own dark model and flat of one channel, from calibration exposures of a hidden detector.

    The **instrument side** reads the hidden detector planes of ``hidden_cal_dir`` (the
    simulator's ``lst_<chan>_dark_*``/``lst_<chan>_flat_*``, dark rate at :data:`SCIENCE_TEMP_C`)
    only to *make* the exposures: :data:`N_BIAS` bias frames, :data:`N_DARK_PER_TEMP` darks of
    :data:`DARK_EXPTIME_S` at each of :data:`DARK_TEMPS_C` (the rate doubling every
    :data:`HIDDEN_DOUBLING_C`), and the flat set (SDI/WST: the dithered full-disk set of
    :func:`pipelines.simulation.dithers.simulate_dithered_flat_set` through the *same* hidden
    flat; SCI: diffuser-like uniform frames). The **chain side** sees only those frames:
    :func:`estimate_dark_model` (bias, dark rate at ``DARKTREF``, fitted ``DARKTDBL``, gain,
    read noise), the sub-pixel KLL flat (:func:`pipelines.calibration.masters.flatfield.derive_flat_master`,
    mean 1 over the pixels it measured; :func:`kll_flat_error`) or the SCI diffuser flat.

    Parameters
    ----------
    hidden_cal_dir : pathlib.Path
        Folder with the hidden detector's planes (instrument side).
    chan : str
        ``SDI``, ``WST``, ``SCI-UV`` or ``SCI-WL``.
    n : int
        Frame side [pixel].
    noise : bool
        Poisson and read noise in the calibration exposures.
    rng : numpy.random.Generator
        Draws the bias, dark and (SCI) flat exposures.
    dither_seed : int
        Seed of the dithered flat set (SDI, WST).
    work : pathlib.Path
        Where the chain's masters are written.
    valid_from, valid_to : str
        Validity [UTC ISO] of the masters.
    out : dict
        Receives the scores (truth used only here): ``flat_rms_C``, ``flat_rms_none_C``,
        ``flat_level_C`` (mean of chain flat / hidden flat over the measured pixels),
        ``flat_pull_C``, ``tdbl_C``, ``gain_C``, ``read_noise_C`` and, with ``science_header``,
        ``dark_err_frac_C``, ``dark_err_frac_unscaled_C``, ``dark_rms_dn_C``.
    science_header : astropy.io.fits.Header, optional
        A science frame's header (``EXPTIME``, ``DET_TEMP``) at which the dark is scored.
    families : validation.families.Families, optional
        Instrument-side truths the chain does not assume (:mod:`validation.families`): the
        dark law (``dark_law``, 1 at :data:`SCIENCE_TEMP_C`), the SCI diffuser's illumination
        (``diffuser``), the flat inputs' contamination (``flat_inputs``). ``None``: today's.
    dither_scene : callable, optional
        The dithered flat set's scene (``scene`` of
        :func:`pipelines.simulation.dithers.simulate_dithered_flat_set`); ``None``: its disk.

    Returns
    -------
    cals : dict of str to pipelines.calibration.l2.flow.CalibrationInput
        ``dark`` and ``flat`` (the chain's masters).
    est : dict
        :func:`estimate_dark_model`'s result.
    det : dict of numpy.ndarray
        The hidden planes (scoring only).
    flat : numpy.ndarray, shape (n, n)
        The chain's flat (NaN where not measured).
    """
    from validation import blind_units as bu
    from pipelines.calibration.masters.flatfield import compare_flats, derive_flat_master
    from pipelines.calibration.l2.flow import load_calibration_master
    from pipelines.simulation import INSTRUMENT
    from pipelines.calibration.masters.diffuser_flat import DIFFUSER_SIGMA_KEY, diffuser_flat_keywords
    from pipelines.simulation.dithers import simulate_dithered_flat_set

    model = INSTRUMENT[chan]
    ref = SimpleNamespace(valid_from=valid_from, valid_to=valid_to)
    # ---- instrument side: calibration exposures from the hidden detector
    det = _hidden(Path(hidden_cal_dir), chan)
    hidden_flat = det["flat"].astype(np.float64)
    if hidden_flat.shape != (n, n):
        raise ValueError(f"the hidden detector is {hidden_flat.shape}, not {n}x{n}")
    kw = {"model": model, "noise": noise}
    law = lambda temp: 2.0 ** ((temp - SCIENCE_TEMP_C) / HIDDEN_DOUBLING_C)  # noqa: E731
    if families is not None and families.dark_law is not None:
        law = families.dark_law
    diffuser = None if families is None else families.diffuser.get(chan)
    flat_inputs = None if families is None else families.flat_inputs.get(chan)

    def darks():
        for temp in DARK_TEMPS_C:
            for fr in _frames(rng, det, t=DARK_EXPTIME_S, level_dn=0.0, n=N_DARK_PER_TEMP, rate_factor=law(temp), **kw):
                yield temp, fr

    # ---- chain side: the dark model, then the flat
    est = estimate_dark_model(_frames(rng, det, t=0.0, level_dn=0.0, n=N_BIAS, **kw), darks(), DARK_EXPTIME_S)
    if chan.startswith("SCI"):
        t_flat = DARK_TEMPS_C[1]
        stack = lambda **k: np.stack(list(_frames(rng, det, n=bu.N_CAL_FRAMES, **kw, **k)))  # noqa: E731
        fe = bu.estimate_detector_masters(stack(t=0.0, level_dn=0.0),
                                          stack(t=DARK_EXPTIME_S, level_dn=0.0, rate_factor=law(t_flat)),
                                          DARK_EXPTIME_S,
                                          stack(t=bu.FLAT_EXPTIME_S, rate_factor=law(t_flat),
                                                level_dn=bu.FLAT_LEVEL_DN if diffuser is None
                                                else bu.FLAT_LEVEL_DN * diffuser(n)),
                                          bu.FLAT_EXPTIME_S)
        flat, flaterr = fe["flat"].astype(np.float64), fe["flaterr"]
        valid = np.ones(flat.shape, bool)
        plane_kw = diffuser_flat_keywords()  # the diffuser's large scale, stated (FLATDFSG)
        desc = f"{chan} flat from {bu.N_CAL_FRAMES} diffuser-like uniform frames"
        del fe
    else:
        dset = simulate_dithered_flat_set(n, noise=noise, seed=int(dither_seed), channel=chan, flat=hidden_flat,
                                          read_noise_e=model.read_noise_dn * model.gain_e_per_dn,
                                          **({} if dither_scene is None else {"scene": dither_scene}))
        images_dn = [im / model.gain_e_per_dn for im in dset.images]  # what the detector gives [DN]
        if flat_inputs is not None:  # not perfectly dark-subtracted, hot pixels, cosmic rays
            images_dn = flat_inputs.contaminate(images_dn, det["dark_rate"].astype(np.float64) * model.exptime_s,
                                                exptime_s=model.exptime_s, detector_px=4608,
                                                gain=model.gain_e_per_dn, quiet_rate_cm2_s=CR_RATE_QUIET_CM2_S)
        commanded = dset.commanded
        del dset
        der = derive_flat_master(images_dn, commanded, chan, 2, valid_from, method="subpixel")
        valid = der.result.valid_mask
        flat = np.asarray(der.flat, dtype=np.float64)
        flaterr = kll_flat_error(images_dn, flat, valid, gain=est["gain"], read_noise=est["read_noise"],
                                 replaced=der.result.replaced)
        desc = f"{chan} sub-pixel KLL flat from {len(images_dn)} dithered images"
        plane_kw = {k: der.hdul[0].header[k] for k in ("FLATPLSR", "FLATPLWY", "FLATPLSG", "FLATPLY0", "FLATPLX0",
                                                       "FLATNCR", "FLATNHOT") if k in der.hdul[0].header}
        del images_dn, der
    # ---- scores: flat, dark at the science frame's temperature (the flow's own dark step)
    sc = compare_flats(flat, hidden_flat, valid)
    out[f"flat_rms_{chan}"] = sc["rms"]
    out[f"flat_rms_none_{chan}"] = sc["injected_rms"]
    ratio = flat[valid] / hidden_flat[valid]
    out[f"flat_level_{chan}"] = float(ratio.mean())
    ratio /= ratio.mean()
    if not chan.startswith("SCI"):
        ratio = _score_flat_plane(flat, hidden_flat, valid, flaterr, plane_kw, chan, out)
    rel = flaterr[valid] / flat[valid]
    if DIFFUSER_SIGMA_KEY in plane_kw:  # SCI: the stated diffuser term in quadrature (the total the product states)
        rel = np.hypot(rel, float(plane_kw[DIFFUSER_SIGMA_KEY][0]))
    with np.errstate(divide="ignore", invalid="ignore"):  # noise off: FLATERR can be 0
        fp = (ratio - 1.0) / rel
    out[f"flat_pull_{chan}"] = float(1.4826 * np.median(np.abs(fp - np.median(fp))))
    if not chan.startswith("SCI"):
        out[f"flat_pull_width_{chan}"] = out[f"flat_pull_{chan}"]
    out[f"tdbl_{chan}"] = float(est["tdbl"])
    out[f"gain_{chan}"] = float(est["gain"])
    out[f"read_noise_{chan}"] = float(est["read_noise"])
    if science_header is not None:
        true_dc = det["dark_rate"].astype(np.float64) * float(science_header["EXPTIME"])
        for tag, scaled in (("", True), ("_unscaled", False)):
            err = _chain_dark(est, science_header, scaled=scaled) - est["bias"].astype(np.float64) - true_dc
            out[f"dark_err_frac{tag}_{chan}"] = abs(float(err.mean())) / float(true_dc.mean())
            if not tag:
                out[f"dark_rms_dn_{chan}"] = float(np.sqrt(np.mean((err + bias_err(est, det)) ** 2)))
    paths = _write_masters(est, np.where(np.isfinite(flat), flat, 1.0), flaterr, chan, work, ref, desc, plane_kw)
    cals = {k: load_calibration_master(p) for k, p in paths.items()}
    return cals, est, det, flat


def _score_flat_plane(flat, hidden_flat, valid, flaterr, plane_kw: dict, chan: str, out: dict[str, float]) -> np.ndarray:
    """The flat's plane against the hidden flat's (issue 27 item 2; truth used only here), into ``out``.

    ``flat_rms_real_pct_C`` = 100 ``flat_rms_C``; ``flat_plane_stated_C`` (1 when the master
    states its plane with ``FLATPLSG``); the error ``e = ln(flat / hidden)`` over ``valid`` is
    fitted by a plane about the master's pivot (``FLATPLY0/X0``, else the valid centroid):
    ``flat_plane_err_{y,x}_C`` [1/pixel]; ``flat_plane_pull_{y,x}_C`` = that x ``nx / FLATPLSG``
    (the stated sigma of each axis; NaN when nothing is stated) and ``flat_plane_pull_C`` =
    ``sqrt((pull_y**2 + pull_x**2) / 2)`` (the width over seeds is the RMS of these);
    ``flat_rms_real_resid_pct_C`` the RMS error [%] with the best-fit plane removed;
    ``flat_pull_total_C`` the robust width of ``e`` over ``FLATERR`` and the plane's per-pixel
    sigma in quadrature. Returns the flat / hidden ratio (mean 1) used for ``flat_pull_C``:
    with the fitted plane removed when the plane is stated (its error is the plane's stated
    systematic, not ``FLATERR``'s), as it is otherwise.
    """
    from pipelines.calibration.masters.subpixel_flat import plane_sigma_map

    ny, nx = flat.shape
    e = np.log(flat[valid] / hidden_flat[valid])
    e -= e.mean()
    vy, vx = np.nonzero(valid)
    py0 = float(plane_kw["FLATPLY0"]) - 1.0 if "FLATPLY0" in plane_kw else float(vy.mean())
    px0 = float(plane_kw["FLATPLX0"]) - 1.0 if "FLATPLX0" in plane_kw else float(vx.mean())
    design = np.column_stack([np.ones(vy.size), vy - py0, vx - px0])
    coef = np.linalg.lstsq(design, e, rcond=None)[0]
    resid = e - design @ coef
    stated = str(plane_kw.get("FLATPLSR", "")).upper() == "STATED" and "FLATPLSG" in plane_kw
    sig = float(plane_kw["FLATPLSG"]) / nx if stated else float("nan")
    out[f"flat_rms_real_pct_{chan}"] = 100.0 * out[f"flat_rms_{chan}"]
    out[f"flat_plane_stated_{chan}"] = float(stated)
    out[f"flat_rms_real_resid_pct_{chan}"] = 100.0 * float(np.sqrt(np.mean(np.expm1(resid - resid.mean()) ** 2)))
    out[f"flat_plane_err_y_{chan}"], out[f"flat_plane_err_x_{chan}"] = float(coef[1]), float(coef[2])
    out[f"flat_plane_pull_y_{chan}"], out[f"flat_plane_pull_x_{chan}"] = float(coef[1]) / sig, float(coef[2]) / sig
    out[f"flat_plane_pull_{chan}"] = math.sqrt((out[f"flat_plane_pull_y_{chan}"] ** 2
                                                + out[f"flat_plane_pull_x_{chan}"] ** 2) / 2.0)
    if stated:
        pm = plane_sigma_map(flat.shape, float(plane_kw["FLATPLSG"]), (py0, px0))[valid]
        rel = np.hypot(flaterr[valid] / flat[valid], pm)
        with np.errstate(divide="ignore", invalid="ignore"):
            tp = e / rel
        out[f"flat_pull_total_{chan}"] = float(1.4826 * np.median(np.abs(tp - np.median(tp))))
        ratio = np.exp(resid - resid.mean())
    else:
        out[f"flat_pull_total_{chan}"] = float("nan")
        ratio = np.exp(e)
    return ratio / ratio.mean()


def _stray_master(frames, chan: str, cals: dict, ref, work: Path):
    """SCI: the stray light from the roll sequence calibrated with the chain's dark and flat (master and estimate).

    The estimate runs the model set (``model_set=True``): stated 1-sigma, chi-square, residual
    profile; a fit refused above :data:`validation.blind_stray.STRAY_CHI2_LIMIT` falls back to
    the channel's default law (:func:`pipelines.simulation.stray_light_model`, LST.md's two
    on-orbit points, the master the simulator hands out), and the master says so."""
    from validation.blind_stray import blind_stray_master, estimate_stray_light
    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from pipelines.calibration.l2.options import CalibrationOptions
    from pipelines.fitsio import write_fits_atomic
    from pipelines.simulation import lyman_alpha_corona, sci_wl_corona, stray_light_model

    opts_l1 = CalibrationOptions(subtract_stray_light=False, rotate_north_up=False)
    l1s, hdrs, valids = [], [], []
    for f in frames:
        d, h, _ = _raw(f)
        l1 = calibrate_frame(d, h, cals, opts_l1)
        l1s.append(np.asarray(l1.data, dtype=np.float64))
        hdrs.append(l1.header)
        valids.append(l1.dq == 0)
    # the occulter-to-Sun offset from the roll sequence (the occulter fit finds the occulter, the
    # corona turns about the Sun): the Sun centre of each frame is its occulter fit minus it
    from pipelines.calibration.masters.occulter import measure_occulter_offset
    from pipelines.errors import DataError
    try:
        occ = measure_occulter_offset(l1s, hdrs, valids)
    except DataError:
        occ = None
    tilt = None
    if occ is not None:
        for h in hdrs:
            if "FITCRPX1" in h and "FITCRPX2" in h:
                h["CRPIX1"] = float(h["FITCRPX1"]) - occ.dx_px
                h["CRPIX2"] = float(h["FITCRPX2"]) - occ.dy_px
        # the flat's tilt the roll measured (OCCGRAD1/2): out of the sequence too, by exactly the
        # factor the corrected flat (_flat_without_roll_tilt) changes the science frame's flat by
        from pipelines.calibration.masters.diffuser_flat import remove_roll_tilt

        tilt = occ
        flat0 = np.asarray(cals["flat"].data["flat"], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = remove_roll_tilt(flat0, occ.gradient, occ.rsun_px) / flat0
        factor = np.where(np.isfinite(factor), factor, 1.0)
        l1s = [im / factor for im in l1s]
    prior0 = sci_wl_corona if chan == "SCI-WL" else lyman_alpha_corona
    # issue 27 item 3: the model set (stated 1-sigma, chi-square, refusal); a refused fit falls back to
    # the channel's default master, LST.md's on-orbit power law (the simulator's given master)
    default = stray_light_model(chan)
    sest = estimate_stray_light(l1s, hdrs, lambda r: STRAY_PRIOR_FACTOR * prior0(r), valid=valids, model_set=True,
                                fallback=default.brightness)
    mpath = work / f"lst_{chan.lower()}_stray_light_chain.fits"
    hdul = blind_stray_master(sest, l1s[0].shape, hdrs[0], chan, 9, ref.valid_from, ref.valid_to)
    if occ is not None:
        for k, v in occ.keywords().items():
            hdul[0].header[k] = v
    write_fits_atomic(hdul, mpath)
    return load_calibration_master(mpath), sest, tilt


def _flat_without_roll_tilt(flat_cal, tilt, hidden_flat: np.ndarray, chan: str, work: Path,
                            out: dict[str, float]):
    """SCI: the diffuser flat master with the gain tilt its roll sequence measured taken out.

    :func:`pipelines.calibration.masters.diffuser_flat.remove_roll_tilt` on the chain's flat
    (``tilt``: the :class:`~pipelines.calibration.masters.occulter.OcculterOffset` of
    :func:`_stray_master`), ``FLATERR`` scaled with it, ``FLATDFSG`` restated as
    :data:`~pipelines.calibration.masters.diffuser_flat.DIFFUSER_BOWL_SIGMA` and
    :data:`~pipelines.calibration.masters.diffuser_flat.ROLL_TILT_KEYWORDS` recorded; written
    beside the first and loaded. A flat that already records a removed tilt is refused
    (``ValueError``: the roll sequence was calibrated with it, so its tilt is the increment). Scores it against
    the hidden flat (truth used only here) as :func:`derive_chain_masters` scored the first:
    ``flat_rms_C``, ``flat_level_C`` and ``flat_pull_C`` are then the corrected flat's, the first
    flat's kept as ``flat_rms_diffuser_C`` and ``flat_pull_diffuser_C``.
    """
    from pipelines.calibration.l2.flow import load_calibration_master
    from pipelines.calibration.masters.diffuser_flat import (DIFFUSER_BOWL_SIGMA, DIFFUSER_SIGMA_KEY,
                                                             diffuser_flat_keywords, remove_roll_tilt,
                                                             roll_tilt_keywords)
    from pipelines.calibration.masters.flatfield import compare_flats
    from pipelines.fitsio import write_fits_atomic

    with fits.open(flat_cal.path) as hd:
        hdul = fits.HDUList([h.copy() for h in hd])
    if "FLATTLT1" in hdul[0].header:
        raise ValueError(f"{flat_cal.name}: a roll tilt was already removed (FLATTLT1/2)")
    flat0 = np.asarray(hdul[0].data, dtype=np.float64)
    valid = np.isfinite(flat0) & (flat0 > 0)
    flat1 = remove_roll_tilt(flat0, tilt.gradient, tilt.rsun_px, valid)
    hdul[0].data = flat1.astype(np.float32)
    if "FLATERR" in hdul:  # an absolute error: scaled with the flat
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(valid, flat1 / flat0, 1.0)
        hdul["FLATERR"].data = (np.asarray(hdul["FLATERR"].data, dtype=np.float64) * scale).astype(np.float32)
    for k, v in {**roll_tilt_keywords(tilt.gradient, "roll sequence OCCGRAD1/2", sigma=tilt.gradient_sigma,
                                      rsun_px=tilt.rsun_px),
                 **diffuser_flat_keywords(DIFFUSER_BOWL_SIGMA)}.items():
        hdul[0].header[k] = v
    hdul[0].header.add_history("gain tilt measured by the roll sequence removed (FLATTLT1/2); FLATDFSG restated "
                               "for the diffuser's radial part left")
    path = Path(work) / f"lst_{chan.lower()}_flat_rolltilt.fits"
    write_fits_atomic(hdul, path)
    cal = load_calibration_master(path)
    out[f"flat_rms_diffuser_{chan}"] = out.get(f"flat_rms_{chan}", float("nan"))
    out[f"flat_pull_diffuser_{chan}"] = out.get(f"flat_pull_{chan}", float("nan"))
    flat = np.asarray(cal.data["flat"], dtype=np.float64)
    out[f"flat_rms_{chan}"] = compare_flats(flat, hidden_flat, valid)["rms"]
    ratio = flat[valid] / hidden_flat[valid]
    out[f"flat_level_{chan}"] = float(ratio.mean())
    ratio /= ratio.mean()
    rel = np.hypot(np.asarray(cal.data["flaterr"], dtype=np.float64)[valid] / flat[valid],
                   float(cal.parameters[DIFFUSER_SIGMA_KEY]))
    with np.errstate(divide="ignore", invalid="ignore"):
        fp = (ratio - 1.0) / rel
    out[f"flat_pull_{chan}"] = float(1.4826 * np.median(np.abs(fp - np.median(fp))))
    return cal


#: Where :func:`_score_l2` keeps what the SCI stray light's scoring used (``None``: nowhere). Set by
#: ``benchmarks/sci_stray_sigma_tune.py`` only: one ``{seed}_{channel}.npz`` per SCI product, so that
#: the stated 1-sigma's constants can be tuned on the tuning seeds by re-scoring the same products
#: offline (:data:`validation.blind_stray.STRAY_TUNING_SEEDS`), not by re-running the chain.
STRAY_KEEP_DIR: Path | None = None
#: The seed :func:`_run` is scoring (names the kept files).
_SCORING_SEED: int | None = None


def _keep_stray_scoring(l2, truth, chan: str, rho, stray_inj, kcor, s_est, s_sig, inputs: dict) -> None:
    """One SCI product's scoring inputs into :data:`STRAY_KEEP_DIR` (``{seed}_{chan}.npz``): the L2
    data, truth, total error and DQ, the truth's radii, injected stray light and K corona, the
    estimate and its stated 1-sigma there, and the model set's fit inputs (``in_*``,
    :attr:`validation.blind_stray.StrayModelSet.inputs`)."""
    from pipelines.products import total_uncertainty_from

    if _SCORING_SEED is None:
        raise ValueError("no seed is being scored (_keep_stray_scoring runs inside _run)")
    d = Path(STRAY_KEEP_DIR)
    d.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(d / f"{_SCORING_SEED}_{chan}.npz", data=l2.data, truth=truth, dq=l2.dq,
                        sig=total_uncertainty_from(l2.data, l2.uncertainty, l2.header, l2.dq),
                        rho=rho, stray_inj=stray_inj, kcor=kcor, s_est=s_est, s_sig=s_sig,
                        **{"in_" + k: v for k, v in inputs.items()})


def _score_l2(l2, frame, chan: str, truth: np.ndarray, sest, out: dict[str, float]) -> None:
    """Pull width, L2 error, level, centre and (SCI) stray light of the science frame's L2, into ``out``."""
    from validation.blind_stray import _annulus, _k_corona_truth
    from validation.blind_units import _score
    from validation.gates import _read_truth, _rho

    # L2 itself against the truth as it is, with UNCERT alone (reported: the frame-wide errors widen it)
    width, med, err = _score(l2, truth)
    out[f"pull_width_{chan}"], out[f"pull_median_{chan}"], out[f"median_l2_error_pct_{chan}"] = width, med, err
    out[f"level_{chan}"] = _level(l2, truth)
    out[f"radunc_{chan}"] = float(l2.header.get("RADUNC", float("nan")))  # the product's stated scale error
    # the gated pulls: L2 against the truth as it is over the total error a user reads from the
    # product (UNCERT with RADUNC and the centre's CRDER/CSYER; pipelines.products.total_uncertainty_from).
    # Nothing measured against the truth corrects L2 before it is scored.
    stated = sest is not None and sest.model_set is not None  # the stray light's stated 1-sigma
    score_total_pulls(l2, truth, chan, out, stray_sigma=sest.stray_sigma if stated else None)
    out[f"centre_err_px_{chan}"], out[f"fit_used_{chan}"] = _centre_err(l2.header, frame.crpix)
    # the product's own claim on its centre (CRDERia random, CSYERia systematic; arcsec)
    h2 = l2.header
    scale = float(h2.get("CDELT1", float("nan")))
    out[f"centre_err_arcsec_{chan}"] = out[f"centre_err_px_{chan}"] * abs(scale)
    if all(k in h2 for k in ("CSYER1", "CSYER2")):  # a refused/failed fit states CSYER only (no random error)
        out[f"centre_claim_arcsec_{chan}"] = (math.hypot(float(h2["CSYER1"]), float(h2["CSYER2"]))
                                              + 3.0 * math.hypot(float(h2.get("CRDER1", 0.0)),
                                                                 float(h2.get("CRDER2", 0.0))))
    else:
        out[f"centre_claim_arcsec_{chan}"] = float("nan")
    # the frame-wide claims one at a time (scoring only; their RMS over seeds should be 1):
    # the level's error over RADUNC, the centre's over hypot of its per-axis 1-sigma
    # (hypot(CRDERi, CSYERi) per axis, the error a user reads)
    radunc = out[f"radunc_{chan}"]
    out[f"level_pull_{chan}"] = (out[f"level_{chan}"] - 1.0) / radunc if math.isfinite(radunc) and radunc > 0 \
        else float("nan")
    sig_c = math.hypot(*(math.hypot(float(h2.get(f"CRDER{i}", 0.0)), float(h2.get(f"CSYER{i}", 0.0))) for i in (1, 2)))
    out[f"centre_pull_{chan}"] = (out[f"centre_err_arcsec_{chan}"] / sig_c) if sig_c > 0 else float("nan")
    hx, hy = frame.header_crpix or frame.crpix
    out[f"header_err_px_{chan}"] = math.hypot(hx - frame.crpix[0], hy - frame.crpix[1])
    if sest is not None:
        tr, stray_inj, thd = _read_truth(frame.truth_path)
        rho = _rho(tr.shape[0], thd)
        kcor = _k_corona_truth(chan, tr, rho)
        s_est = sest.stray(np.clip(rho, 1.0, 3.0))
        good = (l2.dq == 0) & np.isfinite(l2.data)
        s_sig = sest.stray_sigma(np.clip(rho, 1.0, 3.0))
        pulls = []
        for r0 in RADII:
            sel = _annulus(rho, r0)
            k = float(np.mean(kcor[sel]))
            d_s = float(np.mean(s_est[sel] - stray_inj[sel]))
            out[f"stray_pct_{chan}_r{r0:g}"] = 100 * abs(d_s) / k
            # issue 27 item 3: the error against the stated 1-sigma (the annulus mean of it)
            sig = float(np.mean(s_sig[sel]))
            out[f"stray_sigma_pct_{chan}_r{r0:g}"] = 100 * sig / k
            out[f"stray_pull_{chan}_r{r0:g}"] = d_s / sig if sig > 0 else float("nan")
            pulls.append(out[f"stray_pull_{chan}_r{r0:g}"])
            sg = sel & good
            out[f"l2_corona_pct_{chan}_r{r0:g}"] = 100 * abs(float(np.mean(l2.data[sg] - tr[sg]))) / k
        out[f"stray_pull_{chan}"] = float(np.sqrt(np.mean(np.square(pulls))))
        if STRAY_KEEP_DIR is not None and sest.model_set is not None and sest.model_set.inputs is not None:
            _keep_stray_scoring(l2, tr, chan, rho, stray_inj, kcor, s_est, s_sig, sest.model_set.inputs)
        ms = sest.model_set
        out[f"stray_refused_{chan}"] = float(ms.refused) if ms is not None else float("nan")
        out[f"stray_chi2_{chan}"] = ms.chi2_red if ms is not None else sest.chi2_red
        out[f"stray_flagged_{chan}"] = float(int(l2.header.get("QUALITY", 0)) & 4 != 0 and "STRYFAIL" in l2.header)
        out[f"stray_runs_z_{chan}"] = float(l2.header.get("STRYRUNZ", float("nan")))  # as the product says
        out[f"stray_structured_{chan}"] = float(l2.header.get("STRYSTRC", False) is True)
        # diagnostic: the level with the stray-light error put back (what of level_C is the stray estimate's)
        fixed = SimpleNamespace(data=l2.data + (s_est - stray_inj), dq=l2.dq)
        out[f"level_stray_corrected_{chan}"] = _level(fixed, tr)
        # what the issue's stray-light allowance (5 % of the K corona) allows the level: the K
        # corona's share of the scored brightness, times 5 %
        sel = _level_pixels(l2, tr)
        out[f"k_share_{chan}"] = float(np.median(kcor[sel] / tr[sel]))
        # the stated stray-light 1-sigma's share of the scored brightness (for level_tolerance)
        out[f"stray_level_sigma_{chan}"] = float(np.median(s_sig[sel] / tr[sel]))


def score_total_pulls(l2, truth: np.ndarray, chan: str, out: dict[str, float], *,
                      stray_sigma: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
    """The gated pulls of one product against the truth as it is, into ``out``.

    ``(L2 - truth) / sigma_total``, ``sigma_total`` what a user reads from the product
    (:func:`pipelines.products.total_uncertainty_from` of ``l2.data``, ``l2.uncertainty``,
    ``l2.header``, ``l2.dq``); :func:`frame_pull_stats` gives ``pull_width_total_C`` and
    ``pull_median_total_C``, ``pull_frame_total_C`` is their ``hypot``. L2 is scored as it is:
    no level or centre measured against the truth corrects it first.

    A product that states its flat plane (``FLATPLSG``: one gain gradient for the whole frame,
    which the dithers cannot measure; its 1-sigma is in ``UNCERT``) has that frame-wide mode
    fitted to its pulls (:func:`frame_pull_stats` with ``plane=True``): ``pull_width_total_C``
    is then the width about it, ``pull_plane_total_C`` what the fitted field adds to the pixels'
    mean square pull beyond the shift [pull units, signed: :func:`frame_pull_stats`] (0 without
    a fitted mode; it enters :func:`pooled_pull_width`), ``pull_plane_amp_C`` the
    fitted relative gradient across the frame width over ``FLATPLSG`` (per-axis RMS, NaN without
    ``FLATPLSG``; gated within :data:`GATES` ``frame_pull_max``) and ``pull_width_total_raw_C``
    the width with the mode left in (reported).

    A SCI product whose stray light states its 1-sigma (``stray_sigma``: ``r [Rsun] -> 1-sigma``,
    the product's master's ``SIGMA`` profile, evaluated at the product's own radii from its
    header) has the stray light's frame-wide radial mode fitted the same way
    (:func:`frame_pull_stats` with ``radial``): one axisymmetric law per frame, so one smooth
    radial draw of error per frame. ``pull_width_total_C`` is then the width about it,
    ``pull_plane_total_C`` the fitted mode's share as for the plane (the name is the plane's:
    whichever mode was fitted) and ``pull_field_total_C`` the RMS over the pixels of the fitted
    frame-wide field, ``sqrt(median**2 + mode |mode|)`` [pull units], gated within
    :data:`GATES` ``frame_pull_max`` with the shift: the radial mode is fitted whatever its size,
    so without this gate a stray 1-sigma stated 3 times too small passed every frame's width and
    all but a quarter of the frames' shifts (NaN where no radial mode was fitted).
    """
    from pipelines.products import total_uncertainty_from

    sig = total_uncertainty_from(l2.data, l2.uncertainty, l2.header, l2.dq)
    plane_sg = l2.header.get("FLATPLSG")
    w, m = frame_pull_stats(l2.data, truth, sig, l2.dq)
    out[f"pull_width_total_raw_{chan}"] = w
    out[f"pull_plane_total_{chan}"], out[f"pull_plane_amp_{chan}"] = 0.0, float("nan")
    out[f"pull_field_total_{chan}"] = float("nan")
    plane = plane_sg is not None and float(plane_sg) > 0
    radial = None
    if stray_sigma is not None:
        from pipelines.sun import radius_map, sun_geometry

        rho = np.asarray(radius_map(np.shape(l2.data), sun_geometry(l2.header)), dtype=np.float64)
        radial = (rho, np.asarray(stray_sigma(np.clip(rho, 1.0, 3.0)), dtype=np.float64))
    if plane or radial is not None:
        w, m, rms, (gy, gx) = frame_pull_stats(l2.data, truth, sig, l2.dq, plane=plane, radial=radial)
        nx = np.shape(l2.data)[1]
        out[f"pull_plane_total_{chan}"] = rms
        if radial is not None:
            out[f"pull_field_total_{chan}"] = math.sqrt(max(m * m + rms * abs(rms), 0.0))
        if plane:
            out[f"pull_plane_amp_{chan}"] = math.sqrt((gy * gy + gx * gx) / 2.0) * nx / float(plane_sg)
    out[f"pull_width_total_{chan}"], out[f"pull_median_total_{chan}"] = w, m
    out[f"pull_frame_total_{chan}"] = math.hypot(w, m)


def _score_cosmics(tag: str, d, d_cr, dep, h, cals, flat, ref: dict, opts, chan: str, out: dict[str, float]) -> None:
    """Cosmic-ray score on the detector grid (L1, before north-up): the frame with and without the hits.

    ``ref`` caches the hit-free L1 (``data``, ``flag``, ``sigma``) between the quiet and SAA cases.
    """
    from pipelines.calibration.l2.flow import bad_pixel_map, calibrate_frame
    from pipelines.calibration.l2.steps import DQ
    from pipelines.simulation import INSTRUMENT

    from pipelines.calibration.masters.radiometry import coefficient_at

    model = INSTRUMENT[chan]
    coef, t = coefficient_at(cals["radiometric"].parameters, h["DATE-OBS"]), float(h["EXPTIME"])
    if not ref:
        l1_ref = calibrate_frame(d, h, cals, opts)
        ref["data"] = np.asarray(l1_ref.data, dtype=np.float64)
        ref["flag"] = (l1_ref.dq & int(DQ.COSMIC_RAY)) != 0
        # the pixel's noise [DN] on the frame without hits (scoring: the hidden gain and read noise)
        ref["sigma"] = np.sqrt(np.maximum(ref["data"] * t * flat / coef, 0) / model.gain_e_per_dn
                               + model.read_noise_dn ** 2)
        ref["bad"] = bad_pixel_map(cals["dark"])  # hot pixels are flagged BAD_PIXEL, not cosmic rays
    l1_cr = calibrate_frame(d_cr, h, cals, opts)
    to_l1 = coef / t / np.where(flat > 0, flat, 1.0)
    flagged = ((l1_cr.dq & int(DQ.COSMIC_RAY)) != 0) & ~ref["flag"]
    hit = dep > 0.5
    usable = ~ref["bad"]
    det_hit = hit & (dep > CR_DETECTABLE_SIGMA * ref["sigma"]) & usable
    n = d.shape[0]
    out[f"cr_found_frac_{tag}_{chan}"] = float(flagged[det_hit].mean()) if det_hit.any() else float("nan")
    out[f"cr_found_all_{tag}_{chan}"] = float(flagged[hit & usable].mean()) if hit.any() else float("nan")
    out[f"cr_false_per_mpx_{tag}_{chan}"] = float((flagged & ~hit).sum()) / (n * n) * 1e6
    fin = np.isfinite(l1_cr.data) & np.isfinite(ref["data"])
    resid = np.asarray(l1_cr.data, dtype=np.float64) - ref["data"]
    injected = float(np.sum((dep * to_l1)[fin]))
    out[f"cr_residual_all_{tag}_{chan}"] = float(np.sum(resid[fin])) / injected if injected > 0 else float("nan")
    sel = fin & det_hit
    inj_d = float(np.sum((dep * to_l1)[sel]))
    out[f"cr_residual_frac_{tag}_{chan}"] = float(np.sum(resid[sel])) / inj_d if inj_d > 0 else float("nan")
    if tag == "saa":  # control: the same frame without the rejection
        l1_off = calibrate_frame(d_cr, h, cals, opts.model_copy(update={"remove_cosmic_rays": False}))
        left_o = float(np.sum((np.asarray(l1_off.data, dtype=np.float64) - ref["data"])[sel]))
        out[f"cr_residual_frac_off_{chan}"] = left_o / inj_d if inj_d > 0 else float("nan")
    out[f"cr_detectable_pix_{tag}_{chan}"] = float(det_hit.sum())


def _run(size: int, noise: bool, seed: int, *, channels=CHANNELS, pointing_error_px: float = POINTING_ERROR_PX,
         remove_cosmic_rays: bool = True, sdi_radiometry: str = "campaign", families=None) -> dict[str, float]:
    """:func:`run` for some ``channels``, another header pointing error, (controls) without cosmic-ray
    removal, or SDI calibrated with the given ``RADCOEF`` (``sdi_radiometry="given"``) instead of the
    law its radiometric campaign fitted (``"campaign"``, :func:`_sdi_campaign_radiometry`)."""
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.calibration.l2.options import CalibrationOptions
    from pipelines.simulation import INSTRUMENT, simulate

    if not 64 <= int(size) <= 4608:
        raise ValueError(f"size must lie in 64-4608 pixels, got {size}")
    if sdi_radiometry not in ("campaign", "given"):
        raise ValueError(f"sdi_radiometry must be 'campaign' or 'given', got {sdi_radiometry!r}")
    t_start = time.perf_counter()
    out: dict[str, float] = {}
    global _SCORING_SEED
    _SCORING_SEED = int(seed)
    with tempfile.TemporaryDirectory(prefix="lstdp-blind-chain-") as tmp:
        tmp_path = Path(tmp)
        sim = simulate(tmp_path / "sim", channels=channels, naxis=int(size), noise=noise, seed=seed,
                       sdi_sequence=False, pointing_error_px=pointing_error_px, sci_roll_deg=list(ROLLS_DEG),
                       **({} if families is None or not families.variants else {"variants": families.variants}))
        for chan in channels:
            ci = CHANNELS.index(chan)  # the channel's own streams: a one-channel run reproduces its part of all four
            frames = [f for f in sim.frames if f.channel == chan]
            sci = chan.startswith("SCI")
            cals, est, det, flat = _masters(sim, chan, ci, noise, seed, tmp_path / "chain", out, families)
            rad_given = cals["radiometric"]
            if chan == "SDI" and sdi_radiometry == "campaign":
                cals["radiometric"] = _sdi_campaign_radiometry(frames[0], cals, det, noise, seed,
                                                               tmp_path / "campaign", out, families=families)
            sest = None
            if sci:
                ref = next(i for i in sim.calibration_files if i.channel == chan)
                cals["stray_light"], sest, tilt = _stray_master(frames, chan, cals, ref, tmp_path / "chain")
                if tilt is not None:  # the diffuser flat's tilt, measured by the roll: out of the flat
                    cals["flat"] = _flat_without_roll_tilt(cals["flat"], tilt, det["flat"].astype(np.float64),
                                                           chan, tmp_path / "chain", out)
            for kind, cal in cals.items():
                cal.id = 9000 + ci * 10 + len(kind)
            # ---- the science frame: cosmic rays at its time's rate (and in an SAA pass), then calibrate
            with fits.open(frames[0].truth_path) as th:
                truth = np.asarray(th[0].data, dtype=np.float64)
            ref_l1: dict = {}
            o1 = CalibrationOptions(remove_cosmic_rays=remove_cosmic_rays, rotate_north_up=False, fit_centre=False,
                                    subtract_stray_light=False)
            for ctag, saa in (("q", None), ("saa", True)):
                d, h, flag = _raw(frames[0], saa)
                rate = CR_RATE_QUIET_CM2_S * (SAA_RATE_FACTOR if flag else 1.0)
                crng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 14, 2, ci, int(bool(saa))]))
                d_cr, dep, n_ev = inject_cosmic_rays(d, rate_cm2_s=rate, exptime_s=float(h["EXPTIME"]),
                                                     detector_px=2048 if sci else 4608,
                                                     gain=INSTRUMENT[chan].gain_e_per_dn, rng=crng)
                out[f"cr_events_{ctag}_{chan}"] = float(n_ev)
                if ctag == "q":
                    out[f"saa_flag_{chan}"] = float(flag)
                    l2 = calibrate_frame(d_cr, h, cals, CalibrationOptions(remove_cosmic_rays=remove_cosmic_rays))
                    _score_l2(l2, frames[0], chan, truth, sest, out)
                    if chan == "SDI":
                        _score_sdi_level(out, cals["radiometric"], rad_given, h)
                    del l2
                    hc = calibrate_frame(d_cr, h, cals, CalibrationOptions(fit_centre=False, rotate_north_up=False)).header
                    out[f"centre_err_px_header_{chan}"] = _centre_err(hc, frames[0].crpix)[0]
                # the flat the frame is calibrated with (SCI: the roll tilt taken out)
                flat_used = np.asarray(cals["flat"].data["flat"], np.float64) if sci else flat
                _score_cosmics(ctag, d, d_cr, dep, h, cals, flat_used, ref_l1, o1, chan, out)
                del d_cr, dep
            del truth, det, flat, cals, est, ref_l1
    out["seconds"] = time.perf_counter() - t_start
    return out


def _level_pixels(l2, truth: np.ndarray) -> np.ndarray:
    """The pixels :func:`_level` scores: good, and brighter than 1 % of the 99th-percentile truth."""
    good = (l2.dq == 0) & np.isfinite(l2.data) & (truth > 0)
    return good & (truth > 0.01 * np.percentile(truth[good], 99))


def _level(l2, truth: np.ndarray) -> float:
    """``median(L2 / truth)`` over :func:`_level_pixels` (scoring only)."""
    sel = _level_pixels(l2, truth)
    return float(np.median(l2.data[sel] / truth[sel]))


def bias_err(est, det) -> np.ndarray:
    """The chain's bias minus the hidden bias [DN] (scoring only)."""
    return est["bias"].astype(np.float64) - det["bias"]


# --------------------------------------------------------------------------- SDI radiometry from the campaign


#: The fixed part of the gate (issue 14 item 5: "within 2 % plus the irradiance series' own
#: stated uncertainty").
GATE_BASE = 0.02


def gate_tolerance() -> float:
    """``GATE_BASE + LASP_SCALE_UNCERTAINTY``: the largest relative coefficient error allowed."""
    from pipelines.calibration.masters.radiometry import LASP_SCALE_UNCERTAINTY

    return GATE_BASE + LASP_SCALE_UNCERTAINTY


def _calibrated_irradiance(raw_files, cals, *, as_sent: bool = False) -> tuple[list[Time], np.ndarray, np.ndarray]:
    """DATE-OBS, irradiance at 1 au [photons cm-2 s-1] and its relative photon-noise error, per frame.

    ``as_sent``: the raw header as the instrument sends it to the chain's own masters
    (:func:`validation.blind_chain._raw`: ``DET_TEMP``, without the simulator's
    ``GAIN``/``RDNOISE``); otherwise the file's header as it is (the given-masters control).
    """
    from astropy.time import Time

    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.calibration.masters.radiometry import disk_integrated_irradiance
    from pipelines.fitsio import read_image

    times, e, err = [], [], []
    for p in raw_files:
        if as_sent:
            data, header, _ = _raw(p)
        else:
            raw = read_image(p)
            data, header = raw.data, raw.header
        l2 = calibrate_frame(data, header, cals)
        irr = disk_integrated_irradiance(l2.data, l2.dq, l2.header)
        times.append(Time(str(l2.header["DATE-OBS"]), scale="utc"))
        e.append(irr["irradiance_ph_cm2_s"])
        if l2.uncertainty is not None:
            u = np.asarray(l2.uncertainty, dtype=np.float64)
            d = np.asarray(l2.data, dtype=np.float64)
            ok = np.isfinite(u) & np.isfinite(d)
            err.append(math.sqrt(float(np.sum(u[ok] ** 2))) / max(float(np.sum(d[ok])), 1e-300))
        else:
            err.append(0.0)
    return times, np.asarray(e), np.asarray(err)


def cross_calibrate_campaign(sim, cals: dict, lasp, work: Path, *, as_sent: bool = True,
                             fit_degradation: bool = True, master_id: int | None = None) -> dict:
    """Chain side: calibrate a campaign's frames with ``cals``, fit ``C(t)`` against ``lasp``, write the master.

    Parameters
    ----------
    sim : pipelines.simulation.campaign.CampaignResult
        The campaign (its raw frames; its ``radiometric`` master is the coefficient the chain
        is given and calibrates with first).
    cals : dict of str to pipelines.calibration.l2.flow.CalibrationInput
        ``dark``, ``flat``, ``mask_geometry``, ``radiometric`` (the given one).
    lasp : LyaSeries
        The published reference series.
    work : pathlib.Path
        Where the fitted master is written.
    as_sent : bool
        Headers as the instrument sends them (:func:`_calibrated_irradiance`).
    fit_degradation : bool
        Fit the sensitivity-loss rate (:func:`~pipelines.calibration.masters.radiometry.fit_cross_calibration`).
    master_id : int, optional
        Registry id given to the fitted master.

    Returns
    -------
    dict
        ``times``, ``e_before``, ``e_after`` [photons cm-2 s-1 at 1 au; NaN when the fit is
        refused], ``fit`` (:class:`~pipelines.calibration.masters.radiometry.CrossCalibration`),
        ``c_given``, ``master`` (the fitted ``radiometric`` CalibrationInput, version + 1,
        the given master's validity; None when the fit is refused).
    """
    from pipelines.calibration.l2.flow import load_calibration_master
    from pipelines.calibration.masters.radiometry import fit_cross_calibration, write_radiometric_master

    given = cals["radiometric"]
    c_given = given.param("RADCOEF")
    times, e_before, meas_err = _calibrated_irradiance(sim.raw_files, cals, as_sent=as_sent)
    fit = fit_cross_calibration(times, e_before, lasp, c_given, fit_degradation=fit_degradation,
                                measurement_rel_err=meas_err)
    master = None
    if fit.accepted:
        path = write_radiometric_master(fit, Path(work) / "lst_sdi_radiometric_xcal_v02.fits", naxis=sim.naxis,
                                        version=given.version + 1, valid_from=str(given.parameters["VALIDFRM"]),
                                        valid_to=str(given.parameters["VALIDTO"]))
        master = load_calibration_master(path)
        master.id = master_id
        _, e_after, _ = _calibrated_irradiance(sim.raw_files, dict(cals, radiometric=master), as_sent=as_sent)
    else:  # the chain refuses the fit (write_radiometric_master would raise): nothing to use
        e_after = np.full(len(times), np.nan)
    return {"times": times, "e_before": e_before, "e_after": e_after, "fit": fit, "c_given": c_given,
            "master": master}




def _sdi_campaign_radiometry(frame, cals: dict, det: dict, noise: bool, seed: int, work: Path,
                             out: dict[str, float], *, families=None):
    """SDI's radiometric law from a campaign of the *same* hidden instrument, fitted with the chain's masters.

    Instrument side: :func:`pipelines.simulation.campaign.simulate_sdi_campaign` exposed
    through the science frame's hidden detector planes (``det``: the same flat the dithered
    flat set went through, the same bias and dark rate), its hidden coefficient anchored at
    the one the simulator made the science frame with (``C_true(DATE-OBS) =`` the simulator's
    ``RADCOEF``: one instrument, one law), with the campaign's own drawn rate, days, series
    errors and a given (wrong) coefficient. Chain side:
    :func:`validation.blind_chain.cross_calibrate_campaign` with the chain's
    own dark and KLL flat (``cals``) against the published LASP composite; the fitted master
    (``RADCOEF``, ``RADRATE``) replaces the given one if the fit is accepted and the science
    frame's DATE-OBS lies within its validity (else :class:`~pipelines.errors.DataError`).

    Into ``out``: ``radcal_fit_accepted_SDI``, ``radcal_chi2_SDI``, ``radcal_n_days_SDI``,
    ``radcal_rate_per_year_SDI``, ``radcal_valid_SDI`` (1: DATE-OBS within the validity),
    ``radcal_exptime_s_SDI`` (the campaign's exposure) and, scoring only,
    ``lasp_scale_error_hidden_SDI`` (the composite's hidden scale error ``delta`` of the
    campaign), ``radcal_rate_true_per_year_SDI``.
    """
    import json

    from pipelines.calibration.l2.flow import load_calibration_master
    from pipelines.calibration.masters.radiometry import _parse_date, read_lasp_composite
    from pipelines.errors import DataError
    from pipelines.simulation.campaign import simulate_sdi_campaign
    from pipelines.simulation.sources import LYA_INDEX_FILE, SAMPLE_DIR
    from astropy.time import Time

    t_sci = Time(frame.date_obs, scale="utc")
    c_sim = float(cals["radiometric"].param("RADCOEF"))  # instrument side: the coefficient the frame was made with
    sim = simulate_sdi_campaign(work / "sim", naxis=frame.naxis, noise=noise, seed=int(seed) + 1000,
                                detector=det, coefficient_anchor=(t_sci, c_sim),
                                **({} if families is None else families.campaign_kwargs()))
    given = next(load_calibration_master(i.path) for i in sim.calibration_files if i.kind == "radiometric")
    given.id = 9100
    lasp = read_lasp_composite(SAMPLE_DIR / LYA_INDEX_FILE)
    camp = {"dark": cals["dark"], "flat": cals["flat"], "mask_geometry": cals["mask_geometry"], "radiometric": given}
    res = cross_calibrate_campaign(sim, camp, lasp, work / "chain", as_sent=True, master_id=9101)
    fit, master = res["fit"], res["master"]
    truth = json.loads(sim.truth_path.read_text())  # scoring only
    out["radcal_fit_accepted_SDI"] = 1.0 if fit.accepted else 0.0
    out["radcal_chi2_SDI"] = fit.chi2_reduced
    out["radcal_n_days_SDI"] = float(fit.n_days)
    out["radcal_rate_per_year_SDI"] = fit.rate_per_year
    out["radcal_exptime_s_SDI"] = float(truth["exptime_s"])
    out["radcal_rate_true_per_year_SDI"] = float(truth["rate_per_year"])
    out["lasp_scale_error_hidden_SDI"] = float(truth["lasp_scale_error"])
    if master is None:
        raise DataError(f"SDI cross-calibration refused (reduced chi-square {fit.chi2_reduced:.3g})")
    lo, hi = (Time(str(master.parameters[k]), scale="utc") for k in ("VALIDFRM", "VALIDTO"))
    t_frame = _parse_date(str(_raw(frame)[1]["DATE-OBS"]))  # the frame's own DATE-OBS, as the chain reads it
    out["radcal_valid_SDI"] = 1.0 if lo <= t_frame <= hi else 0.0
    if not out["radcal_valid_SDI"]:
        raise DataError(f"the SDI frame of {t_frame.isot} lies outside the campaign's validity {lo.isot}-{hi.isot}")
    return master


def _score_sdi_level(out: dict[str, float], used, given, header: fits.Header) -> None:
    """SDI level with the given ``RADCOEF`` and, with the campaign's law, without the series' hidden scale error.

    L2 is proportional to the radiometric coefficient (the flow multiplies the frame by it), so
    ``level_given_radcoef_SDI = level_SDI C_given / C_used(DATE-OBS)`` exactly. With the
    campaign's law, ``level_scale_error_removed_SDI = level_SDI (1 + delta)`` (``delta`` the
    campaign's hidden LASP scale error; diagnostic, scoring only): what the chain adds beyond
    the reference series' own scale error (the KLL flat's constant cancels: the same flat
    calibrated the campaign).
    """
    from pipelines.calibration.masters.radiometry import coefficient_at

    c_used = coefficient_at(used.parameters, header["DATE-OBS"])
    c_given = coefficient_at(given.parameters, header["DATE-OBS"])
    out["radcoef_used_over_given_SDI"] = c_used / c_given
    out["level_given_radcoef_SDI"] = out["level_SDI"] * c_given / c_used
    out["radiometry_from_campaign_SDI"] = 1.0 if used is not given else 0.0
    if used is not given:
        out["level_scale_error_removed_SDI"] = out["level_SDI"] * (1.0 + out["lasp_scale_error_hidden_SDI"])


#: Seeds of 0-9 used to set a limit or tune a constant, excluded from the reported pass rates
#: (:func:`reported_seeds`). None since issue 27 item 4: the cosmic-ray limits, first set after
#: measuring seed 0, are re-derived on :data:`LIMIT_SEEDS` (:func:`derive_cosmic_ray_limits`),
#: and the pull gates no longer have a measured limit. (Many figures quoted in this module's
#: docstrings were measured on seed 0: diagnostics, not limits.)
TUNING_SEEDS: tuple[int, ...] = ()
#: Seeds (>= 1000, outside the test seeds 0-9) on which the limits that are measured are set:
#: the blind chain at 256 px, noise on, mismatch on (``benchmarks/reports/cosmic_ray_limits_tuning.json``).
LIMIT_SEEDS = (1000, 1001, 1002)


def derive_cosmic_ray_limits(rows) -> dict[str, float]:
    """The cosmic-ray gate limits from runs on :data:`LIMIT_SEEDS`: the weakest value rounded outward to 0.05.

    Parameters
    ----------
    rows : iterable of dict
        :func:`run` metrics (or their ``cr_*_saa_C`` keys) of the limit seeds.

    Returns
    -------
    dict
        ``cr_found_frac``: the smallest ``cr_found_frac_saa_C`` over rows and channels (with
        detectable hits) rounded down to a multiple of 0.05; ``cr_residual_frac``: the largest
        ``|cr_residual_frac_saa_C|`` rounded up to one. On seeds 1000-1002 (mismatch on,
        256 px): 0.820 (SDI, seed 1001) -> 0.80 and 0.218 (SDI, seed 1001) -> 0.25, the limits of
        :data:`GATES` (the same as the ones first set on seed 0).
    """
    found, left = [], []
    for m in rows:
        for c in CHANNELS:
            if m.get(f"cr_detectable_pix_saa_{c}", 0) > 0:
                found.append(m[f"cr_found_frac_saa_{c}"])
                left.append(abs(m[f"cr_residual_frac_saa_{c}"]))
    step = 0.05
    return {"cr_found_frac": round(math.floor(min(found) / step + 1e-9) * step, 2),
            "cr_residual_frac": round(math.ceil(max(left) / step - 1e-9) * step, 2)}


def reported_seeds(seeds) -> list[int]:
    """``seeds`` without :data:`TUNING_SEEDS` (the seeds whose pass rates may be reported)."""
    return [int(s) for s in seeds if int(s) not in TUNING_SEEDS]


def frame_pull_stats(data, truth, sigma, dq=None, *, plane: bool = False, radial: tuple | None = None):
    """Pixel-to-pixel width and median of one frame's pulls ``(data - truth) / sigma``.

    Parameters
    ----------
    data, truth, sigma : numpy.ndarray, shape (ny, nx)
        The product, the truth (the same unit) and the 1-sigma error to test (e.g.
        :func:`pipelines.products.total_uncertainty_from`).
    dq : numpy.ndarray, shape (ny, nx), optional
        Pixels with ``dq != 0`` are left out, as are non-finite values and ``sigma <= 0``.
    plane : bool
        Also fit the frame-wide flat-plane mode and take the width about it. A flat's gain
        gradient ``g`` (1/pixel, the same for every pixel of the frame: one draw, like the
        frame's shift) makes ``data`` off by ``-data (g . r)``, ``r`` the pixel's position
        about the frame centre; a frame whose plane is a large draw of its stated 1-sigma has
        its pixels' pulls spread along that gradient, not scattered. The pulls are fitted
        by least squares with ``c + b_y data y / sigma + b_x data x / sigma`` (good pixels,
        then again without those beyond 5 robust sigma of the first fit's residual); the width
        is that of the pulls less the fitted ``b`` terms.

    radial : (rho, stray_sigma), optional
        Also fit the frame-wide stray-light mode of a SCI product that states its stray light's
        1-sigma, and take the width about it. ``rho`` [Rsun] and ``stray_sigma`` (the stated
        1-sigma of the subtracted stray light [the data's unit], what the product's ``UNCERT``
        holds of it), arrays of the frame's shape, both the product's own (its header's geometry,
        its master's ``SIGMA`` profile). The stray light is one axisymmetric law per frame
        (:mod:`validation.blind_stray`): its error is one smooth radial draw for the whole frame,
        like the shift and the flat's plane, not a pixel-to-pixel scatter, so a frame whose
        stray-light error is a large draw has its pixels' pulls spread along radius. The pulls
        are fitted with ``c + (b_0 + b_1 P_1(x) + b_2 P_2(x)) stray_sigma / sigma`` (``P_k`` the
        Legendre polynomials, ``x = (rho - 1.8) / 0.7`` clipped to [-1, 1]: the scored 1.1-2.5
        Rsun; the error's level, slope and curvature across the field, any smooth radial draw
        of a law with a handful of parameters; on the chain's products of seeds 1000-1039, with
        a first candidate's 1-sigma, the pooled widths with a linear or a cubic mode differed
        from the quadratic's by < 0.01), as with ``plane``
        (robust refit); the width is that of the pulls less the ``b`` terms.

    Returns
    -------
    (width, median) : tuple of float
        ``width`` = 1.4826 x the median absolute deviation of the pulls about their median
        (the Gaussian sigma of the pulls' core, robust to the few bad pixels left), ``median``
        the median pull (the frame-wide shift); NaN without good pixels.
    (width, median, mode, (g_y, g_x)) : with ``plane`` and/or ``radial``
        ``width`` about the fitted modes, ``median`` as without, ``mode`` what the fitted
        frame-wide field ``F`` (the constant, taken as the median of the pulls less the modes,
        plus the ``b`` terms, plane and radial together) adds to the pixels' mean square pull
        beyond the frame's shift, signed: ``mode * |mode| = mean(F**2) - median**2`` [pull
        units], so that ``median**2 + mode * |mode|`` is the field's mean square whatever its
        skew over the pixels (a radial mode is not symmetric about its mean: most pixels lie at
        large radii; the RMS of the modes about their mean counted a skewed mode twice, 1.12 for
        a right claim). Negative where the field's mean square is below the median's square
        (the median is not the field's mean). ``(g_y, g_x)`` the fitted relative gradient of the
        plane [1/pixel] (``-b``; NaN without ``plane``).
    """
    d = np.asarray(data, dtype=np.float64)
    sg = np.asarray(sigma, dtype=np.float64)
    good = np.isfinite(d) & np.isfinite(sg) & (sg > 0) & np.isfinite(truth)
    if dq is not None:
        good &= np.asarray(dq) == 0
    if not good.any():
        return (float("nan"), float("nan")) if not (plane or radial is not None) \
            else (float("nan"),) * 3 + ((float("nan"),) * 2,)
    pull = (d[good] - np.asarray(truth, dtype=np.float64)[good]) / sg[good]
    med = float(np.median(pull))
    if not plane and radial is None:
        return float(1.4826 * np.median(np.abs(pull - med))), med
    ny, nx = d.shape
    cols = [np.ones(pull.size)]
    if plane:
        yy, xx = np.nonzero(good)
        v = d[good] / sg[good]
        cols += [v * (yy - (ny - 1) / 2.0), v * (xx - (nx - 1) / 2.0)]
    if radial is not None:
        rho, ssig = (np.asarray(x, dtype=np.float64)[good] for x in radial)
        u = np.where(np.isfinite(ssig), ssig, 0.0) / sg[good]
        x = np.clip((np.where(np.isfinite(rho), rho, 1.8) - 1.8) / 0.7, -1.0, 1.0)
        cols += [u, u * x, u * (1.5 * x * x - 0.5)]
    a = np.column_stack(cols)
    keep = np.ones(pull.size, dtype=bool)
    for _ in range(2):  # least squares, then again without the outliers (cosmic-ray residuals, edges)
        coef = np.linalg.lstsq(a[keep], pull[keep], rcond=None)[0]
        res = pull - a @ coef
        keep = np.abs(res - np.median(res)) <= 5.0 * 1.4826 * np.median(np.abs(res - np.median(res)))
    mode = a[:, 1:] @ coef[1:]
    rest = pull - mode
    centre = float(np.median(rest))
    width = float(1.4826 * np.median(np.abs(rest - centre)))
    grad = (-float(coef[1]), -float(coef[2])) if plane else (float("nan"), float("nan"))
    # what the frame-wide field (its constant and modes) gives the pixels' mean square beyond the
    # frame's shift, signed: shift^2 + mode|mode| is that field's mean square, whatever its skew
    # over the pixels (a radial mode is not symmetric about its mean: most pixels lie at large radii)
    excess = float(np.mean((centre + mode) ** 2)) - med * med
    return width, med, math.copysign(math.sqrt(abs(excess)), excess), grad


def pooled_pull_width(widths, medians, planes=None) -> float:
    """The pull width over frames: ``sqrt(mean(width**2 + median**2 + plane * |plane|))``.

    The pulls of a pixel of a frame taken at random: the pixel-to-pixel variance within a frame
    (:func:`frame_pull_stats`' width squared) plus the spread of the frames' shifts about 0 (a
    frame-wide error is one draw per frame) plus, where a frame-wide mode was fitted (the flat's
    plane, the stray light's radial mode; ``planes``: ``pull_plane_total_C``, signed, see
    :func:`frame_pull_stats`; None or NaN: 0, the width then holds it), what that mode gave the
    frame's pixels' mean square beyond the shift. 1 when the stated total error is right; NaN
    pairs are left out, NaN if none is left.
    """
    w = np.asarray(widths, dtype=np.float64)
    m = np.asarray(medians, dtype=np.float64)
    p = np.zeros_like(w) if planes is None else np.nan_to_num(np.asarray(planes, dtype=np.float64), nan=0.0)
    ok = np.isfinite(w) & np.isfinite(m)
    return float(np.sqrt(max(float(np.mean(w[ok] ** 2 + m[ok] ** 2 + p[ok] * np.abs(p[ok]))), 0.0))) \
        if ok.any() else float("nan")


def level_tolerance(m: dict[str, float], c: str) -> float:
    """Largest ``|level_C - 1|`` of channel ``c`` in a :func:`run` result (:data:`GATES`).

    SDI/WST: 1 %; SDI calibrated with its campaign's law (``radiometry_from_campaign_SDI``):
    the radiometric gate, 2 % + 3 x the product's own ``RADUNC`` (``radunc_SDI``: the fit's
    error at DATE-OBS and the LASP composite's stated scale uncertainty, a 1-sigma; 3 sigma as
    the frame pull and the stray gates, since the validation draws the series' scale error
    Gaussian at its stated sigma; without it :func:`gate_tolerance`), the level then carrying
    the series' scale error; SCI: 1 % plus what the stray-light allowance of 5 % of the K corona
    makes of the scored brightness (``k_share_C``).
    """
    if c.startswith("SCI"):  # issue 27: or 3 x the stated stray-light 1-sigma's share, if larger
        stated = GATES["stray_pull_max"] * m.get(f"stray_level_sigma_{c}", 0.0)
        return GATES["level_dev_sci"] + max(GATES["stray_pct"] / 100.0 * m[f"k_share_{c}"],
                                            stated if math.isfinite(stated) else 0.0)
    if c == "SDI" and m.get("radiometry_from_campaign_SDI", 0.0) == 1.0:
        radunc = m.get("radunc_SDI", float("nan"))  # the product's own RADUNC, else the series' stated scale
        # 3 stated sigma, as the frame pull and the stray gates: the LASP scale error is drawn
        # Gaussian at its stated sigma (issue 27 item 1), so a 1-sigma gate would pass 68 % of honest seeds
        return GATE_BASE + GATES["frame_pull_max"] * radunc if math.isfinite(radunc) else gate_tolerance()
    return GATES["level_dev_disk"]


def gate_failures(m: dict[str, float], channels=CHANNELS, *, cosmic: bool = True) -> list[str]:
    """The gates (:data:`GATES`) that ``m`` (a :func:`run` result, noise on) misses, as readable strings.

    The names of :func:`gate_checks` whose check fails (see there for the gates).
    """
    return [name for name, ok in gate_checks(m, channels, cosmic=cosmic) if not ok]


def gate_checks(m: dict[str, float], channels=CHANNELS, *, cosmic: bool = True) -> list[tuple[str, bool]]:
    """Every gate (:data:`GATES`) of ``m`` (a :func:`run` result, noise on): ``(name, passed)`` in a fixed order.

    Per channel (:data:`GATES` says why each is what it is):

    * pull width: ``pull_width_total_C <= 1.1`` (the pixel-to-pixel width of the pulls against
      the truth as it is over the product's total error; about the fitted flat-plane mode where
      the product states ``FLATPLSG``, about the stray light's radial mode where a SCI product
      states its stray 1-sigma) and frame pull: ``|pull_median_total_C| <= 3`` (the frame's
      shift within 3 total sigma), with a stated plane ``pull_plane_amp_C <= 3`` (the fitted
      gradient within 3 stated sigma) and with a radial mode ``pull_field_total_C <= 3`` (the
      fitted frame-wide field's RMS within 3 total sigma); the pooled width over seeds
      (:func:`pooled_pull_width`) is the benchmark's;
    * level: ``|level_C - 1| <= level_tolerance(m, C)``, L2 against the truth as it is. What
      the chain adds beyond its stated errors (SCI ``level_stray_corrected_C``, the stray-light
      error put back; SDI ``level_scale_error_removed_SDI``, the series' hidden scale error taken
      out) is reported, not gated: both correct the estimate with what was measured against the
      truth, which issue 27 item 4 keeps out of the scoring;
    * centre: ``<= 0.1 px`` with the 2 px header error (issue 14 point 4), and within the
      product's own ``CRDER``/``CSYER`` claim. SDI meets 0.1 px at 256 px only just (0.097 px,
      seed 0) and misses it at larger sizes: as in :mod:`validation.blind_centre`,
      the SDI scene's limb (SWAP's EUV limb with its active regions and off-limb structure) is
      not a circle about the simulator's nominal centre: its m = 1 term puts a limb fit of the
      noise-free truth 0.7-0.9 arcsec off (0.098 px at 256, 0.31 px at 1024, 0.61 px at 2048;
      seed 0), and the m = 2 and 3 terms are as large, so no single-frame limb fit can do
      better there. Every seed uses that one scene (0.0985 px on seeds 0-9; built from SWAP's
      azimuthal mean 0.0002 px; other edge levels, smoothings and rejections 0.083-0.110 px on it
      and 0.009-0.023 px on the EIT scenes: ``benchmarks/sdi_limb_bias.py``), so the gate's pass
      rate at 256 px is the noise's and the pixel phase's draw about 0.098 px; SDI states
      1.0 arcsec per axis in ``CSYERia``
      (:data:`pipelines.calibration.l2.centre.EDGE_SYSTEMATIC_ARCSEC`), which its error meets;
    * SCI: stray-light error <= 5 % of the K corona at 1.1, 1.5, 2.0 and 2.5 Rsun
      (``stray_pct_C_rR``), or within 3 times the stated stray-light 1-sigma there
      (``|stray_pull_C_rR| <= 3``, issue 27: solved or stated);
    * flat RMS <= 0.5 % (SDI, WST), or, when the flat states its plane (``flat_plane_stated_C``),
      the RMS with the best-fit plane removed (``flat_rms_real_resid_pct_C``) <= 0.5 % (the plane's
      pulls against its stated ``FLATPLSG`` are scored across seeds); dark-current error at the
      science temperature <= 2 %;
    * cosmic rays in the SAA-pass frame: >= 80 % of the detectable hit pixels flagged and
      <= 25 % of their injected signal left (where the frame has detectable hits). The
      cosmic-ray limits are measured: first set on seed 0, re-derived on :data:`LIMIT_SEEDS`
      (:func:`derive_cosmic_ray_limits`: SDI 82-84 % found, 18-22 % left, the weakest:
      L.A.Cosmic's fine-structure test spares hits on the sharp Ly-alpha network; WST, SCI
      89-96 %, 3-18 %), so the test seeds 0-9 set no limit (:data:`TUNING_SEEDS`).
    """
    g = GATES
    done: list[tuple[str, bool]] = []
    for c in channels:
        claim = m.get(f"centre_claim_arcsec_{c}", float("nan"))
        checks = [(f"pull width {c}", m.get(f"pull_width_total_{c}", math.nan) <= 1.0 + g["pull_width_dev"]),
                  (f"frame pull {c}", abs(m.get(f"pull_median_total_{c}", math.nan)) <= g["frame_pull_max"]
                   and not m.get(f"pull_plane_amp_{c}", 0.0) > g["frame_pull_max"]
                   and not m.get(f"pull_field_total_{c}", 0.0) > g["frame_pull_max"]),
                  (f"level {c}", abs(m[f"level_{c}"] - 1.0) <= level_tolerance(m, c)),
                  (f"centre claim {c}", m[f"centre_err_arcsec_{c}"] <= claim),  # NaN (no claim) fails
                  (f"dark {c}", m[f"dark_err_frac_{c}"] <= g["dark_err_frac"])]
        if c.startswith("SCI"):
            checks += [(f"stray {c} {r:g} Rsun", m[f"stray_pct_{c}_r{r:g}"] <= g["stray_pct"]
                        or abs(m.get(f"stray_pull_{c}_r{r:g}", math.inf)) <= g["stray_pull_max"]) for r in RADII]
            # (the level with the stray-light error put back, level_stray_corrected_C, and SDI's level
            # with the series' hidden scale error taken out, level_scale_error_removed_SDI, correct
            # the estimate with what was measured against the truth: reported, not gated; issue 27 item 4)
        checks.append((f"centre {c}", m[f"centre_err_px_{c}"] <= g["centre_err_px"]))
        if not c.startswith("SCI"):
            # issue 27 item 2: a stated plane is scored by its own pulls (across seeds), the flat without it here
            checks.append((f"flat {c}", m[f"flat_rms_{c}"] <= g["flat_rms_disk"] or (
                m.get(f"flat_plane_stated_{c}", 0.0) == 1.0
                and m[f"flat_rms_real_resid_pct_{c}"] <= 100 * g["flat_rms_disk"])))
        if cosmic and m.get(f"cr_detectable_pix_saa_{c}", 0) > 0:
            checks += [(f"cosmic-ray detection {c}", m[f"cr_found_frac_saa_{c}"] >= g["cr_found_frac"]),
                       (f"cosmic-ray residual {c}", abs(m[f"cr_residual_frac_saa_{c}"]) <= g["cr_residual_frac"])]
        done += [(name, bool(ok)) for name, ok in checks]
    return done


if __name__ == "__main__":  # pragma: no cover - python -m validation.blind_chain SIZE [NOISE] [SEED]
    import sys

    args = sys.argv[1:]
    res = run(int(args[0]) if args else 256, bool(int(args[1])) if len(args) > 1 else True,
              int(args[2]) if len(args) > 2 else 0)
    for k, v in res.items():
        print(f"{k:34s} {v:.6g}")
    print("gate failures:", gate_failures(res))
