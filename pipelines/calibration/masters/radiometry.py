"""Radiometric cross-calibration of SDI against the LASP composite and PROBA2/LYRA Lyman-alpha irradiance.

In flight the SDI radiometric coefficient (``RADCOEF``, erg cm-2 s-1 sr-1 per DN/s) is not
known from the ground to better than tens of per cent, and Lyman-alpha instruments lose
sensitivity in orbit (contamination of the optics and filters; PROBA2/LYRA's Lyman-alpha
channel lost most of its response within months: BenMoussa et al. 2013, "On-orbit degradation
of solar instruments", Sol. Phys. 288, 389, which reviews LYRA, SOHO and other FUV/EUV
instruments). This module derives both from the data, the way irradiance instruments are
tied together:

1. :func:`disk_integrated_irradiance`: the Lyman-alpha irradiance of one calibrated SDI
   frame, ``E = sum(L * Omega_pix) * (DSUN_OBS / 1 au)**2`` over every pixel out to the field
   stop (``FOVRAD``, 1.2 Rsun: the disk, the limb-brightened chromosphere and the inner
   corona), DQ-flagged pixels filled by the mean of the good ones at the same radius
   (annuli of 0.01 Rsun); in W m-2 and photons cm-2 s-1 (Lyman-alpha photon energy at
   121.567 nm).
2. The ratio ``r_i = E_SDI,i / E_ref,i`` to the LASP composite on the same day (the LYRA
   daily mean on the LYRA day, reported beside it), frames calibrated with the coefficient
   the chain is given (``C_g``).
3. :func:`fit_cross_calibration`: weighted least squares of
   ``ln r(t) = ln(C_g / C0) - lambda (t - t0)`` over the campaign: the coefficient ``C0`` at
   the epoch ``t0`` and the exponential sensitivity-loss rate ``lambda`` [1/yr], with their
   standard errors (covariance scaled by the reduced chi-square when it exceeds 1), i.e.
   ``C(t) = C0 exp(lambda (t - t0))``.
4. :func:`write_radiometric_master`: a ``radiometric`` calibration master with that law
   (``RADCOEF`` at ``RADEPOCH``, ``RADRATE``, their errors, ``RADREF``) and a validity
   interval; :func:`coefficient_at` evaluates it at a frame's DATE-OBS, which
   :func:`pipelines.calibration.l2.flow.calibrate_frame` does for every frame (a master without
   ``RADRATE`` is constant, as before).

Reference series (``sample-data/real/lyman-alpha``, MANIFEST.md)
-----------------------------------------------------------------
* LASP composite Lyman-alpha (Woods et al. 2000, JGR 105, 27195; Machol et al. 2019, Earth
  Space Sci. 6, 2263), daily, 1997-001 to 2013-365, [1e11 photons cm-2 s-1] at 1 au. The
  shipped file states **no uncertainty** (columns ``time, LymanAlpha, type``).
  :data:`LASP_SCALE_UNCERTAINTY` (absolute scale, 5 %, 1 sigma) is the UARS SOLSTICE scale's
  (10 % at 2 sigma: Woods et al. 1996, JGR 101, 9541, and the SOLSTICE requirement), to which
  the composite is referenced (see the constant); :data:`LASP_DAILY_SCATTER` (day-to-day
  noise) is measured from the file itself by :func:`lasp_daily_scatter`.
* PROBA2/LYRA level 2, channel 1 (Lyman-alpha, 120-123 nm) [W m-2], 2012-01-01 only (no
  other LYRA day is in the sample data). Its header states no uncertainty either.

One irradiance convention (issue 27 item 6)
-------------------------------------------
The Lyman-alpha irradiance of the Sun, here and in the simulator, is the radiance integrated
over the solid angle within :data:`IRRADIANCE_RADIUS_RSUN` = 1.2 Rsun of the disk centre (the
disk, the limb-brightened chromosphere and the inner corona to SDI's field stop), moved to 1 au.
:func:`disk_integrated_irradiance` measures it; the simulator's single frames and series and
its radiometric campaign set their scene to the LASP value under it
(``pipelines.simulation.scenes._scale_to_irradiance``). The whole-Sun references also see the
corona beyond 1.2 Rsun, at most :data:`CORONA_BEYOND_RADIUS_FRACTION` (2.5e-4) of the total: a
term of the budget below, not a correction.

Before (issue 14, main's SDI frame of 2012-01-01 00:16 at 256 px with its given ``RADCOEF``)
SDI read 1.030 x LASP and 1.213 x LYRA: the single frames put the LASP value on the *disk
alone* (disk-average radiance = E / Omega_sun), so the limb and inner corona added 3.0 % (the
disk holds 0.967 of the integral), while the campaign scaled the whole square frame. Now the
same frame reads 1.0002 x LASP and 1.1777 x LYRA, i.e. the LASP/LYRA ratio of that day.

Two references and their budget
-------------------------------
The two series disagree by 1.1775x on 2012-01-01: LASP 4.57e11 photons cm-2 s-1 = 7.47e-3
W m-2, LYRA channel 1 6.34e-3 W m-2 (daily median of the file). :func:`reference_budget` states
what covers it, relative 1 sigma, in quadrature:

========================  ========  =====================================================
term                      value     source
========================  ========  =====================================================
LASP absolute scale       0.05      :data:`LASP_SCALE_UNCERTAINTY` (UARS SOLSTICE scale)
LYRA absolute scale       0.11      :data:`LYRA_SCALE_UNCERTAINTY` (BenMoussa et al. 2009)
LASP daily value          0.0040    :data:`LASP_DAILY_SCATTER` (measured from the file)
LYRA daily value          2e-5      standard error of the day's samples (the file)
corona beyond 1.2 Rsun    2.5e-4    :data:`CORONA_BEYOND_RADIUS_FRACTION`
total                     0.121
========================  ========  =====================================================

ln 1.1775 = 0.163 = 1.35 sigma: within :data:`REFERENCE_AGREEMENT_K` = 2. Not in the budget
(stated by no provider, so the total is a lower bound): LYRA's level-2 correction of channel
1's in-flight degradation (see :data:`LYRA_SCALE_UNCERTAINTY`). LASP's scale alone (5 %) would
make the disagreement 3.3 sigma. LASP (continuous over 1997-2013) is the reference SDI's law is
fitted to, LYRA the check; :func:`compare_with_reference` makes the check either way (SDI tied to
LASP against LYRA, SDI tied to LYRA by :func:`cross_calibrate_on_day` against LASP) and the
same z (+-1.35) results (``tests/validation/test_reference_radiometry.py``, the real files).
After a campaign's fit SDI follows the series it is tied to: SDI/LASP = 1.000 on average over
the campaign (RMS 0.2-0.4 % per day) and SDI/LYRA on 2012-01-01 = 1.168-1.178 (blind runs).

A law of the wrong shape
------------------------
The fit assumes ``C(t) = C0 exp(lambda (t - t0))``. :func:`_law_mismatch` tests the residuals of
every day (outliers included) against two alternatives with one parameter more, a step in
sensitivity between any two observing days and a curvature of ln C (a fast early loss), by the
largest chi-square drop against its parametric-bootstrap null distribution; below
:data:`MISMATCH_P` the fit carries ``law_mismatch`` and the master ``RADMISFL = 'STEP'`` or
``'CURVE'`` with ``RADMISP`` (the master is written, flagged, not refused: the chain still
calibrates with the best exponential law, and the flag says its shape is refuted). Measured on
synthetic campaign ratios (the campaign's day layout, 13 days, the composite's daily noise,
200 seeds each, ``validation.families.Degradation`` drawn in its ranges): the exponential law
flagged 2/200; a step (1-4 %) 158/200, those missed within 1.5 % of the truth; a fast early
loss (2-6 %, e-folding 5-30 % of the span) 164/200, 19 missed by more than 1 %, at most 4.0 %.
A one-day outlier (a flare snapshot) on the campaign's first or last day is flagged ``STEP``
too (20 of 100 outliers at random days, all at an end): one day cannot tell them apart.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from astropy import constants as const
from astropy import units as u
from astropy.io import fits
from astropy.time import Time

from pipelines.errors import DataError

__all__ = ["LYA_WAVELENGTH_NM", "LYA_PHOTON_J", "LASP_SCALE_UNCERTAINTY", "LASP_DAILY_SCATTER", "CHI2_ACCEPT",
           "CLIP_SIGMA", "IRRADIANCE_RADIUS_RSUN", "LYRA_SCALE_UNCERTAINTY", "CORONA_BEYOND_RADIUS_FRACTION",
           "REFERENCE_AGREEMENT_K", "MISMATCH_P", "reference_budget", "ReferenceCheck", "cross_calibrate_on_day",
           "compare_with_reference",
           "LyaSeries", "read_lasp_composite", "read_lyra_level2", "lyra_daily_irradiance", "lasp_daily_scatter",
           "disk_integrated_irradiance", "CrossCalibration", "fit_cross_calibration", "write_radiometric_master",
           "radiometric_uncertainty_at", "coefficient_at", "ph_cm2_s_to_w_m2", "w_m2_to_ph_cm2_s"]

#: The project's one Lyman-alpha irradiance convention [Rsun]: the irradiance of the Sun is the
#: radiance integrated over the solid angle within this radius of the disk centre (the disk, the
#: limb-brightened chromosphere and the inner corona out to SDI's field stop, ``FOVRAD``; the part
#: of that circle on the frame), moved to 1 au. The simulator's single frames and series
#: (:mod:`pipelines.simulation.truth`), its radiometric campaign
#: (:mod:`pipelines.simulation.campaign`) and the chain (:func:`disk_integrated_irradiance`)
#: all use it, and it is what the LASP composite and LYRA are compared with. Beyond 1.2 Rsun the
#: Lyman-alpha corona adds :data:`CORONA_BEYOND_RADIUS_FRACTION` of the irradiance, which
#: neither reference separates (whole-Sun radiometers): a term of :func:`reference_budget`.
IRRADIANCE_RADIUS_RSUN = 1.2

#: Hydrogen Lyman-alpha wavelength [nm] (vacuum, the 1s-2p multiplet's weighted centre; NIST ASD).
LYA_WAVELENGTH_NM = 121.567

#: Energy of one Lyman-alpha photon [J]: h c / 121.567 nm = 1.634e-18 J.
LYA_PHOTON_J = float((const.h * const.c / (LYA_WAVELENGTH_NM * u.nm)).to_value(u.J))

#: Relative uncertainty of the LASP composite's absolute scale (1 sigma): 0.05 is the 1 sigma
#: of a 10 % (2 sigma) scale. The shipped file states none; the value follows from the scale
#: the composite is referenced to. The composite scales every instrument it merges (AE-E,
#: SME, SORCE SOLSTICE, TIMED SEE) to the UARS SOLSTICE reference level (Woods et al. 2000,
#: JGR 105, 27195; LASP SEE note "Lyman-Alpha Time Series Updated", 2007: TIMED and SORCE
#: "scaled to match the UARS reference level"), so its absolute scale is UARS SOLSTICE's.
#: UARS SOLSTICE and SUSIM agree with ATLAS 1 and 2 (ATLAS SUSIM, SSBUV) to within the 2 sigma
#: uncertainty of any one instrument, 5-10 % for strong emission features below 160 nm
#: (Woods et al. 1996, JGR 101, 9541); the SOLSTICE requirement was +-10 % (2 sigma) absolute
#: (LASP SOLSTICE project description). The upper end, 10 % at 2 sigma, gives 5 % at 1 sigma.
#: The composite's revision (Machol et al. 2019, Earth Space Sci. 6, 2263, "An Improved
#: Lyman-Alpha Composite": daily values from 1947 from AE-E, SME, UARS and SORCE, gaps filled
#: by Mg II, F10.7 and F30 proxy models) postdates the shipped file (a copy first seen in
#: 2014, ``sample-data/real/MANIFEST.md``), which is thus the earlier composite; no scale
#: uncertainty of the revision is claimed here.
LASP_SCALE_UNCERTAINTY = 0.05

#: Day-to-day relative noise of the LASP composite: the value :func:`lasp_daily_scatter`
#: measures from the shipped file (robust RMS of the second difference of ln E over three
#: consecutive days / sqrt(6), so that the smooth solar variation cancels). Recomputed by
#: ``tests/validation/test_blind_radiometry.py``.
LASP_DAILY_SCATTER = 0.0040

#: Largest reduced chi-square of an accepted fit: the ratios may scatter up to 3x the
#: reference's stated daily noise (frame-level effects the noise model leaves out); beyond,
#: the frames and the reference do not describe the same days (a wrong day, a bad frame, a
#: flare day) and :func:`write_radiometric_master` refuses the fit.
CHI2_ACCEPT = 9.0

#: A day whose ratio is more than this many sigma off the fit is left out (one at a time, the
#: worst first), at most :data:`MAX_REJECT_FRACTION` of the days: an SDI snapshot during a
#: flare against a daily mean, or a bad frame.
CLIP_SIGMA = 5.0
MAX_REJECT_FRACTION = 0.2

#: Relative uncertainty of PROBA2/LYRA's absolute scale (1 sigma): 0.11, the upper end of the
#: total relative uncertainty of LYRA's radiometric calibration, 1-11 % across its channels and
#: detectors (BenMoussa et al. 2009, A&A 508, 1085, "Pre-flight calibration of LYRA": PTB/BESSY II
#: synchrotron radiometry), taken for channel 1 (Lyman-alpha). The level-2 file states none. Not
#: included (the provider states no number, so the budget is a lower bound there): the level-2
#: correction of the in-flight degradation, severe for channel 1 of the nominal unit ("very low
#: signal-to-noise ratio ... to be used with caution after mid-2010", PROBA2 Science Center,
#: LYRA level 2 page; BenMoussa et al. 2013, Sol. Phys. 288, 389).
LYRA_SCALE_UNCERTAINTY = 0.11

#: Share of the whole-Sun Lyman-alpha irradiance beyond :data:`IRRADIANCE_RADIUS_RSUN`: 2.5e-4,
#: the integral from 1.2 to 10 Rsun of a bright-streamer Lyman-alpha corona all round the Sun
#: (Baumbach's K-corona radial shape, 8.5e-5 of the disk-average radiance at 1.5 Rsun: streamer
#: intensities of 1e11-1e12 photons cm-2 s-1 sr-1 at 1.5 Rsun from Spartan 201 and SOHO/UVCS,
#: Kohl et al. 1995, Sol. Phys. 162, 313; resonant scattering, Gabriel 1971, Sol. Phys. 21, 392;
#: the simulator's ``lyman_alpha_corona``, integrated with scipy ``quad``) over the disk plus
#: the corona to 1.2 Rsun; an upper bound (streamers
#: do not fill every position angle). The references are whole-Sun radiometers; SDI's integral
#: stops at 1.2 Rsun: a term of :func:`reference_budget` (negligible beside the scales).
CORONA_BEYOND_RADIUS_FRACTION = 2.5e-4

#: Coverage factor of :func:`compare_with_reference`: two irradiances agree when their log
#: ratio is within this many combined standard uncertainties (2: about 95 % for a Gaussian).
REFERENCE_AGREEMENT_K = 2.0

#: Model-mismatch test of :func:`fit_cross_calibration`: the fitted exponential law is flagged
#: (``law_mismatch``; ``RADMISFL``/``RADMISP`` in the master) when a law of another shape fits the
#: same ratios significantly better: a step in sensitivity at any date between two observing
#: days, or a curvature of ln C(t) (a fast early loss), each an extra parameter tested by the
#: chi-square drop of nested least-squares models (Bevington & Robinson 2003, sect. 11.4), the
#: largest over the alternatives and dates, its null distribution by parametric bootstrap
#: (:func:`_law_mismatch`). Flagged below this family-wise false-alarm probability (ours: one
#: correct law in a hundred flagged).
MISMATCH_P = 0.01
#: Parametric-bootstrap draws of the mismatch test's null distribution (p resolution 1/2000).
MISMATCH_BOOTSTRAP = 2000

_AU_M = float(const.au.to_value(u.m))
_YEAR_DAYS = 365.25
_ERG_CM2_S_TO_W_M2 = 1e-3


def ph_cm2_s_to_w_m2(photons_cm2_s: float) -> float:
    """Lyman-alpha photon irradiance [photons cm-2 s-1] to energy irradiance [W m-2]."""
    return float(photons_cm2_s) * 1e4 * LYA_PHOTON_J


def w_m2_to_ph_cm2_s(w_m2: float) -> float:
    """Lyman-alpha energy irradiance [W m-2] to photon irradiance [photons cm-2 s-1]."""
    return float(w_m2) / (1e4 * LYA_PHOTON_J)


# --------------------------------------------------------------------------- reference series


@dataclass
class LyaSeries:
    """A daily Lyman-alpha irradiance series at 1 au.

    Attributes
    ----------
    name : str
        ``LASP`` or ``LYRA``.
    days : dict of datetime.date to float
        Irradiance [photons cm-2 s-1] per UTC day.
    rel_uncertainty : float
        Relative uncertainty of one day's value against the series' own scale (1 sigma).
    scale_uncertainty : float
        Relative uncertainty of the series' absolute scale (1 sigma).
    source : str
        The file read.
    """

    name: str
    days: dict[dt.date, float]
    rel_uncertainty: float
    scale_uncertainty: float
    source: str
    kind: dict[dt.date, int] = field(default_factory=dict)

    def on(self, day: dt.date | Time | str) -> float:
        """Irradiance [photons cm-2 s-1] on the UTC day of ``day``; DataError if the series has no value that day."""
        d = _utc_day(day)
        try:
            return self.days[d]
        except KeyError:
            raise DataError(f"{self.name} Lyman-alpha series has no value on {d.isoformat()}") from None

    def shifted(self, n_days: int) -> "LyaSeries":
        """The series with every value moved ``n_days`` later, wrapped around its span (tests:
        the wrong day's irradiance on every day the series covers)."""
        first, last = min(self.days), max(self.days)
        span = (last - first).days + 1
        out = {}
        for d in self.days:
            src = first + dt.timedelta(days=((d - first).days - int(n_days)) % span)
            if src in self.days:
                out[d] = self.days[src]
        return LyaSeries(self.name + f"{n_days:+d}d", out, self.rel_uncertainty, self.scale_uncertainty,
                         self.source)


def _utc_day(day: dt.date | Time | str) -> dt.date:
    if isinstance(day, dt.datetime):
        return day.date()
    if isinstance(day, dt.date):
        return day
    t = day if isinstance(day, Time) else Time(str(day), scale="utc")
    return t.utc.to_datetime().date()


def read_lasp_composite(path: str | Path) -> LyaSeries:
    """Read the LASP composite Lyman-alpha file (``time,LymanAlpha,type``; YYYYDDD, 1e11 photons cm-2 s-1).

    Returns
    -------
    LyaSeries
        ``days`` in photons cm-2 s-1; ``rel_uncertainty`` = :data:`LASP_DAILY_SCATTER`,
        ``scale_uncertainty`` = :data:`LASP_SCALE_UNCERTAINTY`.

    Raises
    ------
    DataError
        If the file is missing or holds no valid row.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"LASP Lyman-alpha composite not found: {p}")
    days: dict[dt.date, float] = {}
    kinds: dict[dt.date, int] = {}
    with open(p) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 2:
                continue
            try:
                key, val = int(parts[0]), float(parts[1])
            except ValueError:
                continue  # the header row
            if not (math.isfinite(val) and val > 0):
                continue
            d = dt.date(key // 1000, 1, 1) + dt.timedelta(days=key % 1000 - 1)
            days[d] = val * 1e11
            kinds[d] = int(parts[2]) if len(parts) > 2 and parts[2].strip().isdigit() else 0
    if not days:
        raise DataError(f"{p.name}: no Lyman-alpha values")
    return LyaSeries("LASP", days, LASP_DAILY_SCATTER, LASP_SCALE_UNCERTAINTY, p.name, kinds)


def lasp_daily_scatter(series: LyaSeries) -> float:
    """Day-to-day relative noise of a daily series, measured from the series itself.

    ``1.4826 * MAD(d2) / sqrt(6)`` with ``d2 = ln E[i-1] - 2 ln E[i] + ln E[i+1]`` over
    runs of three consecutive days: white noise of relative RMS ``s`` gives
    ``var(d2) = 6 s**2``; the solar variation, smooth over three days, cancels to first order
    (what remains of it makes this an upper bound).
    """
    ds = sorted(series.days)
    d2 = []
    for a, b, c in zip(ds, ds[1:], ds[2:]):
        if (c - a).days == 2:
            d2.append(math.log(series.days[a]) - 2 * math.log(series.days[b]) + math.log(series.days[c]))
    if len(d2) < 10:
        raise DataError("too few consecutive days to measure the series' scatter")
    v = np.asarray(d2)
    return float(1.4826 * np.median(np.abs(v - np.median(v))) / math.sqrt(6.0))


def read_lyra_level2(path: str | Path, channel: int = 1) -> tuple[Time, np.ndarray]:
    """PROBA2/LYRA level-2 irradiance of one channel (channel 1: Lyman-alpha 120-123 nm) [W m-2].

    Parameters
    ----------
    path : path-like
        A LYRA ``lev2_std`` FITS file (BINTABLE ``TIME`` [s after DATE-OBS], ``CHANNEL1..4``).

    Returns
    -------
    times : astropy.time.Time, shape (N,)
    irradiance : numpy.ndarray, shape (N,) [W m-2]
        Finite positive samples only.

    Raises
    ------
    DataError
        If the file is missing, not a LYRA level-2 table, or has no valid sample.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"LYRA file not found: {p}")
    try:
        with fits.open(p, memmap=False) as h:
            if str(h[0].header.get("INSTRUME", "")).strip() != "LYRA":
                raise DataError(f"{p.name} is not a LYRA file (INSTRUME={h[0].header.get('INSTRUME')!r})")
            t0 = Time(str(h[0].header["DATE-OBS"]), scale="utc")
            tab = h[1].data
            secs = np.asarray(tab["TIME"], dtype=np.float64)
            val = np.asarray(tab[f"CHANNEL{int(channel)}"], dtype=np.float64)
    except DataError:
        raise
    except (OSError, KeyError, IndexError, ValueError) as exc:
        raise DataError(f"unreadable LYRA level-2 file {p.name}: {exc}") from None
    good = np.isfinite(val) & (val > 0) & np.isfinite(secs)
    if not good.any():
        raise DataError(f"{p.name}: no valid channel-{channel} sample")
    return t0 + secs[good] * u.s, val[good]


