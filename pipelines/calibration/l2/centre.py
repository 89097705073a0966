"""The Sun's centre from the data: a limb fit (SDI, WST) and an occulter-edge fit (SCI).

The chain used to trust the header's disk centre (``CRPIX``/``CRVAL``, or ASO-S's centre
keywords mapped to them by :func:`pipelines.fitsio.read_image`). A pointing error in the
header moves everything that depends on the centre: the SCI stray-light subtraction (a
power law in the distance from the centre), the occulter and field-of-view masks and the
north-up re-centring. At 512 px a 0.25 px error makes the SCI-WL corona at 2.3-2.45 Rsun
17.6 % too faint on one side and 18.9 % too bright on the other (issue 14).

:func:`fit_disk_centre` finds the centre from the frame itself:

1. **Edge points.** Along ``n_rays`` radial rays from the first guess (the header's centre
   and radius), each ray the mean of three parallel rays half a pixel apart, the profile
   is sampled every 0.1 px (bilinear, ``scipy.ndimage.map_coordinates``), smoothed by a
   Gaussian of ``smooth_px`` and differentiated. The edge is the centroid of the radial
   gradient above half its peak around its extremum: the steepest fall of the limb
   (Toner & Jefferies 1993, PASP 105, 1243: the inflection point of the limb profile as
   the disk edge; Brown & Christensen-Dalsgaard 1998, ApJ 500, L195, for the same
   definition in solar-radius work) or the steepest rise of the SCI occulter's shadow.
   The centroid of the gradient is biased the same way on every ray (limb darkening, the
   occulter's vignetting ramp), which changes the radius, not the centre. For the
   occulter, whose shadow multiplies a brightness falling steeply and varying with
   position angle (stray light, streamers), each ray is first divided by the power law
   ``r^b`` fitted to ``log I`` beyond the edge, so the edge found is the transmission's
   (at 1024 px this halves the fit's systematic, 0.028 -> 0.012 px).
2. **Robust circle fit.** Kasa's algebraic circle (Kasa 1976, IEEE Trans. Instrum. Meas.
   IM-25, 8, eq. 3) as the start of a geometric least-squares fit of the distances
   ``|p_i - c| - R`` (Chernov 2010, *Circular and Linear Regression*, CRC, ch. 4) by
   ``scipy.optimize.least_squares`` with the Huber loss (Huber 1964, Ann. Math. Stat. 35,
   73) of scale 1.4826 x MAD; points beyond 4 robust standard deviations (active regions
   on the limb, prominences, a cosmic ray on a ray) are rejected and the fit repeated.
   The whole of 1-2 runs twice, the second time from the fitted centre and radius.
3. **Uncertainty.** ``sigma = sqrt(s^2 diag((J^T J)^-1))`` with ``J`` the Jacobian at the
   solution and ``s^2`` the residual variance of the kept points (the usual least-squares
   covariance, e.g. Press et al. 2007, *Numerical Recipes*, 3rd ed., sect. 15.4).

For SCI the edge is the occulter's (``OCCRAD`` of the mask-geometry calibration, else the
channel's 1.1 Rsun): this gives the Sun's centre only where the occulter is centred on
the Sun. A single frame cannot do better: the corona around the occulter has m = 1
asymmetries of its own (streamers, tilts) that no symmetry argument separates from a centre
offset. The occulter-to-Sun offset is therefore measured from a roll sequence
(:mod:`pipelines.calibration.masters.occulter`: the corona turns about the Sun, the occulter
stays) and carried by the stray-light (or mask-geometry) master as ``OCCOFF1/2``,
``OCCOFERR``; :func:`fit_and_apply_centre` subtracts it from the occulter fit and adds its
1-sigma to ``CSYERia`` (issue 27). Without it the occulter is taken as centred (HISTORY
says so). The field stop (2.5 Rsun) is not used: at most frame
sizes its vignetting ramp lies partly outside the detector.

The flat derivation registers its dithers with another, image-only fit
(:func:`pipelines.calibration.masters.limb.fit_solar_limb`; why two: that module's docstring).

:func:`fit_and_apply_centre` is the step of :func:`pipelines.calibration.l2.flow.calibrate_frame`:
it fits, compares with the header and, when they disagree by more than
``max(tolerance_px, 3 sigma, systematic)`` (:data:`EDGE_SYSTEMATIC_ARCSEC`), moves the WCS
(``CRPIX``) by the difference, so that every later step (stray light, masks, north-up
re-centring) uses the fitted centre. Both centres go into the header (``FITCRPX1/2``,
``HDRCRPX1/2``, ``FITCSIG``, ``CTRSHIFT``, ``CTRSRC``) and into HISTORY; a failed fit keeps
the header's centre and says so (``CTRSRC = 'HEADER'``, ``FITCSTAT = 'FAILED'``, a HISTORY
line with the reason) and flags the frame (:mod:`pipelines.calibration.l2.quality`): bit
``CENTRE_REFUSED`` of ``QUALITY`` when a fit was made and refused (further from the header than
:func:`pointing_uncertainty_px`, 4.2 px at 256 px, or too uncertain; its centre is then in
``FITCRPX1/2`` and its distance in ``CTRSHIFT``), ``CENTRE_FAILED`` when none could be made;
``CENTFAIL`` says why.

The centre's uncertainty goes into the WCS's own error keywords (FITS Standard 4.0, sect. 8.2;
Greisen & Calabretta 2002, A&A 395, 1061, WCS Paper I): ``CRDERia`` (random: the fit's
1-sigma) and ``CSYERia`` (systematic: the channel's edge systematic, at least
:data:`EDGE_SYSTEMATIC_FLOOR_PX`, plus the header's distance from the fit when the header's
centre is kept), in ``CUNITia``; a disabled fit writes neither and removes any that came in
with the header (they would state the error of a centre nobody measured); a failed or refused
fit removes them too and writes ``CSYERia`` = the pointing uncertainty (the larger of
:func:`pointing_uncertainty_px` and a refused fit's distance from the header), no ``CRDERia``,
so that the product never claims the precision of a measured centre. The per-pixel
uncertainty (``UNCERT``) does not include them: a centre error is one error for the whole
frame, like the radiometric coefficient's (the radiometric master's ``RADCERR``/``RADSCALE``;
no L2 keyword states that one yet).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from astropy.io import fits
from scipy import optimize

from pipelines.array_backend import namespace_of, ndimage_for, to_numpy
from pipelines.calibration.l2 import device
from pipelines.calibration.l2 import fused
from pipelines.calibration.l2.quality import FrameQuality, flag_frame
from pipelines.errors import DataError
from pipelines.sun import sun_geometry

__all__ = ["CentreFit", "edge_points", "fit_circle", "fit_disk_centre", "fit_and_apply_centre",
           "CENTRE_KEYWORDS", "MAX_POINTING_ERROR_PX", "EDGE_SYSTEMATIC_ARCSEC",
           "EDGE_SYSTEMATIC_FLOOR_PX", "pointing_uncertainty_px"]

#: A fit more than this far from the header's centre [pixel of the frame, scaled from
#: 40 px at 4608 px] is not believed (the pointing of ASO-S is known to a few arcsec;
#: a fit that far off has locked on something else).
MAX_POINTING_ERROR_PX = 40.0

#: Largest formal 1-sigma [pixel] of a fit that is used.
MAX_SIGMA_PX = 0.5

#: Systematic error of the edge fit [arcsec] per channel, below which a disagreement with
#: the header is not believed. Measured on the simulated scenes (``blind_centre.run``
#: with the true centre, 192-2048 px): the SDI Lyman-alpha limb (the EUV proxy's off-limb
#: emission, with active regions on the limb) puts the limb fit 0.7-1.0 arcsec off the
#: disk centre; no single frame can tell such a limb asymmetry from a centre shift (both
#: are the m = 1 term of the limb's shape). The WST photospheric limb and the SCI occulter
#: edge fit to about 0.1 arcsec. To be measured again on flight data (SDI against WST).
EDGE_SYSTEMATIC_ARCSEC = {"SDI": 1.0, "WST": 0.1, "SCI-UV": 0.1, "SCI-WL": 0.1}

#: Keywords the step writes, with their comments.
CENTRE_KEYWORDS = {
    "FITCMETH": "centre fit: LIMB (disk) or OCCULTER (SCI)",
    "FITCSTAT": "centre fit status: OK or FAILED",
    "FITCRPX1": "[pix] fitted centre x, detector, 1-based",
    "FITCRPX2": "[pix] fitted centre y, detector, 1-based",
    "FITCSIG": "[pix] 1-sigma of the fitted centre",
    "FITCRMS": "[pix] RMS of edge points about the circle",
    "FITCRAD": "[pix] fitted edge radius (limb/occulter)",
    "FITCNPT": "edge points used by the centre fit",
    "HDRCRPX1": "[pix] header's centre x, detector, 1-based",
    "HDRCRPX2": "[pix] header's centre y, detector, 1-based",
    "CTRSHIFT": "[pix] |fitted - header's| disk centre",
    "CTRTOL": "[pix] disagreement above which fit is used",
    "CTRSRC": "disk centre used: FIT or HEADER",
    "CRDER1": "[CUNIT1] random error of the disk centre",
    "CRDER2": "[CUNIT2] random error of the disk centre",
    "CSYER1": "[CUNIT1] systematic error, disk centre",
    "CSYER2": "[CUNIT2] systematic error, disk centre",
}

#: Floor of the stated systematic error of an edge fit [pixel]: at coarse sampling the edge
#: fit's bias is a fraction of a pixel whatever the channel (measured with the true centre in
#: the header, seed 0, ``blind_centre``: WST 0.065 px at 256 px, 0.0005-0.0017 px at
#: 1024-2048 px; SCI 0.006-0.013 px at 256 px), so ``CSYERia`` is at least this.
EDGE_SYSTEMATIC_FLOOR_PX = 0.1


@dataclass(frozen=True)
class CentreFit:
    """A fitted disk centre.

    Attributes
    ----------
    x0, y0 : float
        Centre [pixel, 0-based column, row].
    radius : float
        Radius of the fitted edge [pixel] (limb or occulter edge).
    sigma_x, sigma_y : float
        1-sigma formal uncertainties of ``x0``, ``y0`` [pixel].
    rms : float
        RMS distance of the kept edge points to the circle [pixel].
    n_points, n_rays : int
        Edge points kept, rays cast.
    method : str
        ``limb`` or ``occulter``.
    """

    x0: float
    y0: float
    radius: float
    sigma_x: float
    sigma_y: float
    rms: float
    n_points: int
    n_rays: int
    method: str

    @property
    def sigma(self) -> float:
        """The larger of ``sigma_x`` and ``sigma_y`` [pixel]."""
        return max(self.sigma_x, self.sigma_y)


def edge_points(image: np.ndarray, x0: float, y0: float, radius: float, *, rising: bool, half_width: float,
                n_rays: int, smooth_px: float = 1.0, step: float = 0.1, level: float = 0.5,
                normalise: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Sub-pixel edge points along radial rays from ``(x0, y0)`` near ``radius``.

    Parameters
    ----------
    image : numpy.ndarray, shape (ny, nx)
        Finite values (non-finite ones must be replaced before).
    x0, y0 : float
        Ray origin [pixel, 0-based].
    radius : float
        Expected edge radius [pixel]; rays span ``radius +- half_width``.
    rising : bool
        ``True``: the intensity rises outward at the edge (occulter shadow); ``False``: it
        falls (limb).
    half_width : float
        Half length of the searched radial range [pixel].
    n_rays : int
        Rays, evenly spaced in position angle.
    smooth_px : float
        Gaussian sigma [pixel] of the radial smoothing before differentiating.
    step : float
        Radial sampling [pixel].
    level : float
        The edge is the centroid of the gradient over its run above ``level`` x its peak.
    normalise : bool
        ``rising`` edges only: divide each ray by the power law fitted beyond the edge
        first (the occulter's transmission edge, not that of transmission x brightness).

    Returns
    -------
    x, y : numpy.ndarray, shape (n,)
        Edge points [pixel, 0-based] of the rays that stay inside the frame and show an
        edge (n <= n_rays).
    """
    ny, nx = image.shape
    theta = np.linspace(0.0, 2.0 * math.pi, int(n_rays), endpoint=False)
    radii = np.arange(radius - half_width, radius + half_width + 0.5 * step, step)
    radii = radii[radii > 1.0]
    if radii.size < 16:
        raise DataError(f"edge search range too small (radius {radius:.1f} px)")
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
    offsets = (-0.5, 0.0, 0.5)  # three parallel rays, half a pixel apart (tangentially)
    inside = np.ones(theta.size, dtype=bool)
    for t in offsets:  # the rays' ends (a ray is a segment: its extremes are its end points)
        for r in (radii[0], radii[-1]):
            xe = x0 + c[:, 0] * r - s[:, 0] * t
            ye = y0 + s[:, 0] * r + c[:, 0] * t
            inside &= (xe >= 0) & (xe <= nx - 1) & (ye >= 0) & (ye <= ny - 1)
    with device.section("centre_sampling"):
        if fused.enabled() and isinstance(image, np.ndarray) and image.dtype in (np.float32, np.float64):
            prof = fused.ray_profiles(image, x0, y0, theta, radii, offsets)  # the same values, compiled
        else:  # on the image's module (CuPy: cupyx.scipy.ndimage, on the device)
            xp = namespace_of(image)
            nd = ndimage_for(xp)
            cd, sd, rd = xp.asarray(c), xp.asarray(s), xp.asarray(radii)
            prof = xp.zeros((theta.size, radii.size))
            for t in offsets:
                xs = x0 + cd * rd[None, :] - sd * t
                ys = y0 + sd * rd[None, :] + cd * t
                prof += nd.map_coordinates(image, [ys.ravel(), xs.ravel()], order=1,
                                           mode="nearest").reshape(prof.shape)
            prof /= 3.0
        # the profiles' edges on the same module (CuPy: on the device); only the edge points come back
        r_edge, ok = _edges(prof, inside, radii, step, smooth_px, rising, normalise, level)
        td = namespace_of(prof).asarray(theta)
        xs_e = to_numpy((x0 + r_edge * namespace_of(prof).cos(td))[ok])
        ys_e = to_numpy((y0 + r_edge * namespace_of(prof).sin(td))[ok])
    return xs_e, ys_e


