"""SCI occulter-to-Sun offset measured from a roll sequence.

The SCI centre fit (:func:`pipelines.calibration.l2.centre.fit_and_apply_centre`) finds the
occulter's shadow edge, which is the Sun's centre only where the occulter is centred on the
Sun. A single frame cannot tell the two apart: the corona behind and around the occulter has
its own m = 1 asymmetries (streamers, a brightness tilt), so no brightness symmetry pins the
Sun centre to the accuracy asked (0.1 px). A *roll sequence* can. The spacecraft rolls about
the Sun line, so the occulter (fixed in the instrument) and the Sun keep their detector
positions while the corona turns about the Sun centre by the roll step.

Method (:func:`measure_occulter_offset`): the **roll-averaged frame**. Each frame is shifted so
that its occulter fit (``FITCRPX1/2``) lands on the first frame's (the pointing jitter between
frames), and the frames are averaged. Averaged over rolls spread evenly round the circle, every
azimuthal harmonic ``m`` of the corona that is not a multiple of the number of rolls cancels
(``sum_k exp(i m theta_k) = 0``), so the mean frame is

``M(x) = P(x) F(|x - s|)``

with ``F`` radially symmetric about the Sun centre ``s`` (the azimuthally averaged corona plus
the stray light, which is radially symmetric about the Sun) and ``P`` what does not turn with
the roll: the flat's error, of which a diffuser's large-scale non-uniformity (LST.md: SCI's flat
comes through a diffuser) is the part that matters here. ``ln M`` is fitted over the annulus
:data:`ANNULUS_RSUN` about the occulter (outside its vignetting ramp, inside the field stop's) as
``f(|x - s|) + g . (x - c) / Rsun``: ``f`` a cubic B-spline in the distance from ``s``
(:data:`N_KNOTS` knots), ``g`` a detector-fixed gain gradient [1/Rsun] about the detector centre
``c``. ``f`` and ``g`` enter linearly and are solved by least squares for each trial ``s``
(variable projection, Golub & Pereyra 1973, SIAM J. Numer. Anal. 10, 413); ``s`` by
:func:`scipy.optimize.least_squares`. Why ``g`` must be free: a flat tilt of a fraction ``g`` per
Rsun times a profile falling as ``r^-k`` looks like a centre shift of ``g r^2 / k`` Rsun (0.1-0.4 px
at 256 px for the simulated 0.5-2 % diffusers), but its signature grows with ``r`` where a shift's
falls as ``1/r``, and the fit over 1.3-2.2 Rsun separates them. The earlier method (each roll
frame mapped onto the first, pair by pair) could not: a pair's ratio leaves a detector-fixed
plane degenerate with the offset, so its estimate moved with the diffuser (seeds 0-9 of
:mod:`validation.families`, 256 px: errors 0.03-0.29 px; this method: 0.003-0.033 px).

Uncertainty per axis: the fit's formal 1-sigma (``s^2 (J^T J)^-1``, ``J`` the Jacobian of the
projected residuals) in quadrature with :data:`OFFSET_SYSTEMATIC_RSUN`, the rest of the error
measured on held-out seeds. The roll set's balance (``|mean exp(i theta_k)|``, 0 for rolls evenly
spread) is checked: above :data:`ROLL_BALANCE_MAX` the corona's own m = 1 would not cancel and a
:class:`~pipelines.errors.DataError` says so.

The master keywords (:data:`OFFSET_KEYWORDS`) hold ``s``'s offset from the occulter in arcsec
along the detector axes and the gain gradient found; the flow subtracts the offset from the
occulter fit and adds its 1-sigma to the centre's ``CSYERia``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from astropy.io import fits

from pipelines.errors import DataError

__all__ = ["OcculterOffset", "measure_occulter_offset", "offset_from_parameters", "OFFSET_KEYWORDS",
           "ANNULUS_RSUN", "N_KNOTS", "OFFSET_SYSTEMATIC_RSUN", "ROLL_BALANCE_MAX"]

#: Annulus [Rsun, about the fitted occulter centre] used: beyond the occulter's 1.1 Rsun edge
#: and its vignetting ramp (LST.md: SCI field 1.1-2.5 Rsun), inside the 2.5 Rsun field stop's.
ANNULUS_RSUN = (1.3, 2.2)
#: Knots of the radial B-spline ``f`` (cubic), evenly spread over the annulus widened by 0.15 Rsun
#: each side (so that a trial centre off the occulter still has ``f`` defined on every pixel).
N_KNOTS = 10
#: Systematic 1-sigma per axis of the offset beyond the fit's formal error [Rsun]: the RMS of the
#: per-axis error over the formal one in quadrature, on the tuning seeds 1000-1007 of
#: :mod:`validation.families` (SCI-UV and SCI-WL, 256 px, noise on, mismatch on: RMS error 0.0097 px,
#: formal 0.0033 px, so 0.0091 px at 48.4 px per Rsun). The test seeds 0-9 then give a pull RMS of
#: 1.15. Mostly a common bias of about 0.012 px along y, which the occulter edge fit shows as well
#: (the offset found matches the simulator's aperture offset to 0.005 px): the frames' own, not
#: this fit's. Measured at 256 px only.
OFFSET_SYSTEMATIC_RSUN = 1.9e-4
#: Largest ``|mean exp(i theta_k)|`` of the rolls used: beyond it the corona's m = 1 does not cancel
#: in the roll average (0 for rolls evenly spread round the circle, 1 for no roll).
ROLL_BALANCE_MAX = 0.1
#: Pixels of the annulus used at most (a regular subsample beyond it: full-size frames).
MAX_PIXELS = 250_000
#: Stray-light / mask master keywords of the measured offset.
OFFSET_KEYWORDS = {
    "OCCOFF1": "[arcsec] occulter minus Sun centre, detector x",
    "OCCOFF2": "[arcsec] occulter minus Sun centre, detector y",
    "OCCOFERR": "[arcsec] 1-sigma of OCCOFF1/2 (each axis)",
    "OCCOFNFR": "roll frames measuring OCCOFF1/2",
    "OCCGRAD1": "[1/Rsun] detector-fixed gain gradient found, x",
    "OCCGRAD2": "[1/Rsun] detector-fixed gain gradient found, y",
    "OCCROLBL": "roll balance |mean exp(i roll)| (0: even)",
}


@dataclass(frozen=True)
class OcculterOffset:
    """Occulter centre minus Sun centre along the detector axes [pixel], its 1-sigma per axis [pixel],
    the frames used, the plate scale [arcsec/pixel], the detector-fixed gain gradient found
    ``(gx, gy)`` [1/Rsun] and the roll set's balance ``|mean exp(i theta_k)|``."""

    dx_px: float
    dy_px: float
    sigma_px: float
    n_frames: int
    scale_arcsec: float
    gradient: tuple[float, float] = (0.0, 0.0)
    roll_balance: float = 0.0

    def keywords(self) -> dict[str, tuple[Any, str]]:
        """:data:`OFFSET_KEYWORDS` with values (offset in arcsec)."""
        s = self.scale_arcsec
        vals = (round(self.dx_px * s, 4), round(self.dy_px * s, 4), round(self.sigma_px * s, 4), int(self.n_frames),
                float(f"{self.gradient[0]:.4g}"), float(f"{self.gradient[1]:.4g}"), round(self.roll_balance, 4))
        return {k: (v, c) for (k, c), v in zip(OFFSET_KEYWORDS.items(), vals)}