def lyra_daily_irradiance(path: str | Path) -> LyaSeries:
    """The LYRA Lyman-alpha daily value (median of the day's samples) as a :class:`LyaSeries`.

    ``rel_uncertainty`` is the robust relative scatter of the day's samples over sqrt(N)
    (the standard error of the daily value); ``scale_uncertainty`` is
    :data:`LYRA_SCALE_UNCERTAINTY` (the file states none; see the constant for its source).
    """
    t, e = read_lyra_level2(path)
    days: dict[dt.date, float] = {}
    errs = []
    keys = np.array([d.date() for d in t.utc.to_datetime()])
    for d in sorted(set(keys)):
        v = e[keys == d]
        med = float(np.median(v))
        days[d] = w_m2_to_ph_cm2_s(med)
        errs.append(1.4826 * float(np.median(np.abs(v - med))) / med / math.sqrt(len(v)))
    return LyaSeries("LYRA", days, float(max(errs)), LYRA_SCALE_UNCERTAINTY, Path(path).name)


# --------------------------------------------------------------------------- two references


def reference_budget(a: LyaSeries, b: LyaSeries, *, sdi_rel_err: float = 0.0) -> dict[str, float]:
    """Error budget of an irradiance tied to series ``a`` compared with series ``b`` on one day.

    Relative 1-sigma terms, independent, added in quadrature (Bevington & Robinson 2003, ch. 3):
    each series' absolute scale (``scale_uncertainty``: :data:`LASP_SCALE_UNCERTAINTY`,
    :data:`LYRA_SCALE_UNCERTAINTY`), each one's daily value (``rel_uncertainty``), the SDI
    measurement's own (``sdi_rel_err``: photometry, the cross-calibration fit) and the corona
    beyond :data:`IRRADIANCE_RADIUS_RSUN` that the whole-Sun references see and SDI's integral
    does not (:data:`CORONA_BEYOND_RADIUS_FRACTION`). The same budget bounds ``a / b`` itself.

    Returns
    -------
    dict of str to float
        One entry per term (``"<name> scale"``, ``"<name> daily"``, ``"SDI"``,
        ``"corona beyond 1.2 Rsun"``) and ``"total"`` (their quadrature sum).

    Raises
    ------
    DataError
        If a series states no (finite) scale uncertainty: no budget can be made.
    """
    terms: dict[str, float] = {}
    for ser in (a, b):
        if not (math.isfinite(ser.scale_uncertainty) and ser.scale_uncertainty >= 0):
            raise DataError(f"{ser.name} states no scale uncertainty: no error budget against it")
        terms[f"{ser.name} scale"] = float(ser.scale_uncertainty)
        terms[f"{ser.name} daily"] = float(ser.rel_uncertainty)
    terms["SDI"] = float(sdi_rel_err)
    terms[f"corona beyond {IRRADIANCE_RADIUS_RSUN:g} Rsun"] = CORONA_BEYOND_RADIUS_FRACTION
    terms["total"] = math.sqrt(sum(v * v for v in terms.values()))
    return terms


