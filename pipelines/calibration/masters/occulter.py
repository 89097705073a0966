"""SCI occulter-to-Sun offset measured from a roll sequence.

The SCI centre fit (:func:`pipelines.calibration.l2.centre.fit_and_apply_centre`) finds the
occulter's shadow edge, which is the Sun's centre only where the occulter is centred on the
Sun. A single frame cannot tell the two apart: the corona behind and around the occulter has
its own m = 1 asymmetries (streamers, a brightness tilt), so no brightness symmetry pins the
Sun centre to the accuracy asked (0.1 px). A *roll sequence* can. The spacecraft rolls about
the Sun line, so the occulter (fixed in the instrument) and the Sun keep their detector
positions while the corona turns about the Sun centre by the roll step. Frame ``k`` seen in
frame 0's pixels is then frame 0 rotated by ``theta_k - theta_0`` about the Sun centre
``s = o - d`` (``o`` the fitted occulter centre of each frame, ``d`` the offset sought): the
rotation centre that maps the coronal structure of each roll onto frame 0's is the Sun's.
Stray light, radially symmetric about the Sun, rotates onto itself and does not bias it.

Method (:func:`measure_occulter_offset`): for every frame ``k >= 1`` of the sequence, the
offset ``d`` (with a free level between the two frames) that minimises
``sum (I_k(x) - I_0(s_0 + R(theta_k - theta_0)(x - s_k)))**2`` over the annulus
:data:`ANNULUS_RSUN` about the occulter (outside its vignetting ramp, inside the field stop's),
``R`` the rotation of the simulator's and the WCS's roll convention (``CROTA2``: sky =
R(roll) (detector - centre)), ``I_0`` resampled by cubic splines, by
:func:`scipy.optimize.least_squares`; ``d`` is the mean over the pairs. Its 1-sigma per axis:
the pairs' standard error in quadrature with the estimate's sensitivity to a detector-fixed
flat error (a diffuser's large-scale non-uniformity does not turn with the roll and mimics a
common offset: measured on seed 1001 of :mod:`validation.families`, 0.19 px of 0.95), taken as
``|d_plane - d| / sqrt(2)``, ``d_plane`` the same fit with a detector-fixed plane free (which
absorbs such an error but correlates with the offset), floored at :data:`OFFSET_SIGMA_FLOOR_PX`.

The master keywords (:data:`OFFSET_KEYWORDS`) hold ``d`` in arcsec along the detector axes; the
flow subtracts it from the occulter fit and adds its 1-sigma to the centre's ``CSYERia``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from astropy.io import fits

from pipelines.errors import DataError

__all__ = ["OcculterOffset", "measure_occulter_offset", "offset_from_parameters", "OFFSET_KEYWORDS",
           "ANNULUS_RSUN", "OFFSET_SIGMA_FLOOR_PX"]

#: Annulus [Rsun, about the fitted occulter centre] used: beyond the occulter's 1.1 Rsun edge
#: and its vignetting ramp (LST.md: SCI field 1.1-2.5 Rsun), inside the 2.5 Rsun field stop's.
ANNULUS_RSUN = (1.3, 2.2)
#: Floor of the offset's stated 1-sigma [pixel of the sequence's frames]: the occulter fit's own
#: systematic (:data:`pipelines.calibration.l2.centre.EDGE_SYSTEMATIC_FLOOR_PX`).
OFFSET_SIGMA_FLOOR_PX = 0.1
#: Stray-light / mask master keywords of the measured offset.
OFFSET_KEYWORDS = {
    "OCCOFF1": "[arcsec] occulter minus Sun centre, detector x",
    "OCCOFF2": "[arcsec] occulter minus Sun centre, detector y",
    "OCCOFERR": "[arcsec] 1-sigma of OCCOFF1/2 (each axis)",
    "OCCOFNPR": "roll pairs measuring OCCOFF1/2",
}


@dataclass(frozen=True)
class OcculterOffset:
    """Occulter centre minus Sun centre along the detector axes [pixel] and its 1-sigma per axis."""

    dx_px: float
    dy_px: float
    sigma_px: float
    n_pairs: int
    scale_arcsec: float

    def keywords(self) -> dict[str, tuple[Any, str]]:
        """:data:`OFFSET_KEYWORDS` with values (arcsec)."""
        s = self.scale_arcsec
        vals = (round(self.dx_px * s, 4), round(self.dy_px * s, 4), round(self.sigma_px * s, 4), int(self.n_pairs))
        return {k: (v, c) for (k, c), v in zip(OFFSET_KEYWORDS.items(), vals)}


def offset_from_parameters(params: Any) -> tuple[float, float, float] | None:
    """``(OCCOFF1, OCCOFF2, OCCOFERR)`` [arcsec] of a master's parameters, or ``None`` if absent/invalid."""
    try:
        vals = tuple(float(params[k]) for k in ("OCCOFF1", "OCCOFF2", "OCCOFERR"))
    except (KeyError, TypeError, ValueError):
        return None
    return vals if all(math.isfinite(v) for v in vals) and vals[2] >= 0 else None


