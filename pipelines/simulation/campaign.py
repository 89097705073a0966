"""An SDI radiometric campaign: one raw frame on each of many observing days, with a hidden coefficient and degradation.

What :mod:`validation.blind_radiometry` cross-calibrates. The instrument side:

* **Observing days** spread over the LASP composite's span (1997-2013): ``n_days`` days at
  even spacing with a seeded jitter of up to a quarter of the spacing, plus 2012-01-01,
  the one day of the PROBA2/LYRA file in the sample data; a seeded time of day each.
* **The Sun's true irradiance** on each day follows the real LASP composite on that day
  with the series' own errors, drawn once per seed: ``E_true = E_LASP (1 + delta)(1 + eps_i)``
  with ``delta`` uniform in +-:data:`~pipelines.calibration.masters.radiometry.LASP_SCALE_UNCERTAINTY`
  (the composite's absolute scale error, one for the whole series; that constant is a 1-sigma
  value, so the draw stays within 1 sigma: the gate of 2 % plus it then tests the chain, not
  the luck of the draw; a real scale error is beyond 1 sigma a third of the time) and ``eps_i`` Gaussian
  of RMS :data:`~pipelines.calibration.masters.radiometry.LASP_DAILY_SCATTER` (its day-to-day noise,
  measured from the file). The chain compares against the published series, not ``E_true``,
  so it never sees either error.
* **The scene**: the SWAP 174 A image of 2012-01-01 made into Lyman-alpha radiance
  (:func:`~pipelines.simulation.scenes._sdi_scene`: the EUV proxy, the limb-brightened
  chromosphere and the Lyman-alpha corona), band-limited to SDI's resolution, then scaled so
  that its irradiance within 1.2 Rsun (the project's one convention,
  :data:`~pipelines.calibration.masters.radiometry.IRRADIANCE_RADIUS_RSUN`: disk, limb and inner
  corona to SDI's field stop, as the chain integrates it and as the single frames of
  :mod:`pipelines.simulation.truth` are scaled) seen from the observer at ``DSUN_OBS`` (Earth at
  DATE-OBS) is ``E_true (1 au / DSUN_OBS)**2``: an irradiance instrument sees the whole Sun.
  (Before 2026-12-05 the whole square frame was summed, corners beyond 1.2 Rsun included.) The structure is the same every day (no other Lyman-alpha
  proxy image is in the sample data); only the disk-integrated value matters here.
* **The hidden instrument**: ``raw = bias + dark t + flat t S / C_true(t)`` (the forward
  model of :mod:`pipelines.simulation.forward`, Poisson and read noise) with
  ``C_true(t) = C_hidden exp(lambda (t - LAUNCH))``: an exponential loss of sensitivity
  ``exp(-lambda (t - LAUNCH))``, the simulator's assumption (Lyman-alpha instruments degrade
  in flight: PROBA2/LYRA and the SOHO instruments in BenMoussa et al. 2013, Sol. Phys. 288,
  389; SDO/AIA's time-dependent degradation tables, which aiapy applies, do the same job).
  ``lambda`` is drawn uniform in :data:`RATE_RANGE` per year, ``C_hidden`` 2-25 % above the
  coefficient that keeps the brightest frame below 16 bits, and the **given** master
  ``RADCOEF`` independently in the same range, at least 5 % away from ``C_hidden``.

The hidden values go to ``truth/campaign_truth.json`` only (for scoring); the masters in
``calibration/`` are the simulator's dark, flat, mask geometry and the *given* radiometric
coefficient, constant in time.

**Flat convention of the hidden coefficient.** ``C_true`` is defined through the forward
model's ``flat t S / C_true`` with the simulator's flat (:func:`~pipelines.simulation.forward._flat_field`),
normalised to mean 1 over the whole detector; so is ``RADCOEF`` of every simulated master. A
chain that calibrates with a flat of another normalisation (a KLL flat: mean 1 over the pixels
it measured) finds ``C_true`` times that flat's level: see
:mod:`validation.blind_radiometry`.

**The same hidden instrument as a science frame** (``detector=`` and ``coefficient_anchor=``,
used by :mod:`validation.blind_chain`): the campaign is exposed through given
bias, dark-rate and flat planes instead of drawn ones, and ``C_hidden`` follows from the
coefficient the instrument has at one time (``C_true(t_a) = C_a``, so
``C_hidden = C_a exp(-lambda (t_a - LAUNCH))``); the rate is drawn as above. As ``C_true``
is then smaller before ``t_a``, the campaign's exposure time is shortened from the model's
(1 s for SDI) by ``min_k C_true(t_k) / C_safe`` (3 significant digits, rounded down) so that
no frame saturates; ``EXPTIME`` says so, and the coefficient is per DN/s, so it does not
depend on the exposure.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from astropy import units as u
from astropy.io import fits
from astropy.time import Time
from scipy import ndimage

from pipelines.channels import CHANNELS, MIN_FRAME_SIDE
from pipelines.errors import DataError
from pipelines.simulation.forward import (INSTRUMENT, _dark_planes, _detector_geometry, _flat_field, _forward_model,
                                          _raw_header)
from pipelines.simulation.grid import _apparent_rsun_arcsec
from pipelines.simulation.masters import _radiometric_coefficient, _write_masters
from pipelines.simulation.output import _iso, _write
from pipelines.simulation.results import CalibrationFileInfo

__all__ = ["simulate_sdi_campaign", "CampaignResult", "LAUNCH", "RATE_RANGE", "LYRA_DAY", "FIRST_DAY", "LAST_DAY"]

#: The campaign's first and last possible day: the LASP composite's span in the sample data.
FIRST_DAY = dt.date(1997, 1, 1)
LAST_DAY = dt.date(2013, 12, 31)

#: The day of the PROBA2/LYRA level-2 file in the sample data (always observed).
LYRA_DAY = dt.date(2012, 1, 1)

#: Start of the hidden degradation (the simulated instrument's "first light").
LAUNCH = Time("1997-01-01T00:00:00", scale="utc")

#: Range of the hidden sensitivity-loss rate [1/yr] (a choice: a few per cent a year, far
#: slower than LYRA's Lyman-alpha channel, which a pipeline would recalibrate stepwise).
RATE_RANGE = (0.02, 0.06)


@dataclass
class CampaignResult:
    """What :func:`simulate_sdi_campaign` wrote.

    Attributes
    ----------
    out_dir : pathlib.Path
    raw_files : list of pathlib.Path
        One raw SDI frame per observing day, in time order.
    date_obs : list of str
        Their DATE-OBS (ISO, UTC).
    calibration_files : list of CalibrationFileInfo
        The masters the chain is given (``radiometric`` holds the *given* coefficient).
    given_coefficient : float
        ``RADCOEF`` of the given master [erg cm-2 s-1 sr-1 per DN/s].
    truth_path : pathlib.Path
        ``truth/campaign_truth.json``: the hidden coefficient and rate, ``delta``, each day's
        true irradiance. For scoring only.
    """

    out_dir: Path
    raw_files: list[Path]
    date_obs: list[str]
    calibration_files: list[CalibrationFileInfo]
    given_coefficient: float
    truth_path: Path
    naxis: int
    notes: list[str] = field(default_factory=list)


def _days(rng: np.random.Generator, n_days: int) -> list[dt.date]:
    span = (LAST_DAY - FIRST_DAY).days
    step = span / max(n_days - 1, 1)
    out = set()
    for k in range(n_days):
        j = k * step + rng.uniform(-0.25, 0.25) * step
        out.add(FIRST_DAY + dt.timedelta(days=int(min(max(round(j), 0), span))))
    out.add(LYRA_DAY)
    return sorted(out)


def simulate_sdi_campaign(out_dir: str | os.PathLike, *, naxis: int = 128, n_days: int = 16, noise: bool = True,
                          seed: int = 0, sample_dir: str | os.PathLike | None = None,
                          detector: dict[str, np.ndarray] | None = None,
                          coefficient_anchor: tuple[Time, float] | None = None,
                          sensitivity_extra=None, lasp_scale_error: float | None = None) -> CampaignResult:
    """Simulate an SDI campaign (see the module docstring).

    Parameters
    ----------
    out_dir : path-like
        Written: ``raw/``, ``calibration/``, ``truth/campaign_truth.json``.
    naxis : int
        Frame side [pixel], 32 to 4608.
    n_days : int
        Observing days besides the LYRA day (>= 2).
    noise : bool
        Poisson and read noise in the raw frames.
    seed : int
        Everything random (days, hidden values, series errors, detector, noise).
    sample_dir : path-like, optional
        The real data (default ``sample-data/real``).
    detector : dict, optional
        The hidden detector to expose the campaign through, instead of drawn planes:
        ``bias`` [DN], ``dark_rate`` [DN/s], ``flat`` (mean 1 over the detector), each of
        shape (naxis, naxis) (instrument side only).
    coefficient_anchor : (astropy.time.Time, float), optional
        ``(t_a, C_a)``: the hidden coefficient at ``t_a`` [erg cm-2 s-1 sr-1 per DN/s], > 0
        (module docstring); the campaign's exposure is shortened where needed.
    sensitivity_extra : callable, optional
        ``g(y, y_first, y_last) -> float``: a factor on the sensitivity beyond the exponential
        law, ``y`` [years since launch], ``y_first``/``y_last`` the campaign's first and last
        day [years] (a step, a fast early loss: validation families). The hidden coefficient
        is divided by ``g(y) / g(y_anchor)`` (``y_first`` without an anchor), so the anchored
        coefficient stays. ``None``: the exponential law alone (output unchanged).
    lasp_scale_error : float, optional
        The composite's hidden scale error ``delta`` (fraction) instead of the uniform draw
        (the random stream is drawn as before). ``None``: the uniform draw.

    Returns
    -------
    CampaignResult

    Raises
    ------
    ValueError
        For a size outside 32-4608 px, fewer than two days, detector planes of another shape
        or a non-positive anchor coefficient.
    DataError
        If a real input file is missing.
    """
    # Long: one campaign end to end (hidden values, days, detector, frames, truth file): the
    # instrument side in the order it happens, sharing the draws of one seed.
    from pipelines.calibration.masters.radiometry import LASP_DAILY_SCATTER, LASP_SCALE_UNCERTAINTY, read_lasp_composite
    from pipelines.simulation.scenes import _scale_to_irradiance, _sdi_reference, _sdi_scene
    from pipelines.simulation.sources import LYA_INDEX_FILE, SAMPLE_DIR, SWAP_FILE, _sunpy_source
    from pipelines.simulation.truth import _smooth_sigma_px

    spec, model = CHANNELS["SDI"], INSTRUMENT["SDI"]
    n = int(naxis)
    if not MIN_FRAME_SIDE <= n <= spec.naxis:
        raise ValueError(f"naxis must be between {MIN_FRAME_SIDE} and {spec.naxis} pixels, got {n}")
    if n_days < 2:
        raise ValueError("a campaign needs at least two observing days")
    sample = Path(sample_dir) if sample_dir is not None else SAMPLE_DIR
    out = Path(out_dir)
    for sub in ("raw", "calibration", "truth"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 14, 5]))
    lasp = read_lasp_composite(sample / LYA_INDEX_FILE)
    days = _days(rng, n_days)
    delta = float(rng.uniform(-LASP_SCALE_UNCERTAINTY, LASP_SCALE_UNCERTAINTY))
    if lasp_scale_error is not None:  # drawn by the caller (the random stream stays the same)
        delta = float(lasp_scale_error)
    eps = rng.normal(0.0, LASP_DAILY_SCATTER, len(days))
    rate = float(rng.uniform(*RATE_RANGE))
    times = [Time(dt.datetime.combine(d, dt.time()) + dt.timedelta(seconds=float(rng.uniform(0, 86000))), scale="utc")
             for d in days]

    src = _sunpy_source(sample / SWAP_FILE)
    ref = _sdi_reference(src)
    scale = spec.plate_scale_for(n)
    truths, e_true, rsun = [], [], []
    for d, t, e in zip(days, times, eps):
        rsun_arcsec, obs = _apparent_rsun_arcsec(t)
        dsun_au = float(obs["DSUN_OBS"]) / float(u.au.to(u.m))
        scene = _sdi_scene(src, n, scale, rsun_arcsec, ref, 1.0)
        truth = ndimage.gaussian_filter(scene, _smooth_sigma_px(spec, scale), mode="nearest").astype(np.float64)
        e_day = lasp.on(d) * (1.0 + delta) * (1.0 + float(e))  # photons cm-2 s-1 at 1 au
        # the irradiance within IRRADIANCE_RADIUS_RSUN (1.2 Rsun), as in single frames and the chain
        _scale_to_irradiance(truth, rsun_arcsec / scale, scale, e_day, dsun_au)
        truths.append(truth.astype(np.float32))
        e_true.append(e_day)
        rsun.append(rsun_arcsec)

    if detector is None:
        flat = _flat_field(n, spec.naxis, model, rng)
        bias, dark_rate = _dark_planes(n, model, rng)
    else:
        flat, bias, dark_rate = (np.asarray(detector[k], dtype=np.float32) for k in ("flat", "bias", "dark_rate"))
        if any(a.shape != (n, n) for a in (flat, bias, dark_rate)):
            raise ValueError(f"detector planes must be {n}x{n}")
    c_safe = _radiometric_coefficient(max(float(tr.max()) for tr in truths), flat, bias, dark_rate, model)
    c_given = float(f"{c_safe * rng.uniform(1.02, 1.25):.4g}")
    years_of = lambda t: float((t - LAUNCH).to_value(u.day)) / 365.25  # noqa: E731
    y_first, y_last = years_of(times[0]), years_of(times[-1])
    if sensitivity_extra is None:
        extra = lambda y: 1.0  # noqa: E731
    else:  # C is inverse to the sensitivity; 1 at the anchor, so the anchored frame keeps its coefficient
        y_ref = years_of(Time(coefficient_anchor[0])) if coefficient_anchor is not None else y_first
        s_ref = float(sensitivity_extra(y_ref, y_first, y_last))
        extra = lambda y: s_ref / float(sensitivity_extra(y, y_first, y_last))  # noqa: E731
    if coefficient_anchor is None:
        while True:
            c_hidden = c_safe * float(rng.uniform(1.02, 1.25))
            if abs(math.log(c_hidden / c_given)) >= 0.05:
                break
    else:
        t_a, c_a = coefficient_anchor
        if not float(c_a) > 0:
            raise ValueError("the anchor coefficient must be positive")
        c_hidden = float(c_a) * math.exp(-rate * years_of(Time(t_a)))
        while abs(math.log(c_hidden / c_given)) < 0.05:  # the given value stays at least 5 % off
            c_given = float(f"{c_safe * rng.uniform(1.02, 1.25):.4g}")
        c_min = min(c_hidden * math.exp(rate * years_of(t)) * extra(years_of(t)) for t in times)
        if c_min < c_safe:  # shorter exposures keep the brightest frame below 16 bits
            t_exp = model.exptime_s * c_min / c_safe
            e = math.floor(math.log10(t_exp)) - 2
            model = dataclasses.replace(model, exptime_s=math.floor(t_exp / 10.0 ** e) * 10.0 ** e)
    valid_from = (Time(dt.datetime.combine(days[0], dt.time())) - 30 * u.day).utc.strftime("%Y-%m-%dT00:00:00")
    valid_to = (Time(dt.datetime.combine(days[-1], dt.time())) + 30 * u.day).utc.strftime("%Y-%m-%dT00:00:00")
    cal_infos = _write_masters(out, "SDI", spec, model, n, flat, bias, dark_rate, c_given, None, valid_from, valid_to,
                               _iso(times[0]))

    raw_files, date_obs, true_coefs = [], [], []
    for k, (t, truth, rs) in enumerate(zip(times, truths, rsun)):
        c_true = c_hidden * math.exp(rate * years_of(t))
        if sensitivity_extra is not None:
            c_true *= extra(years_of(t))
        x0, y0, roll = _detector_geometry(model, n, rng)
        raw = _forward_model(truth, spec, model, n, x0, y0, roll, rs / scale, None, flat, bias, dark_rate, c_true,
                             noise, rng)
        name = f"lst_sdi_{t.utc.to_datetime().strftime('%Y%m%dT%H%M%S')}_raw.fits"
        notes = [f"radiometric campaign day {k + 1}/{len(times)}: scene irradiance set to the LASP composite of "
                 f"the day with the series' errors (hidden); SWAP 174 A structure of 2012-01-01"]
        h = _raw_header(spec, t, model, scale, x0, y0, roll, "PROBA2/SWAP 174 A 2012-01-01", name, notes)
        path = out / "raw" / name
        _write(fits.HDUList([fits.PrimaryHDU(raw, header=h)]), path, _iso(t))
        raw_files.append(path)
        date_obs.append(_iso(t))
        true_coefs.append(c_true)
    if not raw_files:
        raise DataError("no campaign frame written")
    truth_doc = {"hidden_coefficient_at_launch": c_hidden, "launch": LAUNCH.isot, "rate_per_year": rate,
                 "given_coefficient": c_given, "lasp_scale_error": delta, "lasp_daily_errors": [float(e) for e in eps],
                 "days": [{"date_obs": d, "true_irradiance_ph_cm2_s": e, "true_coefficient": c}
                          for d, e, c in zip(date_obs, e_true, true_coefs)],
                 "naxis": n, "noise": noise, "seed": seed, "exptime_s": model.exptime_s,
                 "detector_given": detector is not None,
                 "coefficient_anchor": None if coefficient_anchor is None else
                 [Time(coefficient_anchor[0]).utc.isot, float(coefficient_anchor[1])]}
    if sensitivity_extra is not None:  # hidden_coefficient() then lacks the extra factor: use "days"
        truth_doc["sensitivity_extra"] = True
    tp = out / "truth" / "campaign_truth.json"
    tp.write_text(json.dumps(truth_doc, indent=2) + "\n")
    return CampaignResult(out_dir=out, raw_files=raw_files, date_obs=date_obs, calibration_files=cal_infos,
                          given_coefficient=c_given, truth_path=tp, naxis=n)


def hidden_coefficient(truth: dict, t: Time | str) -> float:
    """The hidden ``C_true(t)`` of a campaign's truth document (scoring only)."""
    tt = t if isinstance(t, Time) else Time(str(t), scale="utc")
    years = float((tt - Time(truth["launch"], scale="utc")).to_value(u.day)) / 365.25
    return float(truth["hidden_coefficient_at_launch"]) * math.exp(float(truth["rate_per_year"]) * years)