@dataclass(frozen=True)
class ReferenceCheck:
    """SDI's irradiance, tied to one reference series, checked against another on one day.

    Attributes
    ----------
    tied_to, checked_against : str
        The series SDI's scale comes from and the one it is compared with.
    day : datetime.date
    ratio : float
        ``E_SDI / E_check`` (dimensionless).
    sigma : float
        Combined relative 1-sigma uncertainty of the ratio (:func:`reference_budget` total).
    z : float
        ``ln(ratio) / sigma``.
    within : bool
        ``|z| <= k`` (:data:`REFERENCE_AGREEMENT_K` by default).
    budget : dict of str to float
        The terms of ``sigma``.
    """

    tied_to: str
    checked_against: str
    day: dt.date
    ratio: float
    sigma: float
    z: float
    within: bool
    budget: dict[str, float]


def cross_calibrate_on_day(e_sdi: float, day: dt.date | Time | str, reference: LyaSeries) -> float:
    """One-day cross-calibration factor ``E_ref / E_SDI`` (multiply SDI's coefficient by it).

    ``e_sdi`` [photons cm-2 s-1 at 1 au, > 0]; DataError if ``reference`` has no value that day,
    ValueError for a non-positive irradiance.
    """
    if not (math.isfinite(e_sdi) and e_sdi > 0):
        raise ValueError(f"SDI irradiance must be a positive number, got {e_sdi!r}")
    return reference.on(day) / float(e_sdi)