def _rot(a_deg: float) -> np.ndarray:
    a = math.radians(a_deg)
    return np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])


def measure_occulter_offset(images: Sequence[np.ndarray], headers: Sequence[fits.Header],
                            valid: Sequence[np.ndarray] | None = None) -> OcculterOffset:
    """The occulter-to-Sun offset from a roll sequence of SCI frames (module docstring).

    Parameters
    ----------
    images : sequence of numpy.ndarray, shape (ny, nx)
        Frames of one channel calibrated to brightness, same shape, >= 2 distinct rolls.
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
        Fewer than two frames with an occulter fit and distinct rolls, or no fit converged.
    """
    from scipy.ndimage import spline_filter

    from pipelines.sun import sun_geometry

    use = [i for i, h in enumerate(headers) if "FITCRPX1" in h and "FITCRPX2" in h and "CROTA2" in h]
    if len(use) < 2:
        raise DataError("occulter offset: fewer than two frames with an occulter fit and a roll")
    i0 = use[0]
    geom = sun_geometry(headers[i0])
    rs = float(geom.rsun_px)
    img0 = np.asarray(images[i0], dtype=np.float64)
    ok0 = np.isfinite(img0) & (np.asarray(valid[i0], bool) if valid is not None else True)
    # brightness in units of its median in frame 0's annulus (the fits' tolerances are absolute:
    # a channel in 1e-10 MSB would stop at its first step)
    yy0, xx0 = np.mgrid[0:img0.shape[0], 0:img0.shape[1]]
    o0_ = (float(headers[i0]["FITCRPX1"]) - 1.0, float(headers[i0]["FITCRPX2"]) - 1.0)
    rho0 = np.hypot(xx0 - o0_[0], yy0 - o0_[1]) / rs
    ring = ok0 & (rho0 > ANNULUS_RSUN[0]) & (rho0 < ANNULUS_RSUN[1])
    norm = float(np.median(np.abs(img0[ring]))) if ring.any() else 0.0
    if not (math.isfinite(norm) and norm > 0):
        raise DataError("occulter offset: no signal in the annulus of the first frame")
    img0 = img0 / norm
    coef0 = spline_filter(np.where(ok0, img0, 0.0), order=3, mode="nearest")  # cubic: no interpolation bias
    ok0f = ok0.astype(np.float64)
    o0 = np.array([float(headers[i0]["FITCRPX1"]) - 1.0, float(headers[i0]["FITCRPX2"]) - 1.0])
    th0 = float(headers[i0]["CROTA2"])
    ny, nx = img0.shape
    yy, xx = np.mgrid[0:ny, 0:nx].astype(np.float64)
    r_in, r_out = ANNULUS_RSUN
    sols, alts = [], []
    for k in use[1:]:
        dth = float(headers[k]["CROTA2"]) - th0
        if abs(((dth + 180.0) % 360.0) - 180.0) < 5.0:  # no roll between them: no leverage on the centre
            continue
        img = np.asarray(images[k], dtype=np.float64) / norm
        ok = np.isfinite(img) & (np.asarray(valid[k], bool) if valid is not None else True)
        o_k = np.array([float(headers[k]["FITCRPX1"]) - 1.0, float(headers[k]["FITCRPX2"]) - 1.0])
        rho = np.hypot(xx - o_k[0], yy - o_k[1]) / rs
        sel = ok & (rho > r_in) & (rho < r_out)
        px, py, val = xx[sel], yy[sel], img[sel]
        if px.size < 100:
            continue
        rmat = _rot(dth)

        def mapped(d, px=px, py=py, rmat=rmat, o_k=o_k):
            s0, sk = o0 - d, o_k - d
            q = rmat @ np.vstack([px - sk[0], py - sk[1]])
            return s0[0] + q[0], s0[1] + q[1]

        both = []
        for plane in (False, True):
            sol = _solve_pair(mapped, coef0, ok0f, o0, o_k, px, py, val, rs, plane)
            if sol is None:
                break
            both.append(sol)
        if len(both) == 2:
            sols.append(both[0])
            alts.append(both[1])
    if not sols:
        raise DataError("occulter offset: no roll pair gave a solution")
    arr, alt = np.array(sols), np.array(alts)
    d = arr.mean(axis=0)
    se = float(np.sqrt(np.mean(arr.var(axis=0, ddof=1)) / len(arr))) if len(arr) > 1 else OFFSET_SIGMA_FLOOR_PX
    # a detector-fixed flat error (the diffuser's non-uniformity) does not turn with the roll and
    # mimics an offset common to all pairs; the same fit with a detector-fixed plane free says how
    # much: the shift between the two, |shift| / sqrt(2) per axis, in quadrature with the pairs'
    # standard error
    sens = float(np.hypot(*(alt.mean(axis=0) - d))) / math.sqrt(2.0)
    sig = max(math.hypot(se, sens), OFFSET_SIGMA_FLOOR_PX)
    return OcculterOffset(float(d[0]), float(d[1]), sig, len(arr), float(abs(geom.scale)))