def _edges(prof: Any, inside: np.ndarray, radii: np.ndarray, step: float, smooth_px: float, rising: bool,
           normalise: bool, level: float) -> tuple[Any, Any]:
    """Edge radius [pixel] per ray of the profiles ``prof`` (n_rays, n_radii) and which rays
    show a usable edge (:func:`edge_points`), on the profiles' array module."""
    xp = namespace_of(prof)
    rd = xp.asarray(radii)
    if smooth_px > 0:
        prof = ndimage_for(xp).gaussian_filter1d(prof, smooth_px / step, axis=1, mode="nearest")
    grad = xp.gradient(prof, step, axis=1)
    if not rising:
        grad = -grad
    r_edge, peak, left, right = _gradient_centroid(grad, rd, level)
    noise = 1.4826 * xp.median(xp.abs(xp.diff(grad, axis=1)), axis=1)
    # a usable edge: inside the frame, a positive peak clear of the range's ends, the run closed on both sides
    ok = xp.asarray(inside) & (peak > 0) & (left >= 0) & (right < radii.size) & (peak > 5.0 * noise)
    if rising and normalise:
        # the occulter's shadow multiplies a steeply falling brightness S(r) (stray light and
        # corona, streamers varying with position angle): divide each ray by the power law
        # r^b fitted to log I beyond the edge, so that the edge is that of the transmission
        # alone, then locate it again
        width = xp.maximum(right - left, 1)
        start = xp.minimum(right + width // 2, radii.size - 1)
        lr = xp.log(rd)
        lp = xp.log(xp.maximum(prof, np.finfo(np.float64).tiny))
        sel = xp.arange(radii.size)[None, :] >= start[:, None]  # the samples beyond the edge
        nsel = sel.sum(axis=1)
        ok &= nsel >= 10
        sx = xp.where(sel, lr[None, :], 0.0).sum(axis=1)
        sy = xp.where(sel, lp, 0.0).sum(axis=1)
        sxx = xp.where(sel, lr[None, :] ** 2, 0.0).sum(axis=1)
        sxy = xp.where(sel, lr[None, :] * lp, 0.0).sum(axis=1)
        den = nsel * sxx - sx * sx
        b = xp.where(den > 0, (nsel * sxy - sx * sy) / xp.where(den > 0, den, 1.0), 0.0)
        trans = prof * xp.exp(-b[:, None] * (lr[None, :] - xp.log(xp.maximum(r_edge, 1.0))[:, None]))
        grad_t = xp.gradient(trans, step, axis=1)
        r_edge, peak_t, left, right = _gradient_centroid(grad_t, rd, level)
        ok &= (peak_t > 0) & (left >= 0) & (right < radii.size)
    return r_edge, ok


def _gradient_centroid(grad: np.ndarray, radii: np.ndarray, level: float) -> tuple[np.ndarray, ...]:
    """Per ray: the centroid [pixel] of ``grad`` over the contiguous run above ``level`` x its
    peak around the peak, the peak, and the last index before and first index after the run."""
    xp = namespace_of(grad)
    k = xp.argmax(grad, axis=1)
    peak = grad[xp.arange(grad.shape[0]), k]
    above = grad >= level * peak[:, None]
    idx = xp.arange(radii.size)[None, :]
    left = xp.where((~above) & (idx < k[:, None]), idx, -1).max(axis=1)
    right = xp.where((~above) & (idx > k[:, None]), idx, radii.size).min(axis=1)
    run = (idx > left[:, None]) & (idx < right[:, None])
    w = xp.where(run, grad, 0.0)
    tot = w.sum(axis=1)
    return (w * radii[None, :]).sum(axis=1) / xp.where(tot > 0, tot, 1.0), peak, left, right


def _kasa(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Kasa's algebraic circle (Kasa 1976, eq. 3): least squares of ``x^2 + y^2 = 2ax + 2by + c``."""
    a = np.column_stack([x, y, np.ones_like(x)])
    sol, *_ = np.linalg.lstsq(a, x * x + y * y, rcond=None)
    cx, cy = sol[0] / 2.0, sol[1] / 2.0
    return float(cx), float(cy), float(math.sqrt(max(sol[2] + cx * cx + cy * cy, 0.0)))


def fit_circle(x: np.ndarray, y: np.ndarray, *, reject_sigma: float = 4.0) -> tuple[np.ndarray, np.ndarray,
                                                                                 float, np.ndarray]:
    """Robust geometric circle fit through points ``(x, y)``.

    Kasa's algebraic fit starts a geometric least-squares fit of ``|p_i - c| - R``
    (``scipy.optimize.least_squares``, Huber loss of scale 1.4826 x MAD of the start's
    residuals); points beyond ``reject_sigma`` robust standard deviations are dropped and
    the fit repeated (at most four times).

    Parameters
    ----------
    x, y : numpy.ndarray, shape (n,)
        Points [pixel]; n >= 8.
    reject_sigma : float

    Returns
    -------
    params : numpy.ndarray, shape (3,)
        ``(x0, y0, R)`` [pixel].
    sigma : numpy.ndarray, shape (3,)
        Their 1-sigma formal uncertainties [pixel].
    rms : float
        RMS residual of the kept points [pixel].
    keep : numpy.ndarray of bool, shape (n,)

    Raises
    ------
    DataError
        If fewer than 8 points are given or kept.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size < 8:
        raise DataError(f"too few edge points for a circle fit ({x.size})")
    p = np.array(_kasa(x, y))
    keep = np.ones(x.size, dtype=bool)

    def resid(q: np.ndarray, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
        return np.hypot(xx - q[0], yy - q[1]) - q[2]

    def jac(q: np.ndarray, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
        d = np.maximum(np.hypot(xx - q[0], yy - q[1]), 1e-12)
        return np.column_stack([-(xx - q[0]) / d, -(yy - q[1]) / d, -np.ones_like(xx)])

    for _ in range(4):
        r0 = resid(p, x[keep], y[keep])
        scale = max(1.4826 * float(np.median(np.abs(r0 - np.median(r0)))), 1e-3)
        sol = optimize.least_squares(resid, p, jac=jac, args=(x[keep], y[keep]), loss="huber", f_scale=scale,
                                     x_scale="jac", method="trf")
        p = sol.x
        r_all = resid(p, x, y)
        mad = max(1.4826 * float(np.median(np.abs(r_all[keep] - np.median(r_all[keep])))), 1e-4)
        new_keep = np.abs(r_all - np.median(r_all[keep])) < reject_sigma * mad
        if new_keep.sum() < 8:
            raise DataError("too few edge points left after outlier rejection")
        if np.array_equal(new_keep, keep):
            break
        keep = new_keep
    r = resid(p, x[keep], y[keep])
    j = jac(p, x[keep], y[keep])
    dof = max(int(keep.sum()) - 3, 1)
    s2 = float(np.sum(r * r)) / dof
    cov = np.linalg.pinv(j.T @ j) * s2
    return p, np.sqrt(np.clip(np.diag(cov), 0.0, None)), float(math.sqrt(np.mean(r * r))), keep


def fit_disk_centre(image: Any, x0: float, y0: float, radius: float, *, method: str = "limb",
                    search_px: float | None = None, n_rays: int | None = None,
                    smooth_px: float = 1.0) -> CentreFit:
    """Fit the disk centre of a frame from its limb or its occulter edge.

    Parameters
    ----------
    image : array, shape (ny, nx)
        Dark-subtracted, flat-fielded frame (NumPy or CuPy; any unit). Non-finite
        pixels are set to the frame's median first. On CuPy the frame stays on the device:
        the fill, the ray sampling and the edge search run there and only the edge points
        (at most ``n_rays``) come to the host for the circle fit.
    x0, y0 : float
        First guess of the centre [pixel, 0-based] (the header's).
    radius : float
        First guess of the edge radius [pixel]: the photospheric radius (``limb``) or the
        occulter's (``occulter``).
    method : {"limb", "occulter"}
        ``limb``: the intensity falls outward at the edge; ``occulter``: it rises (SCI).
    search_px : float, optional
        Half width of the first radial search [pixel]; default ``0.06 radius`` within
        6-30 px for the limb, ``0.12 radius`` within 8-48 px for the occulter (room beyond
        the edge for the brightness fit); it must hold the pointing error and the edge's
        width. The radial sampling is 0.1 px, or ``half width / 120`` when coarser.
    n_rays : int, optional
        Rays (default: one per pixel of circumference, 180 to 4096).
    smooth_px : float
        Radial Gaussian smoothing [pixel] before differentiating.

    Returns
    -------
    CentreFit

    Raises
    ------
    DataError
        If no edge is found on enough rays (a quarter of them), or the circle fit fails.
    """
    if method not in ("limb", "occulter"):
        raise ValueError(f"method must be 'limb' or 'occulter', got {method!r}")
    xp = namespace_of(image)  # the frame stays where it is (CuPy: the fill and the sampling on the device)
    img = xp.asarray(image, dtype=xp.float32)
    if img.ndim != 2:
        raise DataError(f"a frame must be 2-D, got shape {img.shape}")
    with device.section("centre_sampling"):
        finite = xp.isfinite(img)
        if not bool(finite.any()):
            raise DataError("the frame has no finite pixel")
        if not bool(finite.all()):
            img = xp.where(finite, img, xp.float32(float(xp.median(img[finite]))))
        del finite
    if not (radius > 4 and math.isfinite(radius)):
        raise DataError(f"edge radius too small to fit ({radius:.2f} px)")
    rays = int(n_rays) if n_rays is not None else int(np.clip(2.0 * math.pi * radius, 180, 4096))
    if method == "occulter":
        default = float(np.clip(0.12 * radius, 8.0, 48.0))
    else:
        default = float(np.clip(0.06 * radius, 6.0, 30.0))
    half = float(search_px) if search_px is not None else default
    cx, cy, r = float(x0), float(y0), float(radius)
    rising = method == "occulter"
    p = sig = keep = None
    rms = float("nan")
    for half_width in (half, max(3.0, 0.5 * half)):
        # 0.1 px samples, coarser on wide searches (at most ~240 samples a ray: memory and time at 4608 px)
        xs, ys = edge_points(img, cx, cy, r, rising=rising, half_width=half_width, n_rays=rays, smooth_px=smooth_px,
                             step=max(0.1, half_width / 120.0))
        if xs.size < 0.25 * rays:
            raise DataError(f"{method} edge found on {xs.size} of {rays} rays only")
        p, sig, rms, keep = fit_circle(xs, ys)
        cx, cy, r = (float(v) for v in p)
    return CentreFit(x0=cx, y0=cy, radius=r, sigma_x=float(sig[0]), sigma_y=float(sig[1]), rms=rms,
                     n_points=int(keep.sum()), n_rays=rays, method=method)


def _set(h: fits.Header, key: str, value: Any) -> None:
    h[key] = (value, CENTRE_KEYWORDS[key])


def _drop_wcs_errors(h: fits.Header, axes=(1, 2)) -> None:
    """Remove ``CRDERia``/``CSYERia`` of ``axes`` that came in with the header: they would state an
    error of a centre this step has not measured (fit disabled or failed, or a unit it does not know)."""
    for axis in axes:
        for key in (f"CRDER{axis}", f"CSYER{axis}"):
            h.remove(key, ignore_missing=True, remove_all=True)


def _set_wcs_errors(h: fits.Header, scale_arcsec: float, rand_x_px: float, rand_y_px: float, sys_px: float,
                    *, random: bool = True) -> None:
    """``CRDER1/2`` (unless ``random`` is false), ``CSYER1/2`` from pixel errors, in the header's
    ``CUNITia`` (arcsec or deg)."""
    for axis, rand in ((1, rand_x_px), (2, rand_y_px)):
        unit = str(h.get(f"CUNIT{axis}", "arcsec")).strip().lower()
        per = {"arcsec": 1.0, "deg": 1.0 / 3600.0, "arcmin": 1.0 / 60.0}.get(unit)
        if per is None:  # a unit the step does not know: say nothing rather than something wrong
            _drop_wcs_errors(h, (axis,))
            continue
        if random:
            _set(h, f"CRDER{axis}", float(f"{rand * scale_arcsec * per:.3g}"))
        _set(h, f"CSYER{axis}", float(f"{sys_px * scale_arcsec * per:.3g}"))


def pointing_uncertainty_px(n: int) -> float:
    """The largest pointing error believed in a header [pixel] for a frame of ``n`` pixels a side.

    :data:`MAX_POINTING_ERROR_PX` scaled from 4608 px (frames below 256 px as 256), plus 2 px
    for the edge search: 4.22 px at 256 px, 6.44 px at 512 px, 42 px at 4608 px. A centre fit
    further from the header is refused; with no fit used, it is the header centre's stated
    systematic error.
    """
    return MAX_POINTING_ERROR_PX * max(int(n), 256) / 4608.0 + 2.0


def fit_and_apply_centre(img: Any, h: fits.Header, *, coronagraph: bool, occulter_rsun: float | None = None,
                         tolerance_px: float = 0.05, systematic_arcsec: float = 0.0,
                         enabled: bool = True,
                         occulter_offset_arcsec: tuple[float, float, float] | None = None,
                         ) -> tuple[fits.Header, CentreFit | None]:
    """Fit the disk centre and, if it disagrees with the header, move the WCS onto it.

    Parameters
    ----------
    img : array, shape (ny, nx)
        The frame after dark, flat and exposure normalisation (NumPy or CuPy).
    h : astropy.io.fits.Header
        Its header (helioprojective WCS); a copy is returned.
    coronagraph : bool
        SCI: fit the occulter edge at ``occulter_rsun``; else the limb.
    occulter_rsun : float, optional
        Occulter radius [Rsun] (``OCCRAD``; default 1.1, the channel's).
    tolerance_px : float
        The fit replaces the header's centre when they differ by more than
        ``max(tolerance_px, 3 sigma, systematic_arcsec / plate scale)`` [pixel].
    systematic_arcsec : float
        The edge fit's systematic error [arcsec] (:data:`EDGE_SYSTEMATIC_ARCSEC`).
    enabled : bool
        ``False``: no fit; the header's centre is kept and HISTORY says so.
    occulter_offset_arcsec : (float, float, float), optional
        SCI: the occulter centre minus the Sun centre along the detector axes and its 1-sigma
        per axis [arcsec] (``OCCOFF1``, ``OCCOFF2``, ``OCCOFERR`` of the stray-light master,
        measured from a roll sequence: :mod:`pipelines.calibration.masters.occulter`). The Sun
        centre is the occulter fit minus it, and its 1-sigma is added in quadrature to
        ``CSYERia``. ``None``: the occulter is taken as centred on the Sun (HISTORY says so).

    Returns
    -------
    header : astropy.io.fits.Header
        With ``CRPIX1/2`` moved by (fitted - header's) when the fit is used, and the
        :data:`CENTRE_KEYWORDS`.
    fit : CentreFit or None
        ``None`` when disabled or failed.

    Raises
    ------
    DataError
        If the header does not locate the Sun (no WCS): nothing to start from.
    """
    h = h.copy()
    _drop_wcs_errors(h)  # only this step's own claim on the centre goes out (none when it measures none)
    if not enabled:
        h.add_history("fit_sun_centre: skipped on request (option fit_centre=false); the header's centre used")
        _set(h, "CTRSRC", "HEADER")
        return h, None
    geom = sun_geometry(h)
    method = "occulter" if coronagraph else "limb"
    r_guess = geom.rsun_px * (float(occulter_rsun) if coronagraph and occulter_rsun else (1.1 if coronagraph else 1.0))
    n = max(img.shape)
    _set(h, "FITCMETH", method.upper())
    _set(h, "HDRCRPX1", round(geom.x0 + 1.0, 4))
    _set(h, "HDRCRPX2", round(geom.y0 + 1.0, 4))
    reason = short = ""
    fit = None
    try:
        fit = fit_disk_centre(img, geom.x0, geom.y0, r_guess, method=method)
    except DataError as exc:
        reason = short = str(exc)
    occ_sys_px = 0.0
    if fit is not None and coronagraph:
        if occulter_offset_arcsec is not None:  # the occulter's centre is not the Sun's: move to the Sun
            ox, oy, oerr = (float(v) for v in occulter_offset_arcsec)
            fit = dataclasses.replace(fit, x0=fit.x0 - ox / abs(geom.scale), y0=fit.y0 - oy / abs(geom.scale))
            occ_sys_px = oerr / abs(geom.scale)
            h.add_history(f"fit_sun_centre: occulter fit moved by the measured occulter-to-Sun offset "
                          f"({-ox:+.2f}, {-oy:+.2f}) arcsec (OCCOFF1/2, 1-sigma {oerr:.2f} arcsec in CSYER1/2)")
        else:
            h.add_history("fit_sun_centre: no measured occulter-to-Sun offset (OCCOFF1/2): the occulter "
                          "is taken as centred on the Sun")
    limit = pointing_uncertainty_px(n)
    pointing_px = limit  # the header's centre is believed to this, no better, when nothing measured it
    if fit is not None:
        shift = math.hypot(fit.x0 - geom.x0, fit.y0 - geom.y0)
        if shift > limit:
            reason = f"fit {shift:.2f} px from the header's centre, more than the {limit:.1f} px believed"
            short = f"fit {shift:.2f} px off header, limit {limit:.2f} px"
        elif not fit.sigma <= MAX_SIGMA_PX:
            reason = short = f"fit uncertainty {fit.sigma:.3f} px above {MAX_SIGMA_PX} px"
        if reason:
            pointing_px = max(limit, shift)  # header and fit disagree by `shift`: either may be the wrong one
            _set(h, "FITCRPX1", round(fit.x0 + 1.0, 4))
            _set(h, "FITCRPX2", round(fit.y0 + 1.0, 4))
            _set(h, "FITCSIG", float(f"{fit.sigma:.3g}"))
            _set(h, "CTRSHIFT", round(shift, 4))
    if reason:
        _set(h, "FITCSTAT", "FAILED")
        _set(h, "CTRSRC", "HEADER")
        h.add_history(f"fit_sun_centre: {method} fit FAILED ({reason}); the header's centre "
                      f"({geom.x0 + 1:.3f}, {geom.y0 + 1:.3f}) kept (1-based)")
        # the header's centre is unverified: say so frame-wide and state the pointing uncertainty
        # as its systematic error (no random error: nothing was measured)
        flag_frame(h, FrameQuality.CENTRE_REFUSED if fit is not None else FrameQuality.CENTRE_FAILED,
                   short)
        _set_wcs_errors(h, geom.scale, 0.0, 0.0, pointing_px, random=False)
        h.add_history(f"fit_sun_centre: CSYER1/2 state the pointing uncertainty, {pointing_px:.2f} px "
                      f"({pointing_px * geom.scale:.2f} arcsec), as the centre's systematic error")
        return h, None
    dx, dy = fit.x0 - geom.x0, fit.y0 - geom.y0
    shift = math.hypot(dx, dy)
    threshold = max(float(tolerance_px), 3.0 * fit.sigma, float(systematic_arcsec) / geom.scale)
    _set(h, "FITCSTAT", "OK")
    _set(h, "FITCRPX1", round(fit.x0 + 1.0, 4))
    _set(h, "FITCRPX2", round(fit.y0 + 1.0, 4))
    _set(h, "FITCSIG", float(f"{fit.sigma:.3g}"))
    _set(h, "FITCRMS", float(f"{fit.rms:.3g}"))
    _set(h, "FITCRAD", round(fit.radius, 3))
    _set(h, "FITCNPT", int(fit.n_points))
    _set(h, "CTRSHIFT", round(shift, 4))
    _set(h, "CTRTOL", round(threshold, 4))
    sys_px = math.hypot(max(float(systematic_arcsec) / geom.scale, EDGE_SYSTEMATIC_FLOOR_PX), occ_sys_px)
    if shift <= threshold:  # the header's centre is kept: off the fit by `shift`, the fit off by sys_px
        sys_px += shift
    _set_wcs_errors(h, geom.scale, fit.sigma_x, fit.sigma_y, sys_px)
    text = (f"{method} fit ({fit.n_points} of {fit.n_rays} rays, sigma {fit.sigma:.3f} px) puts the disk centre at "
            f"({fit.x0 + 1:.3f}, {fit.y0 + 1:.3f}), the header at ({geom.x0 + 1:.3f}, {geom.y0 + 1:.3f}) (1-based): "
            f"{shift:.3f} px apart")
    if shift > threshold:
        h["CRPIX1"] = (float(h["CRPIX1"]) + dx, h.comments["CRPIX1"])
        h["CRPIX2"] = (float(h["CRPIX2"]) + dy, h.comments["CRPIX2"])
        _set(h, "CTRSRC", "FIT")
        h.add_history(f"fit_sun_centre: {text}, more than {threshold:.3f} px: CRPIX moved by ({dx:+.3f}, {dy:+.3f}) "
                      "px, the fitted centre used from here on")
    else:
        _set(h, "CTRSRC", "HEADER")
        h.add_history(f"fit_sun_centre: {text}, within {threshold:.3f} px: the header's centre kept")
    return h, fit