def compare_with_reference(e_sdi: float, day: dt.date | Time | str, tied_to: LyaSeries, check: LyaSeries, *,
                           sdi_rel_err: float = 0.0, k: float = REFERENCE_AGREEMENT_K) -> ReferenceCheck:
    """Check SDI's irradiance (its scale tied to ``tied_to``) against ``check`` within their budget.

    Parameters
    ----------
    e_sdi : float
        SDI's irradiance at 1 au [photons cm-2 s-1] on ``day``, calibrated with a coefficient
        cross-calibrated against ``tied_to`` (:func:`fit_cross_calibration` or
        :func:`cross_calibrate_on_day`), > 0.
    day : datetime.date, astropy.time.Time or str
    tied_to, check : LyaSeries
        E.g. LASP and LYRA, or the reverse.
    sdi_rel_err : float
        Relative 1-sigma error of SDI's value beyond the scale of ``tied_to`` (fit, photometry).
    k : float
        Coverage factor.

    Returns
    -------
    ReferenceCheck

    Raises
    ------
    DataError
        If ``check`` has no value that day or a series states no scale uncertainty.
    ValueError
        For a non-positive irradiance.

    Notes
    -----
    Measured on the real files (2012-01-01, ``tests/validation/test_reference_radiometry.py``):
    LASP/LYRA = 1.1775 (LASP 4.57e11 photons cm-2 s-1, LYRA channel 1 6.34e-3 W m-2, daily
    median); budget 0.121 (LASP scale 0.05, LYRA scale 0.11, daily 0.004 and 2e-5, corona
    2.5e-4): ln 1.1775 = 0.163 is 1.35 sigma, within k = 2. An SDI tied to either series reads
    the same ratio to the other.
    """
    if not (math.isfinite(e_sdi) and e_sdi > 0):
        raise ValueError(f"SDI irradiance must be a positive number, got {e_sdi!r}")
    budget = reference_budget(tied_to, check, sdi_rel_err=sdi_rel_err)
    ratio = float(e_sdi) / check.on(day)
    z = math.log(ratio) / budget["total"]
    return ReferenceCheck(tied_to=tied_to.name, checked_against=check.name, day=_utc_day(day), ratio=ratio,
                          sigma=budget["total"], z=z, within=abs(z) <= k, budget=budget)