def offset_from_parameters(params: Any) -> tuple[float, float, float] | None:
    """``(OCCOFF1, OCCOFF2, OCCOFERR)`` [arcsec] of a master's parameters, or ``None`` if absent/invalid."""
    try:
        vals = tuple(float(params[k]) for k in ("OCCOFF1", "OCCOFF2", "OCCOFERR"))
    except (KeyError, TypeError, ValueError):
        return None
    return vals if all(math.isfinite(v) for v in vals) and vals[2] >= 0 else None


def measure_occulter_offset(images: Sequence[np.ndarray], headers: Sequence[fits.Header],
                            valid: Sequence[np.ndarray] | None = None) -> OcculterOffset:
    """The occulter-to-Sun offset from a roll sequence of SCI frames (module docstring).

    Parameters
    ----------
    images : sequence of numpy.ndarray, shape (ny, nx)
        Frames of one channel calibrated to brightness (no stray-light subtraction needed), same
        shape, rolls spread round the circle (:data:`ROLL_BALANCE_MAX`).
    headers : sequence of astropy.io.fits.Header
        Their headers: ``FITCRPX1/2`` (the occulter fit, 1-based, :mod:`pipelines.calibration.l2.centre`),
        ``CROTA2`` [deg], and a solar WCS (``RSUN_OBS``, ``CDELT1``).
    valid : sequence of numpy.ndarray of bool, optional
        Usable pixels of each frame.

    Returns
    -------
    OcculterOffset

    Raises
    ------
    DataError
        Fewer than two frames with an occulter fit and a roll; rolls not spread round the circle
        (balance above :data:`ROLL_BALANCE_MAX`); too few usable pixels in the annulus; or the fit
        did not converge.
    """
    from scipy.interpolate import BSpline
    from scipy.ndimage import shift as nd_shift
    from scipy.optimize import least_squares

    from pipelines.sun import sun_geometry

    use = [i for i, h in enumerate(headers) if "FITCRPX1" in h and "FITCRPX2" in h and "CROTA2" in h]
    if len(use) < 2:
        raise DataError("occulter offset: fewer than two frames with an occulter fit and a roll")
    rolls = np.radians([float(headers[i]["CROTA2"]) for i in use])
    balance = float(abs(np.mean(np.exp(1j * rolls))))
    if balance > ROLL_BALANCE_MAX:
        raise DataError(f"occulter offset: the rolls ({', '.join(f'{math.degrees(a):.0f}' for a in rolls)} deg) are "
                        f"not spread round the circle (|mean exp(i roll)| = {balance:.2f} > {ROLL_BALANCE_MAX}): "
                        "the corona's own m = 1 would not cancel in their average")
    geom = sun_geometry(headers[use[0]])
    rs = float(geom.rsun_px)
    o0 = np.array([float(headers[use[0]]["FITCRPX1"]) - 1.0, float(headers[use[0]]["FITCRPX2"]) - 1.0])
    total, ok_all = None, None
    for i in use:  # each frame moved so that its occulter fit lands on the first's (pointing jitter)
        img = np.asarray(images[i], dtype=np.float64)
        ok = np.isfinite(img) & (np.asarray(valid[i], bool) if valid is not None else True)
        if img.shape != np.shape(images[use[0]]):
            raise DataError("occulter offset: the frames differ in shape")
        step = (o0[1] - (float(headers[i]["FITCRPX2"]) - 1.0), o0[0] - (float(headers[i]["FITCRPX1"]) - 1.0))
        moved = nd_shift(np.where(ok, img, 0.0), step, order=3, mode="nearest")
        ok_moved = nd_shift(ok.astype(np.float64), step, order=1, mode="constant", cval=0.0) > 0.999
        total = moved if total is None else total + moved
        ok_all = ok_moved if ok_all is None else ok_all & ok_moved
    mean = total / len(use)
    ny, nx = mean.shape
    yy, xx = np.mgrid[0:ny, 0:nx]
    rho_o = np.hypot(xx - o0[0], yy - o0[1]) / rs
    r_in, r_out = ANNULUS_RSUN
    sel = ok_all & (rho_o > r_in) & (rho_o < r_out) & (mean > 0)
    n_sel = int(sel.sum())
    if n_sel < 200:
        raise DataError(f"occulter offset: {n_sel} usable pixels in the {r_in}-{r_out} Rsun annulus (200 needed)")
    stride = max(1, math.ceil(math.sqrt(n_sel / MAX_PIXELS)))
    if stride > 1:
        sub = np.zeros_like(sel)
        sub[::stride, ::stride] = True
        sel &= sub
    px, py = xx[sel].astype(np.float64), yy[sel].astype(np.float64)
    lm = np.log(mean[sel])
    ux, uy = (px - (nx - 1) / 2.0) / rs, (py - (ny - 1) / 2.0) / rs
    lo, hi = r_in - 0.15, r_out + 0.15
    knots = np.r_[[lo] * 3, np.linspace(lo, hi, N_KNOTS), [hi] * 3]

    def design(d):
        rho = np.clip(np.hypot(px - (o0[0] - d[0]), py - (o0[1] - d[1])) / rs, lo, hi)
        basis = BSpline.design_matrix(rho, knots, 3).toarray()
        return np.column_stack([basis, ux, uy])

    def projected(d):
        a = design(d)
        coef, *_ = np.linalg.lstsq(a, lm, rcond=None)
        return lm - a @ coef

    try:
        fit = least_squares(projected, np.zeros(2), diff_step=1e-3, max_nfev=200)
    except (ValueError, np.linalg.LinAlgError) as exc:
        raise DataError(f"occulter offset: the roll-average fit failed ({exc})") from exc
    if not (fit.success and np.all(np.isfinite(fit.x))):
        raise DataError(f"occulter offset: the roll-average fit did not converge ({fit.message})")
    d = fit.x
    a = design(d)
    coef, *_ = np.linalg.lstsq(a, lm, rcond=None)
    resid = lm - a @ coef
    dof = max(resid.size - a.shape[1] - 2, 1)
    try:
        cov = np.linalg.inv(fit.jac.T @ fit.jac) * float(resid @ resid) / dof
    except np.linalg.LinAlgError as exc:
        raise DataError("occulter offset: the roll-average fit is degenerate") from exc
    formal = float(np.sqrt(max(cov[0, 0], cov[1, 1], 0.0)))
    sig = math.hypot(formal, OFFSET_SYSTEMATIC_RSUN * rs)
    return OcculterOffset(float(d[0]), float(d[1]), sig, len(use), float(abs(geom.scale)),
                          (float(coef[-2]), float(coef[-1])), balance)