def _solve_pair(mapped, coef0, ok0f, o0, o_k, px, py, val, rs, plane: bool):
    """The offset (dx, dy) [pixel] mapping one roll frame onto frame 0, or ``None``; ``plane``: a level
    and plane (detector-fixed) free between them, else a level only."""
    from scipy.ndimage import map_coordinates
    from scipy.optimize import least_squares

    r_in, r_out = ANNULUS_RSUN
    d = np.zeros(2)
    fit = None
    for _ in range(2):  # the pixel set fixed within a solve, renewed at its solution
        x0, y0 = mapped(d)
        r0 = np.hypot(x0 - o0[0], y0 - o0[1]) / rs
        keep = (r0 > r_in) & (r0 < r_out) & (map_coordinates(ok0f, [y0, x0], order=1, mode="constant", cval=0.0) > 0.999)
        if keep.sum() < 100:
            return None
        ux, uy = (px[keep] - o_k[0]) / rs, (py[keep] - o_k[1]) / rs

        def resid(q, keep=keep, ux=ux, uy=uy):
            x0, y0 = mapped(q[:2])
            ref = map_coordinates(coef0, [y0[keep], x0[keep]], order=3, mode="nearest", prefilter=False)
            gain = 1.0 + q[2] + ((q[3] * ux + q[4] * uy) if plane else 0.0)
            return val[keep] - ref * gain

        try:
            fit = least_squares(resid, np.r_[d, 0.0, 0.0, 0.0] if plane else np.r_[d, 0.0], diff_step=1e-4,
                                max_nfev=400)
        except (ValueError, np.linalg.LinAlgError):
            return None
        d = fit.x[:2]
    return fit.x[:2] if fit is not None and fit.success and np.all(np.isfinite(fit.x)) else None