# --------------------------------------------------------------------------- SDI irradiance


def disk_integrated_irradiance(data: np.ndarray, dq: np.ndarray | None, header: fits.Header, *,
                               r_max_rsun: float | None = None, annulus_rsun: float = 0.01) -> dict[str, float]:
    """Lyman-alpha irradiance of a calibrated SDI frame, at the observer and at 1 au.

    Parameters
    ----------
    data : numpy.ndarray, shape (ny, nx) [erg cm-2 s-1 sr-1]
        L2 radiance; NaN where unknown.
    dq : numpy.ndarray, shape (ny, nx), or None
        DQ bits; non-zero pixels are filled like NaN ones.
    header : astropy.io.fits.Header
        L2 header: helioprojective WCS, ``DSUN_OBS`` [m], ``BUNIT``.
    r_max_rsun : float, optional
        Outer radius of the integral [Rsun]; default the header's ``FOVRAD`` or 1.2 (SDI's
        field, LST.md).
    annulus_rsun : float
        Width of the annuli whose good-pixel mean fills the bad pixels [Rsun].

    Returns
    -------
    dict
        ``irradiance_obs_w_m2`` (at the observer), ``irradiance_w_m2`` and
        ``irradiance_ph_cm2_s`` (at 1 au), ``disk_fraction`` (share within 1 Rsun),
        ``filled_fraction`` (share of the pixels within ``r_max`` that were filled),
        ``dsun_au``, ``r_max_rsun``.

    Raises
    ------
    DataError
        If ``BUNIT`` is not ``erg cm-2 s-1 sr-1``, the header has no WCS or ``DSUN_OBS``, or
        an annulus has no good pixel.

    Notes
    -----
    Pixel solid angle ``|det(PC * CDELT)|`` [arcsec**2] converted to sr (the TAN projection's
    pixel solid angle differs from it by ``cos**3`` of the angle from the centre, < 5e-5 at
    1.2 Rsun). The irradiance scales with the inverse square of the distance:
    ``E_1au = E_obs * (DSUN_OBS / 1 au)**2`` (IAU 2012 au).
    """
    from pipelines.sun import radius_map, sun_geometry

    bunit = str(header.get("BUNIT", "")).strip()
    if bunit != "erg cm-2 s-1 sr-1":
        raise DataError(f"disk-integrated irradiance needs radiance in erg cm-2 s-1 sr-1, got BUNIT={bunit!r}")
    try:
        dsun = float(header["DSUN_OBS"])
    except (KeyError, TypeError, ValueError):
        raise DataError("the header has no DSUN_OBS: the irradiance cannot be moved to 1 au") from None
    if not (math.isfinite(dsun) and dsun > 0):
        raise DataError(f"unusable DSUN_OBS {header.get('DSUN_OBS')!r}")
    geo = sun_geometry(header)
    img = np.asarray(data, dtype=np.float64)
    rho = radius_map(img.shape, geo)
    if r_max_rsun is None:
        r_max_rsun = float(header.get("FOVRAD", IRRADIANCE_RADIUS_RSUN))
    good = np.isfinite(img)
    if dq is not None:
        good &= np.asarray(dq) == 0
    inside = rho <= r_max_rsun
    bins = np.minimum((rho[inside] / annulus_rsun).astype(np.int64), int(r_max_rsun / annulus_rsun))
    g = good[inside]
    vals = np.where(g, img[inside], 0.0)
    nb = int(bins.max()) + 1
    s_good = np.bincount(bins, weights=vals, minlength=nb)
    n_good = np.bincount(bins, weights=g.astype(np.float64), minlength=nb)
    n_all = np.bincount(bins, minlength=nb).astype(np.float64)
    occupied = n_all > 0
    if np.any(occupied & (n_good == 0)):
        raise DataError("an annulus of the frame has no good pixel: the irradiance cannot be filled in")
    mean = np.divide(s_good, n_good, out=np.zeros_like(s_good), where=n_good > 0)
    total_px = s_good + (n_all - n_good) * mean  # sum of radiance over the pixels, bad ones filled
    omega_pix = abs(float(np.linalg.det(geo.matrix))) * (math.pi / (180.0 * 3600.0)) ** 2  # sr
    e_obs = float(total_px.sum()) * omega_pix * _ERG_CM2_S_TO_W_M2
    edges = np.arange(nb) * annulus_rsun
    disk = float(total_px[edges + annulus_rsun <= 1.0 + 1e-9].sum())
    e_1au = e_obs * (dsun / _AU_M) ** 2
    return {"irradiance_obs_w_m2": e_obs, "irradiance_w_m2": e_1au, "irradiance_ph_cm2_s": w_m2_to_ph_cm2_s(e_1au),
            "disk_fraction": disk / float(total_px.sum()),
            "filled_fraction": float((n_all - n_good).sum() / n_all.sum()),
            "dsun_au": dsun / _AU_M, "r_max_rsun": float(r_max_rsun)}


