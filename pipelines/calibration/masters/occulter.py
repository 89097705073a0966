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
frames), and the frames are averaged with weights ``w_k`` (:func:`roll_weights`) for which the
corona's m = 1 harmonic cancels, ``sum_k w_k exp(i theta_k) = 0`` (uniform weights for rolls
evenly spread; for those every harmonic not a multiple of the number of rolls cancels). With
uneven rolls the m = 2 and 3 harmonics that the weights leave are fitted too (a coarse radial
shape each, :data:`N_KNOTS_HARMONIC`): over a full annulus they would be orthogonal to a shift's
m = 1 pattern, but the annulus is cut by the frame's edge and the occulter is off the Sun, and
unfitted they moved the centre by 0.24 px in a test. The mean frame is then

``M(x) = P(x) F(|x - s|)``

with ``F`` radially symmetric about the Sun centre ``s`` (the azimuthally averaged corona plus
the stray light) and ``P`` what does not turn with the roll: the flat's error, of which a
diffuser's large-scale non-uniformity (LST.md: SCI's flat comes through a diffuser) is the part
that matters here. **Assumed:** the stray light is radially symmetric about the Sun (scattered
disk light, as LST.md's law in the distance from the Sun and the simulator have it). A
stray-light component fixed to the instrument and centred on the occulter would be additive,
not part of ``P``, and would pull ``s`` towards the occulter; no validation family tests that yet.

``ln M`` is fitted over the annulus :data:`ANNULUS_RSUN` about the occulter (outside its vignetting
ramp, inside the field stop's) as
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
:mod:`validation.families`, 256 px: errors 0.01-0.29 px; this method: 0.005-0.036 px).

Uncertainty per axis: the fit's formal 1-sigma (``s^2 (J^T J)^-1``, ``J`` the Jacobian of the
projected residuals), the frames' own occulter-fit errors averaged (``FITCSIG``: the alignment
carries ``sum_k w_k e_k``, ``e_k`` each fit's error) and :data:`OFFSET_SYSTEMATIC_RSUN` (the rest
of the error, measured on tuning seeds), in quadrature. Rolls whose weighted m = 1 cannot be
brought below :data:`ROLL_BALANCE_MAX` (rolls not surrounding the Sun) are refused with a
:class:`~pipelines.errors.DataError`, as are frames whose occulter fit was refused
(``FITCSTAT`` not ``OK``) or already moved by an offset (a HISTORY line of
:func:`pipelines.calibration.l2.centre.fit_and_apply_centre`: ``FITCRPX1/2`` is then the Sun's,
not the occulter's, and would measure about 0).

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
           "ANNULUS_RSUN", "N_KNOTS", "OFFSET_SYSTEMATIC_RSUN", "ROLL_BALANCE_MAX", "roll_weights"]

#: Annulus [Rsun, about the fitted occulter centre] used: beyond the occulter's 1.1 Rsun edge
#: and its vignetting ramp (LST.md: SCI field 1.1-2.5 Rsun), inside the 2.5 Rsun field stop's.
ANNULUS_RSUN = (1.3, 2.2)
#: Knots of the radial B-spline ``f`` (cubic), evenly spread over the annulus widened by 0.15 Rsun
#: each side (so that a trial centre off the occulter still has ``f`` defined on every pixel).
N_KNOTS = 10
#: Knots of the coarse radial B-spline (cubic) of each azimuthal harmonic m = 2, 3 fitted when the
#: roll weights do not cancel it (uneven rolls).
N_KNOTS_HARMONIC = 4
#: Systematic 1-sigma per axis of the offset beyond the fit's formal error [Rsun]: the RMS of the
#: per-axis error over the formal one in quadrature (``benchmarks/sci_occulter_offset_seeds.py``),
#: on the tuning seeds 1000-1007 of
#: :mod:`validation.families` (SCI-UV and SCI-WL, 256 px, noise on, mismatch on: RMS error 0.0097 px,
#: formal 0.0033 px, so 0.0091 px at 48.4 px per Rsun). The test seeds 0-9 then give a pull RMS of
#: 1.15. Mostly a common bias of about 0.012 px along y, which the occulter edge fit shows as well
#: (the offset found matches the simulator's aperture offset to 0.005 px): the frames' own, not
#: this fit's. Measured at 256 px only.
OFFSET_SYSTEMATIC_RSUN = 1.9e-4
#: Largest ``|sum_k w_k exp(i theta_k)|`` left after the weighting (:func:`roll_weights`): the
#: fraction of the corona's m = 1 left in the roll average. The corona's m = 1 of amplitude ``A1``
#: left at ``b`` moves the centre by about ``b A1 r / (2 k)`` Rsun (about 0.004 Rsun for ``b = 0.1``,
#: ``A1 = 0.15``, ``k = 3``, ``r = 1.7``): 1e-3 keeps it below 1e-4 Rsun (0.005 px at 256 px), far
#: below :data:`OFFSET_SYSTEMATIC_RSUN`. Weights reach 0 only when the rolls do not surround the Sun.
ROLL_BALANCE_MAX = 1e-3
#: Relative weight of staying near uniform weights in :func:`roll_weights` (as many frames as
#: possible share the average; the m = 1 constraint dominates).
_UNIFORM_PULL = 1e-3
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
    "OCCROLBL": "roll balance |sum w exp(i roll)| left (0: even)",
}