# --------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class CrossCalibration:
    """The fitted law ``C(t) = coefficient * exp(rate * (t - epoch) / 1 yr)``.

    Attributes
    ----------
    coefficient : float
        ``C0`` at ``epoch`` [erg cm-2 s-1 sr-1 per DN/s].
    coefficient_err : float
        Its standard error from the fit (statistical) [same unit].
    rate_per_year : float
        Sensitivity-loss rate ``lambda`` [1/yr] (> 0: the instrument loses sensitivity, C grows).
    rate_err : float
        Its standard error [1/yr].
    epoch : astropy.time.Time
    scale_uncertainty : float
        Relative systematic uncertainty of ``C0`` from the reference series' absolute scale.
    reference : str
        The series fitted against.
    n_days : int
    chi2_reduced : float
    residuals : tuple of float
        ``ln r - model`` per frame (rejected ones included).
    first, last : astropy.time.Time
        The campaign's first and last frame.
    rejected : tuple of str
        DATE-OBS of the frames left out as outliers (:data:`CLIP_SIGMA`).
    """

    coefficient: float
    coefficient_err: float
    rate_per_year: float
    rate_err: float
    epoch: Time
    scale_uncertainty: float
    reference: str
    n_days: int
    chi2_reduced: float
    residuals: tuple[float, ...]
    first: Time
    last: Time
    rejected: tuple[str, ...] = ()
    #: Covariance of ln C0 and the rate [1/yr] of the fit (0 without a rate).
    log_coef_rate_cov: float = 0.0
    #: Model-mismatch test (:data:`MISMATCH_P`): family-wise p-value that the law's shape is
    #: right (NaN: too few days to test), and the alternative that fits better ("STEP",
    #: "CURVE"; "" when none was tested).
    mismatch_p: float = float("nan")
    mismatch_alternative: str = ""

    @property
    def law_mismatch(self) -> bool:
        """The residuals against the exponential law show another shape (``mismatch_p`` < :data:`MISMATCH_P`)."""
        return math.isfinite(self.mismatch_p) and self.mismatch_p < MISMATCH_P

    @property
    def accepted(self) -> bool:
        """The fit's reduced chi-square is finite and at most :data:`CHI2_ACCEPT`."""
        return math.isfinite(self.chi2_reduced) and self.chi2_reduced <= CHI2_ACCEPT

    def at(self, t: Time | str) -> float:
        """Coefficient at ``t`` [erg cm-2 s-1 sr-1 per DN/s]."""
        tt = t if isinstance(t, Time) else Time(str(t), scale="utc")
        return self.coefficient * math.exp(self.rate_per_year * float((tt - self.epoch).to_value(u.day)) / _YEAR_DAYS)


def fit_cross_calibration(times: Sequence[Time], sdi_irradiance: Sequence[float], reference: LyaSeries,
                          given_coefficient: float, *, epoch: Time | None = None,
                          fit_degradation: bool = True, measurement_rel_err: Sequence[float] | None = None
                          ) -> CrossCalibration:
    """Fit the radiometric coefficient and the sensitivity-loss rate to SDI/reference irradiance ratios.

    Parameters
    ----------
    times : sequence of astropy.time.Time
        DATE-OBS of the SDI frames (one or more per day), N >= 2 (>= 3 with ``fit_degradation``).
    sdi_irradiance : sequence of float
        Their disk-integrated irradiance at 1 au [photons cm-2 s-1], calibrated with
        ``given_coefficient``.
    reference : LyaSeries
        The series on the same UTC days (:meth:`LyaSeries.on`).
    given_coefficient : float
        The coefficient the frames were calibrated with [erg cm-2 s-1 sr-1 per DN/s], > 0.
    epoch : astropy.time.Time, optional
        ``t0`` of the law; default the first frame's UTC midnight.
    fit_degradation : bool
        Fit ``lambda`` (True) or hold it at 0 (a constant coefficient).
    measurement_rel_err : sequence of float, optional
        Relative error of each SDI irradiance (photon noise, fill); added in quadrature to
        the reference's ``rel_uncertainty``.

    Returns
    -------
    CrossCalibration

    Notes
    -----
    A frame more than :data:`CLIP_SIGMA` standard errors off the fit is left out and the fit
    repeated (worst first, at most :data:`MAX_REJECT_FRACTION` of the frames); the reduced
    chi-square of what is kept decides :attr:`CrossCalibration.accepted`.

    Raises
    ------
    ValueError
        Too few frames, lengths that differ, or a non-positive value.
    DataError
        If the reference has no value on a frame's day.
    """
    ts = [t if isinstance(t, Time) else Time(str(t), scale="utc") for t in times]
    e_sdi = np.asarray(sdi_irradiance, dtype=np.float64)
    npar = 2 if fit_degradation else 1
    if len(ts) != len(e_sdi) or len(ts) < npar + 1:
        raise ValueError(f"need at least {npar + 1} frames with one irradiance each")
    if not (np.all(np.isfinite(e_sdi)) and np.all(e_sdi > 0)) or not given_coefficient > 0:
        raise ValueError("irradiances and the given coefficient must be positive numbers")
    e_ref = np.array([reference.on(t) for t in ts])
    first, last = min(ts, key=lambda t: t.jd), max(ts, key=lambda t: t.jd)
    if epoch is None:
        epoch = Time(first.utc.to_datetime().strftime("%Y-%m-%dT00:00:00"), scale="utc")
    x = np.array([float((t - epoch).to_value(u.day)) / _YEAR_DAYS for t in ts])
    y = np.log(e_sdi / e_ref)
    sig = np.full(len(y), float(reference.rel_uncertainty))
    if measurement_rel_err is not None:
        sig = np.hypot(sig, np.asarray(measurement_rel_err, dtype=np.float64))
    sig = np.maximum(sig, 1e-6)
    a = np.column_stack([np.ones_like(x), -x])[:, :npar]
    keep = np.ones(len(y), dtype=bool)
    max_reject = int(MAX_REJECT_FRACTION * len(y))
    while True:
        coef, cov, chi2r = _wls(a[keep], y[keep], sig[keep])
        z = np.abs(y - a @ coef) / sig
        z[~keep] = 0.0
        worst = int(np.argmax(z))
        # one outlier day at a time (a flare in the snapshot, a bad frame), while the rest fits
        if z[worst] <= CLIP_SIGMA or (~keep).sum() >= max_reject or keep.sum() - 1 <= npar:
            break
        keep[worst] = False
    resid = y - a @ coef
    # over every day, the ones left out as outliers too: a fast early loss or a step next to the
    # campaign's edge leaves one or two days off the law, which the clipping alone would drop
    mis_p, mis_alt = _law_mismatch(x, y, sig, a) if fit_degradation else (float("nan"), "")
    c0 = float(given_coefficient) * math.exp(-float(coef[0]))
    rate = float(coef[1]) if fit_degradation else 0.0
    return CrossCalibration(coefficient=c0, coefficient_err=c0 * math.sqrt(float(cov[0, 0])), rate_per_year=rate,
                            rate_err=math.sqrt(float(cov[1, 1])) if fit_degradation else 0.0, epoch=epoch,
                            log_coef_rate_cov=-float(cov[0, 1]) if fit_degradation else 0.0,
                            scale_uncertainty=float(reference.scale_uncertainty), reference=reference.name,
                            n_days=len(set(_utc_day(t) for t, k in zip(ts, keep) if k)), chi2_reduced=chi2r,
                            residuals=tuple(float(r) for r in resid), first=first, last=last,
                            rejected=tuple(t.utc.isot for t, k in zip(ts, keep) if not k),
                            mismatch_p=mis_p, mismatch_alternative=mis_alt)