@dataclass(frozen=True)
class OcculterOffset:
    """Occulter centre minus Sun centre along the detector axes [pixel], its 1-sigma per axis [pixel],
    the frames used, the plate scale [arcsec/pixel], the detector-fixed gain gradient found
    ``(gx, gy)`` [1/Rsun], the roll set's balance left after weighting ``|sum_k w_k exp(i theta_k)|``,
    the gradient's formal 1-sigma per axis [1/Rsun] (``s^2 (A^T A)^-1`` of the linear fit at the
    offset found: a lower bound, the radial model's misfit not included) and the solar radius
    [pixel] the gradient is per (the first frame used)."""

    dx_px: float
    dy_px: float
    sigma_px: float
    n_frames: int
    scale_arcsec: float
    gradient: tuple[float, float] = (0.0, 0.0)
    roll_balance: float = 0.0
    gradient_sigma: tuple[float, float] = (0.0, 0.0)
    rsun_px: float = float("nan")

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


def roll_weights(rolls_deg: Sequence[float]) -> tuple[np.ndarray, float]:
    """Weights of the frames of a roll sequence for which the corona's m = 1 cancels in their mean.

    Non-negative least squares (:func:`scipy.optimize.nnls`; Lawson & Hanson 1974, *Solving Least
    Squares Problems*, ch. 23) of ``sum w_k exp(i theta_k) = 0`` and ``sum w_k = 1`` (both heavily
    weighted) with a weak pull of each ``w_k`` towards ``1 / N`` (:data:`_UNIFORM_PULL`): rolls
    evenly spread get uniform weights; uneven rolls that surround the Sun get the near-uniform
    weights that cancel m = 1 (:func:`measure_occulter_offset` then fits what is left of m = 2, 3).

    Parameters
    ----------
    rolls_deg : sequence of float
        Roll angles [deg] (``CROTA2``), at least two.

    Returns
    -------
    weights : numpy.ndarray, shape (N,)
        Non-negative, summing to 1.
    balance : float
        ``|sum_k w_k exp(i theta_k)|`` left: 0 when m = 1 cancels; above :data:`ROLL_BALANCE_MAX`
        when the rolls do not surround the Sun (all within a half circle).
    """
    from scipy.optimize import nnls

    th = np.radians(np.asarray(rolls_deg, dtype=np.float64))
    n = th.size
    big = 1e3
    a = np.vstack([big * np.cos(th), big * np.sin(th), big * np.ones(n), _UNIFORM_PULL * np.eye(n)])
    b = np.r_[0.0, 0.0, big, np.full(n, _UNIFORM_PULL / n)]
    w, _ = nnls(a, b)
    w = w / w.sum() if w.sum() > 0 else np.full(n, 1.0 / n)
    return w, float(abs(np.sum(w * np.exp(1j * th))))