def _law_mismatch(x: np.ndarray, y: np.ndarray, sig: np.ndarray, a: np.ndarray) -> tuple[float, str]:
    """Family-wise p-value that the exponential law's shape fits, and the better alternative.

    Nested weighted least-squares models with one extra parameter (Bevington & Robinson 2003,
    sect. 11.4): a curvature ``x**2`` of ln C (a fast early loss, a slowing loss) and a step in
    sensitivity between each two consecutive observing days. The statistic is the largest
    chi-square drop over the alternatives, ``max (chi2_0 - chi2_1)``, with the errors scaled by
    the best alternative's reduced chi-square where it exceeds 1 (more scatter than stated).
    Its null distribution (the law right, the errors as scaled) comes from
    :data:`MISMATCH_BOOTSTRAP` parametric-bootstrap draws about the fitted law (fixed seed:
    the result is reproducible), which accounts for trying every date (Andrews 1993,
    Econometrica 61, 821, on the supremum test of a break at an unknown date). Needs ``n >= 5``
    days (NaN, "" otherwise). ``x`` [yr], ``y`` ln ratios, ``sig`` their errors, ``a`` the
    law's design matrix, shape (n, 2).
    """
    n = len(y)
    if n < 5:
        return float("nan"), ""
    order = np.argsort(x, kind="stable")
    x, y, sig, a = x[order], y[order], sig[order], a[order]
    xc = (x - x.mean()) / max(float(np.ptp(x)), 1e-12)
    alts = [("CURVE", np.column_stack([a, xc ** 2]))]
    alts += [("STEP", np.column_stack([a, (np.arange(n) >= k).astype(np.float64)]))
             for k in range(1, n) if x[k] > x[k - 1]]
    w = 1.0 / sig
    # projections: residual chi-square of each model for many data vectors at once
    def resid_chi2(design: np.ndarray, ys: np.ndarray) -> np.ndarray:
        aw = design * w[:, None]
        q, _ = np.linalg.qr(aw)
        yw = ys * w[:, None]
        r = yw - q @ (q.T @ yw)
        return np.sum(r * r, axis=0)

    def stat(ys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        chi0 = resid_chi2(a, ys)
        chis = np.stack([resid_chi2(d, ys) for _, d in alts])  # (n_alt, n_draws)
        best = np.argmin(chis, axis=0)
        red = np.maximum(chis[best, np.arange(ys.shape[1])] / (n - 3), 1.0)
        return np.max(chi0[None, :] - chis, axis=0) / red, best, red

    obs, best, red = stat(y[:, None])
    coef, _, _ = _wls(a, y, sig)
    rng = np.random.default_rng(20261205)
    draws = (a @ coef)[:, None] + rng.standard_normal((n, MISMATCH_BOOTSTRAP)) * (sig * math.sqrt(red[0]))[:, None]
    null, _, _ = stat(draws)
    p = (1.0 + float(np.sum(null >= obs[0]))) / (MISMATCH_BOOTSTRAP + 1.0)
    return p, alts[int(best[0])][0]


def _wls(a: np.ndarray, y: np.ndarray, sig: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Weighted least squares: parameters, covariance (scaled by chi2_red when > 1), chi2_red."""
    w = 1.0 / sig
    coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    cov = np.linalg.inv((a * w[:, None] ** 2).T @ a)
    dof = len(y) - a.shape[1]
    chi2r = float(np.sum(((y - a @ coef) / sig) ** 2) / dof) if dof > 0 else float("nan")
    if dof > 0 and chi2r > 1.0:
        cov = cov * chi2r
    return coef, cov, chi2r


# --------------------------------------------------------------------------- the master


def write_radiometric_master(fit: CrossCalibration, path: str | Path, *, channel: str = "SDI", naxis: int,
                             version: int, valid_from: str, valid_to: str) -> Path:
    """Write the fitted law as a ``radiometric`` calibration master (FITS, primary header only).

    Raises :class:`~pipelines.errors.DataError` for a fit that is not
    :attr:`CrossCalibration.accepted` (nothing is written).

    Keywords: ``RADCOEF`` (C0 at ``RADEPOCH``), ``RADRATE`` [1/yr], ``RADLAW='EXP'``,
    ``RADCERR``, ``RADRERR``, ``RADCRCOV`` (covariance of ln C0 and the rate), ``RADSCALE``
    (reference scale uncertainty), ``RADREF``,
    ``RADNDAYS``, ``RADCHI2``, ``RADUNIT``, the model-mismatch test's ``RADMISP`` (its
    family-wise p-value, -1 untested) and ``RADMISFL`` (``STEP`` or ``CURVE`` when the
    exponential law's shape is refuted, :data:`MISMATCH_P`; ``NONE`` otherwise: such a master is
    written, flagged, not refused, since the law still holds on the days it was fitted to
    within the residuals it states), and the master keywords ``CALKIND``, ``CHANNEL``,
    ``FRMNAXIS``, ``CALVER``, ``VALIDFRM``/``VALIDTO``, ``CALDESC``; CHECKSUM/DATASUM.

    Returns
    -------
    pathlib.Path
    """
    from pipelines.channels import CHANNELS

    spec = CHANNELS[channel]
    if not fit.accepted:
        raise DataError(f"cross-calibration against {fit.reference} rejected: reduced chi-square "
                        f"{fit.chi2_reduced:.3g} > {CHI2_ACCEPT:g} (the SDI/{fit.reference} ratios scatter far more "
                        "than the series' noise: wrong days, a bad frame or the wrong reference)")
    h = fits.Header()
    h["TELESCOP"], h["INSTRUME"] = "ASO-S", "LST"
    h["CALKIND"] = ("radiometric", "calibration kind")
    h["CHANNEL"] = (channel, "LST channel")
    h["FRMNAXIS"] = (int(naxis), "[pix] frame size it applies to")
    h["DETECTOR"] = (spec.instrument, "LST instrument")
    h["CALVER"] = (int(version), "calibration version")
    h["VALIDFRM"] = (valid_from, "[UTC] valid from")
    h["VALIDTO"] = (valid_to, "[UTC] valid to")
    h["CALDESC"] = (f"{channel} C(t)={fit.coefficient:.5g}*exp({fit.rate_per_year:.4f}"
                    f"*(t-{fit.epoch.utc.isot[:10]})/yr) vs {fit.reference}")
    h["RADCOEF"] = (fit.coefficient, "RADUNIT per DN/s at RADEPOCH")
    h["RADUNIT"] = (spec.bunit, "unit of the calibrated data")
    h["RADEPOCH"] = (fit.epoch.utc.isot, "[UTC] epoch of RADCOEF")
    h["RADLAW"] = ("EXP", "C=RADCOEF*exp(RADRATE*(t-RADEPOCH)/yr)")
    h["RADRATE"] = (fit.rate_per_year, "[1/yr] sensitivity-loss rate")
    h["RADCERR"] = (fit.coefficient_err, "std error of RADCOEF (fit)")
    h["RADRERR"] = (fit.rate_err, "[1/yr] std error of RADRATE")
    h["RADCRCOV"] = (fit.log_coef_rate_cov, "[1/yr] cov(ln RADCOEF, RADRATE) of the fit")
    h["RADSCALE"] = (fit.scale_uncertainty, "rel. scale uncertainty of RADREF")
    h["RADREF"] = (fit.reference, "reference irradiance series")
    h["RADNDAYS"] = (fit.n_days, "observing days in the fit")
    h["RADNREJ"] = (len(fit.rejected), "frames left out as outliers")
    h["RADCHI2"] = (fit.chi2_reduced if math.isfinite(fit.chi2_reduced) else -1.0, "reduced chi-square")
    h["RADMISP"] = (fit.mismatch_p if math.isfinite(fit.mismatch_p) else -1.0,
                    "p that the law's shape fits (-1: untested)")
    h["RADMISFL"] = (fit.mismatch_alternative if fit.law_mismatch else "NONE",
                     f"law shape refuted (p<{MISMATCH_P:g}) by: STEP/CURVE")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fits.HDUList([fits.PrimaryHDU(header=h)]).writeto(p, overwrite=True, checksum=True)
    return p


def coefficient_at(parameters: dict[str, Any], date_obs: Time | str | None) -> float:
    """The radiometric coefficient of a master at a frame's DATE-OBS.

    Parameters
    ----------
    parameters : dict
        The master's primary-header keywords (``CalibrationInput.parameters``).
    date_obs : astropy.time.Time, str or None
        The frame's DATE-OBS (ISO or the SSW ``DD-Mon-YY`` form). Needed only when the master
        has a ``RADRATE``.

    Returns
    -------
    float
        ``RADCOEF`` for a constant master; ``RADCOEF * exp(RADRATE * (t - RADEPOCH) / 365.25 d)``
        for a time-dependent one.

    Raises
    ------
    DataError
        If ``RADCOEF`` is missing or not positive, or a time-dependent master meets a frame
        without a usable DATE-OBS or has an unknown ``RADLAW``.
    """
    try:
        c0 = float(parameters["RADCOEF"])
    except (KeyError, TypeError, ValueError):
        raise DataError("radiometric calibration lacks a valid RADCOEF keyword") from None
    rate = parameters.get("RADRATE")
    if rate in (None, "") or float(rate) == 0.0:
        return c0
    law = str(parameters.get("RADLAW", "EXP")).strip().upper()
    if law != "EXP":
        raise DataError(f"unknown RADLAW {law!r} (expected 'EXP')")
    if date_obs is None:
        raise DataError("a time-dependent radiometric calibration needs the frame's DATE-OBS")
    try:
        t = date_obs if isinstance(date_obs, Time) else _parse_date(str(date_obs))
        epoch = Time(str(parameters["RADEPOCH"]).strip(), scale="utc")
    except (KeyError, ValueError) as exc:
        raise DataError(f"time-dependent radiometric calibration: unusable date ({exc})") from None
    return c0 * math.exp(float(rate) * float((t - epoch).to_value(u.day)) / _YEAR_DAYS)


def radiometric_uncertainty_at(parameters: dict[str, Any], date_obs: Time | str | None) -> float | None:
    """Relative 1-sigma uncertainty of a master's radiometric scale at a frame's DATE-OBS.

    For a cross-calibration master (``RADCERR`` present): the fit's error of
    ``ln C(t) = ln C0 + lambda (t - t0)`` by first-order propagation with the fit's covariance,
    ``var = (RADCERR / RADCOEF)**2 + dt**2 RADRERR**2 + 2 dt RADCRCOV`` (``dt`` in years), and
    the reference series' scale uncertainty ``RADSCALE`` added in quadrature (independent:
    the fit cannot see the scale; Bevington & Robinson 2003, ch. 3). Otherwise the master's own
    ``RADUNC`` if it states one.

    Returns
    -------
    float or None
        The fraction (0.05 = 5 %), or ``None`` when the master states no uncertainty.

    Raises
    ------
    DataError
        As :func:`coefficient_at`, for a time-dependent master without a usable date.
    """
    if parameters.get("RADCERR") in (None, ""):
        unc = parameters.get("RADUNC")
        return float(unc) if unc not in (None, "") else None
    c0 = float(parameters["RADCOEF"])
    var = (float(parameters["RADCERR"]) / c0) ** 2
    rate = parameters.get("RADRATE")
    if rate not in (None, "") and float(rate) != 0.0:
        if date_obs is None:
            raise DataError("a time-dependent radiometric calibration needs the frame's DATE-OBS")
        t = date_obs if isinstance(date_obs, Time) else _parse_date(str(date_obs))
        dt_yr = float((t - Time(str(parameters["RADEPOCH"]).strip(), scale="utc")).to_value(u.day)) / _YEAR_DAYS
        var += dt_yr ** 2 * float(parameters.get("RADRERR") or 0.0) ** 2
        var += 2.0 * dt_yr * float(parameters.get("RADCRCOV") or 0.0)
    var = max(var, 0.0) + float(parameters.get("RADSCALE") or 0.0) ** 2
    return math.sqrt(var)


def _parse_date(s: str) -> Time:
    """DATE-OBS in ISO 8601 or the SSW/ASO-S ``01-Mar-04 00:00:10.515`` form."""
    s = s.strip()
    try:
        return Time(s, scale="utc")
    except ValueError:
        d = dt.datetime.strptime(s.split(".")[0], "%d-%b-%y %H:%M:%S")
        frac = float("0." + s.split(".")[1]) if "." in s else 0.0
        return Time(d, scale="utc") + frac * u.s