def _roll_average(images, headers, valid, use, weights, o0) -> tuple[np.ndarray, np.ndarray]:
    """The weighted mean of frames ``use`` (float64), each moved so that its occulter fit
    (``FITCRPX1/2``) lands on ``o0`` (0-based x, y: the pointing jitter), and the pixels usable in
    every frame moved (bool), both of the frames' shape."""
    from scipy.ndimage import binary_erosion
    from scipy.ndimage import shift as nd_shift

    total, ok_all = None, None
    for w, i in zip(weights, use):
        if w <= 0.0:
            continue
        img = np.asarray(images[i], dtype=np.float64)
        ok = np.isfinite(img) & (np.asarray(valid[i], bool) if valid is not None else True)
        step = (o0[1] - (float(headers[i]["FITCRPX2"]) - 1.0), o0[0] - (float(headers[i]["FITCRPX1"]) - 1.0))
        moved = nd_shift(np.where(ok, img, 0.0), step, order=3, mode="nearest")
        # a masked pixel (set to 0) rings into its neighbours through the cubic spline (about -10 % of
        # its brightness 1.5 px away, 3 % at 2.5 px): those within 3 px of one are left out too
        ok_moved = binary_erosion(nd_shift(ok.astype(np.float64), step, order=1, mode="constant", cval=0.0) > 0.999,
                                  iterations=3, border_value=1)
        total = w * moved if total is None else total + w * moved
        ok_all = ok_moved if ok_all is None else ok_all & ok_moved
    return total, ok_all


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
        Fewer than two frames with an accepted occulter fit (``FITCSTAT = 'OK'``) and a roll; a
        frame whose fit was already moved by an offset; frames, masks or headers that do not
        match; rolls that do not surround the Sun (m = 1 left above :data:`ROLL_BALANCE_MAX` after
        :func:`roll_weights`); too few usable pixels in the annulus; or the fit did not converge.
    """
    from scipy.interpolate import BSpline
    from scipy.optimize import least_squares

    from pipelines.sun import sun_geometry

    if valid is not None and len(valid) != len(images):
        raise DataError(f"occulter offset: {len(valid)} validity masks for {len(images)} frames")
    if len(headers) != len(images):
        raise DataError(f"occulter offset: {len(headers)} headers for {len(images)} frames")
    for h in headers:
        # (HISTORY text is cut into 72-character cards: read it whole)
        if "occulter fit moved by the measured occulter-to-Sun offset" in "".join(str(v) for v in h.get("HISTORY", [])):
            raise DataError("occulter offset: a frame's FITCRPX1/2 was already moved by an occulter-to-Sun offset "
                            "(its masters carried OCCOFF1/2): calibrate the roll sequence without one")
    use = [i for i, h in enumerate(headers) if "FITCRPX1" in h and "FITCRPX2" in h and "CROTA2" in h
           and str(h.get("FITCSTAT", "OK")).strip().upper() == "OK"]
    if len(use) < 2:
        raise DataError("occulter offset: fewer than two frames with an accepted occulter fit and a roll")
    shape = np.shape(images[use[0]])
    if any(np.shape(images[i]) != shape or (valid is not None and np.shape(valid[i]) != shape) for i in use):
        raise DataError("occulter offset: the frames (or their validity masks) differ in shape")
    rolls = [float(headers[i]["CROTA2"]) for i in use]
    weights, balance = roll_weights(rolls)
    th = np.radians(rolls)
    # harmonics m = 2, 3 the weights do not cancel: fitted with a coarse radial shape each
    harmonics = [m for m in (2, 3) if abs(np.sum(weights * np.exp(1j * m * th))) > ROLL_BALANCE_MAX]
    if balance > ROLL_BALANCE_MAX:
        raise DataError(f"occulter offset: the rolls ({', '.join(f'{a:.0f}' for a in rolls)} deg) do not surround "
                        f"the Sun (m = 1 left {balance:.3f} > {ROLL_BALANCE_MAX} at best): the corona's own m = 1 "
                        "would not cancel in their average")
    geom = sun_geometry(headers[use[0]])
    rs = float(geom.rsun_px)
    o0 = np.array([float(headers[use[0]]["FITCRPX1"]) - 1.0, float(headers[use[0]]["FITCRPX2"]) - 1.0])
    mean, ok_all = _roll_average(images, headers, valid, use, weights, o0)
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

    coarse = np.r_[[lo] * 3, np.linspace(lo, hi, N_KNOTS_HARMONIC), [hi] * 3]

    def design(d):
        ex, ey = px - (o0[0] - d[0]), py - (o0[1] - d[1])
        rho = np.clip(np.hypot(ex, ey) / rs, lo, hi)
        basis = BSpline.design_matrix(rho, knots, 3).toarray()
        cols = [basis]
        if harmonics:  # what the weights leave of the corona's m = 2, 3 (uneven rolls): fitted, not modelled away
            phi = np.arctan2(ey, ex)
            coarse_b = BSpline.design_matrix(rho, coarse, 3).toarray()
            cols += [coarse_b * f(m * phi)[:, None] for m in harmonics for f in (np.cos, np.sin)]
        return np.column_stack(cols + [ux, uy])

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
    # the alignment on each frame's occulter fit carries sum_k w_k e_k (per axis): FITCSIG is the fit's 1-sigma
    fitcsig = np.array([float(headers[i].get("FITCSIG", 0.0) or 0.0) for i in use])
    align = float(np.sqrt(np.sum((weights * fitcsig) ** 2)))
    sig = math.sqrt(formal ** 2 + align ** 2 + (OFFSET_SYSTEMATIC_RSUN * rs) ** 2)
    try:  # the gain gradient's formal error: the linear fit's covariance at the offset found
        lin_cov = np.linalg.pinv(a.T @ a) * float(resid @ resid) / dof
        g_sig = (float(np.sqrt(max(lin_cov[-2, -2], 0.0))), float(np.sqrt(max(lin_cov[-1, -1], 0.0))))
    except np.linalg.LinAlgError:
        g_sig = (float("nan"), float("nan"))
    return OcculterOffset(float(d[0]), float(d[1]), sig, int(np.count_nonzero(weights > 0)), float(abs(geom.scale)),
                          (float(coef[-2]), float(coef[-1])), balance, g_sig, rs)
